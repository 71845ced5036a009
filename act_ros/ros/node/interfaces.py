"""What ``act_node`` builds at configure around its control loop
(:func:`act_ros.core.control.loop.build_control_loop`): its ROS interfaces.

Split from :mod:`act_ros.ros.node.act_node` so the node reads as lifecycle logic only. With
``execution: process`` the loop's runtime has only started its inference child when these
are created; the node creates them while the child loads, then waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from rclpy.guard_condition import GuardCondition
from rclpy.lifecycle import LifecyclePublisher
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.service import Service
from rclpy.subscription import Subscription
from rclpy.timer import Timer
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from act_ros.core.contract import Contract
from act_ros.core.control.inputs import (
    EE_POSE,
    JOINT_EFFORTS,
    JOINT_STATES,
    PAD_POSE,
    image_stream,
    object_pose_stream,
)
from act_ros.core.object_state import OBJECTS
from act_ros.ros import conversions as conv
from act_ros.ros.node.parameters import NodeSettings
from act_ros.ros.node.visualization import PlanVisualizer


class PolicyNodeHooks(Protocol):
    """What :func:`create_interfaces` needs of the lifecycle node it equips (``ActNode``
    provides it; declared here so this module does not import the node)."""

    input_group: Any
    control_group: Any
    stream_group: Any
    status_group: Any
    visualization_group: Any
    status: Any

    def store(self, stream: str, msg: Any, convert: Callable[[Any], Any]) -> None: ...

    def tick(self) -> None: ...

    def handle_reset(self, request: Any, response: Any) -> Any: ...

    def handle_seams(self, request: Any, response: Any) -> Any: ...

    def stream_tick(self) -> None: ...

    def resolve_topic_name(self, topic: str, *, only_expand: bool = False) -> str: ...


def describe_subscription(msg_type: Any, topic: str, qos: QoSProfile) -> str:
    """Where a subscription listens, for the lines that say an input is missing:
    ``'/top/image_raw (sensor_msgs/Image, best effort, depth 5)'``."""
    package = msg_type.__module__.split('.')[0]
    reliability = 'best effort' if qos.reliability == ReliabilityPolicy.BEST_EFFORT \
        else 'reliable'
    return f'{topic} ({package}/{msg_type.__name__}, {reliability}, depth {qos.depth})'


#: Commands go to ros2_control controllers, whose command topics are reliable.
COMMAND_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
DIAGNOSTICS_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
DIAGNOSTICS_TOPIC = '/diagnostics'


@dataclass
class Interfaces:
    """Publishers, subscriptions, service and timers that exist while configured."""

    command_pub: LifecyclePublisher
    diagnostics_pub: LifecyclePublisher
    reset_service: Service
    diagnostics_timer: Timer
    control_timer: Timer | None = None  # timer trigger; created cancelled, runs while active
    observation_ready: GuardCondition | None = None
    subscriptions: list[Subscription] = field(default_factory=list)
    # Input stream -> its resolved topic, type and QoS (describe_subscription).
    input_sources: dict[str, str] = field(default_factory=dict)
    # visualization.enabled: ~/planned_path and ~/markers with their low-rate timer.
    visualizer: PlanVisualizer | None = None
    seams_service: Service | None = None  # ~/seams: the seam figures as JSON
    stream_timer: Timer | None = None  # command_stream_rate_hz: the interpolated stream

    def destroy(self, node: Any) -> None:
        if self.visualizer is not None:
            self.visualizer.destroy(node)
            self.visualizer = None
        for sub in self.subscriptions:
            node.destroy_subscription(sub)
        self.subscriptions.clear()
        for timer in (self.diagnostics_timer, self.control_timer, self.stream_timer):
            if timer is not None:
                timer.cancel()
                node.destroy_timer(timer)
        if self.observation_ready is not None:
            node.destroy_guard_condition(self.observation_ready)
        node.destroy_service(self.reset_service)
        if self.seams_service is not None:
            node.destroy_service(self.seams_service)
        node.destroy_lifecycle_publisher(self.command_pub)
        node.destroy_lifecycle_publisher(self.diagnostics_pub)


def create_interfaces(node: PolicyNodeHooks, settings: NodeSettings, contract: Contract, *,
                      cameras: tuple[str, ...] | None = None,
                      object_poses: bool = False) -> Interfaces:
    """Subscriptions (sensor QoS), command and diagnostics publishers, ``~/reset``, timers
and, with ``visualization.enabled``, the plan's view
(:mod:`act_ros.ros.node.visualization`).

    ``cameras``: those the checkpoint takes (default: every contract camera);
    ``object_poses``: subscribe one ``PoseStamped`` per object
    (``object_pose_topics.<object>``). A topic needed twice (the pad's pose, also the
    release gate's with ``pad_source: topic``) gets one subscription feeding both. A pose
    whose ``header.frame_id`` is not ``pose_frame_id`` is rejected on every stream it feeds.
    """
    group = node.input_group
    subs = []
    sources: dict[str, str] = {}

    def subscribe(msg_type: Any, topic: str, stream: str, convert: Callable[[Any], Any],
                  *also: tuple[str, Callable[[Any], Any]]) -> None:
        # ``also``: other streams from the same message, stored first (the tick that the
        # last one triggers sees them).
        def store(msg: Any) -> None:
            for other, other_convert in also:
                node.store(other, msg, other_convert)
            node.store(stream, msg, convert)

        subs.append(node.create_subscription(msg_type, topic, store, qos_profile_sensor_data,
                                             callback_group=group))
        sources[stream] = describe_subscription(msg_type, subs[-1].topic_name,
                                                qos_profile_sensor_data)

    names = settings.joint_names
    # The efforts (where the message carries them) are the release gate's evidence of an
    # empty gripper; the positions are the policy's state.
    subscribe(JointState, settings.joint_states_topic, JOINT_STATES,
              lambda msg: conv.joint_positions(msg, names),
              (JOINT_EFFORTS, lambda msg: conv.joint_efforts(msg, names)))
    compressed = settings.image_transport == 'compressed'
    for cam in contract.camera_names if cameras is None else cameras:
        subscribe(CompressedImage if compressed else Image, settings.camera_topics[cam],
                  image_stream(cam), conv.compressed_to_rgb if compressed else conv.image_to_rgb)
    # Pose topics: resolved name -> (stream, conversion) for every use of that topic.
    poses: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {}

    def use_pose(topic: str, stream: str, convert: Callable[[Any], Any]) -> None:
        resolved = node.resolve_topic_name(topic)
        # Every pose must be in the expected frame (pose_frame_id): never transformed.
        poses.setdefault(resolved, []).append(
            (stream, conv.in_frame(convert, settings.pose_frame_id, resolved)))

    if settings.ee_source == 'topic':
        use_pose(settings.ee_pose_topic, EE_POSE, conv.pose_position)
    if settings.pad_source == 'topic':
        use_pose(settings.pad_pose_topic, PAD_POSE, conv.pose_position)
    if object_poses:
        for obj in OBJECTS:
            use_pose(settings.object_pose_topics[obj], object_pose_stream(obj),
                     conv.pose_components)

    def store_pose(msg: Any, uses: tuple[tuple[str, Callable[[Any], Any]], ...]) -> None:
        for stream, convert in uses:
            node.store(stream, msg, convert)

    for topic, uses in poses.items():
        subs.append(node.create_subscription(
            PoseStamped, topic, lambda msg, uses=tuple(uses): store_pose(msg, uses),
            qos_profile_sensor_data, callback_group=group))
        sources.update((stream, describe_subscription(PoseStamped, topic,
                                                      qos_profile_sensor_data))
                       for stream, _ in uses)

    command_type = JointTrajectory if settings.command_type == 'JointTrajectory' \
        else Float64MultiArray
    guard = timer = None
    if settings.trigger == 'observation':
        guard = node.create_guard_condition(node.tick, callback_group=node.control_group)
    else:
        timer = node.create_timer(settings.period_s, node.tick, callback_group=node.control_group)
        timer.cancel()
    stream_timer = None
    if settings.command_type == 'Float64MultiArray' and settings.command_stream_rate_hz > 0:
        stream_timer = node.create_timer(1.0 / settings.command_stream_rate_hz, node.stream_tick,
                                         callback_group=node.stream_group)
    return Interfaces(
        command_pub=node.create_lifecycle_publisher(command_type, settings.command_topic,
                                                    COMMAND_QOS),
        diagnostics_pub=node.create_lifecycle_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC,
                                                        DIAGNOSTICS_QOS),
        reset_service=node.create_service(Trigger, '~/reset', node.handle_reset,
                                          callback_group=node.control_group),
        seams_service=node.create_service(Trigger, '~/seams', node.handle_seams,
                                          callback_group=node.status_group),
        stream_timer=stream_timer,
        diagnostics_timer=node.create_timer(settings.diagnostics_period_s,
                                            node.status.publish,
                                            callback_group=node.status_group),
        control_timer=timer,
        observation_ready=guard,
        subscriptions=subs,
        input_sources=sources,
        visualizer=PlanVisualizer(node, settings, contract,
                                  callback_group=node.visualization_group)
        if settings.visualization_enabled else None,
    )
