"""Messages of ``sim_bridge``: simulation state out, controller commands in.

Pure functions (no node, no middleware), so they are tested without a ROS graph. Images
go through :func:`act_ros.ros.conversions.rgb_to_image`, the same code the node's tests
use, and malformed commands raise
:class:`~act_ros.ros.conversions.MalformedMessageError` with one line that says what was
expected and what was found.

Episode status (``std_msgs/String``, JSON object), see :func:`status_json`:

- ``state``: ``idle`` (no episode yet), ``running`` or ``done``;
- ``episode`` (0-based count of episodes started by this bridge), ``seed``, ``step``,
  ``episode_steps``, ``done``, ``sim_time_s``, ``mode`` (``realtime`` / ``lockstep``);
- ``commands``: counters of the episode: ``received``, ``applied``, ``rejected``
  (malformed), ``superseded`` (replaced by a newer one before being used),
  ``lockstep_timeouts`` (steps that held the last target because no command came in
  time) and ``realtime_overruns`` (steps that started late);
- ``peers``: ``command_publishers`` and ``observation_subscribers`` matched right now;
- ``result`` (only when ``done``): :meth:`act_ros.sim.EpisodeResult.to_dict` — ``success``
  ("aligned"), ``position_error_m``, ``yaw_error_deg``, ``released``, ``box_on_pad``,
  ``box_still``, ``max_box_height_m``, ``steps``, ``seed``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import PoseStamped
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from act_ros.ros.conversions import MalformedMessageError, rgb_to_image


def time_msg(nanoseconds: int) -> Time:
    """``builtin_interfaces/Time`` for a non-negative number of nanoseconds."""
    return Time(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def clock_msg(stamp: Time) -> Clock:
    return Clock(clock=stamp)


def camera_image(rgb: np.ndarray, stamp: Time, frame_id: str) -> Image:
    """An ``rgb8`` ``sensor_msgs/Image`` of one rendered camera."""
    return rgb_to_image(rgb, 'rgb8', stamp=stamp, frame_id=frame_id)


def joint_state(positions: np.ndarray, joint_names: Sequence[str], stamp: Time,
                efforts: np.ndarray | None = None) -> JointState:
    """Measured joints (contract names and order; gripper normalized 0 closed .. 1 open),
    with their actuator efforts where given (N m; the gripper's mean finger force in N)."""
    msg = JointState(name=list(joint_names), position=[float(v) for v in positions],
                     effort=[] if efforts is None else [float(v) for v in efforts])
    msg.header.stamp = stamp
    return msg


def pose_stamped(position: Sequence[float], quaternion_wxyz: Sequence[float], stamp: Time,
                 frame_id: str) -> PoseStamped:
    """A ``PoseStamped`` from a position and a MuJoCo-order (w, x, y, z) quaternion."""
    msg = PoseStamped()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    p, q = msg.pose.position, msg.pose.orientation
    p.x, p.y, p.z = (float(v) for v in position)
    q.w, q.x, q.y, q.z = (float(v) for v in quaternion_wxyz)
    return msg


def yaw_quaternion(yaw_rad: float) -> tuple[float, float, float, float]:
    """(w, x, y, z) of a rotation by ``yaw_rad`` about +z."""
    return (math.cos(yaw_rad / 2.0), 0.0, 0.0, math.sin(yaw_rad / 2.0))


def status_json(status: dict[str, Any]) -> String:
    """The episode status as a ``std_msgs/String`` holding one JSON object."""
    return String(data=json.dumps(status, sort_keys=True))


def parse_status(msg: String) -> dict[str, Any]:
    """Inverse of :func:`status_json`; raises ``ValueError`` on anything but a JSON object."""
    data = json.loads(msg.data)
    if not isinstance(data, dict):
        raise ValueError(f'episode status must be a JSON object, got {type(data).__name__}')
    return data


def _finite(values: np.ndarray, what: str, names: Sequence[str]) -> np.ndarray:
    bad = [name for name, v in zip(names, values) if not math.isfinite(v)]
    if bad:
        raise MalformedMessageError(f'{what}: non-finite target for joint(s) {bad}')
    return values


def trajectory_target(msg: JointTrajectory, joint_names: Sequence[str]) -> np.ndarray:
    """Joint targets in ``joint_names`` order from a ``JointTrajectory``, matched by name.

    Like ``joint_trajectory_controller`` without partial goals: the message must name
    every joint exactly once and nothing else. The first point is the target of the next
    control step (the bridge does not interpolate; later points are ignored).
    """
    names = list(msg.joint_names)
    if len(set(names)) != len(names):
        raise MalformedMessageError(f'JointTrajectory lists a joint twice: {names}')
    missing = [n for n in joint_names if n not in names]
    unknown = [n for n in names if n not in joint_names]
    if missing or unknown:
        raise MalformedMessageError(
            f'JointTrajectory joints {names} do not match the robot joints {list(joint_names)} '
            f'(missing {missing}, unknown {unknown})')
    if not msg.points:
        raise MalformedMessageError('JointTrajectory has no points')
    positions = np.asarray(msg.points[0].positions, dtype=np.float64)
    if positions.size != len(names):
        raise MalformedMessageError(
            f'JointTrajectory point 0 has {positions.size} positions for {len(names)} joints')
    target = positions[[names.index(n) for n in joint_names]]
    return _finite(target, 'JointTrajectory', joint_names)


def array_target(msg: Float64MultiArray, joint_names: Sequence[str]) -> np.ndarray:
    """Joint targets from a ``Float64MultiArray`` in contract order (forward_position_controller)."""
    data = np.asarray(msg.data, dtype=np.float64)
    if data.size != len(joint_names):
        raise MalformedMessageError(
            f'Float64MultiArray has {data.size} values, expected {len(joint_names)} '
            f'(one per joint, in the order {list(joint_names)})')
    return _finite(data, 'Float64MultiArray', joint_names)
