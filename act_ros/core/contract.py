"""The I/O contract between ROS topics and the policy (``config/contract.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
from pathlib import Path
import re
from typing import Any

import numpy as np

from act_ros.core.paths import config_path, load_yaml_mapping

logger = logging.getLogger(__name__)


_IMAGE_SIZE_RE = re.compile(r'^\s*(\d+)\s*[xX]\s*(\d+)\s*$')


def parse_image_size(text: str) -> tuple[int, int]:
    """Parse ``'HxW'`` (e.g. ``'480x640'``) into ``(height, width)``, both positive."""
    match = _IMAGE_SIZE_RE.match(text)
    if match is None:
        raise ValueError(f"image size must look like HEIGHTxWIDTH (e.g. 480x640), got '{text}'")
    height, width = int(match.group(1)), int(match.group(2))
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got '{text}'")
    return height, width


@dataclass(frozen=True)
class CameraSpec:
    """One camera stream: its ROS-side name, policy feature key and nominal image size."""

    name: str
    feature: str
    height: int
    width: int

    def __post_init__(self) -> None:
        if not self.feature.startswith('observation.images.'):
            raise ValueError(f"camera '{self.name}': feature must start with "
                             f"'observation.images.', got '{self.feature}'")
        if self.height <= 0 or self.width <= 0:
            raise ValueError(f"camera '{self.name}': size must be positive, "
                             f'got {self.height}x{self.width}')


@dataclass(frozen=True)
class Contract:
    """Joint names, limits, camera and feature names shared by node, sim and trainer."""

    joint_names: tuple[str, ...]
    joint_lower: tuple[float, ...]
    joint_upper: tuple[float, ...]
    gripper_joint: str
    cameras: tuple[CameraSpec, ...]
    # The arm's data rate: what its recordings and the policy trained on them are timed
    # at, and act_node's control rate unless control_rate_hz is set. The chunk size is
    # not the arm's: it is the checkpoint's (config.json).
    fps: int
    state_feature: str = 'observation.state'
    action_feature: str = 'action'
    task: str = ''
    source: str = field(default='<memory>', compare=False)

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        if n == 0:
            raise ValueError(f'{self.source}: joint_names is empty')
        if len(set(self.joint_names)) != n:
            raise ValueError(f'{self.source}: joint_names has duplicates: {self.joint_names}')
        for key in ('joint_lower', 'joint_upper'):
            if len(getattr(self, key)) != n:
                raise ValueError(f'{self.source}: {key} has {len(getattr(self, key))} values, '
                                 f'expected {n} (one per joint in joint_names)')
        for name, lo, hi in zip(self.joint_names, self.joint_lower, self.joint_upper):
            if not lo < hi:
                raise ValueError(f"{self.source}: joint '{name}': lower limit {lo} is not "
                                 f'below upper limit {hi}')
        if self.gripper_joint not in self.joint_names:
            raise ValueError(f"{self.source}: gripper_joint '{self.gripper_joint}' is not in "
                             f'joint_names {list(self.joint_names)}')
        if not self.cameras:
            raise ValueError(f'{self.source}: no cameras defined')
        if self.fps < 1:
            raise ValueError(f'{self.source}: fps must be >= 1, got {self.fps}')

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    @property
    def gripper_index(self) -> int:
        return self.joint_names.index(self.gripper_joint)

    @property
    def lower(self) -> np.ndarray:
        return np.asarray(self.joint_lower, dtype=np.float64)

    @property
    def upper(self) -> np.ndarray:
        return np.asarray(self.joint_upper, dtype=np.float64)

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cameras)

    def camera(self, name: str) -> CameraSpec:
        for cam in self.cameras:
            if cam.name == name:
                return cam
        raise KeyError(f"no camera '{name}' in the contract (have {list(self.camera_names)})")

    @property
    def image_features(self) -> tuple[str, ...]:
        return tuple(c.feature for c in self.cameras)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = '<memory>') -> Contract:
        body = data.get('contract', data)
        required = ('joint_names', 'joint_lower', 'joint_upper', 'gripper_joint', 'cameras',
                    'fps')
        missing = [k for k in required if k not in body]
        if missing:
            raise ValueError(f'{source}: missing keys {missing} under "contract"')
        if 'chunk_size' in body:
            logger.warning('%s: chunk_size is ignored: the chunk size is the checkpoint\'s '
                           '(its config.json), and a training run\'s is its chunk_size setting '
                           '(act-ros train --chunk-size)', source)
        cams = body['cameras']
        if not isinstance(cams, dict):
            raise ValueError(f'{source}: "cameras" must be a mapping name -> '
                             f'{{feature, height, width}}, got {type(cams).__name__}')
        cameras = tuple(
            CameraSpec(name=name, feature=str(spec['feature']), height=int(spec['height']),
                       width=int(spec['width']))
            for name, spec in cams.items())
        return cls(
            joint_names=tuple(str(n) for n in body['joint_names']),
            joint_lower=tuple(float(v) for v in body['joint_lower']),
            joint_upper=tuple(float(v) for v in body['joint_upper']),
            gripper_joint=str(body['gripper_joint']),
            cameras=cameras,
            state_feature=str(body.get('state_feature', 'observation.state')),
            action_feature=str(body.get('action_feature', 'action')),
            fps=int(body['fps']),
            task=str(body.get('task', '')),
            source=source,
        )


def load_contract(path: str | Path | None = None) -> Contract:
    """Load a contract file; ``None`` loads the package's ``config/contract.yaml``."""
    path = Path(path) if path else config_path('contract.yaml')
    return Contract.from_dict(load_yaml_mapping(path, 'contract'), source=str(path))
