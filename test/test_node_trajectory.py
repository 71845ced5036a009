"""act_node's command streams over real topics against the chunk it plays: the rest of the
chunk as one multi-point JointTrajectory (points, velocities, times, stamps, the safety
chain on every point, an empty trajectory when the node must stop), the interpolated
Float64MultiArray stream, and the seams of what it sent (/diagnostics, ~/seams)."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')

from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.ros.harness import RobotHarness, spinning, wait_until  # noqa: E402
from act_ros.ros.node.act_node import ActNode  # noqa: E402

CONTRACT = load_contract()
JOINTS = list(CONTRACT.joint_names)
GRIPPER = JOINTS.index('gripper')
MEASURED = np.array([0.3, -0.4, 0.5, -0.2, 0.1, 0.6])
RATE_HZ = 30.0
SLOPE = 0.002  # the test chunk's change per row (rad)
SETTLE_S = 120.0


def ramp_model(runtime, slope=SLOPE):
    """Every chunk: row i = MEASURED + slope * i on every joint (the gripper too), so a
    message's points show which rows of the chunk they are."""
    def predict(obs):
        rows = np.arange(runtime.chunk_size, dtype=np.float64)[:, None]
        return MEASURED + slope * rows
    runtime.predictor.predict = predict


@pytest.fixture(scope='module')
def image48():
    return np.random.default_rng(3).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)


def make_node(context, checkpoint, **params):
    # Chunk mode unless a test says otherwise: the plans below are the chunk's rows as they
    # are (blend, the node's default, crossfades each new chunk in).
    values = {'model_path': str(checkpoint), 'autostart': False, 'torch_threads': 1,
              'mode': 'chunk',
              'backend': 'torch', 'execution': 'sync', 'max_obs_age_s': 2.0,
              'diagnostics_period_s': 0.2, 'control_rate_hz': RATE_HZ,
              'release_gate.enabled': False, 'visualization.enabled': False, **params}
    return ActNode(context=context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def start(node, slope=SLOPE):
    """Configure, put the ramp model in, activate."""
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS, \
        node.last_configure_error
    ramp_model(node.loop.runtime, slope)
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS


def seconds(time_msg) -> float:
    return time_msg.sec + time_msg.nanosec * 1e-9


def test_chunk_as_one_trajectory_matches_the_chunk(rclpy_context, tiny_checkpoint, image48):
    """Each tick sends the rest of the chunk: point k is row j + k of the chunk being
    played (j: the tick's row), reached (k + 1) periods after header.stamp, the tick's
    time, with the chunk's central-difference velocities and the last point at rest."""
    node = make_node(rclpy_context, tiny_checkpoint, command_trajectory='chunk')
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=image48)
    with spinning(rclpy_context, node, harness):
        start(node)
        chunk = node.loop.runtime.chunk_size
        assert wait_until(lambda: len(harness.commands) >= 40, SETTLE_S), \
            f'{len(harness.commands)} trajectories'
        node.trigger_deactivate()
        # Deactivation stops the controller's plan: an empty trajectory comes last.
        assert wait_until(lambda: not harness.commands[-1].message.points, 30.0)
    messages = [c.message for c in harness.commands]
    period = 1.0 / RATE_HZ
    rows_seen, stamps = set(), []
    for received, msg in zip(harness.commands, messages):
        if not msg.points:
            continue  # the hold sent at deactivation
        assert list(msg.joint_names) == JOINTS
        positions = np.array([p.positions for p in msg.points])
        velocities = np.array([p.velocities for p in msg.points])
        times = [seconds(p.time_from_start) for p in msg.points]
        row = int(round((positions[0, 0] - MEASURED[0]) / SLOPE))  # the tick's row j
        rows_seen.add(row)
        assert positions.shape == (chunk - row, len(JOINTS))  # the rest of the chunk
        np.testing.assert_allclose(positions,
                                   MEASURED + SLOPE * np.arange(row, chunk)[:, None], atol=1e-9)
        np.testing.assert_allclose(times, period * np.arange(1, chunk - row + 1), atol=1e-6)
        if len(positions) > 2:
            np.testing.assert_allclose(velocities[1:-1], SLOPE / period, atol=1e-9)
        np.testing.assert_allclose(velocities[-1], 0.0)
        stamp = seconds(msg.header.stamp)
        assert received.middleware_received_s is None or \
            stamp <= received.middleware_received_s + 1e-3
        stamps.append(stamp)
    assert np.all(np.diff(stamps) > 0)  # one plan per tick, stamped when it starts
    assert {0, 1, 2} <= rows_seen and len(rows_seen) >= 20


def test_every_point_passes_the_safety_chain(rclpy_context, tiny_checkpoint, image48):
    """A chunk that runs past the joint limits at 0.05 rad a row, with max_joint_velocity
    0.6 rad/s at 30 Hz (0.02 per tick):
    every point of every trajectory stays inside the limits and moves at most 0.02 from the
    point before it; when the inputs go stale the node sends an empty trajectory, so the
    controller stops instead of playing out the plan."""
    node = make_node(rclpy_context, tiny_checkpoint, command_trajectory='chunk',
                     max_joint_velocity=[0.6], max_obs_age_s=0.5)
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=image48)
    with spinning(rclpy_context, node, harness):
        start(node, slope=0.05)
        assert wait_until(lambda: len(harness.commands) >= 10, SETTLE_S)
        harness.enabled['joint_states'] = False  # the arm's state goes stale
        assert wait_until(lambda: any(not c.message.points for c in harness.commands), 30.0), \
            'no empty trajectory after the inputs went stale'
    lower, upper = CONTRACT.lower, CONTRACT.upper
    planned = [c for c in harness.commands if len(c.message.points) > 1]
    assert planned
    for command in planned:
        positions = np.array([p.positions for p in command.message.points])
        assert np.all(positions >= lower - 1e-12) and np.all(positions <= upper + 1e-12)
        assert np.all(np.abs(np.diff(positions, axis=0)) <= 0.02 + 1e-9)
        assert np.all(np.abs(positions[0, :GRIPPER] - MEASURED[:GRIPPER]) <= 0.02 + 1e-9)
    # The plan would have left the gripper's range (0.6 + 0.05 * 29): capped at its limit.
    assert max(np.array([p.positions for p in c.message.points])[:, GRIPPER].max()
               for c in planned) <= upper[GRIPPER]


@pytest.mark.parametrize('rate_hz', [30.0, 100.0])
def test_the_joint_speed_does_not_change_with_the_control_rate(rclpy_context, tiny_checkpoint,
                                                                image48, rate_hz):
    """The policy asks every joint to go 1 rad away (the gripper to open fully) and the arm
    stays at MEASURED. Each command moves every arm joint by the URDF's 3 rad/s times the
    period and asks for it within one period (time_from_start): 3 rad/s at 30 Hz and at
    100 Hz alike, where the old default of 0.1 rad per tick asked 3 and 10 rad/s. The
    gripper, limited against its previous command, opens at 3 per second too."""
    speed = 3.0  # urdf/so101_class.urdf <limit velocity>; no limit configured
    node = make_node(rclpy_context, tiny_checkpoint, control_rate_hz=rate_hz)
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=image48)
    with spinning(rclpy_context, node, harness):
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS, \
            node.last_configure_error
        runtime = node.loop.runtime
        runtime.predictor.predict = lambda obs: np.tile(MEASURED + 1.0, (runtime.chunk_size, 1))
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        assert wait_until(lambda: len(harness.commands) >= 10, SETTLE_S)
        node.trigger_deactivate()
    commands = [c.message for c in harness.commands]
    for msg in commands:
        (point,) = msg.points
        reach_s = seconds(point.time_from_start)
        assert reach_s == pytest.approx(1.0 / rate_hz, abs=1e-6)
        moved = np.abs(np.array(point.positions) - MEASURED)
        np.testing.assert_allclose(moved[:GRIPPER] / reach_s, speed, rtol=1e-6)
    # The first gripper command moves from the measured opening, at the same speed.
    first = np.array(commands[0].points[0].positions)
    assert first[GRIPPER] - MEASURED[GRIPPER] == pytest.approx(speed / rate_hz)


def test_interpolated_stream_between_ticks(rclpy_context, tiny_checkpoint, image48):
    """Float64MultiArray at 120 Hz with a 30 Hz policy: between two ticks the node sends
    the commands a quarter period apart on the way to the next planned action, so every
    value is MEASURED + SLOPE * (j + n/4), more than one message per tick."""
    node = make_node(rclpy_context, tiny_checkpoint, command_type='Float64MultiArray',
                     command_stream_rate_hz=120.0)
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=image48, command_type='Float64MultiArray')
    with spinning(rclpy_context, node, harness):
        start(node)
        assert wait_until(lambda: len(harness.commands) >= 80, SETTLE_S)
        ticks = node.counters.commands_published
        sent = node.sender.messages
        node.trigger_deactivate()
    assert sent >= 1.5 * ticks, (sent, ticks)
    quarters = [(c.positions - MEASURED) / (SLOPE / 4) for c in harness.commands]
    for q in quarters:
        np.testing.assert_allclose(q, np.round(q[0]), atol=1e-6)
    fractions = {int(round(q[0])) % 4 for q in quarters}
    assert fractions - {0}, 'no sample between two ticks arrived'


def test_seams_on_diagnostics_and_service(rclpy_context, tiny_checkpoint, image48):
    """Blend mode: the handovers of the commands sent are counted on /diagnostics
    (seams.*) and ~/seams returns the whole summary as JSON."""
    node = make_node(rclpy_context, tiny_checkpoint, mode='blend', n_action_steps=5,
                     blend_window='2')
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=image48)
    client = harness.create_client(Trigger, '/act_node/seams')
    with spinning(rclpy_context, node, harness):
        start(node)
        assert wait_until(lambda: len(harness.commands) >= 30, SETTLE_S)
        assert wait_until(lambda: (harness.latest_diagnostics() or (0, '', {}))[2].get(
            'seams.handovers', '0') not in ('0', 'n/a'), 30.0)
        assert client.wait_for_service(timeout_sec=30.0)
        future = client.call_async(Trigger.Request())
        assert wait_until(future.done, 30.0)
        node.trigger_deactivate()
    summary = json.loads(future.result().message)
    assert future.result().success and summary['handovers'] >= 4
    assert summary['arm_joints'] == JOINTS[:GRIPPER] + JOINTS[GRIPPER + 1:]
    values = harness.latest_diagnostics()[2]
    for key in ('seams.over_within_p99', 'seams.velocity_jump_max',
                'seams.within_chunk_velocity_step_p99', 'seams.velocity_jump_max.gripper'):
        assert key in values, key
