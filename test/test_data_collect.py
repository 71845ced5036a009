"""``act-ros collect``: expert demonstrations from the simulation to a LeRobot dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from act_ros.core.contract import load_contract
from act_ros.core.paths import config_path
from act_ros.data import collect, rollout
from act_ros.data.video_backend import video_backend
from act_ros.training.drivers import collect as collect_command

pytest.importorskip('mujoco')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

pytestmark = pytest.mark.sim

H, W = 48, 64
SEED = 3
# Short episodes: the expert places and releases the box of seeds 3 and 4 well within them.
STEPS = 245
COMMON = ['--image-size', f'{H}x{W}', '--episode-steps', str(STEPS), '--no-progress']


def _load(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f'local/{root.name}', root=root, video_backend=video_backend(),
                          delta_timestamps={'action': [i / 30 for i in range(30)]})


def _start_state(seed: int) -> np.ndarray:
    from act_ros.sim import PortPickAlignEnv, SimConfig

    config = SimConfig.from_yaml(render=False, episode_steps=STEPS)
    return PortPickAlignEnv(config).reset(seed=seed).joint_positions


def _columns(root: Path, key: str) -> np.ndarray:
    import pandas as pd

    frames = pd.concat(pd.read_parquet(p) for p in sorted((root / 'data').rglob('*.parquet')))
    return np.stack(frames[key].to_numpy())


@pytest.fixture(scope='module')
def collected(module_tmp) -> Path:
    output = module_tmp('collect') / 'demos'
    rc = collect_command.main(['--output', str(output), '--episodes', '2', '--seed', str(SEED),
                       '--workers', '1', *COMMON])
    assert rc == 0
    return output


def test_collected_dataset_loads_with_contract_features(collected):
    contract = load_contract()
    ds = _load(collected)
    assert ds.num_episodes == 2
    assert ds.num_frames == 2 * STEPS
    assert ds.fps == contract.fps
    for key in (contract.state_feature, contract.action_feature):
        assert ds.features[key]['names'] == list(contract.joint_names)
    item = ds[STEPS + 10]
    assert int(item['episode_index']) == 1 and int(item['frame_index']) == 10
    for cam in contract.cameras:
        assert ds.features[cam.feature]['dtype'] == 'image'   # lossless by default
        assert tuple(item[cam.feature].shape) == (3, H, W)
        assert float(item[cam.feature].std()) > 0.01  # a rendered scene, not a blank frame
    assert tuple(item['action'].shape) == (30, 6)
    assert bool(ds[2 * STEPS - 1]['action_is_pad'][1:].all())
    state = _columns(collected, 'observation.state')
    action = _columns(collected, 'action')
    lo, hi = contract.lower - 1e-3, contract.upper + 1e-3
    assert np.all((state >= lo) & (state <= hi))
    gripper = action[:STEPS, contract.gripper_indices[0]]
    assert gripper.max() > 0.9 and gripper.min() < 0.1  # the expert opens and closes


def test_object_poses_are_recorded_beside_each_frame(collected):
    from act_ros.data.episode import OBJECT_POSE_NAMES, OBJECT_POSES_FEATURE
    from act_ros.sim import PortPickAlignEnv, SimConfig

    ds = _load(collected)
    assert ds.features[OBJECT_POSES_FEATURE]['names'] == list(OBJECT_POSE_NAMES)
    poses = _columns(collected, OBJECT_POSES_FEATURE)
    assert poses.shape == (2 * STEPS, 8)
    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        obs = env.reset(seed=SEED + 1)
    np.testing.assert_allclose(poses[STEPS, :4], obs.box_pose, atol=1e-5)
    np.testing.assert_allclose(poses[STEPS, 4:], obs.pad_pose, atol=1e-5)
    # The pad never moves within an episode; the box does (the expert lifts it).
    assert np.ptp(poses[:STEPS, 4:], axis=0).max() < 1e-6
    assert np.ptp(poses[:STEPS, 2]) > 0.02


def test_exploration_noise_moves_the_arm_but_records_the_expert_action():
    from act_ros.data.rollout import ExplorationNoise, run_expert_episode
    from act_ros.sim import PortPickAlignEnv, SimConfig

    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        clean = run_expert_episode(env, SEED, ())
        noisy = run_expert_episode(env, SEED, (), noise_rad=0.08)
    assert clean.success and noisy.success  # the expert still grasps and places
    arm = [0, 1, 2, 3, 4]
    # The executed arm left the expert's path ...
    assert np.abs(noisy.episode.state[:60, arm] - clean.episode.state[:60, arm]).max() > 0.02
    # ... and each recorded label is what the expert commands from the state observed
    # there (it acts on the measured state), not what was executed.
    from act_ros.sim import ScriptedExpert

    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        obs = env.reset(seed=SEED)
        expert = ScriptedExpert(env)
        expert.reset(obs)
        first = expert.act(obs)
    np.testing.assert_allclose(noisy.episode.action[0], first, atol=1e-6)
    # The noise displaces the arm by a bounded, smooth excursion: the changes it adds sum
    # to the displacement, which returns to zero with the gain (none while closing).
    offsets = ExplorationNoise(0.08, 0)
    total = sum(offsets.offset(1.0) for _ in range(40))
    assert 0 < np.abs(total).max() < 0.08 * 3 * 4       # 4 standard deviations of the roll
    total = total + offsets.offset(0.0)
    np.testing.assert_allclose(total, 0.0, atol=1e-12)
    assert np.all(offsets.offset(0.0) == 0)
    with pytest.raises(ValueError, match='noise_rad'):
        ExplorationNoise(-0.1, 0)


def test_frames_are_stored_losslessly_and_decode_to_the_render(collected):
    """Training must see exactly the pixels the policy sees in closed loop: the frames the
    trainer decodes equal a fresh render of the same episode."""
    from act_ros.core.contract import load_contract
    from act_ros.data.rollout import run_expert_episode
    from act_ros.sim import PortPickAlignEnv, SimConfig
    from act_ros.training.data import load_frames, make_split

    contract = load_contract()
    ds = _load(collected)
    n = ds.num_frames
    episode_index = np.array(ds.hf_dataset['episode_index'])
    _, seg_start, seg_end = make_split(episode_index, 0.0, 0, n)
    store = load_frames(ds, contract, (H, W), seg_start=seg_start, seg_end=seg_end)
    with PortPickAlignEnv(SimConfig.from_yaml(camera_height=H, camera_width=W,
                                              episode_steps=STEPS)) as env:
        again = run_expert_episode(env, SEED + 1, contract.camera_names)
    for cam in contract.cameras:
        decoded = store.images[cam.feature][STEPS:].permute(0, 2, 3, 1).numpy()
        assert np.array_equal(decoded, again.episode.images[cam.name])
    card = (collected / 'README.md').read_text()
    assert 'PNG images, lossless' in card and 'Episodes: 2' in card


def test_object_poses_as_a_policy_input_and_the_episode_source_are_recorded(collected):
    from act_ros.core.object_state import ENVIRONMENT_STATE_FEATURE, ENVIRONMENT_STATE_NAMES
    from act_ros.data.episode import EPISODE_SOURCE_FEATURE
    from act_ros.sim import PortPickAlignEnv, SimConfig

    ds = _load(collected)
    assert ds.features[ENVIRONMENT_STATE_FEATURE]['names'] == list(ENVIRONMENT_STATE_NAMES)
    env_state = _columns(collected, ENVIRONMENT_STATE_FEATURE)
    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        obs = env.reset(seed=SEED)
    np.testing.assert_allclose(env_state[0], obs.environment_state, atol=1e-6)
    assert np.ptp(env_state[:STEPS, 2]) > 0.02                  # the box was lifted
    source = _columns(collected, EPISODE_SOURCE_FEATURE)
    np.testing.assert_array_equal(source, np.tile([0.0, 1.0], (2 * STEPS, 1)))


def test_episode_k_uses_seed_plus_k(collected):
    state = _columns(collected, 'observation.state')
    np.testing.assert_allclose(state[0], _start_state(SEED), atol=1e-6)
    np.testing.assert_allclose(state[STEPS], _start_state(SEED + 1), atol=1e-6)


def test_failed_expert_episodes_are_not_written(tmp_path, monkeypatch, capsys):
    real = rollout.run_expert_episode

    def fail_second_seed(env, seed, cameras, **kwargs):
        if seed == SEED + 1:  # pretend the expert missed on this one
            return rollout.RolloutResult(seed=seed, success=False, frames=STEPS,
                                         episode=None, detail='injected failure')
        return real(env, seed, cameras, **kwargs)

    monkeypatch.setattr(rollout, 'run_expert_episode', fail_second_seed)
    output = tmp_path / 'skips'
    assert collect_command.main(['--output', str(output), '--episodes', '2', '--seed', str(SEED),
                         *COMMON]) == 0
    out = capsys.readouterr()
    assert f'seed {SEED + 1}' in out.err and 'injected failure' in out.err
    assert 'expert failures: 1 of 3' in out.out
    assert _load(output).num_episodes == 2
    state = _columns(output, 'observation.state')
    np.testing.assert_allclose(state[0], _start_state(SEED), atol=1e-6)
    np.testing.assert_allclose(state[STEPS], _start_state(SEED + 2), atol=1e-6)


def test_no_dataset_when_the_expert_keeps_failing(tmp_path, capsys):
    settings = yaml.safe_load(config_path('sim.yaml').read_text())
    settings['sim']['success_position_tol_m'] = 1e-7  # unreachable: every episode fails
    sim_yaml = tmp_path / 'strict_sim.yaml'
    sim_yaml.write_text(yaml.safe_dump(settings))
    output = tmp_path / 'none'
    rc = collect_command.main(['--output', str(output), '--episodes', '1', '--max-attempts', '1',
                       '--sim-config', str(sim_yaml), *COMMON])
    assert rc == 1
    assert 'succeeded in only 0 of 1' in capsys.readouterr().err
    assert not output.exists()
    assert list(tmp_path.iterdir()) == [sim_yaml]


def test_interrupted_collection_leaves_nothing(tmp_path, monkeypatch):
    real = rollout.run_expert_episode

    def interrupt_second(env, seed, cameras, **kwargs):
        if seed == SEED + 1:
            raise KeyboardInterrupt
        return real(env, seed, cameras, **kwargs)

    monkeypatch.setattr(rollout, 'run_expert_episode', interrupt_second)
    output = tmp_path / 'interrupted'
    assert collect_command.main(['--output', str(output), '--episodes', '2', '--seed', str(SEED),
                         *COMMON]) == 130
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_parallel_workers_write_the_same_dataset(collected, tmp_path):
    output = tmp_path / 'parallel'
    assert collect_command.main(['--output', str(output), '--episodes', '2', '--seed', str(SEED),
                         '--workers', '2', *COMMON]) == 0
    for key in ('observation.state', 'action', 'episode_index', 'frame_index'):
        np.testing.assert_array_equal(_columns(output, key), _columns(collected, key))


def test_collect_config_validation(tmp_path):
    with pytest.raises(ValueError, match='workers'):
        collect.CollectConfig(output=tmp_path, episodes=1, workers=0)
    with pytest.raises(ValueError, match='max_attempts'):
        collect.CollectConfig(output=tmp_path, episodes=3, max_attempts=2)
    assert collect.CollectConfig(output=tmp_path, episodes=10).attempt_limit == 15


# A hang guard (a worker that fails must not leave the run waiting), not a speed bound:
# two spawned workers import the simulator, which a stalled machine can take minutes for.
@pytest.mark.timeout(400)
def test_a_worker_that_cannot_build_the_sim_fails_the_run(tmp_path, capsys):
    settings = yaml.safe_load(config_path('sim.yaml').read_text())
    settings['sim']['urdf_path'] = str(tmp_path / 'missing.urdf')
    sim_yaml = tmp_path / 'broken_sim.yaml'
    sim_yaml.write_text(yaml.safe_dump(settings))
    output = tmp_path / 'never'
    rc = collect_command.main(['--output', str(output), '--episodes', '2', '--workers', '2',
                       '--sim-config', str(sim_yaml), *COMMON])
    assert rc == 1
    assert 'could not be built in a worker process' in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['broken_sim.yaml']
