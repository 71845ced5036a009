"""sim_bridge over real rclpy: a probe node sends commands and reads what the bridge publishes.

No mocks: the bridge and the probe exchange real messages over the middleware in a ROS
domain of the test's own. Small images (48x64) and short episodes keep it quick.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.ros, pytest.mark.sim]
rclpy = pytest.importorskip('rclpy')
pytest.importorskip('mujoco')

from geometry_msgs.msg import PoseStamped  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray, String  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.ros import conversions as conv  # noqa: E402
from act_ros.ros.harness import spinning, wait_until  # noqa: E402
from act_ros.ros.sim_bridge.bridge import STATUS_QOS, SimBridge  # noqa: E402
from act_ros.sim.config import GRIPPER_EMPTY_EFFORT_N  # noqa: E402

JOINTS = list(load_contract().joint_names)
DISCOVERY_S = 20.0  # generous: the test machine may be shared and slow
RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


def make_bridge(context, **params) -> SimBridge:
    values = {'mode': 'lockstep', 'autostart': False, 'image_height': 48, 'image_width': 64,
              'episode_steps': 20, 'lockstep_timeout_s': 60.0, 'status_period_s': 0.2,
              **params}
    return SimBridge(context=context,
                     parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def stamp_ns(msg) -> int:
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


class Probe(Node):
    """Records the bridge's output; sends commands, seeds and resets like a policy would."""

    def __init__(self, context, policy_reset_answers=None):
        super().__init__('probe', context=context)
        self.joint_states, self.poses, self.statuses, self.images = [], {}, [], []
        self.create_subscription(JointState, 'joint_states', self.joint_states.append,
                                 qos_profile_sensor_data)
        for name in ('ee_pose', 'box_pose', 'pad_pose'):
            self.poses[name] = []
            self.create_subscription(PoseStamped, name, self.poses[name].append,
                                     qos_profile_sensor_data)
        self.create_subscription(Image, 'camera/top/image_raw', self.images.append,
                                 qos_profile_sensor_data)
        self.wrist_images = []
        self.create_subscription(Image, 'camera/wrist/image_raw', self.wrist_images.append,
                                 qos_profile_sensor_data)
        self.create_subscription(String, '/sim_bridge/episode_status',
                                 lambda m: self.statuses.append(json.loads(m.data)), STATUS_QOS)
        self.trajectory_pub = self.create_publisher(
            JointTrajectory, 'joint_trajectory_controller/joint_trajectory', RELIABLE)
        self.array_pub = self.create_publisher(
            Float64MultiArray, 'forward_position_controller/commands', RELIABLE)
        self.reset_client = self.create_client(Trigger, '/sim_bridge/reset')
        self.param_client = self.create_client(SetParameters, '/sim_bridge/set_parameters')
        self.policy_resets = 0
        if policy_reset_answers is not None:
            self._answers = list(policy_reset_answers)
            self.create_service(Trigger, 'policy/reset', self._policy_reset)

    def _policy_reset(self, request, response):
        self.policy_resets += 1
        response.success = self._answers.pop(0) if self._answers else True
        response.message = 'ok' if response.success else 'not configured'
        return response

    @property
    def status(self):
        return self.statuses[-1] if self.statuses else None

    def send_trajectory(self, target, names=JOINTS):
        order = [JOINTS.index(n) if n in JOINTS else 0 for n in names]
        msg = JointTrajectory(joint_names=list(names))
        msg.points = [JointTrajectoryPoint(positions=[float(target[i]) for i in order])]
        self.trajectory_pub.publish(msg)

    def send_array(self, values):
        self.array_pub.publish(Float64MultiArray(data=[float(v) for v in values]))

    def call(self, client, request):
        assert client.wait_for_service(timeout_sec=DISCOVERY_S), f'{client.srv_name} missing'
        future = client.call_async(request)
        assert wait_until(future.done, DISCOVERY_S), f'{client.srv_name} did not answer'
        return future.result()

    def reset(self, seed=None):
        if seed is not None:
            request = SetParameters.Request(
                parameters=[Parameter('seed', value=seed).to_parameter_msg()])
            assert self.call(self.param_client, request).results[0].successful
        episode = self.status['episode'] if self.status else -1
        response = self.call(self.reset_client, Trigger.Request())
        assert response.success, response.message
        assert wait_until(lambda: self.status and self.status['episode'] > episode, DISCOVERY_S)
        return response

    def wait_step(self, step, timeout=DISCOVERY_S):
        assert wait_until(lambda: self.status and self.status['step'] >= step, timeout), \
            f'bridge did not reach step {step}: {self.status}'
        return self.status

    def latest_joints(self):
        return conv.joint_positions(self.joint_states[-1], JOINTS)

    def first_pose_after(self, name, after_ns):
        found = wait_until(lambda: [p for p in self.poses[name] if stamp_ns(p) > after_ns],
                           DISCOVERY_S)
        assert found, f'no {name} after {after_ns} ns'
        p = found[0].pose
        return np.array([p.position.x, p.position.y, p.position.z,
                         p.orientation.w, p.orientation.x, p.orientation.y, p.orientation.z])


def connect(bridge, probe):
    """Wait until commands and observations flow both ways (discovery)."""
    assert wait_until(lambda: bridge.peers()['command_publishers'] >= 2
                      and bridge.peers()['observation_subscribers'] >= 1
                      and probe.status is not None, DISCOVERY_S), bridge.peers()


@pytest.mark.parametrize('command', ['JointTrajectory', 'Float64MultiArray'])
def test_command_on_the_topic_moves_the_simulated_joints(rclpy_context, command):
    bridge, probe = make_bridge(rclpy_context), Probe(rclpy_context)
    with spinning(rclpy_context, bridge, probe):
        bridge.start()
        connect(bridge, probe)
        probe.reset(seed=3)
        assert wait_until(lambda: probe.joint_states, DISCOVERY_S)
        start = probe.latest_joints()
        target = start.copy()
        target[0] += 0.4       # shoulder_pan
        target[5] = 0.2        # gripper, normalized
        for step in range(1, 16):
            if command == 'JointTrajectory':  # reversed names: matched by name, not position
                probe.send_trajectory(target, names=list(reversed(JOINTS)))
            else:
                probe.send_array(target)
            probe.wait_step(step)
        assert wait_until(lambda: stamp_ns(probe.joint_states[-1]) >= 15, DISCOVERY_S)
        time.sleep(0.2)
        moved = probe.latest_joints()
        assert moved[0] - start[0] > 0.3, (start, moved)
        assert moved[5] < 0.5, (start, moved)
        # The actuator efforts ride along: the gripper at rest on nothing pushes nothing
        # (the release gate's evidence of an empty close, release_gate.empty_effort).
        efforts = conv.joint_efforts(probe.joint_states[-1], JOINTS)
        assert efforts is not None and np.all(np.isfinite(efforts)), probe.joint_states[-1]
        assert abs(efforts[5]) < GRIPPER_EMPTY_EFFORT_N, efforts
        np.testing.assert_allclose(moved[1:5], start[1:5], atol=0.1)
        assert probe.status['commands']['applied'] == 15
        assert probe.status['commands']['rejected'] == 0


def test_lockstep_advances_exactly_one_step_per_command(rclpy_context):
    bridge, probe = make_bridge(rclpy_context), Probe(rclpy_context)
    with spinning(rclpy_context, bridge, probe):
        bridge.start()
        connect(bridge, probe)
        probe.reset(seed=1)
        assert probe.wait_step(0)['step'] == 0
        time.sleep(0.5)
        assert bridge.env.step_index == 0, 'stepped without a command'
        hold = np.array(bridge.loop.held_target)
        for step in range(1, 6):
            probe.send_array(hold)
            probe.wait_step(step)
            time.sleep(0.3)  # nothing else may happen until the next command
            assert bridge.env.step_index == step
        status = probe.status
        assert status['commands']['applied'] == 5 and status['commands']['lockstep_timeouts'] == 0
        # One camera/joint observation per step (the one after the reset included), all
        # with distinct, increasing simulated-time stamps.
        stamps = [stamp_ns(m) for m in probe.joint_states]
        assert len(stamps) == 6 and stamps == sorted(set(stamps)), stamps
        assert len(probe.images) == 6
        image = probe.images[-1]
        assert (image.encoding, image.height, image.width) == ('rgb8', 48, 64)
        assert image.header.frame_id == 'top_camera' and stamp_ns(image) == stamps[-1]


def test_lockstep_without_commands_times_out_holds_and_finishes(rclpy_context):
    bridge = make_bridge(rclpy_context, lockstep_timeout_s=0.05, episode_steps=10)
    probe = Probe(rclpy_context)
    with spinning(rclpy_context, bridge, probe):
        bridge.start()
        connect(bridge, probe)
        probe.reset(seed=2)
        # A bound on waiting, not a speed check (the counts below are): a fresh-clone run on
        # a loaded 2-core machine had 9 of the 10 steps after 20 s.
        assert wait_until(lambda: probe.status['done'], 6 * DISCOVERY_S), probe.status
        status = probe.status
        assert status['commands']['lockstep_timeouts'] == 10 and status['step'] == 10
        assert status['commands']['applied'] == 0
        result = status['result']
        assert result['seed'] == 2 and result['steps'] == 10 and result['success'] is False
        assert set(result) >= {'position_error_m', 'yaw_error_deg', 'released', 'box_on_pad'}
        # The final state is on the pose topics, but no camera/joint observation follows
        # the last lock-step step: no command could answer it.
        final_ns = round(status['sim_time_s'] * 1e9)

        def last_pose_ns():
            return max(stamp_ns(p) for p in probe.poses['box_pose'])
        assert wait_until(lambda: last_pose_ns() >= final_ns - 10, DISCOVERY_S)
        assert last_pose_ns() == pytest.approx(final_ns, abs=10)
        assert max(stamp_ns(m) for m in probe.joint_states) < final_ns - 1_000_000


def test_reset_with_a_seed_reproduces_the_poses(rclpy_context):
    bridge, probe = make_bridge(rclpy_context), Probe(rclpy_context)

    def episode(seed):
        before = max([stamp_ns(p) for p in probe.poses['pad_pose']], default=-1)
        probe.reset(seed=seed)
        assert probe.status['seed'] == seed
        return (probe.first_pose_after('box_pose', before),
                probe.first_pose_after('pad_pose', before))

    with spinning(rclpy_context, bridge, probe):
        bridge.start()
        connect(bridge, probe)
        box_a, pad_a = episode(11)
        box_b, pad_b = episode(12)
        box_c, pad_c = episode(11)
    np.testing.assert_allclose(box_c, box_a, atol=1e-9)
    np.testing.assert_allclose(pad_c, pad_a, atol=1e-9)
    assert np.linalg.norm(box_b[:2] - box_a[:2]) > 1e-3 or np.linalg.norm(pad_b[:2] - pad_a[:2]) > 1e-3
    assert 0.13 - 1e-6 <= np.hypot(*pad_a[:2]) <= 0.225 + 1e-6  # within reach, per sim.yaml
    # Simulated time never goes backwards across episodes.
    stamps = [stamp_ns(p) for p in probe.poses['pad_pose']]
    assert stamps == sorted(stamps)


def test_malformed_commands_are_rejected_without_stepping(rclpy_context):
    bridge, probe = make_bridge(rclpy_context), Probe(rclpy_context)
    with spinning(rclpy_context, bridge, probe):
        bridge.start()
        connect(bridge, probe)
        probe.reset(seed=4)
        good = np.array(bridge.loop.held_target)
        probe.send_trajectory(good, names=JOINTS[:5])                   # a joint missing
        probe.send_trajectory(good, names=JOINTS[:5] + ['elbow_roll'])  # unknown joint
        probe.send_array(good[:5])                                       # too short
        probe.send_array([*good[:5], float('nan')])                      # not finite
        probe.trajectory_pub.publish(JointTrajectory(joint_names=JOINTS))  # no points
        assert wait_until(lambda: probe.status['commands']['rejected'] == 5, DISCOVERY_S), \
            probe.status
        time.sleep(0.3)
        assert bridge.env.step_index == 0 and probe.status['commands']['received'] == 0
        probe.send_trajectory(good)  # the bridge still takes good commands
        assert probe.wait_step(1)['commands']['applied'] == 1


def test_realtime_steps_at_the_wall_clock_rate_holding_the_last_command(rclpy_context):
    bridge = make_bridge(rclpy_context, mode='realtime', autostart=True, episodes=1,
                         episode_steps=45)
    probe = Probe(rclpy_context)
    arrivals = []
    probe.create_subscription(String, '/sim_bridge/episode_status',
                              lambda m: arrivals.append((time.monotonic(), json.loads(m.data))),
                              STATUS_QOS)
    with spinning(rclpy_context, bridge, probe):
        connect(bridge, probe)
        bridge.start()  # autostart: the episode begins at once, no ~/reset
        assert wait_until(lambda: probe.joint_states, DISCOVERY_S)
        target = probe.latest_joints()
        target[0] += 0.3
        probe.send_array(target)  # one command, held for the rest of the episode
        # 45 steps are 1.5 s of wall clock; a busy machine overruns steps (counted), so the
        # wait is long.
        assert wait_until(lambda: probe.status['done'], 3 * DISCOVERY_S), probe.status
        last_step_ns = round(probe.status['sim_time_s'] * 1e9)
        assert wait_until(lambda: stamp_ns(probe.joint_states[-1]) >= last_step_ns - 10,
                          DISCOVERY_S)
        time.sleep(0.5)  # a second episode would have begun by now
        status = probe.status
        assert status['episode'] == 0, 'episodes=1: no second episode'
        assert status['commands']['received'] == 1 and status['commands']['applied'] == 1
        assert abs(probe.latest_joints()[0] - target[0]) < 0.05
    running = [(t, s['step'], s['sim_time_s']) for t, s in arrivals
               if s['episode'] == 0 and s['step'] > 0]
    (t0, s0, sim0), (t1, s1, sim1) = running[0], running[-1]
    assert s1 == 45 and s1 - s0 >= 30, running
    assert sim1 - sim0 == pytest.approx((s1 - s0) / 30, abs=1e-6)
    assert t1 - t0 >= (s1 - s0) / 30 * 0.9, 'faster than the wall clock'


def test_policy_reset_service_runs_before_each_episode(rclpy_context):
    bridge = make_bridge(rclpy_context, policy_reset_service='/policy/reset',
                         policy_reset_timeout_s=5.0)
    probe = Probe(rclpy_context, policy_reset_answers=[True, False])
    with spinning(rclpy_context, bridge, probe):
        bridge.start()
        connect(bridge, probe)
        probe.reset(seed=7)
        assert probe.policy_resets == 1
        response = probe.call(probe.reset_client, Trigger.Request())
        assert not response.success and 'refused: not configured' in response.message
        assert probe.policy_resets == 2


def test_console_script_exits_with_one_line_on_a_bad_parameter(ros_domain_id):
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    proc = subprocess.run(
        [sys.executable, '-m', 'act_ros.ros.sim_bridge.bridge', '--ros-args', '-p', 'mode:=fast'],
        check=False, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if 'cannot start' in line]
    assert len(lines) == 1 and "mode: 'fast' is not one of" in lines[0], proc.stderr[-2000:]
