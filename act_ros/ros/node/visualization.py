"""What ``act_node`` shows of its plan: the chunk's end-effector path and the release gate.

With ``visualization.enabled`` (the default) the node publishes, while active, on its own
topics (``~`` is the node's name, ``/act_node`` at the root), in ``visualization.frame_id``
(``base_link``, the robot base frame of the joint model):

- ``~/planned_path`` (``nav_msgs/Path``; reliable, transient local, depth 1: a late
  subscriber asking for transient local gets the latest at once): the end-effector pose
  (forward kinematics of the arm's robot model, ``urdf_path`` or the contract's ``urdf``,
  at the first gripper's ``ee_frame``; position and orientation) of every
  action of the chunk being played (:attr:`PolicyRuntime.current_chunk`: chunk mode, the
  queued chunk; ensemble mode, the newest one), as the policy wrote it, before the safety
  limits. Header stamp: the observation the chunk was computed from; pose ``i``: that
  stamp plus ``i`` control periods (when the policy means the gripper to be there).
  Published once per new chunk (an empty path after an episode reset), looked for at
  ``visualization.rate_hz``.
- ``~/markers`` (``visualization_msgs/MarkerArray``; same QoS) at ``visualization.rate_hz``,
  one namespace per marker: ``release_region`` (a sphere of ``release_gate.release_radius_m``
  around the pad, the region where the gate lets a release pass; blue FREE, orange
  HOLDING, green RELEASED, grey when the gate is off), ``end_effector`` (the position the
  gate used on the last tick), ``planned_gripper`` (the path's points coloured by the
  chunk's gripper request: green open, red closed, yellow in between) and ``gate_state``
  (a text above the pad: gate state, end effector to pad distance, release radius and the
  age of every required input, as on ``/diagnostics``). A marker whose position is unknown
  (a pad from a stale topic) is deleted. On an arm with several grippers, the end
  effector, the gripper requests and the gate shown are the first gripper's.

Cost to the control tick: none. The tick already keeps what is shown (one reference to
the chunk, the gate's positions); everything is built in this module's timer callback, in
a callback group of its own, with forward kinematics once per new chunk (one pinocchio
call per action: a few milliseconds for a chunk of 30, path message included, on a busy
2-core machine; the markers well under one per period). The node's lock is held only to
publish. ``visualization.enabled: false`` creates no publisher and no timer. Without a robot
model of the arm (the contract names no ``urdf`` and ``urdf_path`` is not set, or the
model lacks the contract's joints or the end-effector frame) there is no path, with one
warning saying why; the markers still show the gate. The package's own model is never
used for an arm whose contract does not name it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from geometry_msgs.msg import Point, PoseStamped
from nav_msgs.msg import Path
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from act_ros.core.contract import Contract
from act_ros.core.control.kinematics import gripper_kinematics
from act_ros.core.inference.chunking import TimedChunk
from act_ros.ros.conversions import seconds_to_time

PATH_TOPIC = '~/planned_path'
MARKERS_TOPIC = '~/markers'
#: Latched: a subscriber that asks for transient local gets the latest message at once.
VISUALIZATION_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                               durability=DurabilityPolicy.TRANSIENT_LOCAL)
# Marker namespaces (one marker each, id 0): RViz lists them and can hide each one.
REGION, END_EFFECTOR, PLANNED_GRIPPER, GATE_TEXT = (
    'release_region', 'end_effector', 'planned_gripper', 'gate_state')
GATE_COLORS = {'FREE': (0.25, 0.55, 1.0), 'HOLDING': (1.0, 0.55, 0.0),
               'RELEASED': (0.2, 0.8, 0.3)}
GATE_OFF_COLOR = (0.6, 0.6, 0.6)
OPEN_COLOR, CLOSED_COLOR, BETWEEN_COLOR = (0.2, 0.85, 0.3), (0.9, 0.2, 0.2), (0.95, 0.85, 0.2)
REGION_ALPHA = 0.25
EE_DIAMETER_M = 0.02
PLAN_POINT_M = 0.008
TEXT_HEIGHT_M = 0.025
TEXT_ABOVE_M = 0.05  # above the release region


@dataclass(frozen=True)
class GateView:
    """What the markers show of the gate at one moment."""

    enabled: bool
    state: str  # GateState value: FREE, HOLDING, RELEASED
    radius_m: float
    release_threshold: float
    hold_threshold: float
    pad: np.ndarray | None
    ee: np.ndarray | None
    distance_m: float | None
    ages_s: dict[str, float | None]  # required input -> age (None: never received)


class PlanView:
    """Builds the messages (no ROS node needed): the path of a chunk, the markers."""

    def __init__(self, fk: Any, grippers: Sequence[int], frame_id: str, period_s: float,
                 opening: Callable[[float], float] = float) -> None:
        self.fk = fk  # act_ros.core.control.kinematics.ForwardKinematics of the arm joints, or None
        # The grippers' indices (left out of forward kinematics); the first one's requests
        # colour the path, as openings (``opening``: its joint units to 0 closed, 1 open).
        self.grippers = list(grippers)
        self.opening = opening
        self.frame_id = frame_id
        self.period_s = period_s

    def chunk_poses(self, actions: np.ndarray) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Forward kinematics of every finite action row: (row indices, positions (N, 3),
        quaternions (N, 4) w, x, y, z)."""
        rows, positions, quaternions = [], [], []
        for i, action in enumerate(np.asarray(actions, dtype=np.float64)):
            arm = np.delete(action, self.grippers)
            if not np.all(np.isfinite(arm)):
                continue  # the safety chain never sends it either
            position, quaternion = self.fk.ee_pose(arm)
            rows.append(i)
            positions.append(position)
            quaternions.append(quaternion)
        return rows, np.reshape(positions, (-1, 3)), np.reshape(quaternions, (-1, 4))

    def path(self, chunk: TimedChunk | None, now_s: float,
             poses: tuple[list[int], np.ndarray, np.ndarray] | None = None) -> Path:
        """``nav_msgs/Path`` of ``chunk`` (empty for ``None``); ``poses`` from
        :meth:`chunk_poses` when already computed."""
        msg = Path()
        msg.header.frame_id = self.frame_id
        if chunk is None:
            msg.header.stamp = seconds_to_time(now_s)
            return msg
        start_s = chunk.stamp_s if chunk.stamp_s else now_s
        msg.header.stamp = seconds_to_time(start_s)
        rows, positions, quaternions = poses or self.chunk_poses(chunk.actions)
        for i, p, q in zip(rows, positions, quaternions):
            pose = PoseStamped()
            pose.header.frame_id = self.frame_id
            pose.header.stamp = seconds_to_time(start_s + i * self.period_s)
            pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (float(v)
                                                                                for v in p)
            o = pose.pose.orientation
            o.w, o.x, o.y, o.z = (float(v) for v in q)
            msg.poses.append(pose)
        return msg

    def markers(self, gate: GateView, now_s: float, chunk: TimedChunk | None = None,
                poses: tuple[list[int], np.ndarray, np.ndarray] | None = None) -> MarkerArray:
        """The release region, end effector, planned gripper requests and the state text."""
        stamp = seconds_to_time(now_s)
        color = GATE_COLORS.get(gate.state, GATE_OFF_COLOR) if gate.enabled else GATE_OFF_COLOR

        def marker(ns: str, kind: int, position: np.ndarray | None) -> Marker:
            m = Marker(ns=ns, id=0, type=kind)
            m.header.frame_id = self.frame_id
            m.header.stamp = stamp
            if position is None:
                m.action = Marker.DELETE
                return m
            m.action = Marker.ADD
            m.pose.position.x, m.pose.position.y, m.pose.position.z = (float(v)
                                                                       for v in position)
            m.pose.orientation.w = 1.0
            return m

        region = marker(REGION, Marker.SPHERE, gate.pad)
        region.scale.x = region.scale.y = region.scale.z = 2.0 * gate.radius_m
        region.color = _rgba(color, REGION_ALPHA)

        ee = marker(END_EFFECTOR, Marker.SPHERE, gate.ee)
        ee.scale.x = ee.scale.y = ee.scale.z = EE_DIAMETER_M
        near = gate.distance_m is not None and gate.distance_m <= gate.radius_m
        ee.color = _rgba(OPEN_COLOR if near else color, 1.0)

        plan = marker(PLANNED_GRIPPER, Marker.SPHERE_LIST,
                      None if chunk is None or poses is None or not poses[0]
                      or not self.grippers else np.zeros(3))
        if plan.action == Marker.ADD:
            plan.scale.x = plan.scale.y = plan.scale.z = PLAN_POINT_M
            rows, positions, _ = poses
            requests = np.asarray(chunk.actions)[rows, self.grippers[0]]
            for p, g in zip(positions, map(self.opening, requests)):
                plan.points.append(Point(x=float(p[0]), y=float(p[1]), z=float(p[2])))
                plan.colors.append(_rgba(OPEN_COLOR if g >= gate.release_threshold else
                                         CLOSED_COLOR if g < gate.hold_threshold else
                                         BETWEEN_COLOR, 1.0))
            plan.color = _rgba(BETWEEN_COLOR, 1.0)

        anchor = gate.pad if gate.pad is not None else np.zeros(3)
        text = marker(GATE_TEXT, Marker.TEXT_VIEW_FACING,
                      anchor + np.array([0.0, 0.0, gate.radius_m + TEXT_ABOVE_M]))
        text.scale.z = TEXT_HEIGHT_M
        text.color = _rgba((1.0, 1.0, 1.0), 1.0)
        text.text = gate_text(gate)
        return MarkerArray(markers=[region, ee, plan, text])


def gate_text(gate: GateView) -> str:
    """Two lines: the gate and the input ages (ASCII: RViz draws nothing else)."""
    distance = 'unknown' if gate.distance_m is None else f'{gate.distance_m:.3f} m'
    state = f'gate {gate.state}' if gate.enabled else 'gate off'
    pad = '' if gate.pad is not None else ' | pad unknown'
    ages = ', '.join(f"{name} {'never' if age is None else f'{age * 1e3:.0f}'}"
                     for name, age in gate.ages_s.items())
    return (f'{state} | ee-pad {distance} | release radius {gate.radius_m:.2f} m{pad}\n'
            f'input age ms: {ages}')


def _rgba(rgb: tuple[float, float, float], alpha: float) -> ColorRGBA:
    return ColorRGBA(r=float(rgb[0]), g=float(rgb[1]), b=float(rgb[2]), a=float(alpha))


class PlanVisualizer:
    """Publishers and the low-rate timer of the visualization (created at configure)."""

    def __init__(self, node: Any, settings: Any, contract: Contract,
                 callback_group: Any = None) -> None:
        self.node = node
        self.settings = settings
        # Without a robot model of the arm (fk_error says why; the node warns once for
        # every feature off) the markers still show the gate; only the path needs it.
        fks, self.fk_error = gripper_kinematics(contract, urdf_path=settings.urdf_path or None,
                                                ee_frame=settings.ee_frame)
        shown = contract.grippers[0].opening if contract.grippers else float
        self.view = PlanView(fks[0] if fks else None, contract.gripper_indices,
                             settings.visualization_frame_id, settings.period_s, shown)
        self.path_pub = node.create_lifecycle_publisher(Path, PATH_TOPIC, VISUALIZATION_QOS)
        self.markers_pub = node.create_lifecycle_publisher(MarkerArray, MARKERS_TOPIC,
                                                           VISUALIZATION_QOS)
        self.timer = node.create_timer(1.0 / settings.visualization_rate_hz, self.publish,
                                       callback_group=callback_group)
        self._closed = False
        self._shown: Any = _NOTHING  # the chunk whose path went out last
        self._poses: tuple[list[int], np.ndarray, np.ndarray] | None = None
        self.paths_published = 0
        self.markers_published = 0

    def describe(self) -> str:
        """One line for ``/diagnostics``."""
        line = f'on, {self.settings.visualization_rate_hz:g} Hz'
        return line + (f'; no path: {self.fk_error}' if self.fk_error else '')

    def publish(self) -> None:
        """Timer callback: a new path if the chunk changed, the markers every time."""
        node = self.node
        loop, inputs = node.loop, node.inputs
        if self._closed or not node.is_active or loop is None or inputs is None:
            return
        try:
            path, markers = self._build(loop, inputs)
        except Exception as exc:  # noqa: BLE001 - never take the node's executor down
            node.get_logger().error(f'visualization: {type(exc).__name__}: {exc}',
                                    throttle_duration_sec=5.0)
            return
        with node.lock:  # teardown destroys the publishers under this lock
            if self._closed or not node.is_active:
                return
            if path is not None:
                self.path_pub.publish(path)
                self.paths_published += 1
            self.markers_pub.publish(markers)
            self.markers_published += 1

    def _build(self, loop: Any, inputs: Any) -> tuple[Path | None, MarkerArray]:
        now = self.node.now_s()
        chunk = loop.runtime.current_chunk  # one reference: no lock, no wait
        path = None
        if chunk is not self._shown:
            self._poses = None
            if chunk is not None and self.view.fk is not None:
                self._poses = self.view.chunk_poses(chunk.actions)
            if chunk is None or self._poses is not None:
                path = self.view.path(chunk, now, self._poses)
            self._shown = chunk
        gate_settings = self.settings.gate
        snap = inputs.snapshot(now)
        # The first gate's (the first gripper's, the path's end effector).
        first = loop.gates[0].gate.state.value if loop.gates else 'FREE'
        gate = GateView(
            enabled=bool(loop.gates),
            state=first,
            radius_m=float(gate_settings.get('release_radius_m', 0.10)),
            release_threshold=float(gate_settings.get('release_threshold', 0.90)),
            hold_threshold=float(gate_settings.get('hold_threshold', 0.90)),
            pad=_position(loop.last_pad_position if loop.last_pad_position is not None
                          else self._parameter_pad()),
            ee=_position(loop.last_ee_positions[0] if loop.gates else None),
            distance_m=loop.last_distances_m[0] if loop.gates else None,
            ages_s={name: snap.age_s(name) for name in inputs.required})
        return path, self.view.markers(gate, now, chunk, self._poses)

    def _parameter_pad(self) -> np.ndarray | None:
        """Before the first tick: the pad from its parameter (a topic's is not known yet)."""
        if self.settings.pad_source == 'parameter':
            return np.asarray(self.settings.pad_position_m, dtype=np.float64)
        return None

    def destroy(self, node: Any) -> None:
        self._closed = True
        self.timer.cancel()
        node.destroy_timer(self.timer)
        node.destroy_lifecycle_publisher(self.path_pub)
        node.destroy_lifecycle_publisher(self.markers_pub)


_NOTHING = object()


def _position(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    position = np.asarray(value, dtype=np.float64).reshape(-1)[:3]
    return position if position.size == 3 and np.all(np.isfinite(position)) else None
