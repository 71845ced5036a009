"""Forward kinematics of the robot model (URDF) for the release gate and the plan's view.

The node needs the end-effector position from the measured joints to decide whether the
gripper is near the pad (:mod:`act_ros.core.control.release_gate`), and the end-effector poses of
the chunk it plays to show where the policy is taking the gripper
(:mod:`act_ros.ros.node.visualization`). This module wraps pinocchio; it never imports
rclpy or mujoco.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from act_ros.core.paths import share_dir

if TYPE_CHECKING:
    from act_ros.core.contract import Contract

DEFAULT_URDF_NAME = 'so101_class.urdf'


def default_urdf_path() -> Path:
    """The package's robot model: ``<share>/urdf/so101_class.urdf``."""
    return share_dir() / 'urdf' / DEFAULT_URDF_NAME


def gripper_kinematics(contract: Contract, *, urdf_path: str | Path | None = None,
                       ee_frame: str = '') -> tuple[list[ForwardKinematics], str]:
    """Forward kinematics of the end effectors of the arm that ``contract`` describes: one
    :class:`ForwardKinematics` per gripper (its ``ee_frame``), of the arm's joints without
    the grippers, from ``urdf_path`` or else the contract's own ``urdf``.

    ``ee_frame`` names the one end effector instead (an arm with one gripper, or none).
    Returns ``([], why)`` when no model serves this arm: none named, pinocchio missing, a
    joint or a frame the model lacks. The features that need it (the release gate's end
    effector, the planned path) then turn themselves off with ``why``: the package's own
    model is never used for an arm whose contract does not name it.
    """
    if ee_frame and len(contract.grippers) > 1:
        raise ValueError(f'ee_frame names one end effector; the contract has '
                         f'{len(contract.grippers)} grippers {list(contract.gripper_joints)} '
                         '(give each its ee_frame in the contract)')
    path = urdf_path or contract.urdf_path
    if not path:
        return [], (f'no robot model: the contract ({contract.source}) names no urdf and '
                    'urdf_path is not set')
    if ee_frame:
        frames = [ee_frame]
    elif not contract.grippers:
        return [], 'no end effector: the contract has no gripper and ee_frame is not set'
    else:
        missing = [g.joint for g in contract.grippers if not g.ee_frame]
        if missing:
            return [], (f'no end-effector frame for grippers {missing} (their ee_frame in '
                        f'the contract {contract.source}, or the ee_frame parameter)')
        frames = [g.ee_frame for g in contract.grippers]
    try:
        return [ForwardKinematics(path, frame, contract.arm_joint_names) for frame in frames], ''
    except (ImportError, OSError, ValueError) as exc:
        return [], str(exc)


def _default_arm_joints() -> tuple[str, ...]:
    """Contract joints without the grippers (the TCP does not move with the fingers)."""
    from act_ros.core.contract import load_contract

    return load_contract().arm_joint_names


class ForwardKinematics:
    """Position of an end-effector frame of a URDF model for joint positions given by name.

    ``joint_names`` lists, in order, the joints that :meth:`ee_position` receives (default:
    the contract's joints without the gripper). :meth:`ee_position` also accepts one extra
    trailing value, the contract's gripper entry, which is ignored: the tool centre point
    lies between the fingers and does not move with them. Joints of the model that are not
    listed stay at their neutral position.
    """

    def __init__(self, urdf_path: str | Path | None = None, ee_frame: str = 'ee_link',
                 joint_names: Sequence[str] | None = None) -> None:
        try:
            import pinocchio
        except ImportError as exc:
            raise ImportError('forward kinematics needs pinocchio: pip install pin') from exc
        self._pin = pinocchio
        path = Path(urdf_path) if urdf_path is not None else default_urdf_path()
        if not path.is_file():
            raise FileNotFoundError(f'robot model (URDF) not found: {path}')
        self.urdf_path = path
        self.model = pinocchio.buildModelFromUrdf(str(path))
        self.data = self.model.createData()
        if not self.model.existFrame(ee_frame):
            frames = sorted({f.name for f in self.model.frames})
            raise ValueError(f"{path}: no frame '{ee_frame}' (expected the end-effector "
                             f'frame; the model has {frames})')
        self.ee_frame = ee_frame
        self._frame_id = self.model.getFrameId(ee_frame)
        self.joint_names = tuple(joint_names) if joint_names is not None else _default_arm_joints()
        if not self.joint_names:
            raise ValueError('joint_names is empty')
        model_joints = list(self.model.names)[1:]  # index 0 is 'universe'
        missing = [n for n in self.joint_names if n not in model_joints]
        if missing:
            raise ValueError(f'{path}: joints {missing} not in the model (it has {model_joints})')
        self._q_index = np.array(
            [self.model.joints[self.model.getJointId(n)].idx_q for n in self.joint_names])
        for name in self.joint_names:
            if self.model.joints[self.model.getJointId(name)].nq != 1:
                raise ValueError(f"{path}: joint '{name}' has "
                                 f'{self.model.joints[self.model.getJointId(name)].nq} position '
                                 'coordinates, expected 1 (revolute or prismatic)')
        self._q = pinocchio.neutral(self.model)

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    def ee_position(self, q: np.ndarray) -> np.ndarray:
        """World (base) position of the end-effector frame, shape ``(3,)``, in metres."""
        return np.array(self._placement(q).translation, dtype=np.float64)

    def ee_pose(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World (base) position ``(3,)`` and orientation of the end-effector frame, the
        latter as a unit quaternion ``(w, x, y, z)`` (the order of the package's poses)."""
        placement = self._placement(q)
        x, y, z, w = self._pin.Quaternion(placement.rotation).coeffs()
        return (np.array(placement.translation, dtype=np.float64),
                np.array([w, x, y, z], dtype=np.float64))

    def _placement(self, q: np.ndarray):
        q = np.asarray(q, dtype=np.float64).reshape(-1)
        n = self.num_joints
        if q.size not in (n, n + 1):
            raise ValueError(f'expected {n} joint positions ({list(self.joint_names)}), '
                             f'optionally followed by the gripper, got {q.size}')
        if not np.all(np.isfinite(q[:n])):
            raise ValueError(f'joint positions must be finite, got {q[:n]}')
        self._q[self._q_index] = q[:n]
        self._pin.forwardKinematics(self.model, self.data, self._q)
        return self._pin.updateFramePlacement(self.model, self.data, self._frame_id)
