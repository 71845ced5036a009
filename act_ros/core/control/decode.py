"""Decoding of ROS message contents into the arrays the policy uses, without ROS.

Functions over any object with the message's fields: rclpy messages in the nodes, and the
message objects ``rosbags`` deserializes from rosbag2 files (``act-ros import-bag``,
which needs no ROS install). Every rejection raises :class:`MalformedMessageError` with
a one-line message that names the offending field and says what was expected and what
was found.

Images come out as ``(H, W, 3)`` ``uint8`` RGB, whatever the wire encoding (OpenCV
decodes to BGR; that is converted here, never further down). Joint states are matched by
name, in any order, with extra joints ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np

from act_ros.core.errors import ObservationError

#: Raw encodings accepted on ``sensor_msgs/Image``: channels and whether the order is BGR.
IMAGE_ENCODINGS: dict[str, tuple[int, bool]] = {
    'rgb8': (3, False),
    'bgr8': (3, True),
    'rgba8': (4, False),
    'bgra8': (4, True),
    'mono8': (1, False),
}


class MalformedMessageError(ObservationError):
    """A message cannot be turned into an observation (bad encoding, size, names or values)."""


def image_to_rgb(msg: Any) -> np.ndarray:
    """Return a ``sensor_msgs/Image`` as an ``(H, W, 3)`` uint8 RGB array (a copy).

    Rows may be padded (``step`` larger than ``width * channels``); the padding is dropped.
    """
    encoding = msg.encoding.lower()
    if encoding not in IMAGE_ENCODINGS:
        raise MalformedMessageError(
            f"image encoding '{msg.encoding}' is not supported "
            f'(expected one of {sorted(IMAGE_ENCODINGS)})')
    channels, is_bgr = IMAGE_ENCODINGS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise MalformedMessageError(f'image size must be positive, got {height}x{width}')
    row_bytes = width * channels
    if step < row_bytes:
        raise MalformedMessageError(
            f'image step {step} is smaller than width*channels = {row_bytes} ({encoding})')
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size != height * step:
        raise MalformedMessageError(
            f'image data has {data.size} bytes, expected height*step = {height}*{step} = '
            f'{height * step} ({width}x{height} {encoding})')
    pixels = data.reshape(height, step)[:, :row_bytes].reshape(height, width, channels)
    if channels == 1:
        return np.ascontiguousarray(np.repeat(pixels, 3, axis=2))
    if is_bgr:
        return np.ascontiguousarray(pixels[:, :, 2::-1])
    return np.ascontiguousarray(pixels[:, :, :3])


def compressed_to_rgb(msg: Any) -> np.ndarray:
    """Decode a ``sensor_msgs/CompressedImage`` (JPEG, PNG, ...) to ``(H, W, 3)`` uint8 RGB."""
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size == 0:
        raise MalformedMessageError(f"compressed image (format '{msg.format}') has no data")
    bgr = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if bgr is None:
        raise MalformedMessageError(
            f"compressed image could not be decoded (format '{msg.format}', {data.size} bytes)")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def joint_positions(msg: Any, joint_names: Sequence[str]) -> np.ndarray:
    """Return the positions of ``joint_names`` (in that order) from a ``JointState``.

    Joints are matched by name; the message may list them in any order and carry extra
    joints. A missing joint, a position array shorter than the name array, duplicate
    names or a non-finite position of a required joint are rejected.
    """
    return named_positions(msg.name, msg.position, joint_names, 'joint state')


def joint_efforts(msg: Any, joint_names: Sequence[str]) -> np.ndarray | None:
    """The efforts of ``joint_names`` (in that order) from a ``JointState``, NaN for a
    joint without a finite one; ``None`` when the message carries no effort per name (an
    empty ``effort`` array is allowed: the release gate then has no effort evidence)."""
    names = list(msg.name)
    efforts = np.asarray(msg.effort, dtype=np.float64).reshape(-1)
    if efforts.size != len(names) or not names:
        return None
    index = {name: i for i, name in enumerate(names)}
    return np.array([efforts[index[name]] if name in index and np.isfinite(efforts[index[name]])
                     else np.nan for name in joint_names])


def check_frame(msg: Any, expected: str, topic: str) -> None:
    """Reject a stamped message (a ``PoseStamped``) whose ``header.frame_id`` is not
    ``expected``: poses are used as they are, never transformed, so a pose in a camera or
    map frame must not pass for one in the robot base frame. ``topic`` names it in the line."""
    frame = msg.header.frame_id
    if frame != expected:
        raise MalformedMessageError(
            f"pose on {topic} is in frame '{frame}', expected '{expected}' (poses are not "
            'transformed: publish them in that frame, or set pose_frame_id)')


def in_frame(convert: Callable[[Any], Any], expected: str, topic: str) -> Callable[[Any], Any]:
    """``convert`` for messages of ``topic`` that must be in frame ``expected``
    (:func:`check_frame` first)."""
    def checked(msg: Any) -> Any:
        check_frame(msg, expected, topic)
        return convert(msg)
    return checked


def pose_position(msg: Any) -> np.ndarray:
    """Return the ``(3,)`` position of a ``PoseStamped``; non-finite values are rejected."""
    p = msg.pose.position
    position = np.array([p.x, p.y, p.z], dtype=np.float64)
    if not np.all(np.isfinite(position)):
        raise MalformedMessageError(
            f"pose (frame '{msg.header.frame_id}') position is not finite: {position.tolist()}")
    return position


def pose_components(msg: Any) -> np.ndarray:
    """Return a ``PoseStamped`` as ``(7,)``: position x, y, z, then the orientation as a
    quaternion w, x, y, z (normalized). Non-finite values and a zero quaternion are
    rejected."""
    p, q = msg.pose.position, msg.pose.orientation
    position = np.array([p.x, p.y, p.z], dtype=np.float64)
    quaternion = np.array([q.w, q.x, q.y, q.z], dtype=np.float64)
    frame = msg.header.frame_id
    if not np.all(np.isfinite(position)):
        raise MalformedMessageError(
            f"pose (frame '{frame}') position is not finite: {position.tolist()}")
    norm = float(np.linalg.norm(quaternion)) if np.all(np.isfinite(quaternion)) else float('nan')
    if not (np.isfinite(norm) and norm > 1e-6):
        raise MalformedMessageError(
            f"pose (frame '{frame}') orientation is not a rotation: quaternion (w, x, y, z) "
            f'{quaternion.tolist()} (expected finite and non-zero)')
    return np.concatenate([position, quaternion / norm])


def named_positions(names: Sequence[str], values: Any, joint_names: Sequence[str],
                    what: str) -> np.ndarray:
    """Values of ``joint_names`` (in that order) from parallel ``names``/``values`` lists."""
    names = list(names)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size != len(names):
        raise MalformedMessageError(f'{what} has {len(names)} names but {values.size} positions')
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in index:
            raise MalformedMessageError(f"{what} lists joint '{name}' twice")
        index[name] = i
    missing = [name for name in joint_names if name not in index]
    if missing:
        raise MalformedMessageError(f'{what} is missing joint(s) {missing} (has {names})')
    out = values[[index[name] for name in joint_names]]
    bad = [name for name, value in zip(joint_names, out) if not np.isfinite(value)]
    if bad:
        raise MalformedMessageError(f'{what} position is not finite (NaN/inf) for joint(s) {bad}')
    return out


def trajectory_positions(msg: Any, joint_names: Sequence[str]) -> np.ndarray:
    """Positions of the first point of a ``trajectory_msgs/JointTrajectory``, by joint name
    (what a joint_trajectory_controller is commanded to reach next)."""
    if not len(msg.points):
        raise MalformedMessageError('joint trajectory has no points')
    return named_positions(msg.joint_names, msg.points[0].positions, joint_names,
                           'joint trajectory')


def multiarray_positions(msg: Any, num_joints: int) -> np.ndarray:
    """A ``std_msgs/Float64MultiArray`` command (forward_position_controller) in contract
    order: exactly ``num_joints`` finite values."""
    values = np.asarray(msg.data, dtype=np.float64).reshape(-1)
    if values.size != num_joints:
        raise MalformedMessageError(f'command array has {values.size} values, expected '
                                    f'{num_joints} (contract order)')
    if not np.all(np.isfinite(values)):
        raise MalformedMessageError(f'command array is not finite: {values.tolist()}')
    return values
