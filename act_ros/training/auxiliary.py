"""Auxiliary object-pose loss: teach the vision backbone where the box and the pad are.

Trained only from the action loss, ACT's backbone learns slowly where the objects are:
for most frames the joint state alone predicts the next actions well (the arm is already
moving where it has to go), so the action loss gives the images little weight, and a
policy that imitates the expert closely on the expert's own states still misses the box
by centimetres and ignores its yaw in closed loop. In simulation the box and pad poses
of every frame are known (``act-ros collect`` records them as ``sim.object_poses``);
a small head on top of each camera's backbone feature map learns to predict them, and
its loss shapes the backbone.

Where the head reads (``source``):

- ``backbone``: each camera's feature map (the input of ACT's image projection). Its
  loss shapes the backbone; it stops when the backbone is frozen and cached.
- ``encoder``: the output of ACT's transformer encoder (every token: latent, joints and
  the camera grid cells). Its loss asks the encoder to gather where the objects are from
  the image tokens into what the decoder reads; it keeps training after the backbone is
  frozen, at the cost of a cached step.

The head exists only during training: it is not part of the checkpoint, which keeps
LeRobot's ACT architecture and takes only the contract's inputs (cameras and joint
state). Object yaws are encoded as ``cos(4 yaw), sin(4 yaw)``: a cube and a square pad
look the same every 90 degrees.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from act_ros.data.episode import OBJECT_POSE_NAMES, OBJECT_POSES_FEATURE
from act_ros.training.config import AUX_SOURCES, YAW_READOUTS


@dataclass(frozen=True)
class AuxTarget:
    """What the auxiliary head predicts: ``feature`` (a per-frame dataset feature of the
    privileged simulator state) and, by index into it, the positions (standardized with
    the training frames' statistics) and yaws (as 4-fold harmonics) of the ``objects``,
    each named with the indices of its x and y among ``positions`` and of its yaw among
    ``yaws`` (None without one)."""

    feature: str
    positions: tuple[int, ...]
    yaws: tuple[int, ...]
    objects: tuple[tuple[str, tuple[int, int], int | None], ...]

    @property
    def dim(self) -> int:
        return len(self.positions) + 2 * len(self.yaws)


def _names(names: tuple[str, ...], *wanted: str) -> tuple[int, ...]:
    return tuple(names.index(n) for n in wanted)


# The package's task: box and pad (x, y, z, yaw) in sim.object_poses.
PORT_PICK_ALIGN_TARGET = AuxTarget(
    OBJECT_POSES_FEATURE,
    positions=_names(OBJECT_POSE_NAMES, 'box_x', 'box_y', 'box_z', 'pad_x', 'pad_y'),
    yaws=_names(OBJECT_POSE_NAMES, 'box_yaw', 'pad_yaw'),
    objects=(('box', (0, 1), 0), ('pad', (3, 4), 1)))


def aux_target(task_name: str) -> AuxTarget:
    """The auxiliary target of a task (act_ros.sim.tasks): for gym-aloha's transfer cube the
    cube's position in gym-aloha's env_state (its yaw never changes at reset)."""
    if task_name == 'aloha_transfer_cube':
        from act_ros.data.aloha_rollout import ALOHA_ENV_STATE_FEATURE, ALOHA_ENV_STATE_NAMES

        return AuxTarget(ALOHA_ENV_STATE_FEATURE,
                         positions=_names(ALOHA_ENV_STATE_NAMES, 'cube_x', 'cube_y', 'cube_z'),
                         yaws=(), objects=(('cube', (0, 1), None),))
    if task_name == 'port_pick_align':
        return PORT_PICK_ALIGN_TARGET
    raise ValueError(f"no auxiliary object-pose target for task '{task_name}'")


# The package task's layout (its pose probes read these).
_POSITIONS = list(PORT_PICK_ALIGN_TARGET.positions)
_YAWS = list(PORT_PICK_ALIGN_TARGET.yaws)
TARGET_DIM = PORT_PICK_ALIGN_TARGET.dim


def pose_targets(poses: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 target: AuxTarget = PORT_PICK_ALIGN_TARGET) -> torch.Tensor:
    """(B, k) poses -> (B, target.dim): positions standardized with ``mean`` and ``std``,
    yaws as 4-fold harmonics."""
    positions = (poses[:, list(target.positions)] - mean) / std
    if not target.yaws:
        return positions
    yaw = poses[:, list(target.yaws)] * 4.0
    return torch.cat([positions, torch.cos(yaw), torch.sin(yaw)], dim=1)


def physical_errors(prediction: torch.Tensor, poses: torch.Tensor, mean: torch.Tensor,
                    std: torch.Tensor, target: AuxTarget = PORT_PICK_ALIGN_TARGET
                    ) -> dict[str, torch.Tensor]:
    """Per-frame errors of a head's (B, target.dim) ``prediction`` against (B, k) ``poses``:
    each object's position in the table plane (m) and yaw modulo 90 degrees (deg)."""
    prediction = prediction.float()
    poses = poses.to(prediction.device).float()
    n = len(target.positions)
    positions = prediction[:, :n] * std + mean
    true = poses[:, list(target.positions)]
    out = {}
    for name, (ix, iy), _ in target.objects:
        out[f'{name}_xy_m'] = torch.linalg.vector_norm(positions[:, [ix, iy]]
                                                       - true[:, [ix, iy]], dim=1)
    yaws = len(target.yaws)
    if yaws:
        angle = torch.atan2(prediction[:, n + yaws:n + 2 * yaws], prediction[:, n:n + yaws]) / 4
        diff = torch.remainder(angle - poses[:, list(target.yaws)] + torch.pi / 4,
                               torch.pi / 2) - torch.pi / 4
        for name, _, k in target.objects:
            if k is not None:
                out[f'{name}_yaw_deg'] = torch.rad2deg(diff[:, k].abs())
    return out


class ObjectPoseHead(nn.Module):
    """Per camera a 1x1 convolution (channels -> ``reduced``), then one MLP over all cameras.

    ``yaw_readout``: ``flatten``: the MLP predicts the yaws with the positions. Its input is
    the flattened grid, so what it learns about an object's orientation in one cell does
    not carry over to another: in pose pretraining the yaws stayed at chance for 48 000
    scenes while the positions came within minutes. ``attention``: the MLP predicts the
    positions; per cell, with weights shared by every cell of a camera, a small network
    gives each object a weight logit and a (cos 4 yaw, sin 4 yaw) vector, and each
    object's yaw is the softmax-weighted sum over every cell of every camera: read where
    the object is, the same way everywhere in the image.
    """

    def __init__(self, channels: int, grids: list[tuple[int, int]], *, reduced: int = 32,
                 hidden: int = 256, yaw_readout: str = 'flatten', cell_hidden: int = 64,
                 target: AuxTarget = PORT_PICK_ALIGN_TARGET) -> None:
        super().__init__()
        self.positions, self.yaws = len(target.positions), len(target.yaws)
        if yaw_readout not in YAW_READOUTS:
            raise ValueError(f"unknown yaw readout '{yaw_readout}', expected one of "
                             f'{YAW_READOUTS}')
        self.yaw_readout = yaw_readout
        self.reduce = nn.ModuleList(nn.Conv2d(channels, reduced, 1) for _ in grids)
        flat = sum(reduced * h * w for h, w in grids)
        outputs = target.dim if yaw_readout == 'flatten' else self.positions
        self.mlp = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, outputs))
        if yaw_readout == 'attention':
            self.cells = nn.ModuleList(
                nn.Sequential(nn.Conv2d(channels, cell_hidden, 1), nn.ReLU(),
                              nn.Conv2d(cell_hidden, 3 * self.yaws, 1)) for _ in grids)

    def forward(self, feature_maps: list[torch.Tensor]) -> torch.Tensor:
        flat = [conv(f.float()).flatten(1) for conv, f in zip(self.reduce, feature_maps)]
        out = self.mlp(torch.cat(flat, dim=1))
        if self.yaw_readout == 'flatten' or not self.yaws:
            return out
        k = self.yaws
        cells = torch.cat([net(f.float()).flatten(2) for net, f in zip(self.cells, feature_maps)],
                          dim=2)  # (B, 3k, every cell of every camera)
        weights = torch.softmax(cells[:, :k], dim=2)
        cos = (cells[:, k:2 * k] * weights).sum(2)
        sin = (cells[:, 2 * k:] * weights).sum(2)
        return torch.cat([out, cos, sin], dim=1)


class EncoderPoseHead(nn.Module):
    """On the transformer encoder's output (S, B, D): per token a linear map D ->
    ``reduced``, then one MLP over all tokens (their order is fixed: latent, joints, grid
    cells camera by camera)."""

    def __init__(self, tokens: int, dim: int, *, reduced: int = 32, hidden: int = 256,
                 target: AuxTarget = PORT_PICK_ALIGN_TARGET) -> None:
        super().__init__()
        self.tokens = tokens
        self.reduce = nn.Linear(dim, reduced)
        self.mlp = nn.Sequential(nn.Linear(tokens * reduced, hidden), nn.ReLU(),
                                 nn.Linear(hidden, target.dim))

    def forward(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        (out,) = outputs
        if out.shape[0] != self.tokens:
            raise ValueError(f'the encoder output has {out.shape[0]} tokens, the pose head was '
                             f'built for {self.tokens}')
        return self.mlp(self.reduce(out.float()).transpose(0, 1).flatten(1))


def _map_shape(backbone: nn.Module, shape: tuple[int, int, int],
               device: torch.device) -> torch.Size:
    """(1, C, h, w) of the backbone's feature map for one (C, H, W) image."""
    return backbone(torch.zeros(1, *shape, device=device))['feature_map'].shape


class ObjectPoseAuxiliary:
    """Captures what the head reads during a forward pass and scores the head.

    ``model``: LeRobot's ACT network (``policy.model``); ``image_shapes``: (C, H, W) of each
    camera it sees; ``poses``: (N, 8) training-frame poses (``OBJECT_POSE_NAMES`` order),
    used for the position statistics. ``source``: ``backbone`` reads every camera's feature
    map as it enters ACT's ``encoder_img_feat_input_proj`` (also while the backbone's first
    stages are replaced by cached outputs), ``encoder`` the transformer encoder's output.
    The head's parameters are trained with the policy's optimizer.
    """

    def __init__(self, model: nn.Module, image_shapes: list[tuple[int, int, int]],
                 poses: torch.Tensor, device: torch.device, *, source: str = 'backbone',
                 yaw_readout: str = 'flatten',
                 target: AuxTarget = PORT_PICK_ALIGN_TARGET) -> None:
        if source not in AUX_SOURCES:
            raise ValueError(f"unknown pose head source '{source}', expected one of "
                             f'{AUX_SOURCES}')
        self.source = source
        self.target = target
        with torch.no_grad():
            maps = [_map_shape(model.backbone, shape, device) for shape in image_shapes]
        grids = [tuple(m[-2:]) for m in maps]
        if source == 'backbone':
            self.head: nn.Module = ObjectPoseHead(int(maps[0][1]), grids,
                                                  yaw_readout=yaw_readout, target=target)
            self._handle = model.encoder_img_feat_input_proj.register_forward_pre_hook(
                self._pre_hook)
        else:
            # ACT's tokens: the 1-D ones (latent, joints, object poses where given), then
            # every camera's grid cells.
            tokens = model.encoder_1d_feature_pos_embed.num_embeddings + sum(
                h * w for h, w in grids)
            self.head = EncoderPoseHead(tokens, model.config.dim_model, target=target)
            self._handle = model.encoder.register_forward_hook(self._hook)
        self.head.to(device)
        positions = poses[:, list(target.positions)].double()
        self.mean = positions.mean(0).float().to(device)
        self.std = positions.std(0).clamp_min(1e-4).float().to(device)
        self._captured: list[torch.Tensor] | None = None

    @property
    def trains_with_frozen_backbone(self) -> bool:
        """Whether the loss still applies once the whole backbone is frozen and cached."""
        return self.source == 'encoder'

    def _hook(self, _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        if self._captured is not None:
            self._captured.append(output)

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

    @property
    def captured(self) -> bool:
        """Whether a forward pass ran inside the last :meth:`capture` and was not yet scored."""
        return bool(self._captured)

    def discard(self) -> None:
        """Forget what the last :meth:`capture` recorded (a pass that is not scored)."""
        self._captured = None

    def targets(self, poses: torch.Tensor) -> torch.Tensor:
        """(B, 8) poses -> (B, TARGET_DIM) standardized positions and yaw harmonics."""
        return pose_targets(poses, self.mean, self.std, self.target)

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
        return physical_errors(self.head(maps), poses, self.mean, self.std, self.target)

    def close(self) -> None:
        self._handle.remove()
