"""sim_bridge without a ROS graph: command parsing, status messages and the stepping loop."""

import math
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.sim
pytest.importorskip('rclpy')
pytest.importorskip('mujoco')

from std_msgs.msg import Float64MultiArray  # noqa: E402
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.ros.conversions import MalformedMessageError  # noqa: E402
from act_ros.ros.sim_bridge.loop import BridgeLoop  # noqa: E402
from act_ros.ros.sim_bridge.messages import (  # noqa: E402
    array_target,
    parse_status,
    status_json,
    time_msg,
    trajectory_target,
    yaw_quaternion,
)
from act_ros.sim import PortPickAlignEnv, SimConfig  # noqa: E402

JOINTS = list(load_contract().joint_names)


def trajectory(names, positions, extra_points=()):
    msg = JointTrajectory(joint_names=list(names))
    msg.points = [JointTrajectoryPoint(positions=[float(v) for v in positions])]
    msg.points += [JointTrajectoryPoint(positions=[float(v) for v in p]) for p in extra_points]
    return msg


def test_trajectory_joints_are_matched_by_name():
    values = dict(zip(JOINTS, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]))
    names = list(reversed(JOINTS))
    msg = trajectory(names, [values[n] for n in names], extra_points=[[9.0] * 6])
    np.testing.assert_allclose(trajectory_target(msg, JOINTS), [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])


@pytest.mark.parametrize('msg, words', [
    (trajectory(JOINTS[:5], [0.0] * 5), "missing ['gripper']"),
    (trajectory(JOINTS + ['conveyor'], [0.0] * 7), "unknown ['conveyor']"),
    (trajectory(JOINTS[:5] + ['shoulder_pan'], [0.0] * 6), 'twice'),
    (trajectory(JOINTS, [0.0] * 5), '5 positions for 6 joints'),
    (trajectory(JOINTS, [0.0] * 5 + [math.inf]), "non-finite target for joint(s) ['gripper']"),
    (JointTrajectory(joint_names=JOINTS), 'no points'),
])
def test_malformed_trajectories_are_rejected_with_a_clear_line(msg, words):
    with pytest.raises(MalformedMessageError, match=None) as info:
        trajectory_target(msg, JOINTS)
    assert words in str(info.value) and '\n' not in str(info.value)


def test_float64_array_is_taken_in_contract_order():
    np.testing.assert_allclose(array_target(Float64MultiArray(data=[1, 2, 3, 4, 5, 0.5]), JOINTS),
                               [1, 2, 3, 4, 5, 0.5])
    with pytest.raises(MalformedMessageError, match='has 7 values, expected 6'):
        array_target(Float64MultiArray(data=[0.0] * 7), JOINTS)
    with pytest.raises(MalformedMessageError, match='non-finite'):
        array_target(Float64MultiArray(data=[0.0] * 5 + [math.nan]), JOINTS)


def test_status_round_trip_and_small_helpers():
    status = {'episode': 2, 'done': True, 'result': {'success': False}}
    assert parse_status(status_json(status)) == status
    stamp = time_msg(3_000_000_123)
    assert (stamp.sec, stamp.nanosec) == (3, 123)
    w, x, y, z = yaw_quaternion(math.pi / 2)
    assert (x, y) == (0.0, 0.0) and w == pytest.approx(z) == pytest.approx(math.sqrt(0.5))


@pytest.fixture
def env():
    config = SimConfig.from_yaml(render=False, episode_steps=5)
    with PortPickAlignEnv(config) as environment:
        yield environment


def run_loop(env, **kwargs):
    published = []
    loop = BridgeLoop(env, publish=lambda obs, sensors: published.append((obs.step_index, sensors)),
                      publish_status=lambda: None, **kwargs)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    return loop, thread, published


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.01)


def test_lockstep_loop_steps_once_per_command_and_ends_without_a_sensor_observation(env):
    loop, thread, published = run_loop(env, mode='lockstep', lockstep_timeout_s=60.0)
    try:
        loop.offer(np.zeros(6))  # before any episode: dropped
        ticket = loop.request_reset(seed=5)
        assert ticket.wait(10.0) and ticket.success and ticket.used_seed == 5
        assert loop.counters.received == 0
        hold = loop.held_target.copy()
        for step in range(1, 6):
            loop.offer(hold)
            wait_for(lambda s=step: env.step_index == s)
        wait_for(lambda: loop.status()['done'])
        assert published == [(0, True), (1, True), (2, True), (3, True), (4, True), (5, False)]
        status = loop.status()
        assert status['state'] == 'done' and status['result']['steps'] == 5
        assert status['commands']['applied'] == 5 and loop.next_seed == 6
    finally:
        loop.stop()
        thread.join(5.0)
    assert not thread.is_alive()


def test_commands_arriving_faster_than_steps_are_superseded(env):
    loop, thread, published = run_loop(env, mode='lockstep', lockstep_timeout_s=60.0)
    try:
        assert loop.request_reset(seed=1).wait(10.0)
        with loop._cond:  # hold the loop so that three commands queue up
            for value in (0.1, 0.2, 0.3):
                loop.offer(np.full(6, value))
        wait_for(lambda: env.step_index == 1)
        time.sleep(0.2)
        assert env.step_index == 1
        np.testing.assert_allclose(loop.held_target, 0.3)
        assert loop.counters.superseded == 2 and loop.counters.applied == 1
    finally:
        loop.stop()
        thread.join(5.0)


def test_autostart_runs_the_given_number_of_episodes_with_consecutive_seeds(env):
    loop, thread, published = run_loop(env, mode='lockstep', lockstep_timeout_s=0.01,
                                       autostart=True, episodes=2, first_seed=40)
    try:
        wait_for(lambda: loop.episode == 1 and loop.status()['done'])
        time.sleep(0.2)
        assert loop.episode == 1 and loop.seed == 41
        assert loop.status()['commands']['lockstep_timeouts'] == 5
    finally:
        loop.stop()
        thread.join(5.0)


def test_bad_loop_settings_are_refused(env):
    with pytest.raises(ValueError, match="mode must be one of"):
        BridgeLoop(env, mode='fast', lockstep_timeout_s=1.0, publish=print, publish_status=print)
    with pytest.raises(ValueError, match='lockstep_timeout_s must be > 0'):
        BridgeLoop(env, mode='lockstep', lockstep_timeout_s=0.0, publish=print,
                   publish_status=print)


def test_published_object_poses_give_the_simulation_environment_state(env):
    """``box_pose`` and ``pad_pose`` as sim_bridge builds them, decoded as act_node decodes
    them, are ``SimObservation.environment_state`` (what the in-process evaluator feeds a
    checkpoint that takes the object poses): the node and the evaluator see one input."""
    from act_ros.core.control.decode import pose_components
    from act_ros.core.object_state import environment_state_from_poses
    from act_ros.ros.sim_bridge.messages import pose_stamped
    from act_ros.sim.scene import BOX_BODY

    box_body = env.model.body(BOX_BODY).id
    for seed in range(6):  # box and pad yaws drawn anew each time
        obs = env.reset(seed=seed)
        for _ in range(3):  # the box settles on the table
            obs = env.step(obs.joint_positions)
        # As SimBridge._publish_observation builds them.
        box = pose_components(pose_stamped(obs.box_pose[:3], env.data.xquat[box_body],
                                           time_msg(0), 'base_link'))
        pad = pose_components(pose_stamped(obs.pad_pose[:3], yaw_quaternion(obs.pad_pose[3]),
                                           time_msg(0), 'base_link'))
        np.testing.assert_allclose(environment_state_from_poses(box[:3], box[3:], pad[:3], pad[3:]),
                                   obs.environment_state, atol=1e-5)
