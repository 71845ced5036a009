"""record_node over real rclpy: the simulation driven by the scripted expert through its
command topic is recorded over ROS 2 and matches what ``act-ros collect`` writes for the
same seed; a recorder fed at camera rate drops ticks without fresh inputs; SIGINT during
recording leaves only whole episodes. The episode store keeps every save readable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

from bag_tools import read_dataset  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.data.episode_store import recording_metadata  # noqa: E402
from act_ros.ros.harness import RobotHarness, spinning, wait_until  # noqa: E402

CONTRACT = load_contract()
H, W = 48, 64
SEED = 21
DISCOVERY_S = 30.0
# A bound on waiting for frames that must come (a few seconds' worth), not a speed
# requirement: a busy machine gets there late, never not at all.
PROGRESS_S = 120.0


def _read(root: Path):
    return read_dataset(root, CONTRACT, (H, W))


def _recorder(context, output: Path, **params):
    from act_ros.ros.recording.record_node import RecordNode

    values = {'output': str(output), 'image_height': H, 'image_width': W, 'use_video': False,
              'diagnostics_period_s': 0.2, **params}
    return RecordNode(context=context,
                      parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def _whole_chains(output: Path, episodes: int, frames: int = 30) -> int:
    """Check the first ``episodes`` episodes of ``output`` as chains of continuations
    (an episode is saved and continued at a gap: see record_node): a chain that ended at
    ``max_episode_s`` holds exactly ``frames`` frames, one cut short (its continuation was
    the open episode at an interruption, lost) fewer; its frames equal its metadata's.
    Returns the number of whole chains."""
    metas = [recording_metadata(output, e) for e in range(episodes)]
    assert all(metas), metas
    chains: list[list[dict]] = []
    for e, meta in enumerate(metas):
        if meta['continues_episode'] is None:
            chains.append([meta])
        else:
            assert meta['continues_episode'] == e - 1, metas
            chains[-1].append(meta)
    whole = 0
    for chain in chains:
        total = sum(m['frames'] for m in chain)
        if chain[-1]['ended_by'] == 'max_episode_s':
            assert total == frames, chain
            whole += 1
        else:
            assert total < frames and chain[-1]['ended_by'].startswith('a gap'), chain
    return whole


def _wait_while_recording(recorder, done, stall_s: float = 120.0) -> bool:
    """Wait for ``done`` as long as the recorder's frame count keeps growing: a hang guard
    (no new frame for ``stall_s``), not a bound on the machine's speed."""
    frames, since = -1, time.monotonic()
    while not done():
        now = recorder.status_values()['frames']
        if now != frames:
            frames, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the episode's pace is the machine's; the wait below guards hangs
def test_expert_over_ros_is_recorded_like_collect(rclpy_context, tmp_path):
    from act_ros.data.collect import CollectConfig, collect
    from act_ros.ros.recording.expert_driver import ExpertDriver
    from act_ros.ros.sim_bridge.bridge import SimBridge

    collect(CollectConfig(output=tmp_path / 'collected', episodes=1, seed=SEED, image_height=H,
                          image_width=W, use_video=False), progress=False)
    bridge = SimBridge(context=rclpy_context, parameter_overrides=[
        Parameter(k, value=v) for k, v in {
            'mode': 'lockstep', 'autostart': False, 'image_height': H, 'image_width': W,
            'seed': SEED, 'lockstep_timeout_s': 30.0,
            'policy_reset_service': '/expert_driver/reset'}.items()])
    driver = ExpertDriver(context=rclpy_context)
    recorder = _recorder(rclpy_context, tmp_path / 'recorded', trigger='observation',
                         start_recording=True, max_episode_s=10.0)
    client_node = rclpy.create_node('reset_client', context=rclpy_context)
    reset = client_node.create_client(Trigger, '/sim_bridge/reset')
    with spinning(rclpy_context, bridge, driver, recorder, client_node, num_threads=6):
        bridge.start()
        # Every input matched before the episode starts, so its first frame is not lost.
        assert wait_until(lambda: not recorder.unconnected_topics(), DISCOVERY_S), \
            recorder.unconnected_topics()
        assert reset.wait_for_service(timeout_sec=DISCOVERY_S)
        future = reset.call_async(Trigger.Request())
        assert wait_until(future.done, 60.0) and future.result().success, future.result()
        # However slow the machine, the episode is recorded while frames keep coming.
        assert _wait_while_recording(recorder, lambda: recorder.saved >= 1), \
            recorder.status_values()
        status = recorder.status_values()
    assert status['last_error'] == 'none'
    _, want = _read(tmp_path / 'collected')
    dataset, got = _read(tmp_path / 'recorded')
    assert dataset.meta.total_episodes == 1
    assert len(got) == len(want) == 300
    # The same simulation, the same expert: states and actions agree to float32 rounding.
    np.testing.assert_allclose(got.state.numpy(), want.state.numpy(), atol=1e-5)
    np.testing.assert_allclose(got.action.numpy(), want.action.numpy(), atol=1e-5)
    for key in got.images:
        diff = (got.images[key].float() - want.images[key].float()).abs().mean()
        assert diff < 1.0, f'{key}: mean pixel difference {diff:.2f}'


def test_timer_recording_drops_ticks_without_fresh_inputs(rclpy_context, tmp_path):
    joints = dict(zip(CONTRACT.joint_names, np.linspace(-0.3, 0.3, CONTRACT.num_joints)))
    harness = RobotHarness(context=rclpy_context, joints=joints,
                           image=np.full((H, W, 3), 90, np.uint8), rate_hz=30.0)
    command = harness.create_publisher(
        __import__('trajectory_msgs.msg', fromlist=['JointTrajectory']).JointTrajectory,
        'joint_trajectory_controller/joint_trajectory', 10)
    from act_ros.ros import conversions as conv

    def send_command():
        command.publish(conv.to_joint_trajectory(np.zeros(CONTRACT.num_joints),
                                                 CONTRACT.joint_names, 1 / 30))
    harness.create_timer(1 / 30, send_command)
    recorder = _recorder(rclpy_context, tmp_path / 'rec', tolerance_s=0.15)
    start = recorder.create_client(Trigger, '/record_node/start_episode')
    save = recorder.create_client(Trigger, '/record_node/save_episode')

    def call(client):
        assert client.wait_for_service(timeout_sec=DISCOVERY_S)
        future = client.call_async(Trigger.Request())
        assert wait_until(future.done, 60.0)
        return future.result()

    with spinning(rclpy_context, harness, recorder):
        assert wait_until(lambda: all(v > 0 for k, v in recorder.status_values().items()
                                      if k.startswith('rate_hz.')), DISCOVERY_S), \
            recorder.status_values()
        assert call(start).success
        total = lambda: recorder.buffer.chain_frames + recorder.buffer.frames  # noqa: E731
        assert wait_until(lambda: total() >= 15, PROGRESS_S)
        harness.enabled['wrist'] = False  # the wrist camera stops: ticks are dropped
        # Counted by their reason: on a busy machine a tick can also be dropped for another
        # input that came late, which the total would mix in.
        assert wait_until(
            lambda: recorder.status_values().get('dropped.image/wrist stale', 0) >= 5,
            PROGRESS_S), \
            recorder.status_values()
        harness.enabled['wrist'] = True
        frames = total()
        assert wait_until(lambda: total() >= frames + 10, PROGRESS_S)
        response = call(save)
        assert response.success, response.message
    # The frame after the stall ended the episode (a gap) and began its continuation.
    dataset, store = _read(tmp_path / 'rec')
    metas = [recording_metadata(tmp_path / 'rec', e) for e in range(dataset.meta.total_episodes)]
    stalled = [e for e, m in enumerate(metas) if m['drops'].get('image/wrist stale', 0) >= 5]
    assert stalled and stalled[0] < len(metas) - 1, metas
    meta = metas[stalled[0]]
    assert meta['ended_by'].startswith('a gap of') and meta['dropped_ticks'] >= 5, meta
    assert metas[stalled[0] + 1]['continues_episode'] == stalled[0], metas
    assert len(store) >= 25 and len(store) == sum(m['frames'] for m in metas)
    np.testing.assert_allclose(store.state.numpy()[0], list(joints.values()), atol=1e-6)
    assert np.all(store.action.numpy() == 0.0)


def _wait_file(path: Path, timeout: float) -> bool:
    return bool(wait_until(path.is_file, timeout, 0.2))


def test_sigint_during_recording_leaves_only_whole_episodes(rclpy_context, ros_domain_id,
                                                            tmp_path):
    output = tmp_path / 'demos'
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    log = (tmp_path / 'record.log').open('w')
    proc = subprocess.Popen(
        [sys.executable, '-m', 'act_ros.ros.recording.record_node', '--ros-args',
         '-p', f'output:={output}', '-p', 'start_recording:=true', '-p', 'max_episode_s:=1.0',
         '-p', f'image_height:={H}', '-p', f'image_width:={W}', '-p', 'use_video:=false',
         '-p', 'action_source:=leader', '-p', 'action_topic:=leader/joint_states',
         '-p', 'tolerance_s:=0.2', '-p', 'restart_after_save:=true'],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    follower = RobotHarness(context=rclpy_context, joints=joints,
                            image=np.full((H, W, 3), 40, np.uint8))
    leader = RobotHarness(context=rclpy_context, joints=joints, image=np.zeros((H, W, 3),
                                                                                 np.uint8),
                          cameras=(), namespace='leader', name='leader')
    try:
        with spinning(rclpy_context, follower, leader):
            # Episodes of 1 s save themselves; wait for the second, then interrupt the third.
            shards = output.parent / f'.{output.name}.episodes'
            assert wait_until(lambda: 'holds 2 episode(s)' in (tmp_path / 'record.log')
                              .read_text(), 120.0), (tmp_path / 'record.log').read_text()[-3000:]
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
            assert code in (0, -signal.SIGINT), \
                f'exit {code}: {(tmp_path / "record.log").read_text()[-4000:]}'
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / 'record.log').read_text()
    dataset, store = _read(output)
    saved = len(list(shards.glob('episode_*/meta/info.json')))
    # The open episode is dropped; where the signal met a save under way (a slow machine
    # moves the moment), that save finished and no frame of the next was taken.
    whole = _whole_chains(output, saved)  # whole 1 s episodes, or their saved parts
    assert 'discarding the open episode' in text \
        or whole == text.count('reached max_episode_s'), text[-3000:]
    assert dataset.meta.total_episodes == saved >= 2
    assert len(store) == sum(recording_metadata(output, e)['frames'] for e in range(saved))
    info = json.loads((output / 'meta' / 'info.json').read_text())
    assert info['total_episodes'] == saved


# -- issue 25 -------------------------------------------------------------------------
def _call(client, timeout=60.0):
    assert client.wait_for_service(timeout_sec=DISCOVERY_S)
    future = client.call_async(Trigger.Request())
    assert wait_until(future.done, timeout)
    return future.result()


def test_a_successful_save_clears_the_last_error(rclpy_context, tmp_path):
    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    recorder = _recorder(rclpy_context, tmp_path / 'rec', action_source='leader',
                         action_topic='leader/joint_states', tolerance_s=0.2)
    start = recorder.create_client(Trigger, '/record_node/start_episode')
    save = recorder.create_client(Trigger, '/record_node/save_episode')
    follower = RobotHarness(context=rclpy_context, joints=joints,
                            image=np.full((H, W, 3), 40, np.uint8))
    follower.enabled['joint_states'] = False  # no follower state yet: every tick dropped
    leader = RobotHarness(context=rclpy_context, joints=joints, image=np.zeros((H, W, 3),
                                                                                np.uint8),
                          cameras=(), namespace='leader', name='leader')
    with spinning(rclpy_context, follower, leader, recorder):
        assert _call(start).success
        assert wait_until(lambda: recorder.status_values()['dropped_ticks'] >= 5, 20.0)
        failed = _call(save)
        assert not failed.success and 'no frames' in failed.message, failed.message
        assert 'save failed' in recorder.status_values()['last_error']
        follower.enabled['joint_states'] = True
        assert _call(start).success
        assert wait_until(lambda: recorder.status_values()['frames'] >= 10, 20.0)
        ok = _call(save)
        assert ok.success, ok.message
        status = recorder.status_values()
    assert status['last_error'] == 'none'
    assert status['episodes_saved'] == 1


def test_one_camera_raw_and_one_compressed(rclpy_context, tmp_path):
    joints = dict(zip(CONTRACT.joint_names, np.linspace(-0.2, 0.2, CONTRACT.num_joints)))
    top = np.full((H, W, 3), 70, np.uint8)
    wrist = np.full((H, W, 3), 150, np.uint8)
    raw = RobotHarness(context=rclpy_context, joints=joints, image=top, cameras=('top',),
                       name='raw_camera')
    png = RobotHarness(context=rclpy_context, joints=joints, image=wrist, cameras=('wrist',),
                       encoding='png', name='png_camera')
    png.enabled['joint_states'] = False
    leader = RobotHarness(context=rclpy_context, joints=joints, image=top, cameras=(),
                          namespace='leader', name='leader')
    recorder = _recorder(rclpy_context, tmp_path / 'rec', action_source='leader',
                         action_topic='leader/joint_states', tolerance_s=0.2,
                         **{'cameras.wrist.transport': 'compressed'})
    assert recorder.spec.image_topic('wrist') == 'camera/wrist/image_raw/compressed'
    assert recorder.spec.image_topic('top') == 'camera/top/image_raw'
    start = recorder.create_client(Trigger, '/record_node/start_episode')
    save = recorder.create_client(Trigger, '/record_node/save_episode')
    with spinning(rclpy_context, raw, png, leader, recorder):
        assert wait_until(lambda: not recorder.unconnected_topics(), DISCOVERY_S), \
            recorder.unconnected_topics()
        assert _call(start).success
        assert wait_until(lambda: recorder.status_values()['frames'] >= 10, 20.0), \
            recorder.status_values()
        response = _call(save)
        assert response.success, response.message
    _, store = _read(tmp_path / 'rec')
    assert len(store) >= 10
    got_top = store.images['observation.images.top'].permute(0, 2, 3, 1).numpy()
    got_wrist = store.images['observation.images.wrist'].permute(0, 2, 3, 1).numpy()
    assert np.all(got_top == 70) and np.all(got_wrist == 150)


def _record_process(output: Path, env: dict, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, '-m', 'act_ros.ros.recording.record_node', '--ros-args',
         '-p', f'output:={output}', '-p', 'start_recording:=true', '-p', 'max_episode_s:=1.0',
         '-p', f'image_height:={H}', '-p', f'image_width:={W}',
         '-p', 'action_source:=leader', '-p', 'action_topic:=leader/joint_states',
         '-p', 'tolerance_s:=0.2', '-p', 'restart_after_save:=true', *extra],
        env=env, stdout=log.open('w'), stderr=subprocess.STDOUT)


def test_sigkill_loses_at_most_the_open_episode_and_a_restart_continues(
        rclpy_context, ros_domain_id, tmp_path):
    """A real SIGKILL mid-episode (videos being encoded): every episode saved before it
    opens in LeRobot, the killed episode leaves nothing, and a restarted recorder adds to
    the same dataset."""
    output = tmp_path / 'demos'
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    rng = np.random.default_rng(0)
    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    follower = RobotHarness(context=rclpy_context, joints=joints,
                            image=rng.integers(0, 255, (H, W, 3), dtype=np.uint8))
    leader = RobotHarness(context=rclpy_context, joints=joints, image=np.zeros((H, W, 3),
                                                                                np.uint8),
                          cameras=(), namespace='leader', name='leader')
    logs = [tmp_path / 'first.log', tmp_path / 'second.log']
    shards = output.parent / f'.{output.name}.episodes'
    with spinning(rclpy_context, follower, leader):
        proc = _record_process(output, env, logs[0])
        try:
            assert wait_until(lambda: 'holds 2 episode(s)' in logs[0].read_text(), 180.0), \
                logs[0].read_text()[-3000:]
            # Mid-episode: the third episode has frames on disk (its shard's staging).
            assert wait_until(lambda: any(shards.glob('.episode_*.partial-*')), 30.0)
            time.sleep(0.4)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
        saved = len(list(shards.glob('episode_*/meta/info.json')))
        assert saved >= 2
        dataset, store = _read(output)
        assert dataset.meta.total_episodes in (saved, saved - 1)  # a save may be cut short
        _whole_chains(output, dataset.meta.total_episodes)  # whole 1 s episodes or parts
        proc = _record_process(output, env, logs[1])
        try:
            assert wait_until(lambda: f'holds {saved + 1} episode(s)' in logs[1].read_text(),
                              180.0), logs[1].read_text()[-3000:]
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = logs[1].read_text()
    assert 'never saved' in text  # the killed episode's staging directory was removed
    dataset, store = _read(output)
    total = dataset.meta.total_episodes
    assert total >= saved + 1
    _whole_chains(output, total)
    assert len(store) == sum(recording_metadata(output, e)['frames'] for e in range(total))
    assert not any(shards.glob('.episode_*.partial-*'))
    assert len(list(shards.glob('episode_*/meta/info.json'))) == total


@pytest.mark.slow
def test_a_full_disk_loses_only_the_episodes_it_cuts(rclpy_context, ros_domain_id, tmp_path):
    """A recorder whose writes fail (the file size limit of its process set so low that
    no episode's files fit: what a full disk does to every write) keeps the dataset it
    continues as it was, says why on its log, and leaves no partial files behind."""
    import resource

    output = tmp_path / 'demos'
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    rng = np.random.default_rng(1)
    follower = RobotHarness(context=rclpy_context, joints=joints,
                            image=rng.integers(0, 255, (H, W, 3), dtype=np.uint8))
    leader = RobotHarness(context=rclpy_context, joints=joints, image=np.zeros((H, W, 3),
                                                                                np.uint8),
                          cameras=(), namespace='leader', name='leader')
    shards = output.parent / f'.{output.name}.episodes'

    def small_files() -> None:  # in the child: writes past 6 KB fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (6 * 1024, 6 * 1024))

    with spinning(rclpy_context, follower, leader):
        first = _record_process(output, env, tmp_path / 'first.log')
        try:
            assert wait_until(lambda: 'holds 2 episode(s)' in (tmp_path / 'first.log')
                              .read_text(), 180.0), (tmp_path / 'first.log').read_text()[-3000:]
            first.send_signal(signal.SIGINT)
            first.wait(timeout=60)
        finally:
            if first.poll() is None:
                first.kill()
        before = len(list(shards.glob('episode_*/meta/info.json')))
        full = subprocess.Popen(
            [sys.executable, '-m', 'act_ros.ros.recording.record_node', '--ros-args',
             '-p', f'output:={output}', '-p', 'start_recording:=true',
             '-p', 'max_episode_s:=1.0', '-p', f'image_height:={H}', '-p', f'image_width:={W}',
             '-p', 'action_source:=leader', '-p', 'action_topic:=leader/joint_states',
             '-p', 'tolerance_s:=0.2', '-p', 'restart_after_save:=true'],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=small_files)
        lines: list[str] = []
        import threading
        reader = threading.Thread(target=lambda: lines.extend(full.stdout), daemon=True)
        reader.start()
        try:
            assert wait_until(lambda: sum('save failed' in line for line in lines) >= 2, 180.0), \
                ''.join(lines)[-3000:]
            full.send_signal(signal.SIGINT)
            # A hang guard: the saves queued before the signal finish (each one fails here),
            # and a busy machine splits episodes often (each part is a save).
            full.wait(timeout=300)
        finally:
            if full.poll() is None:
                full.kill()
        reader.join(timeout=10)
    text = ''.join(lines)
    assert 'File too large' in text, text[-3000:]
    dataset, store = _read(output)
    assert dataset.meta.total_episodes == before >= 2
    _whole_chains(output, before)
    assert len(store) == sum(recording_metadata(output, e)['frames'] for e in range(before))
    assert len(list(shards.glob('episode_*/meta/info.json'))) == before
    assert not any(shards.glob('.episode_*.partial-*'))  # failed episodes left nothing


def _writer_nice() -> dict[str, int]:
    """Nice value of every episode writer thread alive, by thread name."""
    import threading
    return {t.name: os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threading.enumerate()
            if t.name.startswith('episode-writer-') and t.native_id is not None}


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='per-thread nice is Linux-only')
def test_every_episode_is_written_at_the_sampling_priority(rclpy_context, tmp_path):
    """The writers of the episodes after the first are made ahead of time, off the sampling
    path. They (and the encoder threads they start) inherit their creator's priority: made
    by the niced saver they ran 5 below the sampling and, on a busy 2-core CPU, fell behind
    (a third of the ticks of a 10-minute recording dropped as 'writer behind')."""
    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    recorder = _recorder(rclpy_context, tmp_path / 'rec', action_source='leader',
                         action_topic='leader/joint_states', tolerance_s=0.2,
                         restart_after_save=True, max_episode_s=0.5, start_recording=True)
    follower = RobotHarness(context=rclpy_context, joints=joints,
                            image=np.full((H, W, 3), 40, np.uint8))
    leader = RobotHarness(context=rclpy_context, joints=joints, image=np.zeros((H, W, 3),
                                                                                np.uint8),
                          cameras=(), namespace='leader', name='leader')
    base = os.getpriority(os.PRIO_PROCESS, 0)
    seen: dict[str, int] = {}
    with spinning(rclpy_context, follower, leader, recorder):
        def three_saved() -> bool:
            seen.update(_writer_nice())
            return recorder.status_values()['episodes_saved'] >= 3
        assert wait_until(three_saved, 60.0, interval_s=0.05), recorder.status_values()
    later = {name: nice for name, nice in seen.items() if name != 'episode-writer-0'}
    assert len(later) >= 2, seen
    assert set(later.values()) == {base}, f'writer threads ran at {seen}, the sampling at {base}'


def test_a_save_does_not_stop_sampling_on_one_thread(rclpy_context, tmp_path, monkeypatch):
    """``record_node`` spins a single-threaded executor. The save service is a coroutine
    that awaits the saver thread, so the next episode is sampled while one is saved (the
    save is held here until the test has seen that); a service that waited in its callback
    would hold the only thread and no tick would run until the save ended."""
    import threading

    from rclpy.executors import SingleThreadedExecutor

    from act_ros.ros.spin import spin_executor

    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    recorder = _recorder(rclpy_context, tmp_path / 'rec', action_source='leader',
                         action_topic='leader/joint_states', tolerance_s=0.2,
                         restart_after_save=True, start_recording=True)
    commit = recorder.episodes.commit
    release = threading.Event()

    def held_commit(shard):
        release.wait(60.0)
        return commit(shard)

    monkeypatch.setattr(recorder.episodes, 'commit', held_commit)
    save = recorder.create_client(Trigger, '/record_node/save_episode')
    follower = RobotHarness(context=rclpy_context, joints=joints,
                            image=np.full((H, W, 3), 40, np.uint8))
    leader = RobotHarness(context=rclpy_context, joints=joints, image=np.zeros((H, W, 3),
                                                                                np.uint8),
                          cameras=(), namespace='leader', name='leader')
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(recorder)
    thread = threading.Thread(target=spin_executor, args=(executor,), daemon=True)
    thread.start()
    try:
        with spinning(rclpy_context, follower, leader):
            assert save.wait_for_service(timeout_sec=DISCOVERY_S)
            assert wait_until(lambda: recorder.status_values()['frames'] >= 10, 30.0)
            future = save.call_async(Trigger.Request())
            assert wait_until(lambda: recorder.status_values()['saves_pending'] == 1, 5.0)
            sampled = []

            def next_episode_sampled() -> bool:
                values = recorder.status_values()
                sampled.append((values['saves_pending'], values['frames']))
                return values['saves_pending'] == 1 and values['frames'] >= 15

            try:
                assert wait_until(next_episode_sampled, 30.0, interval_s=0.05), sampled[-5:]
            finally:
                release.set()
            assert wait_until(future.done, 30.0)
            assert future.result().success, future.result().message
            assert recorder.status_values()['episodes_saved'] == 1
    finally:
        executor.shutdown(timeout_sec=5.0)
        thread.join(timeout=5.0)
        recorder.destroy_node()


def test_recording_page_states_each_codec_default():
    """docs/recording.md says plainly which codec each tool uses when not told, as the code
    declares it: record_node's video_codec parameter, import-bag's --video-codec."""
    from act_ros.data.bag_import import build_parser
    from act_ros.ros.recording.record_node import parameter_declarations

    recorder = next(spec.default for spec in parameter_declarations()
                    if spec.name == 'video_codec')
    importer = next(a.default for a in build_parser()._actions
                    if '--video-codec' in a.option_strings)
    page = (Path(__file__).resolve().parents[1] / 'docs' / 'recording.md').read_text()
    sentence = page.split('**Video codec.** ', 1)[1].split('\n\n', 1)[0].replace('\n', ' ')
    first = sentence.split('. ')[0]
    assert '`record_node` encodes' in first and f'(`video_codec: {recorder}`)' in first, first
    assert '`act-ros import-bag` encodes' in first and \
        f'(`--video-codec {importer}`)' in first, first


# -- issue 42 -------------------------------------------------------------------------
def _episodes(output: Path):
    """(LeRobot dataset, [(metadata, frame indices, timestamps, state[:, 0])] per episode)."""
    dataset, store = _read(output)
    table = dataset.hf_dataset
    episode = np.asarray(table['episode_index'])
    stamps = np.asarray(table['timestamp'], np.float64)
    index = np.asarray(table['frame_index'])
    state0 = store.state.numpy()[:, 0].astype(np.float64)
    out = []
    for e in range(dataset.meta.total_episodes):
        rows = episode == e
        out.append((recording_metadata(output, e), index[rows], stamps[rows], state0[rows]))
    return dataset, out


def _trailing(meta: dict) -> int:
    """The missing ticks that ended an episode (``ended_by: a gap of N tick(s): ...``)."""
    import re

    match = re.match(r'a gap of (\d+) tick', meta['ended_by'])
    return int(match[1]) if match else 0


def test_an_episode_at_the_cap_is_saved_and_continued(rclpy_context, tmp_path):
    """max_episode_frames 20, about 50 frames recorded on the timer: every frame kept, in
    episodes of at most 20 frames that name the one they continue; each frame's time (its
    episode's first tick plus index / fps) is when its joint states were published, within
    the input tolerance and a period (the joint states carry their publication time)."""
    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    first = CONTRACT.joint_names[0]
    follower = RobotHarness(context=rclpy_context, joints=joints, rate_hz=None,
                            image=np.full((H, W, 3), 40, np.uint8))
    leader = RobotHarness(context=rclpy_context, joints=joints, image=np.zeros((H, W, 3),
                                                                                np.uint8),
                          cameras=(), namespace='leader', name='leader')
    t_ref = follower.get_clock().now().nanoseconds * 1e-9

    def publish():  # the follower's first joint holds its publication time (s after t_ref)
        now = follower.get_clock().now().nanoseconds * 1e-9
        follower.joints[first] = now - t_ref
        follower.publish_once(now)
    follower.create_timer(1 / 30, publish)
    tolerance = 0.2
    recorder = _recorder(rclpy_context, tmp_path / 'rec', action_source='leader',
                         action_topic='leader/joint_states', tolerance_s=tolerance,
                         max_episode_frames=20)
    start = recorder.create_client(Trigger, '/record_node/start_episode')
    save = recorder.create_client(Trigger, '/record_node/save_episode')
    with spinning(rclpy_context, follower, leader, recorder):
        assert wait_until(lambda: not recorder.unconnected_topics(), DISCOVERY_S), \
            recorder.unconnected_topics()
        assert _call(start).success
        total = lambda: recorder.buffer.chain_frames + recorder.buffer.frames  # noqa: E731
        assert _wait_while_recording(recorder, lambda: total() >= 50), recorder.status_values()
        response = _call(save)
        assert response.success, response.message
        status = recorder.status_values()
    dataset, episodes = _episodes(tmp_path / 'rec')
    metas = [m for m, *_ in episodes]
    lengths = [len(i) for _, i, *_ in episodes]
    assert sum(lengths) == dataset.meta.total_frames >= 50
    assert status['episodes_saved'] == len(episodes) >= 3, metas
    assert status['continuations'] == len(episodes) - 1 and status['frames_discarded'] == 0
    assert metas[0]['continues_episode'] is None
    for e, meta in enumerate(metas):
        assert meta['frames'] == lengths[e] <= 20, meta
        if e:
            assert meta['continues_episode'] == e - 1, metas
        if e < len(metas) - 1:  # ended by the cap, or (a busy machine) by a gap
            assert meta['ended_by'] in ('max_episode_frames (20)',) or \
                meta['ended_by'].startswith('a gap of'), meta
            if meta['ended_by'].startswith('max'):
                assert lengths[e] == 20
    if all(m['ended_by'].startswith('max') for m in metas[:-1]):
        assert len(episodes) == 3 and lengths[:2] == [20, 20]
    for meta, index, stamps, published in episodes:
        np.testing.assert_array_equal(index, np.arange(len(index)))
        np.testing.assert_allclose(stamps, index / 30, atol=1e-6)
        lag = meta['start_time_s'] + stamps - (t_ref + published)
        assert np.all((lag > -1 / 30 - 0.005) & (lag < tolerance + 0.005)), lag


def test_a_camera_that_skips_frames_splits_episodes_at_true_times(rclpy_context, tmp_path):
    """Lock-step sets stamped k / 30 s apart, the wrist camera skipping a quarter of them:
    no frame is placed at another time than its stamp. Each episode ends where a set is
    missing and the next continues it; every frame's time (its episode's start plus
    index / fps) is its publication stamp; the drops are counted per episode, the episodes
    over max_drop_fraction flagged, and LeRobot loads the dataset."""
    joints = dict(zip(CONTRACT.joint_names, np.zeros(CONTRACT.num_joints)))
    first = CONTRACT.joint_names[0]
    follower = RobotHarness(context=rclpy_context, joints=joints, rate_hz=None,
                            image=np.full((H, W, 3), 40, np.uint8))
    leader = RobotHarness(context=rclpy_context, joints=joints, rate_hz=None,
                          image=np.zeros((H, W, 3), np.uint8), cameras=(),
                          namespace='leader', name='leader')
    follower.drop = {'wrist': 0.25}
    recorder = _recorder(rclpy_context, tmp_path / 'rec', action_source='leader',
                         action_topic='leader/joint_states', trigger='observation',
                         max_drop_fraction=0.1, start_recording=True)
    t0 = float(int(follower.get_clock().now().nanoseconds * 1e-9))
    sets = 60
    stamps = {}
    with spinning(rclpy_context, follower, leader, recorder):
        assert wait_until(lambda: not recorder.unconnected_topics(), DISCOVERY_S), \
            recorder.unconnected_topics()
        for k in range(sets):
            before = recorder.buffer.chain_frames + recorder.buffer.frames
            follower.joints[first] = float(k)
            stamps[k] = follower.publish_once(t0 + k / 30)
            leader.publish_once(stamps[k])
            # Pacing only: a set whose wrist image was skipped never becomes a frame.
            wait_until(lambda b=before: recorder.buffer.chain_frames + recorder.buffer.frames
                       > b, 0.5)
        save = recorder.create_client(Trigger, '/record_node/save_episode')
        response = _call(save)
        assert response.success, response.message
        status = recorder.status_values()
    dataset, episodes = _episodes(tmp_path / 'rec')
    assert len(episodes) >= 4, [m for m, *_ in episodes]  # about 15 skipped sets
    kept = np.concatenate([published for *_, published in episodes]).astype(int)
    assert np.all(np.diff(kept) > 0)
    missing = set(range(int(kept[0]), int(kept[-1]) + 1)) - set(kept.tolist())
    flagged = 0
    for e, (meta, index, ts, published) in enumerate(episodes):
        np.testing.assert_array_equal(index, np.arange(len(index)))
        np.testing.assert_allclose(ts, index / 30, atol=1e-6)  # what LeRobot checks
        np.testing.assert_array_equal(np.diff(published), 1)  # no set missing inside
        want = np.array([stamps[int(k)] for k in published])
        np.testing.assert_allclose(meta['start_time_s'] + ts, want, atol=1e-4)
        assert meta['frames'] == len(index)
        assert meta['continues_episode'] == (e - 1 if e else None), meta
        if e < len(episodes) - 1:
            assert meta['ended_by'].startswith('a gap of'), meta
        if e:  # the sets between two episodes: the gap that ended the first (counted in
            # it) and any the next one dropped before its first frame (its writer was made)
            before = episodes[e - 1][0]
            between = int(published[0] - episodes[e - 1][3][-1] - 1)
            assert between == _trailing(before) + meta['dropped_ticks'] - _trailing(meta), \
                (before, meta)
        assert meta['flagged'] == (meta['drop_fraction'] > 0.1)
        flagged += meta['flagged']
    assert sum(m['dropped_ticks'] for m, *_ in episodes) == len(missing) > 0
    assert status['episodes_flagged'] == flagged > 0
    assert status['continuations'] == len(episodes) - 1
