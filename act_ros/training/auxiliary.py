"""Auxiliary object-pose loss: teach the vision backbone where the box and the pad are.

Trained only from the action loss, ACT's backbone learns slowly where the objects are:
for most frames the joint state alone predicts the next actions well (the arm is already
moving where it has to go), so the action loss gives the images little weight, and a
policy that imitates the expert closely on the expert's own states still misses the box
by centimetres and ignores its yaw in closed loop. In simulation the box and pad poses
of every frame are known (``act-ros collect`` records them as ``sim.object_poses``);
a small head on top of each camera's backbone feature map learns to predict them, and
its loss shapes the backbone.

The head exists only during training: it is not part of the checkpoint, which keeps
LeRobot's ACT architecture and takes only the contract's inputs (cameras and joint
state). Object yaws are encoded as ``cos(4 yaw), sin(4 yaw)``: a cube and a square pad
look the same every 90 degrees.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib

import torch
from torch import nn

from act_ros.data.episode import OBJECT_POSE_NAMES

# Positions standardized with the training frames' statistics, yaws as 4-fold harmonics.
_POSITIONS = [OBJECT_POSE_NAMES.index(n) for n in ('box_x', 'box_y', 'box_z', 'pad_x', 'pad_y')]
_YAWS = [OBJECT_POSE_NAMES.index(n) for n in ('box_yaw', 'pad_yaw')]
TARGET_DIM = len(_POSITIONS) + 2 * len(_YAWS)


class ObjectPoseHead(nn.Module):
    """Per camera a 1x1 convolution (channels -> ``reduced``), then one MLP over all cameras."""

    def __init__(self, channels: int, grids: list[tuple[int, int]], *, reduced: int = 32,
                 hidden: int = 256) -> None:
        super().__init__()
        self.reduce = nn.ModuleList(nn.Conv2d(channels, reduced, 1) for _ in grids)
        flat = sum(reduced * h * w for h, w in grids)
        self.mlp = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(),
                                 nn.Linear(hidden, TARGET_DIM))

    def forward(self, feature_maps: list[torch.Tensor]) -> torch.Tensor:
        flat = [conv(f.float()).flatten(1) for conv, f in zip(self.reduce, feature_maps)]
        return self.mlp(torch.cat(flat, dim=1))


class ObjectPoseAuxiliary:
    """Captures the backbone's feature maps during a forward pass and scores the head.

    ``poses``: (N, 8) training-frame poses (``OBJECT_POSE_NAMES`` order), used for the
    position statistics. The head's parameters are trained with the policy's optimizer.
    ``tap``: take the feature maps as the input of this module instead of the output of
    ``backbone`` (ACT's ``encoder_img_feat_input_proj`` sees every camera's map, also
    while the backbone's first stages are replaced by cached outputs).
    """

    def __init__(self, backbone: nn.Module, image_shapes: list[tuple[int, int, int]],
                 poses: torch.Tensor, device: torch.device, *,
                 tap: nn.Module | None = None) -> None:
        with torch.no_grad():
            probe = backbone(torch.zeros(1, *image_shapes[0], device=device))['feature_map']
            grids = []
            for shape in image_shapes:
                grids.append(tuple(backbone(torch.zeros(1, *shape, device=device))
                                   ['feature_map'].shape[-2:]))
        self.head = ObjectPoseHead(int(probe.shape[1]), grids).to(device)
        positions = poses[:, _POSITIONS].double()
        self.mean = positions.mean(0).float().to(device)
        self.std = positions.std(0).clamp_min(1e-4).float().to(device)
        self._captured: list[torch.Tensor] | None = None
        if tap is None:
            self._handle = backbone.register_forward_hook(self._hook)
        else:
            self._handle = tap.register_forward_pre_hook(self._pre_hook)

    def _hook(self, _module: nn.Module, _inputs: tuple, output: dict) -> None:
        if self._captured is not None:
            self._captured.append(output['feature_map'])

    def _pre_hook(self, _module: nn.Module, inputs: tuple) -> None:
        if self._captured is not None:
            self._captured.append(inputs[0])

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Record the backbone outputs (one per camera) of the forward pass inside."""
        self._captured = []
        try:
            yield
        finally:
            pass

    def targets(self, poses: torch.Tensor) -> torch.Tensor:
        """(B, 8) poses -> (B, TARGET_DIM) standardized positions and yaw harmonics."""
        yaw = poses[:, _YAWS] * 4.0
        return torch.cat([(poses[:, _POSITIONS] - self.mean) / self.std, torch.cos(yaw),
                          torch.sin(yaw)], dim=1)

    def loss(self, poses: torch.Tensor) -> torch.Tensor:
        """Mean L1 between the head's prediction and the targets of the captured pass."""
        maps, self._captured = self._captured, None
        if not maps:
            raise RuntimeError('ObjectPoseAuxiliary.loss() needs a forward pass inside '
                               'capture()')
        prediction = self.head(maps)
        return (prediction - self.targets(poses.to(prediction.device).float())).abs().mean()

    @torch.no_grad()
    def errors(self, poses: torch.Tensor) -> dict[str, torch.Tensor]:
        """Physical errors of the captured pass (per frame, for validation): box and pad
        position in the table plane (m) and yaw modulo 90 degrees (deg)."""
        maps, self._captured = self._captured, None
        if not maps:
            raise RuntimeError('ObjectPoseAuxiliary.errors() needs a forward pass inside '
                               'capture()')
        prediction = self.head(maps).float()
        poses = poses.to(prediction.device).float()
        n = len(_POSITIONS)
        positions = prediction[:, :n] * self.std + self.mean
        true = poses[:, _POSITIONS]
        out = {}
        for name, (ix, iy) in (('box', (0, 1)), ('pad', (3, 4))):
            out[f'{name}_xy_m'] = torch.linalg.vector_norm(positions[:, [ix, iy]]
                                                           - true[:, [ix, iy]], dim=1)
        yaws = len(_YAWS)
        angle = torch.atan2(prediction[:, n + yaws:n + 2 * yaws], prediction[:, n:n + yaws]) / 4
        diff = torch.remainder(angle - poses[:, _YAWS] + torch.pi / 4, torch.pi / 2) - torch.pi / 4
        for k, name in enumerate(('box', 'pad')):
            out[f'{name}_yaw_deg'] = torch.rad2deg(diff[:, k].abs())
        return out

    def close(self) -> None:
        self._handle.remove()
