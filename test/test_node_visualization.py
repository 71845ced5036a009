"""act_node's view of its plan over real rclpy: ``~/planned_path`` is forward kinematics of
the chunk being played (base frame, stamped from its observation), ``~/markers`` follow
the release gate, and with ``visualization.enabled: false`` neither topic exists.

A recorder node subscribes to both topics as RViz would (reliable, transient local); the
robot is the :class:`~act_ros.ros.harness.RobotHarness` stand-in of the other node tests.
"""

import pathlib
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')

from nav_msgs.msg import Path  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from visualization_msgs.msg import Marker, MarkerArray  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.core.control.kinematics import ForwardKinematics  # noqa: E402
from act_ros.core.inference.checkpoint_info import SIM_CHUNK_SIZE  # noqa: E402
from act_ros.ros.harness import (  # noqa: E402
    FAST_ROBOT_MAX_JOINT_VELOCITY,
    RobotHarness,
    fast_robot_model,
    spinning,
    wait_until,
)
from act_ros.ros.node.act_node import ActNode  # noqa: E402
from act_ros.ros.node.visualization import GATE_COLORS, VISUALIZATION_QOS, GateView, PlanView  # noqa: E402

CONTRACT = load_contract()
JOINTS = list(CONTRACT.joint_names)
GRIPPER, = CONTRACT.gripper_indices
ARM = list(CONTRACT.arm_joint_names)
# The gripper measured at 0.6: fingers closed on an object (an empty gripper frees the gate).
MEASURED = np.array([0.1, -0.3, 0.4, 0.2, 0.0, 0.6])
PAD = [0.25, 0.0, 0.0]
RADIUS = 0.10
PATH_TOPIC, MARKERS_TOPIC = '/act_node/planned_path', '/act_node/markers'
TIMEOUT_S = 120.0  # a bound on waiting for what must come (a stalled machine ran the tiny
#                   model at 2-5 s a call), not a speed requirement


def seconds(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


class PlanRecorder(Node):
    """Records what arrives on the node's visualization topics, subscribed as RViz is
    configured to (rviz/act.rviz: reliable, transient local)."""

    def __init__(self, context) -> None:
        super().__init__('plan_recorder', context=context)
        self._lock = threading.Lock()
        self.paths: list[Path] = []
        self.markers: list[MarkerArray] = []
        self.create_subscription(Path, PATH_TOPIC, lambda m: self._keep(self.paths, m),
                                 VISUALIZATION_QOS)
        self.create_subscription(MarkerArray, MARKERS_TOPIC,
                                 lambda m: self._keep(self.markers, m), VISUALIZATION_QOS)

    def _keep(self, into: list, msg) -> None:
        with self._lock:
            into.append(msg)

    def latest_path(self) -> Path | None:
        with self._lock:
            return self.paths[-1] if self.paths else None

    def marker(self, ns: str, since: int = 0) -> Marker | None:
        """The newest marker of namespace ``ns`` in the arrays from index ``since`` on."""
        with self._lock:
            arrays = self.markers[since:]
        for array in reversed(arrays):
            for m in array.markers:
                if m.ns == ns:
                    return m
        return None


def make_node(context, checkpoint, **params) -> ActNode:
    values = {'model_path': checkpoint, 'autostart': False, 'torch_threads': 1,
              'backend': 'torch',  # no ONNX export per checkpoint (auto: test_backends.py)
              'execution': 'async', 'max_obs_age_s': 2.0, 'diagnostics_period_s': 0.2,
              'pad_position_m': PAD,
              # Commands pass the speed limit unchanged: the same kinematics, fast joints.
              'max_joint_velocity': FAST_ROBOT_MAX_JOINT_VELOCITY,
              'urdf_path': str(fast_robot_model(pathlib.Path(checkpoint).parent)),
              'release_gate.release_radius_m': RADIUS, 'visualization.rate_hz': 10.0,
              **params}
    return ActNode(context=context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


@pytest.fixture(scope='module')
def image():
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)


@pytest.fixture(scope='module')
def fk():
    return ForwardKinematics(joint_names=ARM)


def expected_chunk(checkpoint, image) -> np.ndarray:
    """The chunk the model computes for the harness's inputs, outside the node."""
    from act_ros.core.inference.runtime import Observation, PolicyRuntime, RuntimeConfig
    with PolicyRuntime(RuntimeConfig(checkpoint, execution='sync', contract=CONTRACT,
                                     warmup=False)) as runtime:
        return runtime.predictor.predict(Observation(images={'top': image, 'wrist': image},
                                                     state=MEASURED))


def assert_path_is_fk_of(path: Path, actions: np.ndarray, fk, atol: float) -> None:
    assert len(path.poses) == len(actions)
    for pose, action in zip(path.poses, actions):
        position, quaternion = fk.ee_pose(np.delete(action, GRIPPER))
        p, o = pose.pose.position, pose.pose.orientation
        np.testing.assert_allclose([p.x, p.y, p.z], position, atol=atol)
        # q and -q are the same rotation.
        got = np.array([o.w, o.x, o.y, o.z])
        assert min(np.abs(got - quaternion).max(), np.abs(got + quaternion).max()) < 10 * atol


# process: the node's default (the model in a child process, its chunks come back here).
@pytest.mark.parametrize('execution', ['async', 'process'])
def test_planned_path_is_forward_kinematics_of_the_chunk_being_played(
        rclpy_context, tiny_checkpoint, image, fk, execution):
    checkpoint = str(tiny_checkpoint)
    expected = expected_chunk(checkpoint, image)
    started = time.time()
    node = make_node(rclpy_context, checkpoint, execution=execution,
                     **{'release_gate.enabled': False})
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=image)
    recorder = PlanRecorder(rclpy_context)
    with spinning(rclpy_context, node, harness, recorder):
        assert node.start()

        def shown():
            """(path, chunk) once the newest path is of the chunk the node plays."""
            path, chunk = recorder.latest_path(), node.loop.runtime.current_chunk
            if path is None or chunk is None or not path.poses:
                return None
            return (path, chunk) if abs(seconds(path.header.stamp) - chunk.stamp_s) < 1e-6 \
                else None
        found = wait_until(shown, TIMEOUT_S)
        assert found, f'no path of the current chunk; last: {recorder.latest_path()}'
        path, chunk = found
        topics = dict(node.get_publisher_names_and_types_by_node('act_node', '/'))
    assert topics[PATH_TOPIC] == ['nav_msgs/msg/Path']
    assert topics[MARKERS_TOPIC] == ['visualization_msgs/msg/MarkerArray']
    # The chunk being played, every action of it (async chunk mode queues the whole chunk).
    assert chunk.actions.shape == (SIM_CHUNK_SIZE, CONTRACT.num_joints)  # the tiny model's
    assert_path_is_fk_of(path, chunk.actions, fk, atol=1e-9)
    # ... and that is the model's chunk for these inputs, computed here independently.
    assert_path_is_fk_of(path, expected, fk, atol=1e-4)
    # Base frame; the header has the observation's stamp (a harness publication of this
    # test), pose i that stamp plus i control periods.
    assert path.header.frame_id == 'base_link'
    assert all(pose.header.frame_id == 'base_link' for pose in path.poses)
    start = seconds(path.header.stamp)
    assert started - 1.0 < start < time.time()
    offsets = np.array([seconds(pose.header.stamp) - start for pose in path.poses])
    np.testing.assert_allclose(offsets, np.arange(len(offsets)) / 30.0, atol=1e-6)
    # The poses move: a plan, not one point repeated (else the comparison proves little).
    positions = np.array([[p.pose.position.x, p.pose.position.y, p.pose.position.z]
                          for p in path.poses])
    assert np.ptp(positions, axis=0).max() > 1e-3


def test_markers_follow_the_release_gate(rclpy_context, tmp_path, tiny_checkpoint):
    from act_ros.ros.harness import make_gated_checkpoint

    checkpoint, open_image, closed_image = make_gated_checkpoint(
        tiny_checkpoint, tmp_path / 'gated', state=MEASURED)
    node = make_node(rclpy_context, checkpoint, execution='sync', n_action_steps=1,
                     ee_source='topic')
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=open_image)
    far, near = np.array([0.6, 0.3, 0.3]), np.array([0.27, 0.01, 0.02])
    harness.ee_position = far
    recorder = PlanRecorder(rclpy_context)

    def region_in(state: str, since: int = 0) -> Marker:
        def match():
            m = recorder.marker('release_region', since)
            text = recorder.marker('gate_state', since)
            return m is not None and text is not None and m.action == Marker.ADD and \
                f'gate {state} ' in text.text and m.color.b == pytest.approx(
                    GATE_COLORS[state][2]) and m.color.r == pytest.approx(GATE_COLORS[state][0])
        assert wait_until(match, TIMEOUT_S), (
            f"markers not {state}: {recorder.marker('gate_state', since)}")
        return recorder.marker('release_region', since)

    with spinning(rclpy_context, node, harness, recorder):
        assert node.start()
        # FREE (approach, open gripper): a sphere of the release radius around the pad.
        region = region_in('FREE')
        assert region.header.frame_id == 'base_link' and region.type == Marker.SPHERE
        p = region.pose.position
        np.testing.assert_allclose([p.x, p.y, p.z], PAD)
        assert region.scale.x == region.scale.y == region.scale.z == pytest.approx(2 * RADIUS)
        # Commanded closed: HOLDING, far from the pad.
        harness.image = closed_image
        region_in('HOLDING', len(recorder.markers))
        since = len(recorder.markers)
        assert wait_until(lambda: (m := recorder.marker('end_effector', since)) is not None
                          and m.action == Marker.ADD, TIMEOUT_S)
        ee = recorder.marker('end_effector', since).pose.position
        np.testing.assert_allclose([ee.x, ee.y, ee.z], far, atol=1e-9)
        text = recorder.marker('gate_state', since).text
        assert f'ee-pad {np.linalg.norm(far - PAD):.3f} m' in text
        assert f'release radius {RADIUS:.2f} m' in text
        ages = dict(item.rsplit(' ', 1) for item in
                    text.split('input age ms: ', 1)[1].split(', '))
        assert set(ages) == {'joint_states', 'image/top', 'image/wrist'}
        assert all(0 <= int(v) < 60_000 for v in ages.values()), ages  # ms, not a speed bound
        # An open request near the pad passes: RELEASED.
        harness.image = open_image
        harness.ee_position = near
        region_in('RELEASED', len(recorder.markers))
        # The planned gripper: one point per action (n_action_steps 1), coloured open.
        since = len(recorder.markers)
        assert wait_until(lambda: recorder.marker('planned_gripper', since) is not None,
                          TIMEOUT_S)
        plan = recorder.marker('planned_gripper', since)
        assert plan.type == Marker.SPHERE_LIST and len(plan.points) == len(plan.colors) >= 1


def test_visualization_off_publishes_no_such_topic(rclpy_context, tiny_checkpoint, image):
    node = make_node(rclpy_context, str(tiny_checkpoint), **{'visualization.enabled': False})
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=image)
    recorder = PlanRecorder(rclpy_context)
    with spinning(rclpy_context, node, harness, recorder):
        assert node.start()
        assert wait_until(lambda: len(harness.commands) >= 10, TIMEOUT_S)
        assert wait_until(lambda: harness.latest_diagnostics() is not None, TIMEOUT_S)
        time.sleep(1.0)  # ten periods of the default rate
        topics = dict(node.get_publisher_names_and_types_by_node('act_node', '/'))
        diagnostics = harness.latest_diagnostics()[2]
    assert node.io is None or node.io.visualizer is None
    assert PATH_TOPIC not in topics and MARKERS_TOPIC not in topics, sorted(topics)
    assert not recorder.paths and not recorder.markers
    assert diagnostics['visualization'] == 'off'


# ---- the messages themselves (no node) ---------------------------------------------------

def _gate(**overrides) -> GateView:
    values = dict(enabled=True, state='HOLDING', radius_m=RADIUS, release_threshold=0.9,
                  hold_threshold=0.9, pad=np.array(PAD), ee=None, distance_m=None,
                  ages_s={'joint_states': 0.012, 'image/top': None})
    return GateView(**{**values, **overrides})


def test_markers_of_an_unknown_pad_are_deleted_and_a_gate_off_is_grey(fk):
    view = PlanView(fk, (GRIPPER,), 'base_link', 1 / 30)
    markers = {m.ns: m for m in view.markers(_gate(pad=None, enabled=False), 5.0).markers}
    assert markers['release_region'].action == Marker.DELETE
    assert markers['end_effector'].action == Marker.DELETE  # unknown end effector
    assert markers['planned_gripper'].action == Marker.DELETE  # no chunk yet
    text = markers['gate_state'].text
    assert text.startswith('gate off | ee-pad unknown') and 'pad unknown' in text
    assert text.endswith('input age ms: joint_states 12, image/top never')
    known = {m.ns: m for m in view.markers(_gate(enabled=False), 5.0).markers}
    assert known['release_region'].action == Marker.ADD
    assert (known['release_region'].color.r, known['release_region'].color.g) == \
        pytest.approx((0.6, 0.6))


def test_a_chunk_without_an_observation_stamp_is_stamped_now_and_skips_nan_rows(fk):
    from act_ros.core.inference.chunking import TimedChunk

    actions = np.tile(MEASURED, (4, 1))
    actions[2, 0] = np.nan
    path = PlanView(fk, (GRIPPER,), 'base_link', 0.1).path(TimedChunk(0, actions), now_s=12.5)
    assert seconds(path.header.stamp) == pytest.approx(12.5)
    assert [round(seconds(p.header.stamp) - 12.5, 6) for p in path.poses] == [0.0, 0.1, 0.3]
    empty = PlanView(fk, (GRIPPER,), 'base_link', 0.1).path(None, now_s=3.0)
    assert empty.poses == [] and empty.header.frame_id == 'base_link'


# ---- act-ros bench node --visualization compare (its parts, no processes) ------------------

def test_bench_node_measures_visualization_off_and_on_side_by_side(capsys):
    import os
    import types

    from act_ros.bench import node as bench
    from act_ros.ros.harness import ReceivedCommand

    args = bench.parse_args(['--visualization', 'compare', '--duration', '0.3'])
    assert args.visualization == 'compare'
    assert bench.parse_args([]).visualization == 'on'  # the node's default

    class Harness:
        """Receives a command every period; reports a finished start-up."""
        def __init__(self):
            self.commands = []

        def latest_diagnostics(self, since=0.0):
            return (0, 'ok', {'startup.time_to_first_command_s': '1.0', 'missed_periods': '0'})

        def feed(self):
            now = time.monotonic()
            if not self.commands or now - self.commands[-1].received >= 1 / 30:
                self.commands.append(ReceivedCommand(now, np.zeros(6), (), None))

    harness = Harness()

    class Procs:
        stopped = []

        def start(self, name, cmd):
            harness.feed()
            popen = types.SimpleNamespace(pid=os.getpid(), poll=lambda: None)
            return types.SimpleNamespace(popen=popen, log_path=None, name=name)

        def stop(self, child, grace_s):
            self.stopped.append(child.name)

    feeding = threading.Event()

    def feed():
        while not feeding.is_set():
            harness.feed()
            time.sleep(0.005)
    threading.Thread(target=feed, daemon=True).start()

    class Plan:
        def rates(self, t0, t1):
            return {'visualization_path_rate_hz': 1.0, 'visualization_markers_rate_hz': 5.0}

    procs = Procs()
    try:
        off = bench.run_round(harness, Plan(), procs, ['act_node'], args, 'act_node_off')
        on = bench.run_round(harness, Plan(), procs, ['act_node'], args, 'act_node_on')
    finally:
        feeding.set()
    assert procs.stopped == ['act_node_off', 'act_node_on']  # each node stopped after its round
    for result in (off, on):
        assert result['startup.time_to_first_command_s'] == 1.0
        assert result['command_rate_hz'] > 0 and 'missed_periods' in result
        assert result['visualization_markers_rate_hz'] == 5.0
    bench.report_side_by_side({'off': off, 'on': on}, {'cpu_count': 2}, 'visualization')
    out = capsys.readouterr().out
    assert 'visualization off vs on' in out
    assert 'missed_periods on - off' in out
    assert any(line.split()[:1] == ['missed_periods'] and len(line.split()) == 3
               for line in out.splitlines())


def test_bench_node_compare_repeats_in_a_balanced_order_and_compares_medians(capsys):
    from act_ros.bench import node as bench

    assert bench.balanced_order(['off', 'on'], 1) == ['off', 'on']
    assert bench.balanced_order(['off', 'on'], 3) == ['off', 'on', 'on', 'off', 'off', 'on']
    assert bench.balanced_order(['a', 'b', 'c'], 2) == ['a', 'b', 'c', 'c', 'b', 'a']
    for bad, message in ([['--repeats', '0', '--visualization', 'compare'], '>= 1'],
                         [['--repeats', '2'], 'comparison only'],
                         [['--repeats', '2', '--precision', 'bf16'], 'comparison only']):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
        assert message in capsys.readouterr().err
    rounds = [{'missed_periods': 3, 'command_rate_hz': 29.0, 'device': 'cpu'},
              {'missed_periods': 90, 'command_rate_hz': 27.0, 'device': 'cpu'},
              {'missed_periods': 5, 'command_rate_hz': 29.5, 'device': 'cpu'}]
    merged = bench.median_round(rounds)
    assert merged == {'missed_periods': 5.0, 'command_rate_hz': 29.0, 'device': 'cpu'}
    assert bench.median_round(rounds[:1]) == rounds[0]  # one round: as measured


def test_plot_plan_draws_what_the_topics_carry(tmp_path, fk):
    """act-ros plot-plan's picture, from the node's own messages (no spinning)."""
    from act_ros.core.inference.chunking import TimedChunk
    from act_ros.ros.plan_plot import PlanRecord, draw

    view = PlanView(fk, (GRIPPER,), 'base_link', 1 / 30)
    actions = np.tile(MEASURED, (30, 1))
    actions[:, 1] += np.linspace(0.0, 0.5, 30)
    actions[15:, GRIPPER] = 1.0
    chunk = TimedChunk(0, actions, 100.0)
    poses = view.chunk_poses(actions)
    record = PlanRecord()
    record.add_path(view.path(chunk, 100.0, poses))
    ee = fk.ee_position(np.delete(MEASURED, GRIPPER))
    for state in ('FREE', 'HOLDING'):
        record.add_markers(view.markers(_gate(state=state, ee=ee, distance_m=0.2), 100.0,
                                        chunk, poses))
    assert record.paths[0].shape == (30, 3) and record.frame_id == 'base_link'
    np.testing.assert_allclose(record.region[0], PAD)
    assert record.region[1] == pytest.approx(RADIUS)
    assert record.region[2][:3] == pytest.approx(GATE_COLORS['HOLDING'])  # the latest state
    assert len(record.ee_track) == 2 and record.text.startswith('gate HOLDING')
    # The chunk's gripper requests: closed for the first half, open for the second.
    assert record.plan_colors[0][:3] == pytest.approx((0.9, 0.2, 0.2))
    assert record.plan_colors[-1][:3] == pytest.approx((0.2, 0.85, 0.3))
    out = draw(record, tmp_path / 'plan.png')
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and out.stat().st_size > 10_000


# ---- the chunk a viewer is shown (PolicyRuntime.current_chunk) ------------------------------

@pytest.mark.parametrize('mode', ['chunk', 'ensemble'])
def test_current_chunk_carries_the_stamp_of_its_observation(tiny_checkpoint, mode):
    """Against simulated time (chunks delivered 5 ticks after their request): the chunk
    shown is the one being played, stamped with the observation it was computed from, not
    the one of the tick that received it; a reset shows none."""
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
    from act_ros.core.observation import Observation

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)

    def obs(tick):
        return Observation(images={'top': image, 'wrist': image}, state=MEASURED,
                           stamp_s=1000.0 + tick / 30)
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu',
                                     execution='simulated', mode=mode, n_action_steps=10,
                                     simulated_latency_ticks=5, warmup=False))
    try:
        assert rt.current_chunk is None
        seen = []
        for tick in range(40):
            rt.act(obs(tick))
            chunk = rt.current_chunk
            if chunk is not None and (not seen or seen[-1] is not chunk):
                seen.append(chunk)
                assert chunk.stamp_s == pytest.approx(1000.0 + chunk.start_tick / 30)
                assert chunk.start_tick <= tick - 5  # requested at least 5 ticks earlier
        assert len(seen) >= 2
        if mode == 'chunk':  # the queued chunk, as played: action at tick = its row
            tick = rt.tick - 1
            np.testing.assert_allclose(rt._queue.action(tick),
                                       seen[-1].actions[tick - seen[-1].start_tick])
        rt.reset()
        assert rt.current_chunk is None
    finally:
        rt.close()
