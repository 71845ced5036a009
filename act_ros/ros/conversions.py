"""Conversions between ROS messages and the arrays the policy runtime uses.

Pure functions over message objects (no node, no middleware), so they are tested without a
ROS graph. Every rejection raises :class:`MalformedMessageError` with a one-line message
that names the offending field and says what was expected and what was found.

Images come out as ``(H, W, 3)`` ``uint8`` RGB, whatever the wire encoding (OpenCV
decodes to BGR; that is converted here, never further down). Joint states are matched by
name, in any order, with extra joints ignored. Commands go out in contract order.
"""

from __future__ import annotations

from collections.abc import Sequence

from builtin_interfaces.msg import Duration, Time
import cv2
from geometry_msgs.msg import PoseStamped
import numpy as np
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

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


def image_to_rgb(msg: Image) -> np.ndarray:
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


def compressed_to_rgb(msg: CompressedImage) -> np.ndarray:
    """Decode a ``sensor_msgs/CompressedImage`` (JPEG, PNG, ...) to ``(H, W, 3)`` uint8 RGB."""
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size == 0:
        raise MalformedMessageError(f"compressed image (format '{msg.format}') has no data")
    bgr = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if bgr is None:
        raise MalformedMessageError(
            f"compressed image could not be decoded (format '{msg.format}', {data.size} bytes)")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


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


def joint_positions(msg: JointState, joint_names: Sequence[str]) -> np.ndarray:
    """Return the positions of ``joint_names`` (in that order) from a ``JointState``.

    Joints are matched by name; the message may list them in any order and carry extra
    joints. A missing joint, a position array shorter than the name array, duplicate
    names or a non-finite position of a required joint are rejected.
    """
    names = list(msg.name)
    positions = np.asarray(msg.position, dtype=np.float64)
    if positions.size != len(names):
        raise MalformedMessageError(
            f'joint state has {len(names)} names but {positions.size} positions')
    index = {}
    for i, name in enumerate(names):
        if name in index:
            raise MalformedMessageError(f"joint state lists joint '{name}' twice")
        index[name] = i
    missing = [name for name in joint_names if name not in index]
    if missing:
        raise MalformedMessageError(
            f'joint state is missing joint(s) {missing} (has {names})')
    out = positions[[index[name] for name in joint_names]]
    bad = [name for name, value in zip(joint_names, out) if not np.isfinite(value)]
    if bad:
        raise MalformedMessageError(
            f'joint state position is not finite (NaN/inf) for joint(s) {bad}')
    return out


def pose_position(msg: PoseStamped) -> np.ndarray:
    """Return the ``(3,)`` position of a ``PoseStamped``; non-finite values are rejected."""
    p = msg.pose.position
    position = np.array([p.x, p.y, p.z], dtype=np.float64)
    if not np.all(np.isfinite(position)):
        raise MalformedMessageError(
            f"pose (frame '{msg.header.frame_id}') position is not finite: {position.tolist()}")
    return position


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


def to_float64_multiarray(command: np.ndarray, num_joints: int) -> Float64MultiArray:
    """``Float64MultiArray`` of joint positions in contract order (forward_position_controller)."""
    msg = Float64MultiArray()
    msg.data = _finite_command(command, num_joints)
    return msg
