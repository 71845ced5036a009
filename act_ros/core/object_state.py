"""Object poses as a policy input: LeRobot's ``observation.environment_state``.

A checkpoint that declares ``observation.environment_state`` takes the poses of the task's
objects (the box to pick and the pad to place it on) beside the cameras and the joints.
On a real arm they come from fiducial markers or motion capture, in simulation from the
simulator; either way as one pose per object, position in metres in the robot's base
frame and an orientation.

The feature is a fixed vector, :data:`ENVIRONMENT_STATE_NAMES`: per object its position
and its yaw as ``cos(4 yaw), sin(4 yaw)``. The task looks the same every 90 degrees (a cube
on any face, a square pad), so the yaw is encoded modulo 90 degrees without a jump: a
policy never sees 44.9 and -45 degrees as far apart. The trainer normalizes the vector
with the dataset's statistics like the joint state.

Pure numpy: the node, the simulation and the dataset writers all use these functions, so
the policy sees the same numbers everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ENVIRONMENT_STATE_FEATURE = 'observation.environment_state'
OBJECTS = ('box', 'pad')
# Per object: position (m, base frame) and the 4-fold yaw harmonics.
_PER_OBJECT = ('x', 'y', 'z', 'yaw_cos4', 'yaw_sin4')
ENVIRONMENT_STATE_NAMES = tuple(f'{obj}_{name}' for obj in OBJECTS for name in _PER_OBJECT)
ENVIRONMENT_STATE_DIM = len(ENVIRONMENT_STATE_NAMES)
SYMMETRY_FOLD = 4  # a cube and a square pad look the same every 360 / 4 degrees


def quaternion_to_matrix(quaternion_wxyz: Sequence[float]) -> np.ndarray:
    """Rotation matrix (3, 3) of a unit quaternion given as ``(w, x, y, z)``.

    The quaternion is normalized first; a zero or non-finite one is an error.
    """
    q = np.asarray(quaternion_wxyz, dtype=np.float64).reshape(-1)
    if q.shape != (4,):
        raise ValueError(f'a quaternion has 4 values (w, x, y, z), got {q.size}')
    norm = float(np.linalg.norm(q))
    if not math.isfinite(norm) or norm < 1e-9:
        raise ValueError(f'quaternion must be finite and non-zero, got {q.tolist()}')
    w, x, y, z = q / norm
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def up_axis(rotation: np.ndarray) -> int:
    """Index of the body axis (0 x, 1 y, 2 z) closest to the world's vertical: the axis
    normal to the face a cube rests on."""
    rotation = np.asarray(rotation, dtype=np.float64).reshape(3, 3)
    return int(np.argmax(np.abs(rotation[2, :])))


def tilt_deg(rotation: np.ndarray) -> float:
    """Angle between the body axis nearest the vertical and the vertical, in degrees
    (0 for a cube resting flat on any face)."""
    rotation = np.asarray(rotation, dtype=np.float64).reshape(3, 3)
    cos = min(1.0, float(np.max(np.abs(rotation[2, :]))))
    return math.degrees(math.acos(cos))


def symmetric_yaw(rotation: np.ndarray) -> float:
    """Yaw (rad, in ``[-pi, pi)``) of an object with a square footprint, on any face.

    The yaw of the first body axis that is not the up axis (:func:`up_axis`), projected on
    the table plane. The other horizontal axis lies 90 degrees away, so the result is
    well defined modulo 90 degrees whichever face is down, which is all the task needs.
    """
    rotation = np.asarray(rotation, dtype=np.float64).reshape(3, 3)
    up = up_axis(rotation)
    axis = rotation[:, 0 if up != 0 else 1]
    yaw = math.atan2(axis[1], axis[0])
    return (yaw + math.pi) % (2 * math.pi) - math.pi


def object_features(position: Sequence[float], yaw_rad: float) -> np.ndarray:
    """One object's part of the feature: ``x, y, z, cos(4 yaw), sin(4 yaw)``."""
    p = np.asarray(position, dtype=np.float64).reshape(-1)
    if p.shape != (3,):
        raise ValueError(f'an object position has 3 values (x, y, z in metres), got {p.size}')
    angle = SYMMETRY_FOLD * float(yaw_rad)
    return np.array([p[0], p[1], p[2], math.cos(angle), math.sin(angle)])


def environment_state(box_position: Sequence[float], box_yaw_rad: float,
                      pad_position: Sequence[float], pad_yaw_rad: float) -> np.ndarray:
    """The ``observation.environment_state`` vector (float32, :data:`ENVIRONMENT_STATE_NAMES`).

    Raises ``ValueError`` on a non-finite input, so a bad pose never reaches a policy.
    """
    value = np.concatenate([object_features(box_position, box_yaw_rad),
                            object_features(pad_position, pad_yaw_rad)])
    if not np.all(np.isfinite(value)):
        raise ValueError(f'object poses must be finite, got {value.tolist()}')
    return value.astype(np.float32)


def environment_state_from_poses(box_position: Sequence[float], box_quaternion_wxyz: Sequence[float],
                                 pad_position: Sequence[float],
                                 pad_quaternion_wxyz: Sequence[float]) -> np.ndarray:
    """:func:`environment_state` from positions and ``(w, x, y, z)`` quaternions (the form
    a ``geometry_msgs/Pose`` carries)."""
    return environment_state(box_position, symmetric_yaw(quaternion_to_matrix(box_quaternion_wxyz)),
                             pad_position, symmetric_yaw(quaternion_to_matrix(pad_quaternion_wxyz)))
