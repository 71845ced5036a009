"""A stand-in robot for ``act_node``: publishes cameras and joint states, records commands.

Used by the node tests and the node benchmark. It talks to the node only over the
middleware (real publishers and subscriptions), with the same QoS a robot would use:
sensor data best effort, commands reliable.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from rclpy.executors import Executor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from act_ros.ros import conversions as conv
from act_ros.ros.diagnostics import status_values
from act_ros.ros.spin import PoolExecutor, spin_executor

# What rclpy passes a two-argument subscription callback beside the message: a dict with
# 'received_timestamp', 'publication_sequence_number', ... (Kilted types it as
# rclpy.subscription.MessageInfo, which Jazzy's rclpy does not have).
MessageInfo = dict[str, Any]


@dataclass(frozen=True)
class ReceivedCommand:
    """One command as it arrived: monotonic time of the callback, positions, joint names
    (if any), and when the middleware received it (seconds, system clock; ``None`` where
    the middleware does not say): a callback can run late when this process is busy, the
    middleware's reception time does not. ``publication_seq``: the publisher's sequence
    number of the message (1 for its first; ``None`` where the middleware does not say),
    which shows commands the publisher sent that never arrived (its queue keeps only the
    newest). ``message``: the message itself (a multi-point trajectory's other points,
    velocities, times and stamp)."""

    received: float
    positions: np.ndarray
    joint_names: tuple[str, ...]
    middleware_received_s: float | None = None
    publication_seq: int | None = None
    message: Any = None


class RobotHarness(Node):
    """Publishes ``camera/<name>/image_raw`` and ``joint_states``; subscribes to commands.

    Attributes the caller may change at any time (read on every publish): ``image`` (RGB),
    ``encoding`` (raw encoding or ``'png'``/``'jpeg'`` for compressed transport),
    ``joints`` (name -> position, published in dict order), ``efforts`` (name -> effort:
    the JointState's effort array, NaN for a joint not named; empty: no efforts),
    ``enabled`` (stream -> bool),
    ``mutate`` (stream -> function applied to the outgoing message, for malformed data),
    ``drop`` (stream -> probability that a message is not sent), ``poses`` (topic ->
    (position, quaternion w, x, y, z): a ``PoseStamped`` in ``base_link`` published with
    every set, e.g. ``box_pose`` for a policy that takes the object poses; ``enabled``
    and ``drop`` take the topic as the stream), ``frames`` (pose topic -> the
    ``header.frame_id`` it is published in instead of ``base_link``; ``ee_pose`` and
    ``pad_pose`` too).
    """

    def __init__(self, *, context: Any = None, cameras: Sequence[str] = ('top', 'wrist'),
                 joints: dict[str, float], image: np.ndarray, encoding: str = 'rgb8',
                 command_type: str = 'JointTrajectory', command_topic: str | None = None,
                 rate_hz: float | None = 30.0, namespace: str = '',
                 name: str = 'robot_harness') -> None:
        super().__init__(name, context=context, namespace=namespace)
        self.cameras = tuple(cameras)
        self.joints = dict(joints)
        self.efforts: dict[str, float] = {}
        self.image = image
        self.encoding = encoding
        self.enabled = {stream: True for stream in ('joint_states', *self.cameras)}
        self.mutate: dict[str, Callable[[Any], Any]] = {}
        self.drop: dict[str, float] = {}
        self._rng = np.random.default_rng(0)
        self.ee_position: np.ndarray | None = None
        self.pad_position: np.ndarray | None = None
        self.poses: dict[str, tuple[Sequence[float], Sequence[float]]] = {}
        self.frames: dict[str, str] = {}
        self._pose_pubs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.commands: list[ReceivedCommand] = []
        self.diagnostics: list[tuple[float, bytes, str, dict[str, str]]] = []
        self.published = 0
        self._cache: dict[tuple[int, str], Any] = {}

        self._raw_pubs = {cam: self.create_publisher(Image, f'camera/{cam}/image_raw',
                                                     qos_profile_sensor_data)
                          for cam in self.cameras}
        self._compressed_pubs = {
            cam: self.create_publisher(CompressedImage, f'camera/{cam}/image_raw/compressed',
                                       qos_profile_sensor_data) for cam in self.cameras}
        self._joint_pub = self.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
        self._ee_pub = self.create_publisher(PoseStamped, 'ee_pose', qos_profile_sensor_data)
        self._pad_pub = self.create_publisher(PoseStamped, 'pad_pose', qos_profile_sensor_data)
        self._pose_pubs.update({'ee_pose': self._ee_pub, 'pad_pose': self._pad_pub})
        if command_type == 'JointTrajectory':
            self.create_subscription(
                JointTrajectory, command_topic or 'joint_trajectory_controller/joint_trajectory',
                self._on_trajectory, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        else:
            self.create_subscription(
                Float64MultiArray, command_topic or 'forward_position_controller/commands',
                self._on_array, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, 10)
        self.timer = (self.create_timer(1.0 / rate_hz, self.publish_once)
                      if rate_hz else None)

    # -- publishing ------------------------------------------------------------------------
    def _image_msg(self) -> Image | CompressedImage:
        key = (id(self.image), self.encoding)
        msg = self._cache.get(key)
        if msg is None:
            if self.encoding in ('png', 'jpeg'):
                msg = conv.rgb_to_compressed(self.image, self.encoding)
            else:
                msg = conv.rgb_to_image(self.image, self.encoding)
            self._cache = {key: msg}
        return msg

    def publish_once(self, stamp_s: float | None = None) -> float:
        """Publish every enabled stream once, all with the same header stamp (``stamp_s``,
        seconds; default now); returns that stamp in seconds."""
        stamp = (self.get_clock().now() if stamp_s is None
                 else Time(nanoseconds=round(stamp_s * 1e9))).to_msg()
        if self._sends('joint_states'):
            efforts = dict(self.efforts)
            msg = JointState(name=list(self.joints),
                             position=[float(v) for v in self.joints.values()],
                             effort=[float(efforts.get(n, np.nan)) for n in self.joints]
                             if efforts else [])
            msg.header.stamp = stamp
            self._joint_pub.publish(self.mutate.get('joint_states', _same)(msg))
        image = self._image_msg()
        image.header.stamp = stamp
        compressed = isinstance(image, CompressedImage)
        for cam in self.cameras:
            if self._sends(cam):
                pub = self._compressed_pubs[cam] if compressed else self._raw_pubs[cam]
                pub.publish(self.mutate.get(cam, _same)(image))
        for topic, position, pub in (('ee_pose', self.ee_position, self._ee_pub),
                                     ('pad_pose', self.pad_position, self._pad_pub)):
            if position is not None:
                pose = PoseStamped()
                pose.header.stamp = stamp
                pose.header.frame_id = self.frames.get(topic, 'base_link')
                pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (
                    float(v) for v in position)
                pose.pose.orientation.w = 1.0
                pub.publish(pose)
        for topic, (position, quaternion) in list(self.poses.items()):
            if not self._sends(topic):
                continue
            pub = self._pose_pubs.get(topic)
            if pub is None:
                pub = self._pose_pubs[topic] = self.create_publisher(
                    PoseStamped, topic, qos_profile_sensor_data)
            pose = PoseStamped()
            pose.header.stamp = stamp
            pose.header.frame_id = self.frames.get(topic, 'base_link')
            p, q = pose.pose.position, pose.pose.orientation
            p.x, p.y, p.z = (float(v) for v in position)
            q.w, q.x, q.y, q.z = (float(v) for v in quaternion)
            pub.publish(self.mutate.get(topic, _same)(pose))
        self.published += 1
        return stamp.sec + stamp.nanosec * 1e-9

    def publish_until_answered(self, node: Any, *, publish: Callable[[], float] | None = None,
                               answer_s: float = 15.0, resends: int = 8,
                               arrive_s: float = 120.0) -> ReceivedCommand:
        """One lock-step tick with an ``act_node`` triggered by observations: publish a set
        (``publish``, by default :meth:`publish_once`; it returns the set's stamp) until the
        node has answered that stamp, then wait until the node's latest command has arrived
        here (by the publisher's sequence number), and return it.

        Camera images go best effort: on a loaded machine one image of a set can be lost,
        and the node, which ticks on a whole synchronized set, never answers that stamp; a
        set not answered within ``answer_s`` is published again under a new stamp (up to
        ``resends`` times). The caller counts the node's commands where it needs one per
        set. Raises ``AssertionError`` saying what was seen when no set is answered or the
        command never arrives."""
        publish = publish or self.publish_once
        for _ in range(resends):
            stamp = publish()
            if wait_until(lambda s=stamp: node.status.last_obs_stamp_s == s, answer_s):
                break
        else:
            raise AssertionError(f'the node answered none of {resends} observations sent '
                                 f'{answer_s} s apart (last answered stamp '
                                 f'{node.status.last_obs_stamp_s}, this one {stamp})')
        published = node.counters.commands_published

        def arrived() -> bool:
            with self._lock:
                return bool(self.commands) and self.commands[-1].publication_seq == published
        if not wait_until(arrived, arrive_s):
            with self._lock:
                seqs = [c.publication_seq for c in self.commands[-5:]]
            raise AssertionError(f'command {published} was published but did not arrive '
                                 f'within {arrive_s} s (last sequence numbers received: '
                                 f'{seqs})')
        with self._lock:
            return self.commands[-1]

    def _sends(self, stream: str) -> bool:
        if not self.enabled.get(stream, True):
            return False
        p = self.drop.get(stream, 0.0)
        return not (p and self._rng.random() < p)

    # -- recording -------------------------------------------------------------------------
    def _on_trajectory(self, msg: JointTrajectory, info: MessageInfo) -> None:
        positions = np.array(msg.points[0].positions) if msg.points else np.zeros(0)
        with self._lock:
            self.commands.append(ReceivedCommand(time.monotonic(), positions,
                                                 tuple(msg.joint_names), _received_s(info),
                                                 _publication_seq(info), msg))

    def _on_array(self, msg: Float64MultiArray, info: MessageInfo) -> None:
        with self._lock:
            self.commands.append(ReceivedCommand(time.monotonic(), np.array(msg.data), (),
                                                 _received_s(info), _publication_seq(info),
                                                 msg))

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        if not msg.status:
            return
        status = msg.status[0]
        with self._lock:
            self.diagnostics.append((time.monotonic(), status.level, status.message,
                                     status_values(msg)))

    def commands_since(self, t: float) -> list[ReceivedCommand]:
        with self._lock:
            return [c for c in self.commands if c.received >= t]

    def latest_diagnostics(self, since: float = 0.0) -> tuple[bytes, str, dict[str, str]] | None:
        with self._lock:
            recent = [d for d in self.diagnostics if d[0] >= since]
        return recent[-1][1:] if recent else None


def _received_s(info: MessageInfo) -> float | None:
    stamp = info.get('received_timestamp', 0) if info else 0
    return stamp * 1e-9 if stamp else None


def _publication_seq(info: MessageInfo) -> int | None:
    seq = info.get('publication_sequence_number') if info else None
    return int(seq) if seq else None


def _same(msg: Any) -> Any:
    return msg


POSTPROCESSOR_STATS = 'policy_postprocessor_step_0_unnormalizer_processor.safetensors'


def make_gated_checkpoint(base: str | Path, path: str | Path, *, size: tuple[int, int] = (48, 64),
                          state: np.ndarray | None = None) -> tuple[str, np.ndarray, np.ndarray]:
    """A real ACT checkpoint whose gripper request is steered by the camera image, for
    release-gate tests and fault injection: ``(checkpoint, open_image, closed_image)``.

    Every step of a chunk is made the same action (the decoder's positional queries all set
    to the first one's), so the steering holds whichever step of a chunk is played: in
    background execution the first steps have passed when a chunk arrives. The gripper
    output is then measured on an all-black and an all-white image and the action
    statistics are rescaled so that one image gives -0.5 and the other 1.5 (the joint
    limits then clamp them to exactly 0, closed, and 1, open).
    """
    import shutil

    from safetensors.torch import load_file, save_file

    from act_ros.core.contract import load_contract
    from act_ros.core.inference.export import EXPORT_DIR
    from act_ros.core.inference.hub import resolve_checkpoint
    from act_ros.core.inference.runtime import Observation, PolicyRuntime, RuntimeConfig

    base = resolve_checkpoint(base).path  # a Hub id: its cached snapshot
    path = Path(path)
    shutil.copytree(base, path, ignore=shutil.ignore_patterns(EXPORT_DIR))  # stale anyway
    weights = load_file(str(path / 'model.safetensors'))
    queries = weights['model.decoder_pos_embed.weight']
    queries[:] = queries[0].clone()
    save_file(weights, str(path / 'model.safetensors'), metadata={'format': 'pt'})
    contract = load_contract()
    gripper = contract.gripper_indices[0]  # the package arm's one gripper
    state = np.zeros(contract.num_joints) if state is None else state
    black = np.zeros((*size, 3), dtype=np.uint8)
    white = np.full((*size, 3), 255, dtype=np.uint8)
    raw = {}
    with PolicyRuntime(RuntimeConfig(str(path), execution='sync', n_action_steps=1,
                                     contract=contract, warmup=False)) as runtime:
        for name, img in (('black', black), ('white', white)):
            runtime.reset()
            obs = Observation(images={cam: img for cam in contract.camera_names}, state=state)
            raw[name] = float(runtime.act(obs)[gripper])
    if abs(raw['white'] - raw['black']) < 1e-3:
        raise ValueError(f'the gripper output barely depends on the image: {raw}')
    opened, closed = ('white', 'black') if raw['white'] > raw['black'] else ('black', 'white')
    scale = 2.0 / (raw[opened] - raw[closed])
    offset = -0.5 - scale * raw[closed]
    stats = load_file(str(path / POSTPROCESSOR_STATS))
    stats['action.mean'][gripper] = scale * stats['action.mean'][gripper] + offset
    stats['action.std'][gripper] = scale * stats['action.std'][gripper]
    save_file(stats, str(path / POSTPROCESSOR_STATS))
    images = {'black': black, 'white': white}
    return str(path), images[opened], images[closed]


#: Velocity limit of every joint of :func:`fast_robot_model` (per second).
FAST_ROBOT_SPEED = 1000.0
#: ``max_joint_velocity`` that lets a stand-in robot's commands pass unchanged: 300 per
#: second, the 10 per tick at 30 Hz of a joint model that follows any command at once.
FAST_ROBOT_MAX_JOINT_VELOCITY = [300.0]


def fast_robot_model(directory: str | Path) -> Path:
    """The package's robot model with every joint's ``<limit velocity>`` at
    :data:`FAST_ROBOT_SPEED`, written once as ``directory/fast_robot.urdf``: the same
    kinematics, for tests and benchmarks whose commands must pass the speed limit unchanged
    (``urdf_path`` to it, ``max_joint_velocity`` :data:`FAST_ROBOT_MAX_JOINT_VELOCITY`). A
    configured speed above a URDF's is refused, so a real model cannot serve them."""
    import xml.etree.ElementTree as ET

    from act_ros.core.control.kinematics import default_urdf_path

    path = Path(directory) / 'fast_robot.urdf'
    if not path.is_file():
        root = ET.fromstring(default_urdf_path().read_text())
        for limit in root.iter('limit'):
            if limit.get('velocity') is not None:
                limit.set('velocity', repr(FAST_ROBOT_SPEED))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix('.tmp')
        tmp.write_text(ET.tostring(root, encoding='unicode'))
        tmp.replace(path)
    return path


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


@contextlib.contextmanager
def spinning(context: Any, *nodes: Node, num_threads: int = 4) -> Iterator[Executor]:
    """Spin ``nodes`` in a background thread: on a :class:`PoolExecutor` of
    ``num_threads``, or with ``num_threads=1`` on a single-threaded executor.

    The pool, not rclpy's ``MultiThreadedExecutor``: that one goes round its wait loop
    without blocking while a ready callback waits for a pool thread (ros2/rclpy#1452) and
    holds the GIL the callbacks and the test need (a harness on it burned 75 % of a core
    and published its frames late enough for the node under test to see stale inputs; a
    node's configure-time model measurement beside it took seconds per call). Tests that
    spin a node whose callbacks block (``sync`` execution) keep several threads.

    On exit the executor stops and the nodes are destroyed (their recorded data stays
    readable).
    """
    executor = (SingleThreadedExecutor(context=context) if num_threads == 1
                else PoolExecutor(num_threads, context=context))
    for node in nodes:
        executor.add_node(node)
    thread = threading.Thread(target=spin_executor, args=(executor,), name='harness-executor',
                              daemon=True)
    thread.start()
    try:
        yield executor
    finally:
        executor.shutdown(timeout_sec=5.0)
        thread.join(timeout=5.0)
        for node in nodes:
            node.destroy_node()
