"""``sim_bridge``: the MuJoCo port-pick-align task on ROS 2 topics, like a robot would be.

A thin adapter over :class:`act_ros.sim.PortPickAlignEnv`; when and how the simulation
steps is :class:`act_ros.ros.sim_bridge.loop.BridgeLoop` (modes ``realtime`` and
``lockstep``), message building is :mod:`act_ros.ros.sim_bridge.messages`.

Topics (relative names follow the namespace; remap them as for a real robot):

- out, sensor-data QoS: ``camera/top/image_raw`` and ``camera/wrist/image_raw``
  (``sensor_msgs/Image`` rgb8, frames ``top_camera``/``wrist_camera``; the policy node's
  default camera topics), ``joint_states`` (``sensor_msgs/JointState``, contract names
  and order, gripper normalized; efforts: the actuator forces, the gripper's the mean
  finger force in N, which the release gate takes as its evidence of an empty close),
  ``ee_pose``, ``box_pose``, ``pad_pose``
  (``geometry_msgs/PoseStamped`` in ``frame_id``; the pad pose is the centre of its top
  face, x axis along its stripe: what ``act_node`` reads with ``pad_source: topic``);
- out, reliable: ``/clock`` (``rosgraph_msgs/Clock``, simulated time) and
  ``~/episode_status`` (``std_msgs/String`` holding one JSON object, transient local:
  fields in :mod:`act_ros.ros.sim_bridge.messages`);
- in, reliable, like ros2_control controllers: ``joint_trajectory_controller/
  joint_trajectory`` (``trajectory_msgs/JointTrajectory``, joints matched by name) and
  ``forward_position_controller/commands`` (``std_msgs/Float64MultiArray``, contract
  order). Both are always accepted.

Every message of one step carries the same header stamp: the simulated time, which never
goes backwards (a new episode starts one period after the last one ended). Service
``~/reset`` (``std_srvs/Trigger``) starts an episode with the ``seed`` parameter (set the
parameter first for a chosen episode; std_srvs has no seeded reset); its answer says the
episode index and the seed used. Malformed commands are rejected with a throttled error
and counted in the status.

Usage: ``sim_bridge --ros-args -p mode:=lockstep -p image_height:=96 -p image_width:=128``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import mujoco  # noqa: E402
import numpy as np
import rclpy
from geometry_msgs.msg import PoseStamped
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.task import Future
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from act_ros.ros.conversions import MalformedMessageError
from act_ros.ros.node.parameters import DEFAULT_COMMAND_TOPICS, ParameterFile, ParamSpec, declare_parameters
from act_ros.ros.sim_bridge import messages as msgs
from act_ros.ros.sim_bridge.loop import BridgeLoop, EpisodeStartError
from act_ros.ros.sim_bridge.params import BRIDGE_PARAMETERS, read_bridge_settings
from act_ros.sim import select_headless_gl  # noqa: F401  (picks a headless GL before mujoco)
from act_ros.sim.config import SimConfig
from act_ros.sim.env import PortPickAlignEnv, SimObservation
from act_ros.sim.scene import BOX_BODY, CAMERAS, EE_SITE

LOG_THROTTLE_S = 2.0
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
CLOCK_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
STATUS_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.TRANSIENT_LOCAL)
STATUS_TOPIC = '~/episode_status'


def camera_topic(camera: str) -> str:
    """Image topic of a camera; the policy node's default ``cameras.<name>.topic``."""
    return f'camera/{camera}/image_raw'


class SimBridge(Node):
    """The simulated arm, cameras and objects as ROS 2 topics; see the module docstring.

    Raises ``ValueError`` (one line) on bad parameters. :meth:`start` starts the sim
    thread; :attr:`loop_finished` completes when it ends (with the exception, if one
    ended it).
    """

    def __init__(self, node_name: str = 'sim_bridge', **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        errors = declare_parameters(self, BRIDGE_PARAMETERS)
        if errors:
            raise ValueError('; '.join(errors))
        self.settings = s = read_bridge_settings(self)
        self.aloha = s.task != 'port_pick_align'
        if self.aloha:
            self.env, cameras, poses = self._aloha_env(s), ('top',), ()
            description = (f'{s.task}, {self.env.image_size[0]}x{self.env.image_size[1]} '
                           f'images, {self.env.episode_steps} steps per episode at '
                           f'{self.env.fps} Hz (ends at success)')
        else:
            config = SimConfig.from_yaml(s.sim_config_path or None, **s.sim_overrides())
            self.env, cameras = PortPickAlignEnv(config), CAMERAS
            poses = ('ee_pose', 'box_pose', 'pad_pose')
            self._ee_site = self.env.model.site(EE_SITE).id
            self._box_body = self.env.model.body(BOX_BODY).id
            description = (f'{config.camera_height}x{config.camera_width} images, '
                           f'{config.episode_steps} steps per episode at {config.fps} Hz')
        topics = ['joint_states', *poses, *map(camera_topic, cameras)]
        unknown = [t for t in s.policy_input_topics if t not in topics]
        if unknown:
            self.env.close()
            raise ValueError(f'policy_inputs: {unknown} are not topics of the bridge ({topics})')
        self.joint_names = list(self.env.contract.joint_names)

        sensor = qos_profile_sensor_data
        self.image_pubs = {cam: self.create_publisher(Image, camera_topic(cam), sensor)
                           for cam in cameras}
        self.joint_pub = self.create_publisher(JointState, 'joint_states', sensor)
        self.pose_pubs = {name: self.create_publisher(PoseStamped, name, sensor)
                          for name in poses}
        # What the policy reads (lockstep waits for a subscriber on each): by default the
        # joints and every camera; policy_inputs names others (the object poses, a subset
        # of the cameras).
        published = {'joint_states': self.joint_pub, **self.pose_pubs,
                     **{camera_topic(cam): pub for cam, pub in self.image_pubs.items()}}
        self.policy_input_pubs = ([published[t] for t in s.policy_input_topics]
                                  or [self.joint_pub, *self.image_pubs.values()])
        self.clock_pub = self.create_publisher(Clock, '/clock', CLOCK_QOS)
        self.status_pub = self.create_publisher(String, STATUS_TOPIC, STATUS_QOS)

        commands = MutuallyExclusiveCallbackGroup()
        self.command_subs = [
            self.create_subscription(
                JointTrajectory, DEFAULT_COMMAND_TOPICS['JointTrajectory'],
                lambda m: self._on_command(m, msgs.trajectory_target), COMMAND_QOS,
                callback_group=commands),
            self.create_subscription(
                Float64MultiArray, DEFAULT_COMMAND_TOPICS['Float64MultiArray'],
                lambda m: self._on_command(m, msgs.array_target), COMMAND_QOS,
                callback_group=commands),
        ]
        self.policy_reset = None
        if s.policy_reset_service:
            self.policy_reset = self.create_client(
                Trigger, s.policy_reset_service, callback_group=MutuallyExclusiveCallbackGroup())
        self.loop = BridgeLoop(
            self.env, mode=s.mode, lockstep_timeout_s=s.lockstep_timeout_s,
            publish=self._publish_observation, publish_status=self.publish_status,
            prepare_episode=self._reset_policy if self.policy_reset else None,
            first_seed=s.seed, autostart=s.autostart, episodes=s.episodes)
        self.create_service(Trigger, '~/reset', self._on_reset,
                            callback_group=MutuallyExclusiveCallbackGroup())
        self.add_post_set_parameters_callback(self._on_parameters_set)
        self.create_timer(s.status_period_s, self.publish_status,
                          callback_group=MutuallyExclusiveCallbackGroup())
        self.loop_finished: Future = Future()
        self._thread = threading.Thread(target=self._run_loop, name='sim-bridge-loop',
                                        daemon=True)
        self.get_logger().info(
            f'{s.mode} mode, {description}, next seed {s.seed}, '
            f'{"autostart" if s.autostart else "episodes start on ~/reset"}')

    @staticmethod
    def _aloha_env(s: Any) -> Any:
        """gym-aloha's task at the parameters' image size (default its own 480x640), ending
        at success; the joints named as config/robots/aloha/contract.yaml names them."""
        from act_ros.core.contract import load_contract
        from act_ros.sim.aloha.env import ALOHA_IMAGE_SIZE, ALOHA_JOINTS, AlohaEnv
        from act_ros.sim.tasks import sim_task

        if s.sim_config_path or s.contract_path:
            raise ValueError(f'task {s.task}: sim_config_path and contract_path do not apply '
                             '(gym-aloha defines the scene and the joints)')
        task = sim_task(s.task)
        size = (s.image_height, s.image_width) if s.image_height else ALOHA_IMAGE_SIZE
        env = AlohaEnv(task.aloha_task, cameras=('top',), image_size=size,
                       episode_steps=s.episode_steps or None, terminate_on_success=True)
        env.contract = load_contract(task.contract_path())
        if tuple(env.contract.joint_names) != ALOHA_JOINTS:
            raise ValueError(f'{env.contract.source}: joint_names must be gym-aloha\'s '
                             f'{list(ALOHA_JOINTS)}')
        return env

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the sim thread (episodes begin on ~/reset, or now with autostart)."""
        self._thread.start()

    def _run_loop(self) -> None:
        error = None
        try:
            self.loop.run()
        except Exception as exc:  # noqa: BLE001 - reported, and ends the process (main)
            if self.context.ok():
                self.get_logger().fatal(f'simulation loop failed: {type(exc).__name__}: {exc}')
                error = exc
            # else: Ctrl-C shut the context down while the loop was publishing; a stop.
        finally:
            self.env.close()  # the GL context belongs to this thread
        self.loop_finished.set_result(error)

    def destroy_node(self) -> None:
        self.loop.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)
        super().destroy_node()

    # ------------------------------------------------------------------ publishing
    def _publish_observation(self, obs: SimObservation, sensors: bool) -> None:
        stamp = msgs.time_msg(self.loop.sim_time_ns)
        frame = self.settings.frame_id
        self.clock_pub.publish(msgs.clock_msg(stamp))
        if self.aloha:  # joints and camera only (the policy sees what LeRobot's env gives)
            if sensors:
                self._publish_sensors(obs, stamp)
            return
        data = self.env.data
        ee_quat = np.empty(4)
        mujoco.mju_mat2Quat(ee_quat, data.site_xmat[self._ee_site])
        self.pose_pubs['ee_pose'].publish(msgs.pose_stamped(obs.ee_position, ee_quat, stamp, frame))
        self.pose_pubs['box_pose'].publish(msgs.pose_stamped(
            obs.box_pose[:3], data.xquat[self._box_body], stamp, frame))
        self.pose_pubs['pad_pose'].publish(msgs.pose_stamped(
            obs.pad_pose[:3], msgs.yaw_quaternion(obs.pad_pose[3]), stamp, frame))
        if sensors:
            self._publish_sensors(obs, stamp)

    def _publish_sensors(self, obs: Any, stamp: Any) -> None:
        self.joint_pub.publish(msgs.joint_state(obs.joint_positions, self.joint_names, stamp,
                                                getattr(obs, 'joint_efforts', None)))
        for cam in self.image_pubs:
            self.image_pubs[cam].publish(msgs.camera_image(obs.images[cam], stamp,
                                                           f'{cam}_camera'))

    def peers(self) -> dict[str, int]:
        """Matched command publishers, and subscribers of every observation topic the policy
        reads (minimum; ``policy_inputs``)."""
        observation = self.policy_input_pubs
        return {
            'command_publishers': sum(sub.get_publisher_count() for sub in self.command_subs),
            'observation_subscribers': min(pub.get_subscription_count() for pub in observation),
        }

    def publish_status(self) -> None:
        """Publish the episode status (every step, and as a heartbeat)."""
        status = self.loop.status()
        status['peers'] = self.peers()
        self.status_pub.publish(msgs.status_json(status))

    # ------------------------------------------------------------------ inputs
    def _on_command(self, msg: Any, parse: Any) -> None:
        try:
            target = parse(msg, self.joint_names)
        except MalformedMessageError as exc:
            self.loop.count_rejected()
            self.get_logger().error(f'rejected command: {exc}',
                                    throttle_duration_sec=LOG_THROTTLE_S)
            return
        self.loop.offer(target)

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        ticket = self.loop.request_reset()
        wait_s = self.settings.policy_reset_timeout_s * 2 + 30.0
        if not ticket.wait(wait_s):
            response.success = False
            response.message = f'episode did not start within {wait_s:g} s'
        else:
            response.success, response.message = ticket.success, ticket.message
        if response.success:
            self.get_logger().info(f'~/reset: {response.message}')
        else:
            self.get_logger().error(f'~/reset failed: {response.message}')
        return response

    def _on_parameters_set(self, parameters: list[Parameter]) -> None:
        for param in parameters:
            if param.name == 'seed':
                self.loop.next_seed = int(param.value)

    def _reset_policy(self) -> None:
        """Call the policy's reset service; raise :class:`EpisodeStartError` if it fails.

        In lockstep, first wait (same timeout) until the policy's subscriptions and command
        publisher are matched, so the episode's first observation is not lost to discovery.
        """
        client, timeout = self.policy_reset, self.settings.policy_reset_timeout_s

        def connected() -> bool:
            peers = self.peers()
            return bool(peers['command_publishers'] and peers['observation_subscribers'])

        if self.settings.mode == 'lockstep' and not self._wait(connected, timeout):
            self.get_logger().warning(f'no policy connected after {timeout:g} s ({self.peers()}); '
                                      'starting anyway, steps without commands will time out')
        if not self._wait(client.service_is_ready, timeout):
            raise EpisodeStartError(f"policy reset service '{client.srv_name}' is not available "
                                    f'after {timeout:g} s')
        future = client.call_async(Trigger.Request())
        if not self._wait(future.done, timeout):
            client.remove_pending_request(future)
            raise EpisodeStartError(f"policy reset service '{client.srv_name}' did not answer "
                                    f'within {timeout:g} s')
        response = future.result()
        if not response.success:
            raise EpisodeStartError(f"policy reset '{client.srv_name}' refused: {response.message}")

    def _wait(self, predicate: Any, timeout_s: float) -> bool:
        """Poll ``predicate`` up to ``timeout_s``; :class:`EpisodeStartError` on shutdown."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.loop.stopping:
                raise EpisodeStartError('the bridge is shutting down')
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

def main(args: list[str] | None = None) -> int:
    """Console script ``sim_bridge``: run the bridge until interrupted."""
    from act_ros.ros.spin import run_node

    def start(bridge: SimBridge, _executor: Any) -> None:
        bridge.start()

    def spin(executor: Any, bridge: SimBridge) -> int:
        executor.spin_until_future_complete(bridge.loop_finished)
        return 1 if bridge.loop_finished.result() is not None else 0

    def cannot_start(exc: BaseException) -> int:
        rclpy.logging.get_logger('sim_bridge').fatal(f'cannot start: {exc}')
        return 1

    return run_node(SimBridge, name='sim_bridge', args=args, num_threads=4, start=start,
                    spin=spin, shutdown_timeout_s=None, errors=(ValueError, OSError),
                    on_error=cannot_start, help_text=PARAMETERS.help)


def parameter_declarations() -> list[ParamSpec]:
    """The bridge's parameters as ``--help`` lists them."""
    return list(BRIDGE_PARAMETERS)


PARAMETERS = ParameterFile(
    'sim_bridge', 'The MuJoCo port-pick-align simulation on ROS 2 topics: cameras, '
    'joint states, object poses and /clock out, joint commands in.', parameter_declarations,
    'config/sim_bridge.yaml', 'act_ros/ros/sim_bridge/params.py',
    notes='Example: sim_bridge --ros-args --params-file config/sim_bridge.yaml -p '
    'mode:=lockstep.')


if __name__ == '__main__':
    sys.exit(main())
