"""act_node over real rclpy: a harness node publishes cameras and joint states, we check
what arrives on the command and diagnostics topics (no mocks of rclpy)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.core.inference.backends import installed_backends  # noqa: E402
from act_ros.ros.harness import (  # noqa: E402
    FAST_ROBOT_MAX_JOINT_VELOCITY,
    RobotHarness,
    fast_robot_model,
    spinning,
    wait_until,
)
from act_ros.ros.node.act_node import ActNode  # noqa: E402

CONTRACT = load_contract()
JOINTS = list(CONTRACT.joint_names)
LOWER, UPPER = CONTRACT.lower, CONTRACT.upper
# Distinct measured positions, so a joint taken by position instead of by name shows.
MEASURED = np.array([0.3, -0.4, 0.5, -0.2, 0.1, 0.6])
DISCOVERY_S = 20.0  # generous: the test machine may be shared and slow
SETTLE_S = 120.0  # a bound on waiting for what must come, not a speed requirement
# Inputs count as fresh for this long, in the tests about staleness too: on a busy 2-core
# machine the publishing thread can be held back for up to a second, which the node rightly
# treats as stale input (no command, and the runtime restarts when data returns, dropping a
# chunk still in flight). With a shorter limit such a machine flickers between stale and
# fresh faster than a chunk is computed, and no command comes at all (seen with 0.5 s, the
# tiny model taking 1 s per chunk under load).
FRESH_S = 2.0
# A command computed from inputs that were fresh can still arrive this long after they went
# stale on a busy machine (the tick, the model and the delivery are each held back).


@pytest.fixture(scope='module')
def checkpoint(tiny_checkpoint):
    return str(tiny_checkpoint)


@pytest.fixture(scope='module')
def image():
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)


def make_node(context, checkpoint, *, fast_joints: bool = False, **params) -> ActNode:
    # In-process inference keeps these tests fast; the default (a child process) is tested
    # below and through the console script.
    # backend torch: no ONNX export per checkpoint (backend auto: test_backends.py).
    # fast_joints: commands pass the speed limit unchanged (the same kinematics, fast joints).
    values = {'model_path': checkpoint, 'autostart': False, 'torch_threads': 1,
              'backend': 'torch', 'execution': 'async', 'max_obs_age_s': FRESH_S,
              'diagnostics_period_s': 0.2, **params}
    if fast_joints:
        values.update(max_joint_velocity=FAST_ROBOT_MAX_JOINT_VELOCITY,
                      urdf_path=str(fast_robot_model(Path(checkpoint).parent)))
    return ActNode(context=context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def make_harness(context, image, joints=None, **kwargs) -> RobotHarness:
    joints = joints if joints is not None else dict(zip(JOINTS, MEASURED))
    return RobotHarness(context=context, joints=joints, image=image, **kwargs)


def wait_commands(harness, since, count, timeout=SETTLE_S):
    got = wait_until(lambda: len(harness.commands_since(since)) >= count, timeout)
    assert got, f'expected {count} commands, got {len(harness.commands_since(since))}'
    return harness.commands_since(since)


def wait_diagnostics(harness, predicate, timeout=10.0):
    found = wait_until(lambda: any(predicate(*d[1:]) for d in list(harness.diagnostics)), timeout)
    last = harness.latest_diagnostics()
    assert found, f'no matching diagnostics; last: {last}'


@pytest.mark.parametrize('command_type', ['JointTrajectory', 'Float64MultiArray'])
def test_shuffled_joint_states_give_commands_in_contract_order(rclpy_context, checkpoint,
                                                               image, command_type):
    # JointState in reverse order with extra joints around; every command must be in
    # contract order, inside the limits, each arm joint within a step (max_joint_velocity
    # 1.5 rad/s at 30 Hz: 0.05 per tick) of its measured position and the gripper within a
    # step of its previous command
    # (the first one, and one after a tick without a command: of its measured position).
    joints = {'camera_tilt': 2.5}
    joints.update({name: float(v) for name, v in reversed(list(zip(JOINTS, MEASURED)))})
    joints['conveyor'] = -3.0
    node = make_node(rclpy_context, checkpoint, command_type=command_type,
                     max_joint_velocity=[1.5], **{'release_gate.enabled': False})
    harness = make_harness(rclpy_context, image, joints=joints, command_type=command_type)
    with spinning(rclpy_context, node, harness):
        assert node.start()
        commands = wait_commands(harness, 0.0, 10)
    gripper = JOINTS.index('gripper')
    arm = [i for i in range(6) if i != gripper]
    previous_gripper = None
    for cmd in commands:
        assert cmd.positions.shape == (6,) and np.all(np.isfinite(cmd.positions))
        if command_type == 'JointTrajectory':
            assert list(cmd.joint_names) == JOINTS
        assert np.all(cmd.positions >= LOWER) and np.all(cmd.positions <= UPPER)
        assert np.all(np.abs(cmd.positions[arm] - MEASURED[arm]) <= 0.05 + 1e-9), cmd.positions
        # The gripper's reference is its previous command, or its measured position where
        # a tick went without a command (a slow machine's queue running dry: safety.py).
        step = abs(cmd.positions[gripper] - MEASURED[gripper])
        if previous_gripper is not None:
            step = min(step, abs(cmd.positions[gripper] - previous_gripper))
        assert step <= 0.05 + 1e-9, (cmd.positions[gripper], previous_gripper)
        previous_gripper = cmd.positions[gripper]


def expected_action(checkpoint, rgb, state, environment_state=None):
    """What the runtime computes for this observation (the node must send the same)."""
    from act_ros.core.inference.runtime import Observation, PolicyRuntime, RuntimeConfig
    with PolicyRuntime(RuntimeConfig(checkpoint, execution='sync', n_action_steps=1,
                                     contract=CONTRACT, warmup=False)) as runtime:
        action = runtime.act(Observation(images={'top': rgb, 'wrist': rgb}, state=state,
                                         environment_state=environment_state))
    return np.clip(action, LOWER, UPPER)


# The runtime's action as it is: a chunk per tick (sync, one step), played as computed
# (chunk mode: blend, the default, would crossfade each new chunk into the last).
EXACT = dict(execution='sync', n_action_steps=1, mode='chunk', fast_joints=True,
             **{'release_gate.enabled': False})


def steady_command(harness, after):
    """The command once two full ticks have run on the inputs published since ``after``."""
    commands = wait_commands(harness, after, 3)
    return commands[-1].positions


def test_raw_encodings_give_the_runtime_action(rclpy_context, checkpoint, image):
    expected = expected_action(checkpoint, image, MEASURED)
    node = make_node(rclpy_context, checkpoint, **EXACT)
    harness = make_harness(rclpy_context, image)
    with spinning(rclpy_context, node, harness):
        assert node.start()
        for encoding in ('rgb8', 'bgr8', 'bgra8', 'rgba8'):
            harness.encoding = encoding
            got = steady_command(harness, time.monotonic() + 0.1)
            np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=encoding)
        # Control: the same bytes read with the channels swapped must change the action,
        # otherwise the comparison above would prove nothing.
        harness.image, harness.encoding = np.ascontiguousarray(image[:, :, ::-1]), 'rgb8'
        swapped = steady_command(harness, time.monotonic() + 0.1)
        assert not np.allclose(swapped, expected, atol=1e-5)


def test_compressed_png_gives_the_runtime_action(rclpy_context, checkpoint, image):
    expected = expected_action(checkpoint, image, MEASURED)
    node = make_node(rclpy_context, checkpoint, image_transport='compressed', **EXACT)
    harness = make_harness(rclpy_context, image, encoding='png')
    with spinning(rclpy_context, node, harness):
        assert node.start()
        got = steady_command(harness, time.monotonic() + 0.1)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def assert_silent_once_stale(node, harness, what, ticks=20):
    """After an input stopped: once a tick found it stale, ``ticks`` more ticks send
    nothing, and every command sent before arrives. Counted in the node's ticks, not in
    seconds: a stalled machine held every thread for seconds."""
    counters = node.counters
    stale = counters.stale_ticks
    assert wait_until(lambda: counters.stale_ticks > stale, SETTLE_S)
    sent = counters.commands_published
    assert wait_until(lambda: counters.stale_ticks >= stale + ticks, SETTLE_S)
    assert counters.commands_published == sent, \
        f'{counters.commands_published - sent} commands after {what} went stale'
    assert wait_until(lambda: len(harness.commands) == sent, SETTLE_S)


@pytest.mark.parametrize('execution', ['async', 'process'])
def test_stale_camera_stops_commands_then_they_resume(rclpy_context, checkpoint, image,
                                                       execution):
    node = make_node(rclpy_context, checkpoint, execution=execution)  # max age FRESH_S
    harness = make_harness(rclpy_context, image)
    with spinning(rclpy_context, node, harness):
        assert node.start()
        wait_commands(harness, 0.0, 5)
        harness.enabled['top'] = False
        assert_silent_once_stale(node, harness, 'the top camera')
        wait_diagnostics(harness, lambda level, msg, values: level == DiagnosticStatus.ERROR
                         and 'image/top' in values['input_problems'])
        harness.enabled['top'] = True
        wait_commands(harness, time.monotonic(), 3)
        wait_diagnostics(harness, lambda level, msg, values: int(values['runtime_resets']) >= 1
                         and values['input_problems'] == 'none')
    # The speed limits the safety chain applies are on /diagnostics, per joint.
    values = harness.latest_diagnostics()[2]
    limits = node.settings.speed_limits
    for name, speed, source in zip(limits.joint_names, limits.speed, limits.sources):
        assert float(values[f'speed_limit.{name}']) == pytest.approx(speed, abs=1e-3)
        assert values[f'speed_limit.{name}.source'] == source
        assert float(values[f'speed_limit.{name}.per_tick']) == pytest.approx(
            speed * node.settings.period_s, abs=1e-3)  # /diagnostics shows 3 decimals


# The moments of a start-up, in order (act_ros.core.startup.EVENTS), by execution.
STARTUP_PHASES = {
    'process': ['import', 'node_init', 'wait_configure', 'child_start', 'model_import',
                'checkpoint_load', 'backend_build', 'warmup', 'ready', 'latency_measure',
                'configure_end', 'activate', 'first_request', 'first_chunk', 'first_command'],
    'async': ['import', 'node_init', 'wait_configure', 'model_import', 'checkpoint_load',
              'backend_build', 'warmup', 'latency_measure', 'configure_end', 'activate',
              'first_request', 'first_chunk', 'first_command'],
}


def _startup_phases(values):
    """Phase -> seconds from ``startup.*`` diagnostics (overlapped steps and notes left out)."""
    return {key[len('startup.'):-len('_s')]: float(value) for key, value in values.items()
            if key.startswith('startup.') and key.endswith('_s')
            and key != 'startup.time_to_first_command_s' and not key.endswith('at_s')}


@pytest.mark.parametrize('execution', ['async', 'process'])
def test_startup_phases_add_up_to_the_time_to_the_first_command(rclpy_context, checkpoint,
                                                                 image, execution):
    node = make_node(rclpy_context, checkpoint, execution=execution)
    harness = make_harness(rclpy_context, image)
    with spinning(rclpy_context, node, harness):
        assert node.start()
        wait_commands(harness, 0.0, 1)
        wait_diagnostics(harness, lambda level, msg, values:
                         values.get('startup.time_to_first_command_s', 'n/a') != 'n/a')
        values = harness.latest_diagnostics()[2]
        frozen = node.startup.total_s()
        wait_commands(harness, time.monotonic(), 5)
        assert node.startup.total_s() == frozen  # the first command's, not a later one
    total = float(values['startup.time_to_first_command_s'])
    phases = _startup_phases(values)
    assert list(phases) == STARTUP_PHASES[execution], list(phases)
    assert all(seconds >= 0.0 for seconds in phases.values()), phases
    # Each value is rounded to 1 ms on /diagnostics.
    assert sum(phases.values()) == pytest.approx(total, abs=0.002 * len(phases))
    assert 0.0 < phases['model_import'] + phases['checkpoint_load'] < total
    assert values['startup.backend_cache'] == 'none'
    if execution == 'process':
        assert values['startup.inference_child'] == 'torch + LeRobot'
        assert float(values['startup.node_setup_s (overlapped)']) >= 0.0
    assert 0.0 < float(values['startup.inputs_complete_at_s']) < total


def test_one_thread_spins_the_node_and_harness_on_a_single_threaded_executor(
        rclpy_context, checkpoint, image):
    """``spinning(..., num_threads=1)`` (the benchmarks' load generator): rclpy's
    single-threaded executor, which blocks in its wait instead of looping while a callback
    is pending (ros2/rclpy#1452); frames go out and commands come back through it."""
    from rclpy.executors import SingleThreadedExecutor

    node = make_node(rclpy_context, checkpoint)
    harness = make_harness(rclpy_context, image)
    with spinning(rclpy_context, node, harness, num_threads=1) as executor:
        assert isinstance(executor, SingleThreadedExecutor)
        assert node.start()
        commands = wait_commands(harness, 0.0, 5)
    assert harness.published >= 5 and all(np.isfinite(c.positions).all() for c in commands)


def test_model_only_calls_time_the_model_alone_at_configure(rclpy_context, checkpoint, image):
    """``model_only_calls``: that many calls of the model alone at configure are the
    model-only time beside the latency split on /diagnostics (by default the two calls
    behind the real-time verdict)."""
    for calls, expected in ((0, 2), (5, 5)):
        node = make_node(rclpy_context, checkpoint, model_only_calls=calls)
        harness = make_harness(rclpy_context, image)
        with spinning(rclpy_context, node, harness):
            assert node.start()
            wait_commands(harness, 0.0, 1)
            wait_diagnostics(harness, lambda level, msg, values, n=str(expected):
                             values.get('latency_split.model_only_calls') == n)
            model_only = float(harness.latest_diagnostics()[2]['latency_split.model_only_ms'])
        assert model_only > 0.0


def test_a_failed_configure_does_not_count_in_the_next_start_up(rclpy_context, checkpoint,
                                                                image):
    node = make_node(rclpy_context, '/nonexistent/checkpoint', execution='process')
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        failed_at = node.startup.events['configure_started']
        node.set_parameters([Parameter('model_path', value=checkpoint)])
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.startup.events['configure_started'] > failed_at
        assert node.startup.events['child_running'] > node.startup.events['configure_started']
        assert 'latency_measured' in node.startup.events and not node.startup.complete
    finally:
        node.destroy_node()


def _nan_joint(msg):
    msg.position[JOINTS.index('elbow_flex')] = float('nan')
    return msg


def _truncated(msg):
    msg.data = bytes(msg.data)[:-5]
    return msg


def _yuv(msg):
    msg.encoding = 'yuv422'
    return msg


def test_malformed_messages_are_rejected_and_the_node_keeps_running(rclpy_context, checkpoint,
                                                                     image):
    node = make_node(rclpy_context, checkpoint)
    harness = make_harness(rclpy_context, image)
    cases = [('joint_states', _nan_joint, "'elbow_flex'"),
             ('wrist', _truncated, 'height*step'),
             ('top', _yuv, "encoding 'yuv422'")]
    with spinning(rclpy_context, node, harness):
        assert node.start()
        wait_commands(harness, 0.0, 3)
        for stream, mutate, words in cases:
            # Bad copies of the harness's cached image: mutate a fresh message each time.
            harness.mutate[stream] = (mutate if stream == 'joint_states'
                                      else lambda m, f=mutate: f(_copy_image(m)))
            # Counted by the node, not timed: once two bad messages were rejected (a tick
            # that ran beside the first may still have sent), five more rejections pass
            # with no command published.
            first = node.inputs.rejections
            assert wait_until(lambda n=first + 2: node.inputs.rejections >= n, 20.0)
            published = node.counters.commands_published
            assert wait_until(lambda n=first + 7: node.inputs.rejections >= n, 20.0)
            assert node.counters.commands_published == published, \
                f'commands from a bad {stream}'
            wait_diagnostics(harness, lambda level, msg, values, w=words:
                             level == DiagnosticStatus.ERROR and w in values['last_rejection'])
            del harness.mutate[stream]
            wait_commands(harness, time.monotonic(), 3)  # alive: commands resume
    assert node.inputs.rejections >= 3


def _copy_image(msg):
    from sensor_msgs.msg import Image
    out = Image(height=msg.height, width=msg.width, encoding=msg.encoding, step=msg.step,
                is_bigendian=msg.is_bigendian)
    out.header = msg.header
    out.data = bytes(msg.data)
    return out


@pytest.mark.parametrize('params, words', [
    ({'device': 'tpu'}, "unknown device 'tpu'"),
    ({'model_path': ''}, 'model_path is not set'),
    ({'model_path': '/nonexistent/checkpoint'}, '/nonexistent/checkpoint'),
    ({'control_rate_hz': 5000.0}, 'control_rate_hz: 5000.0 is out of range'),
    ({'control_rate_hz': 0.5}, 'control_rate_hz: expected 0 (the contract fps, 30) or 1 to '
                                '1000 Hz, got 0.5'),
    ({'n_action_steps': -1}, 'n_action_steps: -1 is out of range'),
    ({'mode': 'bogus'}, "mode: 'bogus' is not one of"),
    ({'joint_names': ['a', 'b']}, 'joint_names: expected 6 distinct names'),
    ({'max_joint_step': [0.1, -0.1]}, 'max_joint_step'),
    ({'max_joint_velocity': [0.0]}, 'max_joint_velocity: expected 1 or 6 positive values'),
    # The package's URDF allows 3 rad/s: more is refused, named per joint.
    ({'max_joint_velocity': [3.0, 3.0, 3.0, 3.0, 4.5, 3.0]},
     "max_joint_velocity is above the robot model's <limit velocity>"),
    ({'max_joint_step': [0.2]}, 'max_joint_step [0.2] per tick at 30 Hz is above'),
    ({'max_joint_step': [0.05], 'max_joint_velocity': [1.5]},
     'max_joint_step is deprecated and replaced by max_joint_velocity'),
    ({'n_action_steps': 64}, 'n_action_steps (64) cannot exceed'),
    ({'model_only_calls': -1}, 'model_only_calls: -1 is out of range'),
])
def test_bad_parameters_fail_configure(rclpy_context, checkpoint, params, words):
    node = make_node(rclpy_context, checkpoint, **params)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.lifecycle_state == 'unconfigured'
        assert words in node.last_configure_error
        assert '\n' not in node.last_configure_error
    finally:
        node.destroy_node()


def test_console_script_exits_with_one_line_on_bad_configuration(ros_domain_id):
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    proc = subprocess.run(
        [sys.executable, '-m', 'act_ros.ros.node.act_node', '--ros-args', '-p', 'device:=tpu',
         '-p', 'model_path:=/nonexistent'],
        check=False, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    errors = [line for line in lines if 'configure failed' in line]
    assert len(errors) == 1 and "unknown device 'tpu'" in errors[0], proc.stderr[-2000:]


def test_console_script_drives_commands_with_the_model_in_a_child_process(
        rclpy_context, ros_domain_id, checkpoint, image, tmp_path):
    """The deployed path with its defaults: ``act_node`` as its own process, the model in a
    child process, a single-threaded executor; SIGINT stops it and its inference process."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    log = tmp_path / 'act_node.log'
    # Its own copy: backend auto exports the checkpoint next to it on the first start,
    # which must not change the session's shared checkpoint for other tests.
    own = tmp_path / 'checkpoint'
    shutil.copytree(checkpoint, own)
    with log.open('w') as out:
        proc = subprocess.Popen(
            [sys.executable, '-m', 'act_ros.ros.node.act_node', '--ros-args', '-p',
             f'model_path:={own}', '-p', 'torch_threads:=1', '-p',
             'release_gate.enabled:=false'],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        harness = make_harness(rclpy_context, image)
        with spinning(rclpy_context, harness):
            got = wait_until(lambda: len(harness.commands) >= 10 or proc.poll() is not None, 400.0)
            assert got and proc.poll() is None, log.read_text()[-3000:]
        children = _child_pids(proc.pid)
        assert children, 'no inference child process'
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert 'mode blend (6-tick crossfade)/process' in output, output[-3000:]
    assert 'single_threaded executor' in output
    # backend auto: openvino where it is installed (make test installs it), else torch.
    chosen = 'openvino' if 'openvino' in installed_backends() else 'torch'
    assert f'backend: {chosen} (auto: ' in output, output[-3000:]
    # One line at the first command: the time from process start and its phases.
    lines = [line for line in output.splitlines() if 'start-up: first command' in line]
    assert len(lines) == 1, output[-3000:]
    total = float(lines[0].split('first command ')[1].split(' s after process start')[0])
    phases = lines[0].split('process start: ')[1].split(' s (')[0].split(', ')
    seconds = [float(part.rsplit(' ', 1)[1]) for part in phases]
    assert [part.rsplit(' ', 1)[0] for part in phases][:5] == [
        'import', 'node init', 'wait configure', 'child start', 'model import']
    assert sum(seconds) == pytest.approx(total, abs=0.01 * len(seconds))
    # The inference process ends with the node.
    wait_until(lambda: all(_proc_state(pid) in ('gone', 'Z') for pid in children), 20.0)
    for pid in children:
        assert _proc_state(pid) in ('gone', 'Z'), (
            f"child {pid} alive: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}")


def test_waiting_line_names_each_missing_input_with_its_topic_and_qos(
        rclpy_context, ros_domain_id, checkpoint, image, tmp_path):
    """``act_node`` in a namespace, its wrist camera remapped: while the wrist images never
    come, the node's repeated line names that input with the topic it resolved (namespace
    and remap applied), the message type and the QoS; inputs that arrive are not named."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    log = tmp_path / 'act_node.log'
    with log.open('w') as out:
        proc = subprocess.Popen(
            [sys.executable, '-m', 'act_ros.ros.node.act_node', '--ros-args',
             '-r', '__ns:=/arm1', '-r', 'camera/wrist/image_raw:=/elsewhere/wrist',
             '-p', f'model_path:={checkpoint}', '-p', 'execution:=async', '-p', 'backend:=torch',
             '-p', 'torch_threads:=1', '-p', 'release_gate.enabled:=false'],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    waiting = 'no command, inputs unusable: '

    def settled_line():  # once the harness is discovered: only the wrist camera missing
        lines = [line for line in log.read_text().splitlines() if waiting in line]
        return next((line for line in lines if 'joint_states' not in line), None)

    try:
        harness = make_harness(rclpy_context, image, cameras=('top',), namespace='arm1')
        with spinning(rclpy_context, harness):
            line = wait_until(lambda: settled_line() or proc.poll() is not None, SETTLE_S)
            assert line and proc.poll() is None, log.read_text()[-3000:]
            line = settled_line()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()
    assert line.split(waiting, 1)[1] == ('image/wrist on /elsewhere/wrist (sensor_msgs/Image, '
                                         'best effort, depth 5): never received'), line


def _child_pids(pid):
    tasks = Path(f'/proc/{pid}/task').glob('*/children')
    return [int(c) for task in tasks for c in task.read_text().split()]


def _proc_state(pid):
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
    except OSError:
        return 'gone'


def call(client, request, timeout=SETTLE_S):
    assert client.wait_for_service(timeout_sec=timeout), f'{client.srv_name} not available'
    future = client.call_async(request)
    assert wait_until(future.done, timeout), f'{client.srv_name} did not answer'
    return future.result()


def change_state(client, transition_id):
    return call(client, ChangeState.Request(transition=Transition(id=transition_id))).success


def test_lifecycle_over_services_nothing_published_unless_active(rclpy_context, checkpoint,
                                                                 image):
    node = make_node(rclpy_context, checkpoint)
    harness = make_harness(rclpy_context, image)
    change = harness.create_client(ChangeState, '/act_node/change_state')
    reset = harness.create_client(Trigger, '/act_node/reset')
    with spinning(rclpy_context, node, harness):
        assert change_state(change, Transition.TRANSITION_CONFIGURE)
        assert node.lifecycle_state == 'inactive'
        time.sleep(1.0)  # inputs flow, the node is configured but inactive
        assert not harness.commands and not harness.diagnostics

        assert change_state(change, Transition.TRANSITION_ACTIVATE)
        wait_commands(harness, 0.0, 5)
        response = call(reset, Trigger.Request())
        assert response.success, response.message
        wait_commands(harness, time.monotonic(), 3)  # commanding again after the reset

        assert change_state(change, Transition.TRANSITION_DEACTIVATE)
        stopped = time.monotonic()
        time.sleep(0.8)
        assert not harness.commands_since(stopped + 0.1), 'commands after deactivate'
        assert change_state(change, Transition.TRANSITION_CLEANUP)
        assert node.lifecycle_state == 'unconfigured'


def test_observation_trigger_sends_one_command_per_observation(rclpy_context, checkpoint,
                                                               image):
    """Counted by the observations' stamps, not by waiting: the node answers each one once
    however slow its model runs on a busy machine."""
    node = make_node(rclpy_context, checkpoint, trigger='observation', execution='sync')
    harness = make_harness(rclpy_context, image, rate_hz=None)

    def step():
        """One observation answered, its command arrived (a set that lost an image on a
        busy machine is sent again under a new stamp: the node answers only whole sets)."""
        return harness.publish_until_answered(node)

    with spinning(rclpy_context, node, harness):
        assert node.start()
        # Discovery: publish until the first command comes back; the commands of the other
        # observations published meanwhile may still be on their way, and the command queue,
        # which keeps only the newest, may drop some of that burst on a busy machine ...
        assert wait_until(lambda: harness.publish_once() and bool(harness.commands),
                          SETTLE_S, interval_s=0.3)
        # ... so the burst is over once one more observation is answered and its command
        # (by the publisher's sequence number) has arrived; from then on, one each.
        step()
        for _ in range(3):
            before, seq = len(harness.commands), node.counters.commands_published
            step()
            assert node.counters.commands_published == seq + 1
            assert len(harness.commands) == before + 1


# Object poses (observation.environment_state), robot base frame: position, (w, x, y, z).
def _yaw(rad):
    return (float(np.cos(rad / 2)), 0.0, 0.0, float(np.sin(rad / 2)))


BOX = ((0.22, -0.06, 0.015), _yaw(0.3))
PAD = ((0.26, 0.11, 0.005), _yaw(-0.2))


def _environment_state(box, pad):
    from act_ros.core.object_state import environment_state_from_poses
    return environment_state_from_poses(box[0], box[1], pad[0], pad[1])


def test_object_poses_reach_the_policy(rclpy_context, tiny_pose_checkpoint, image):
    """A checkpoint that takes the object poses: the node subscribes box_pose and pad_pose
    (one pad subscription, shared with the release gate's pad_source topic), converts them
    as the runtime expects and sends the runtime's action; another box pose changes it."""
    checkpoint = str(tiny_pose_checkpoint)
    expected = expected_action(checkpoint, image, MEASURED, _environment_state(BOX, PAD))
    moved = ((0.18, 0.04, 0.015), _yaw(0.7))
    expected_moved = expected_action(checkpoint, image, MEASURED, _environment_state(moved, PAD))
    assert not np.allclose(expected, expected_moved, atol=1e-4)  # the poses matter
    node = make_node(rclpy_context, checkpoint, pad_source='topic', **EXACT)
    harness = make_harness(rclpy_context, image)
    harness.poses = {'box_pose': BOX, 'pad_pose': PAD}
    with spinning(rclpy_context, node, harness):
        assert node.start()
        assert set(node.inputs.required) >= {'object_pose/box', 'object_pose/pad'}
        got = steady_command(harness, time.monotonic() + 0.1)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        harness.poses['box_pose'] = moved
        got = steady_command(harness, time.monotonic() + 0.1)
        np.testing.assert_allclose(got, expected_moved, atol=1e-5)
        pad_subscribers = [info for info in node.get_subscriptions_info_by_topic('/pad_pose')
                           if info.node_name == 'act_node']
        assert len(pad_subscribers) == 1
        assert node.inputs.snapshot(node.now_s()).value('pad_pose') is not None  # the gate's
        wait_diagnostics(harness, lambda level, msg, values:
                         values.get('object_pose_topic.box') == '/box_pose'
                         and 'object_pose/pad' in values['required_inputs']
                         and values.get('age_s.object_pose/box', 'n/a') != 'n/a')


@pytest.mark.parametrize('execution', ['async', 'process'])
def test_missing_or_stale_object_pose_stops_commands(rclpy_context, tiny_pose_checkpoint,
                                                     image, execution):
    node = make_node(rclpy_context, str(tiny_pose_checkpoint), execution=execution)
    harness = make_harness(rclpy_context, image)
    harness.poses = {'pad_pose': PAD}  # no box pose yet
    with spinning(rclpy_context, node, harness):
        assert node.start()
        wait_diagnostics(harness, lambda level, msg, values: level == DiagnosticStatus.ERROR
                         and 'object_pose/box: never received' in values['input_problems'],
                         timeout=DISCOVERY_S)
        assert not harness.commands
        harness.poses['box_pose'] = BOX
        wait_commands(harness, 0.0, 5)
        harness.enabled['box_pose'] = False
        assert_silent_once_stale(node, harness, 'the box pose')
        wait_diagnostics(harness, lambda level, msg, values: level == DiagnosticStatus.ERROR
                         and 'object_pose/box: stale' in values['input_problems']
                         and 'object_pose/pad' not in values['input_problems'])
        harness.enabled['box_pose'] = True
        wait_commands(harness, time.monotonic(), 3)


def test_checkpoint_without_object_poses_subscribes_no_pose_topic(rclpy_context, checkpoint,
                                                                  image):
    node = make_node(rclpy_context, checkpoint)
    harness = make_harness(rclpy_context, image)  # publishes no pose at all
    with spinning(rclpy_context, node, harness):
        assert node.start()
        wait_commands(harness, 0.0, 3)
        topics = {name for name, _ in node.get_subscriber_names_and_types_by_node(
            'act_node', '/')}
        assert not topics & {'/box_pose', '/pad_pose'}, topics
        assert not [name for name in node.inputs.required if name.startswith('object_pose')]
        wait_diagnostics(harness, lambda level, msg, values:
                         'object_pose_topic.box' not in values
                         and values['input_problems'] == 'none')
