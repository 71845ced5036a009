"""The I/O contract between ROS topics and the policy (``config/contract.yaml``)."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
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


#: Keys of one gripper's settings under ``grippers:`` (all optional).
GRIPPER_KEYS = ('closed', 'open', 'units', 'ee_frame')


@dataclass(frozen=True)
class GripperSpec:
    """One gripper of the arm: its joint, where that joint is closed and fully open (in
    the joint's own units, as its ``joint_states`` and commands carry it), the units in
    words, and the robot model's frame of its tool centre point (forward kinematics).

    The release gate and the safety chain's gripper rule think in *openings*, 0 closed to
    1 open (:meth:`opening`, :meth:`position`), so a gripper in metres, degrees, 0-100 or
    one that closes toward its upper limit is served like a normalized one.
    """

    joint: str
    closed: float | None = None  # None: the joint's lower limit (set by the Contract)
    open: float | None = None  # None: its upper limit
    units: str = ''
    ee_frame: str = ''

    def __post_init__(self) -> None:
        if self.closed is None or self.open is None:
            return
        if not (math.isfinite(self.closed) and math.isfinite(self.open)) \
                or self.closed == self.open:
            raise ValueError(f"gripper '{self.joint}': closed ({self.closed}) and open "
                             f'({self.open}) must be finite and differ')

    def opening(self, position: float) -> float:
        """The opening (0 closed, 1 open) of a joint position in the gripper's units."""
        return (float(position) - self.closed) / (self.open - self.closed)

    def position(self, opening: float) -> float:
        """The joint position of an opening (0 closed, 1 open)."""
        return self.closed + float(opening) * (self.open - self.closed)


@dataclass(frozen=True)
class Contract:
    """Joint names, limits, camera and feature names shared by node, sim and trainer."""

    joint_names: tuple[str, ...]
    joint_lower: tuple[float, ...]
    joint_upper: tuple[float, ...]
    cameras: tuple[CameraSpec, ...]
    # The arm's data rate: what its recordings and the policy trained on them are timed
    # at, and act_node's control rate unless control_rate_hz is set. The chunk size is
    # not the arm's: it is the checkpoint's (config.json).
    fps: int
    # The arm's grippers (zero, one or several); a name alone is a gripper closed at its
    # lower limit and open at its upper one.
    grippers: tuple[GripperSpec | str, ...] = ()
    state_feature: str = 'observation.state'
    action_feature: str = 'action'
    task: str = ''
    # Robot model (URDF) of this arm for the features that need kinematics (the release
    # gate's end effector, the planned path); relative to the contract file. Empty: none.
    urdf: str = ''
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
        grippers = []
        for gripper in self.grippers:
            gripper = GripperSpec(gripper) if isinstance(gripper, str) else gripper
            if gripper.joint not in self.joint_names:
                raise ValueError(f"{self.source}: gripper '{gripper.joint}' is not in "
                                 f'joint_names {list(self.joint_names)}')
            i = self.joint_names.index(gripper.joint)
            lo, hi = self.joint_lower[i], self.joint_upper[i]
            gripper = replace(gripper, closed=lo if gripper.closed is None else gripper.closed,
                              open=hi if gripper.open is None else gripper.open)
            if not (lo <= gripper.closed <= hi and lo <= gripper.open <= hi):
                raise ValueError(f"{self.source}: gripper '{gripper.joint}': closed "
                                 f'{gripper.closed} and open {gripper.open} must lie within '
                                 f'its limits [{lo}, {hi}]')
            grippers.append(gripper)
        object.__setattr__(self, 'grippers', tuple(grippers))
        if len(set(self.gripper_joints)) != len(self.grippers):
            raise ValueError(f'{self.source}: grippers has duplicates: '
                             f'{list(self.gripper_joints)}')
        if not self.cameras:
            raise ValueError(f'{self.source}: no cameras defined')
        if self.fps < 1:
            raise ValueError(f'{self.source}: fps must be >= 1, got {self.fps}')

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    @property
    def gripper_joints(self) -> tuple[str, ...]:
        """The grippers' joint names (empty for an arm without one)."""
        return tuple(g.joint for g in self.grippers)

    @property
    def gripper_indices(self) -> tuple[int, ...]:
        """Where the grippers sit in ``observation.state`` and in every action."""
        return tuple(self.joint_names.index(g.joint) for g in self.grippers)

    @property
    def arm_joint_names(self) -> tuple[str, ...]:
        """The joints that are not grippers (those that place the end effectors)."""
        return tuple(n for n in self.joint_names if n not in self.gripper_joints)

    @property
    def urdf_path(self) -> Path | None:
        """The robot model named by ``urdf`` (relative to the contract file), or ``None``."""
        if not self.urdf:
            return None
        path = Path(self.urdf)
        if not path.is_absolute() and Path(self.source).is_file():
            path = Path(self.source).parent / path
        return path

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
        required = ('joint_names', 'joint_lower', 'joint_upper', 'cameras', 'fps')
        missing = [k for k in required if k not in body]
        if 'grippers' not in body and 'gripper_joint' not in body:
            missing.append('grippers')
        if missing:
            raise ValueError(f'{source}: missing keys {missing} under "contract" (grippers: '
                             'a list of gripper joints, [] for an arm without one)')
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
            cameras=cameras,
            grippers=_grippers(body, source),
            state_feature=str(body.get('state_feature', 'observation.state')),
            action_feature=str(body.get('action_feature', 'action')),
            fps=int(body['fps']),
            task=str(body.get('task', '')),
            urdf=str(body.get('urdf', '') or ''),
            source=source,
        )


def _grippers(body: dict[str, Any], source: str) -> tuple[GripperSpec | str, ...]:
    """``grippers:`` as a list of joint names or a mapping joint -> settings
    (:data:`GRIPPER_KEYS`); the older ``gripper_joint: NAME`` is a list of one."""
    if 'grippers' in body and 'gripper_joint' in body:
        raise ValueError(f'{source}: give grippers or gripper_joint (one gripper), not both')
    if 'gripper_joint' in body:
        return (str(body['gripper_joint']),)
    value = body['grippers']
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        if not all(isinstance(name, str) for name in value):
            raise ValueError(f'{source}: grippers as a list holds joint names, got {value}')
        return tuple(value)
    if not isinstance(value, dict):
        raise ValueError(f'{source}: grippers must be a list of joint names or a mapping '
                         f'joint -> {{{", ".join(GRIPPER_KEYS)}}}, got {type(value).__name__}')
    grippers: list[GripperSpec | str] = []
    for joint, spec in value.items():
        spec = spec or {}
        unknown = sorted(set(spec) - set(GRIPPER_KEYS)) if isinstance(spec, dict) else spec
        if unknown:
            raise ValueError(f"{source}: gripper '{joint}': unknown settings {unknown} "
                             f'(expected {list(GRIPPER_KEYS)})')
        closed, opened = spec.get('closed'), spec.get('open')
        grippers.append(GripperSpec(
            str(joint), None if closed is None else float(closed),
            None if opened is None else float(opened), units=str(spec.get('units', '')),
            ee_frame=str(spec.get('ee_frame', '') or '')))
    return tuple(grippers)


def load_contract(path: str | Path | None = None) -> Contract:
    """Load a contract file; ``None`` loads the package's ``config/contract.yaml``. A
    relative path that is not a file here is looked up under the package's ``config/``
    (``robots/so101/contract.yaml``: an example arm's, wherever the package is installed)."""
    path = Path(path) if path else config_path('contract.yaml')
    if not path.is_absolute() and not path.is_file() and config_path(str(path)).is_file():
        path = config_path(str(path))
    return Contract.from_dict(load_yaml_mapping(path, 'contract'), source=str(path))
