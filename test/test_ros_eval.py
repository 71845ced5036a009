"""The over-ROS evaluation driver: sim_bridge and act_node as real processes, no orphans.

The end-to-end test runs the whole stage of `make demo` (lock-step episodes over the
topics, both policy modes) with a tiny checkpoint and short episodes. The signal tests
stop the driver while its children are running and check that none of them survives.
"""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.ros, pytest.mark.sim]
pytest.importorskip('rclpy')
pytest.importorskip('mujoco')

from act_ros.core.processes import child_setup, wait_gone  # noqa: E402
from act_ros.ros.evaluation import ros_eval  # noqa: E402

PID_LINE = re.compile(r'started (sim_bridge|act_node) \(pid (\d+)')


def started_pids(text: str) -> dict[str, int]:
    return {name: int(pid) for name, pid in PID_LINE.findall(text)}


# Where the same commands take the arm in 15 ticks, over ROS 2 and in process. A gap of
# 0.006-0.021 rad here once showed that the in-process run rendered its cameras at another
# size than the bridge (the comparison must render what the bridge renders).
JOINT_GAP_RAD = 1e-3


def _start_joints(checkpoint, seeds):
    """The arm's measured joints at the start of each seed's episode."""
    from act_ros.sim.env import PortPickAlignEnv
    from act_ros.training.evaluation.rollout import make_sim_config

    with PortPickAlignEnv(make_sim_config(checkpoint, episode_steps=15)) as env:
        starts = []
        for seed in seeds:
            env.reset(seed=seed)
            starts.append(env.joint_positions().copy())
    return starts


@pytest.mark.slow
def test_driver_runs_lockstep_episodes_over_two_processes_for_every_mode(
        tiny_checkpoint, ros_domain_id, tmp_path, capsys):
    """Every mode over ROS gives the episodes, and the seams of the commands sent, that
    the same control step gives in process (chunk and blend: a chunk every 5 ticks, blend
    with a 2-tick crossfade)."""
    output = tmp_path / 'ros_eval.json'
    results = ros_eval.main([
        '--checkpoint', str(tiny_checkpoint), '--episodes', '2', '--mode', 'all',
        '--n-action-steps', '5', '--blend-window', '2',
        '--episode-steps', '15', '--seed', '100', '--lockstep-timeout', '30',
        '--torch-threads', '1', '--domain-id', str(ros_domain_id),
        '--log-dir', str(tmp_path / 'logs'), '--output', str(output)])
    printed = capsys.readouterr().out
    assert set(results) == {'chunk', 'ensemble', 'blend'}
    from act_ros.training.evaluation.rollout import make_sim_config, run_policy_episodes

    start_joints = _start_joints(tiny_checkpoint, [100, 101])
    final, gaps = {}, []
    for mode, metrics in results.items():
        assert metrics['count'] == 2 and metrics['seeds'] == [100, 101]
        errors = [e['position_error_m'] for e in metrics['episodes']]
        assert metrics['mean_position_error'] == pytest.approx(sum(errors) / 2)
        # The same policy through the same control step in process: the same episodes.
        # In 15 ticks the box does not move, so its errors are set by the seed; what the
        # policy decided shows in the arm: where its commands took the joints.
        local = run_policy_episodes(tiny_checkpoint, episodes=2, mode=mode, seed=100,
                                    sim_config=make_sim_config(
                                        tiny_checkpoint, ros_eval.render_size(tiny_checkpoint),
                                        episode_steps=15),
                                    n_action_steps=5 if mode != 'ensemble' else None,
                                    blend_ticks=2 if mode == 'blend' else None)
        assert metrics['align_rate'] == local.summary['align_rate']
        # The node's ~/seams over both episodes: the handovers the in-process run counts.
        seams, local_seams = metrics['seams'], local.seam_samples.summary()
        assert seams['handovers'] == local_seams['handovers'], (mode, seams, local_seams)
        # Two episodes: chunk and blend hand over at ticks 5 and 10; ensembling every tick
        # (the first and last ticks' seams have too few commands around them to count).
        assert seams['handovers'] == {'chunk': 4, 'ensemble': 20, 'blend': 4}[mode]
        assert seams['velocity_jump_max'] == pytest.approx(local_seams['velocity_jump_max'],
                                                           rel=1e-3)
        for over_ros, in_process, start in zip(metrics['episodes'], local.episodes,
                                               start_joints, strict=True):
            assert over_ros['seed'] == in_process['seed']
            assert over_ros['failure_phase'] == in_process['failure_phase']
            assert over_ros['position_error_m'] == pytest.approx(
                in_process['position_error_m'], abs=1e-3)
            assert over_ros['yaw_error_deg'] == pytest.approx(in_process['yaw_error_deg'],
                                                              abs=0.5)
            moved = np.abs(np.subtract(in_process['final_joints'], start)).max()
            assert moved > 0.01, f'the policy did not move the arm ({moved:.4f} rad)'
            gaps.append((mode, over_ros['seed'], np.abs(np.subtract(
                over_ros['final_joints'], in_process['final_joints'])).max()))
        final[mode] = np.array([e['final_joints'] for e in metrics['episodes']])
    # Chunk playing and ensembling command differently, and the arm shows it, by more than
    # the over-ROS gap: the joints compared above are the policy's doing, not the seed's.
    between_modes = np.abs(final['chunk'] - final['ensemble']).max()
    assert max(g for _, _, g in gaps) < JOINT_GAP_RAD, gaps
    assert between_modes > 10 * JOINT_GAP_RAD, between_modes
    for mode, metrics in results.items():
        # Clean lock-step: every step was answered by a policy command.
        assert metrics['lockstep_timeouts'] == 0, metrics['episodes']
        for episode in metrics['episodes']:
            assert episode['steps'] == 15
            assert episode['commands']['applied'] == 15 and episode['commands']['rejected'] == 0
            # One command per observation: a second one would have advanced the chunk.
            assert episode['commands']['received'] == 15, episode['commands']
        assert re.search(rf'{mode}\s+align_rate \d\.\d\d \(\d/2\), mean position error', printed)
    assert re.search(r'seams: \d+ of \d+ handovers over the within-chunk p99', printed)
    written = json.loads(output.read_text())
    provenance = written.pop('provenance')
    assert written == json.loads(json.dumps(results))
    # the command that made it, without this machine's paths
    assert provenance['command'].startswith('act-ros ros-eval')
    assert str(tmp_path) not in provenance['command'] and provenance['commit']
    # Both processes really ran, and neither is left.
    logs = {p.name for p in (tmp_path / 'logs').glob('*.log')}
    assert logs == {'sim_bridge.log', 'act_node.log'}
    assert 'reconfiguring act_node for mode ensemble' in printed
    assert 'episode 0 started with seed 100' in (tmp_path / 'logs' / 'sim_bridge.log').read_text()
    pids = [int(p) for _, p in PID_LINE.findall(printed)]
    assert len(pids) == 2 and not wait_gone(pids, 10.0)


@pytest.fixture(scope='module')
def no_camera_checkpoint(module_tmp):
    """The tiny ACT on the joints and the object poses alone."""
    from act_ros.core.inference.checkpoint import create_checkpoint
    return create_checkpoint(module_tmp('ckpt') / 'no_camera', preset='tiny',
                             cameras=(), environment_state=True)


@pytest.mark.slow
@pytest.mark.parametrize('which', ['tiny_pose_checkpoint', 'no_camera_checkpoint'])
def test_object_poses_reach_the_policy_over_ros(request, which, ros_domain_id, tmp_path,
                                               capsys):
    """A checkpoint that takes the object poses (with cameras, or none): act_node gets them
    from the bridge's box_pose and pad_pose (otherwise it would send nothing and every step
    would time out), the bridge waits for exactly the topics the policy reads, and the
    episodes end as in process (SimObservation.environment_state)."""
    from act_ros.training.evaluation.rollout import make_sim_config, run_policy_episodes

    checkpoint = request.getfixturevalue(which)
    cameras = which == 'tiny_pose_checkpoint'
    assert ros_eval.policy_input_topics(checkpoint) == (
        ['joint_states', 'box_pose', 'pad_pose']
        + (['camera/top/image_raw', 'camera/wrist/image_raw'] if cameras else []))
    results = ros_eval.main([
        '--checkpoint', str(checkpoint), '--episodes', '1', '--mode', 'chunk',
        '--episode-steps', '15', '--seed', '300', '--lockstep-timeout', '30',
        '--torch-threads', '1', '--domain-id', str(ros_domain_id),
        '--log-dir', str(tmp_path / 'logs')])
    metrics = results['chunk']
    assert metrics['lockstep_timeouts'] == 0, metrics['episodes']
    commands = metrics['episodes'][0]['commands']
    assert commands['applied'] == commands['received'] == 15 and commands['rejected'] == 0
    # The bridge waited for exactly the topics the policy reads: it found them connected
    # and did not start the episode after giving up on subscribers that never came.
    bridge_log = (tmp_path / 'logs' / 'sim_bridge.log').read_text()
    assert 'no policy connected' not in bridge_log, bridge_log[-2000:]
    assert 'episode 0 started with seed 300' in bridge_log, bridge_log[-2000:]
    node_log = (tmp_path / 'logs' / 'act_node.log').read_text()
    assert 'object poses on /box_pose, /pad_pose' in node_log, node_log[-2000:]
    assert ('inputs: joints, top, wrist, object' if cameras
            else 'inputs: joints, no camera, object') in node_log
    local = run_policy_episodes(checkpoint, episodes=1, mode='chunk', seed=300,
                                sim_config=make_sim_config(checkpoint, (48, 64),
                                                           episode_steps=15))
    over_ros, in_process = metrics['episodes'][0], local.episodes[0]
    assert over_ros['position_error_m'] == pytest.approx(in_process['position_error_m'],
                                                         abs=1e-3)
    assert over_ros['max_box_height_m'] == pytest.approx(in_process['max_box_height_m'],
                                                         abs=1e-3)
    # The poses steer the policy: where it took the arm is the same both ways.
    np.testing.assert_allclose(over_ros['final_joints'], in_process['final_joints'],
                               atol=JOINT_GAP_RAD)
    start = _start_joints(checkpoint, [300])[0]
    assert np.abs(np.subtract(in_process['final_joints'], start)).max() > 0.01
    capsys.readouterr()


def test_a_child_that_fails_is_reported_and_nothing_is_left(tiny_checkpoint, ros_domain_id,
                                                            tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ros_eval.main(['--checkpoint', str(tiny_checkpoint), '--episodes', '1',
                       '--mode', 'chunk', '--device', 'tpu', '--domain-id', str(ros_domain_id),
                       '--log-dir', str(tmp_path)])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    error = [line for line in captured.err.splitlines() if 'error:' in line]
    assert len(error) == 1 and 'act_node' in error[0] and 'exited with code 1' in error[0]
    assert "unknown device 'tpu'" in captured.err  # the child's log tail comes with it
    pids = list(started_pids(captured.out).values())
    assert len(pids) == 2 and not wait_gone(pids, 10.0)


def test_bad_arguments_fail_fast_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ros_eval.main(['--checkpoint', str(tmp_path / 'missing'), '--episodes', '1'])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'missing: checkpoint directory does not exist' in err[0]


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)


@pytest.mark.parametrize('sig, expected_code, mid_episode', [
    pytest.param(signal.SIGINT, 130, True, marks=pytest.mark.slow), (signal.SIGTERM, 130, False),
    (signal.SIGKILL, -signal.SIGKILL, False)])
def test_stopping_the_driver_leaves_no_orphans(tiny_checkpoint, ros_domain_id, tmp_path, sig,
                                               expected_code, mid_episode):
    # SIGINT is Ctrl-C during an episode; SIGTERM and SIGKILL come while act_node is still
    # loading. After SIGKILL the driver cannot clean up: the kernel's parent-death signal
    # stops the children.
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    driver = subprocess.Popen(
        [sys.executable, '-m', 'act_ros.ros.evaluation.ros_eval', '--checkpoint', str(tiny_checkpoint),
         '--episodes', '5', '--mode', 'both', '--domain-id', str(ros_domain_id),
         '--log-dir', str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        # Like a terminal's foreground job, apart from pytest: its own session, SIGINT at
        # its default even when the suite runs in the background (`make test &`).
        start_new_session=True, preexec_fn=child_setup)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(driver.stdout, lines), daemon=True).start()
    seen = ''
    try:
        deadline = time.monotonic() + 60.0
        while len(started_pids(seen)) < 2 and time.monotonic() < deadline:
            try:
                seen += lines.get(timeout=1.0)
            except queue.Empty:
                assert driver.poll() is None, seen
        pids = started_pids(seen)
        assert set(pids) == {'sim_bridge', 'act_node'}, seen
        if mid_episode:
            bridge_log = Path(tmp_path, 'sim_bridge.log')
            while 'episode 0 started' not in bridge_log.read_text():
                assert time.monotonic() < deadline + 60.0, bridge_log.read_text()
                assert driver.poll() is None
                time.sleep(0.2)
        time.sleep(1.5)  # the children are up and busy (loading the model, stepping)
        for pid in pids.values():
            os.kill(pid, 0)  # raises ProcessLookupError if a child died on its own
        driver.send_signal(sig)
        assert driver.wait(timeout=60.0) == expected_code
        left = wait_gone(list(pids.values()), 20.0)
        assert not left, f'orphans after {sig.name}: {left}'
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert Path(tmp_path, 'sim_bridge.log').is_file()


def _installed(distribution: str) -> bool:
    import importlib.metadata
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_dds_profile_is_selected_unless_the_user_chose_one():
    import xml.etree.ElementTree as ET

    from act_ros.ros.evaluation.dds import dds_environment

    env = dds_environment({'RMW_IMPLEMENTATION': 'rmw_fastrtps_cpp'})
    # The variable the installed Fast DDS reads (Kilted's 3.x: FASTDDS_..., Jazzy's 2.14:
    # only FASTRTPS_...; the Jazzy run of test_full_size_images_cross_processes_in_lockstep
    # timed out 7 of 10 steps with the profile in the other one).
    (name,) = env.keys() - {'RMW_IMPLEMENTATION'}
    assert name == ('FASTRTPS_DEFAULT_PROFILES_FILE' if _installed('ros-jazzy-rclpy')
                    else 'FASTDDS_DEFAULT_PROFILES_FILE')
    for distro, expected in (('jazzy', 'FASTRTPS_DEFAULT_PROFILES_FILE'),
                             ('humble', 'FASTRTPS_DEFAULT_PROFILES_FILE'),
                             ('kilted', 'FASTDDS_DEFAULT_PROFILES_FILE'),
                             ('rolling', 'FASTDDS_DEFAULT_PROFILES_FILE')):
        assert expected in dds_environment({'ROS_DISTRO': distro}), distro
    profile = Path(env[name])
    ET.parse(profile)  # well-formed
    assert '<address>127.0.0.1</address>' in profile.read_text()  # loopback only
    mine = {'FASTRTPS_DEFAULT_PROFILES_FILE': '/etc/my_profile.xml'}
    assert dds_environment(mine) == mine
    cyclone = {'RMW_IMPLEMENTATION': 'rmw_cyclonedds_cpp'}
    assert dds_environment(cyclone) == cyclone


def test_full_size_images_cross_processes_in_lockstep(ros_domain_id, tmp_path):
    # 480x640 rgb8 (921,600 bytes) from the bridge process to a best-effort subscriber in
    # another process: with the middleware defaults most are lost (steps time out).
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id), TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, '-m', 'act_ros.ros.sim_bridge.bench', '--image-size', '480x640',
         '--steps', '10', '--domain-id', str(ros_domain_id),
         # A lost image never comes; a step slowed by a busy machine does: wait for it.
         '--lockstep-timeout', '30'],
        check=False, capture_output=True, text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r'480x640: [\d.]+ steps/s .*10 steps, 0 timeouts', proc.stdout), proc.stdout
    # The bridge's log directory is removed after a measurement that succeeded.
    assert not list(tmp_path.glob('act_ros_bridge_bench_*'))


def test_the_bridge_renders_at_the_size_of_the_training_images(tiny_checkpoint, tmp_path):
    """As act-ros evaluate: a model that takes 48x64 inputs but was trained on 96x128
    recordings (downscaled by the runtime) is shown 96x128 renders, downscaled the same way;
    without training_info.json the input size counts."""
    import json
    import shutil

    from act_ros.ros.evaluation.ros_eval import checkpoint_image_size, render_size

    checkpoint = tmp_path / 'ckpt'
    shutil.copytree(tiny_checkpoint, checkpoint)
    (checkpoint / 'training_info.json').unlink(missing_ok=True)
    inputs = checkpoint_image_size(checkpoint)
    assert inputs is not None and render_size(checkpoint) == inputs
    (checkpoint / 'training_info.json').write_text(json.dumps({'dataset_image_size': [96, 128]}))
    assert render_size(checkpoint) == (96, 128)
