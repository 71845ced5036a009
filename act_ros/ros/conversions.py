"""Conversions between ROS messages and the arrays the policy runtime uses.

Pure functions over message objects (no node, no middleware), so they are tested without a
ROS graph. Decoding (message -> array) lives in :mod:`act_ros.core.control.decode`, which needs no
ROS install, and is re-exported here; building messages needs the message classes. Every
rejection raises :class:`MalformedMessageError` with a one-line message that names the
offending field and says what was expected and what was found.

Images come out as ``(H, W, 3)`` ``uint8`` RGB, whatever the wire encoding (OpenCV
decodes to BGR; that is converted here, never further down). Joint states are matched by
name, in any order, with extra joints ignored. Commands go out in contract order.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from builtin_interfaces.msg import Duration, Time
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from act_ros.core.control.decode import (
    IMAGE_ENCODINGS,
    MalformedMessageError,
    check_frame,
    compressed_to_rgb,
    image_to_rgb,
    in_frame,
    joint_efforts,
    joint_positions,
    multiarray_positions,
    pose_components,
    pose_position,
    trajectory_positions,
)

__all__ = ['IMAGE_ENCODINGS', 'MalformedMessageError', 'check_frame', 'compressed_to_rgb',
           'image_to_rgb', 'in_frame', 'joint_efforts', 'joint_positions', 'multiarray_positions',
           'pose_components', 'pose_position',
           'rgb_to_compressed', 'rgb_to_image', 'seconds_to_duration', 'to_float64_multiarray',
           'to_joint_trajectory', 'trajectory_positions']


def rgb_to_image(rgb: np.ndarray, encoding: str = 'rgb8', *, row_padding: int = 0,
                 stamp: Time | None = None, frame_id: str = '') -> Image:
    """Build a ``sensor_msgs/Image`` from an ``(H, W, 3)`` uint8 RGB array.

    The inverse of :func:`image_to_rgb`, used by simulators, benchmarks and tests.
    ``row_padding`` appends that many bytes to every row (``step`` grows accordingly).
    """
    rgb = _check_rgb(rgb)
    if encoding not in IMAGE_ENCODINGS:
        raise ValueError(f"encoding must be one of {sorted(IMAGE_ENCODINGS)}, got '{encoding}'")
    channels, is_bgr = IMAGE_ENCODINGS[encoding]
    if channels == 1:
        pixels = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)[:, :, None]
    else:
        pixels = rgb[:, :, ::-1] if is_bgr else rgb
        if channels == 4:
            alpha = np.full(rgb.shape[:2] + (1,), 255, dtype=np.uint8)
            pixels = np.concatenate([pixels, alpha], axis=2)
    height, width = rgb.shape[:2]
    rows = np.ascontiguousarray(pixels).reshape(height, width * channels)
    if row_padding:
        rows = np.concatenate([rows, np.zeros((height, row_padding), dtype=np.uint8)], axis=1)
    msg = Image(height=height, width=width, encoding=encoding, is_bigendian=0,
                step=width * channels + row_padding)
    msg.data = rows.tobytes()
    if stamp is not None:
        msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    return msg


def rgb_to_compressed(rgb: np.ndarray, fmt: str = 'jpeg', *, quality: int = 90,
                      stamp: Time | None = None, frame_id: str = '') -> CompressedImage:
    """Encode an ``(H, W, 3)`` uint8 RGB array as a ``sensor_msgs/CompressedImage``."""
    rgb = _check_rgb(rgb)
    ext = {'jpeg': '.jpg', 'jpg': '.jpg', 'png': '.png'}.get(fmt.lower())
    if ext is None:
        raise ValueError(f"format must be 'jpeg' or 'png', got '{fmt}'")
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)] if ext == '.jpg' else []
    ok, buf = cv2.imencode(ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params)
    if not ok:
        raise ValueError(f'OpenCV could not encode a {rgb.shape} image as {fmt}')
    msg = CompressedImage(format='jpeg' if ext == '.jpg' else 'png')
    msg.data = buf.tobytes()
    if stamp is not None:
        msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    return msg


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f'expected an (H, W, 3) uint8 RGB array, got {rgb.shape} {rgb.dtype}')
    return np.ascontiguousarray(rgb)


def _finite_command(command: np.ndarray, num_joints: int) -> list[float]:
    values = np.asarray(command, dtype=np.float64).reshape(-1)
    if values.size != num_joints:
        raise ValueError(f'command has {values.size} values, expected {num_joints}')
    if not np.all(np.isfinite(values)):
        raise ValueError(f'refusing to send a non-finite command: {values.tolist()}')
    return [float(v) for v in values]


def seconds_to_duration(seconds: float) -> Duration:
    """Return a ``builtin_interfaces/Duration`` for a non-negative number of seconds."""
    nanoseconds = round(seconds * 1e9)
    return Duration(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def seconds_to_time(seconds: float) -> Time:
    """Return a ``builtin_interfaces/Time`` for a non-negative clock reading in seconds."""
    nanoseconds = round(seconds * 1e9)
    return Time(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def to_joint_trajectory(command: np.ndarray, joint_names: Sequence[str],
                        time_from_start_s: float) -> JointTrajectory:
    """One-point ``JointTrajectory`` (joint_trajectory_controller) reaching ``command``.

    The header stamp is left at zero, which the controller reads as "start now";
    ``time_from_start`` is one control period so consecutive points chain smoothly.
    """
    msg = JointTrajectory(joint_names=list(joint_names))
    point = JointTrajectoryPoint(time_from_start=seconds_to_duration(time_from_start_s))
    point.positions = _finite_command(command, len(joint_names))
    msg.points = [point]
    return msg


def to_joint_trajectory_plan(points: np.ndarray, velocities: np.ndarray,
                             joint_names: Sequence[str], period_s: float,
                             stamp_s: float) -> JointTrajectory:
    """Multi-point ``JointTrajectory``: point ``k`` (positions, velocities) reached at
    ``(k + 1) * period_s`` after ``header.stamp = stamp_s``, the time the plan starts (point
    0 is the tick's command, timed as :func:`to_joint_trajectory` times it). The controller
    interpolates between the points at its own rate."""
    points = np.asarray(points, dtype=np.float64)
    velocities = np.asarray(velocities, dtype=np.float64)
    if points.ndim != 2 or points.shape != velocities.shape or points.shape[0] < 1:
        raise ValueError(f'points and velocities must both be (K >= 1, {len(joint_names)}), '
                         f'got {points.shape} and {velocities.shape}')
    msg = JointTrajectory(joint_names=list(joint_names))
    msg.header.stamp = seconds_to_time(stamp_s)
    msg.points = [JointTrajectoryPoint(
        positions=_finite_command(position, len(joint_names)),
        velocities=_finite_command(velocity, len(joint_names)),
        time_from_start=seconds_to_duration((k + 1) * period_s))
        for k, (position, velocity) in enumerate(zip(points, velocities))]
    return msg


def empty_joint_trajectory(joint_names: Sequence[str]) -> JointTrajectory:
    """A ``JointTrajectory`` without points: joint_trajectory_controller drops the
    trajectory it was following and holds where the arm is."""
    return JointTrajectory(joint_names=list(joint_names))


def to_float64_multiarray(command: np.ndarray, num_joints: int) -> Float64MultiArray:
    """``Float64MultiArray`` of joint positions in contract order (forward_position_controller)."""
    msg = Float64MultiArray()
    msg.data = _finite_command(command, num_joints)
    return msg
