"""gym-aloha's transfer cube as a task of the package: environment, scripted expert,
datasets, evaluation in process and over ROS 2.

The environment must be gym-aloha's own (same object poses for a seed, same physics and
reward step by step), render only what is read, and the expert must succeed the paper's
way (planned in the end-effector task, replayed in joint space).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from extras import needs_gym_aloha

pytestmark = [pytest.mark.sim, needs_gym_aloha]


# ------------------------------------------------------------------ environment
def test_seeded_episode_is_gym_alohas_own():
    """Same seed, same actions: our environment and gym-aloha's gym env (what LeRobot's
    lerobot-eval runs) give the same joints, object pose and reward at every step."""
    import gym_aloha  # noqa: F401 (registers the ids)
    import gymnasium as gym

    from act_ros.sim.aloha.env import AlohaEnv

    theirs = gym.make('gym_aloha/AlohaTransferCube-v0', obs_type='pixels_agent_pos')
    ours = AlohaEnv('transfer_cube', terminate_on_success=False)
    try:
        seed = 123
        their_obs, _ = theirs.reset(seed=seed)
        obs = ours.reset(seed)
        physics = theirs.unwrapped._env.physics
        np.testing.assert_array_equal(obs.joint_positions, their_obs['agent_pos'])
        np.testing.assert_array_equal(obs.env_state, physics.data.qpos[16:])
        rng = np.random.default_rng(0)
        action = obs.joint_positions.copy()
        for _ in range(8):
            action = action + rng.normal(0.0, 0.02, action.shape)
            their_obs, their_reward, *_ = theirs.step(action)
            obs = ours.step(action)
            np.testing.assert_array_equal(obs.joint_positions, their_obs['agent_pos'])
            np.testing.assert_array_equal(obs.env_state, physics.data.qpos[16:])
            assert obs.reward == their_reward
    finally:
        theirs.close()
        ours.close()


def test_renders_only_what_is_read():
    from act_ros.sim.aloha.env import AlohaEnv

    env = AlohaEnv('transfer_cube', cameras=('top',), image_size=(48, 64))
    rendered = []
    original = env.render

    def counting_render(camera='top'):
        rendered.append(camera)
        return original(camera)

    env.render = counting_render
    try:
        obs = env.reset(7)
        for _ in range(5):
            obs = env.step(obs.joint_positions)
        assert rendered == []  # nothing read, nothing rendered
        image = obs.images['top']
        assert image.shape == (48, 64, 3) and image.dtype == np.uint8
        assert obs.images['top'] is image and rendered == ['top']  # once per observation
        stale = env.step(obs.joint_positions)  # its image never read ...
        env.step(obs.joint_positions)  # ... before the simulation moved on
        with pytest.raises(RuntimeError, match='moved on'):
            stale.images['top']
        assert obs.images['top'] is image  # an image read in time stays readable
        with pytest.raises(KeyError, match='not rendered'):
            stale.images['angle']
    finally:
        env.close()


def test_bad_actions_are_refused():
    from act_ros.sim.aloha.env import AlohaEnv

    env = AlohaEnv('transfer_cube')
    try:
        with pytest.raises(RuntimeError, match='reset'):
            env.step(np.zeros(14))
        env.reset(1)
        with pytest.raises(ValueError, match='14 joint targets'):
            env.step(np.zeros(6))
        with pytest.raises(ValueError, match='finite'):
            env.step(np.full(14, np.nan))
    finally:
        env.close()
    with pytest.raises(ValueError, match='unknown gym-aloha task'):
        AlohaEnv('fold_laundry')
    with pytest.raises(ValueError, match='unknown cameras'):
        AlohaEnv('transfer_cube', cameras=('wrist',))


def test_success_ends_the_episode_only_when_asked():
    """An expert episode reaches reward 4; with terminate_on_success it stops right there."""
    from act_ros.sim.aloha.env import AlohaEnv
    from act_ros.sim.aloha.expert import JointTrajectoryExpert, end_effector_rollout

    trajectory = end_effector_rollout('transfer_cube', 0)
    expert = JointTrajectoryExpert(trajectory)
    results = {}
    for terminate in (False, True):
        env = AlohaEnv('transfer_cube', terminate_on_success=terminate)
        try:
            env.reset(0)
            while not env.done:
                env.step(expert.act(env.step_index))
            results[terminate] = env.evaluate()
        finally:
            env.close()
    full, ended = results[False], results[True]
    assert full.success and full.max_reward == 4 and full.steps == 400
    assert ended.success and ended.steps == ended.success_step == full.success_step < 400


# ------------------------------------------------------------------ expert
def test_quaternion_helpers():
    from act_ros.sim.aloha.expert import axis_angle_quat, quat_multiply, quat_to_matrix, slerp

    q = axis_angle_quat([0, 1, 0], -60)
    np.testing.assert_allclose(quat_multiply(np.array([1.0, 0, 0, 0]), q), q)
    np.testing.assert_allclose(quat_to_matrix(q) @ [1, 0, 0],
                               [math.cos(math.radians(60)), 0, math.sin(math.radians(60))],
                               atol=1e-12)
    np.testing.assert_allclose(slerp(np.array([1.0, 0, 0, 0]), q, 0.0), [1, 0, 0, 0])
    np.testing.assert_allclose(slerp(np.array([1.0, 0, 0, 0]), q, 1.0), q)
    half = slerp(np.array([1.0, 0, 0, 0]), q, 0.5)
    np.testing.assert_allclose(half, axis_angle_quat([0, 1, 0], -30), atol=1e-12)


def test_plan_interpolates_and_holds():
    from act_ros.sim.aloha.expert import Waypoint, interpolate

    identity = np.array([1.0, 0, 0, 0])
    plan = (Waypoint(0, np.zeros(3), identity, 0.0),
            Waypoint(10, np.array([1.0, 0, 0]), identity, 1.0))
    xyz, _, grip = interpolate(plan, 5)
    np.testing.assert_allclose(xyz, [0.5, 0, 0])
    assert grip == pytest.approx(0.5)
    xyz, _, grip = interpolate(plan, 50)
    np.testing.assert_allclose(xyz, [1, 0, 0])
    assert grip == 1.0


def test_expert_trajectory_is_finite_and_within_the_servo_ranges():
    from act_ros.core.contract import load_contract
    from act_ros.sim.aloha.expert import end_effector_rollout
    from act_ros.sim.tasks import sim_task

    contract = load_contract(sim_task('aloha_transfer_cube').contract_path())
    trajectory = end_effector_rollout('transfer_cube', 3)
    actions = trajectory.actions
    assert actions.shape == (400, 14) and np.all(np.isfinite(actions))
    assert np.all(actions >= contract.lower - 1e-6) and np.all(actions <= contract.upper + 1e-6)
    # The grippers open and close: both are fully open at some point and closed at others.
    for index in (6, 13):
        assert actions[:, index].max() == 1.0 and actions[:, index].min() == 0.0


# ------------------------------------------------------------------ tasks and checkpoints
def test_contract_names_gym_alohas_joints():
    from act_ros.core.contract import load_contract
    from act_ros.sim.aloha.env import ALOHA_FPS, ALOHA_JOINTS
    from act_ros.sim.tasks import sim_task

    task = sim_task('aloha_transfer_cube')
    contract = load_contract(task.contract_path())
    assert contract.joint_names == ALOHA_JOINTS
    assert contract.fps == task.fps == ALOHA_FPS
    assert contract.camera_names == ('top',)
    with pytest.raises(ValueError, match='unknown task'):
        sim_task('no_such_task')


@pytest.fixture(scope='module')
def aloha_checkpoint(module_tmp) -> Path:
    """An untrained 14-joint checkpoint for transfer cube: chunk 100, all 100 played."""
    from act_ros.core.contract import load_contract
    from act_ros.core.inference.checkpoint import create_checkpoint
    from act_ros.sim.tasks import sim_task

    task = sim_task('aloha_transfer_cube')
    path = module_tmp('ckpt') / 'aloha_tiny'
    create_checkpoint(path, contract=load_contract(task.contract_path()), image_size=(48, 64),
                      preset='tiny', chunk_size=100, n_action_steps=100)
    (path / 'training_info.json').write_text(json.dumps({'task': task.name}))
    return path


def test_evaluate_runs_the_checkpoints_task(aloha_checkpoint, tmp_path, capsys):
    """act-ros evaluate picks gym-aloha from the checkpoint, writes success_rate, and in
    chunk mode (100 actions per chunk) renders only the frames the model reads."""
    from act_ros.training.evaluation.evaluate import main

    out = tmp_path / 'eval.json'
    code = main(['--checkpoint', str(aloha_checkpoint), '--episodes', '1', '--mode', 'chunk',
                 '--seed', '2000000', '--episode-steps', '150', '--output', str(out),
                 '--no-progress'])
    assert code == 0
    assert 'success_rate' in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data['task'] == 'aloha_transfer_cube' and data['render_size'] == [480, 640]
    chunk = data['modes']['chunk']
    assert chunk['count'] == 1 and chunk['success_rate'] == 0.0
    assert chunk['episodes'][0]['steps'] == 150 and chunk['episodes'][0]['seed'] == 2000000


def test_chunk_mode_plays_the_checkpoints_whole_chunk(aloha_checkpoint):
    """LeRobot's select_action semantics: a chunk-100 checkpoint is queried at ticks 0 and
    100 only, so a 150-step episode reads the camera twice."""
    from act_ros.sim.aloha.env import AlohaEnv
    from act_ros.sim.tasks import sim_task
    from act_ros.training.evaluation.rollout import SafetySettings, SimPolicy

    contract = _aloha_contract()
    safety = SafetySettings.from_node_config(
        contract, sim_task('aloha_transfer_cube').node_params_path())
    policy = SimPolicy(aloha_checkpoint, mode='chunk', safety=safety, contract=contract)
    env = AlohaEnv('transfer_cube', cameras=policy.cameras, episode_steps=150)
    try:
        assert policy.runtime.config.n_action_steps is None  # the checkpoint's own
        assert policy.runtime.n_action_steps == 100
        obs = env.reset(5)
        policy.reset(obs)
        while not env.done:
            obs = env.step(policy.act(obs))
        assert policy.runtime.stats.chunks_computed == 2
        assert policy.images_read == 2
    finally:
        policy.close()
        env.close()


def test_package_model_checks_an_aloha_checkpoint_on_its_own_task(aloha_checkpoint, tmp_path):
    """act-ros package-model reads the checkpoint's task: observations of gym-aloha (14
    joints, the top camera) and the ALOHA contract, not the package's 6-joint arm."""
    from act_ros.training.package_model import package, sample_observations

    observations = sample_observations(aloha_checkpoint, count=2)
    assert [o.state.shape for o in observations] == [(14,), (14,)]
    assert set(observations[0].images) == {'top'}
    assert observations[0].images['top'].shape == (48, 64, 3)
    report = package(aloha_checkpoint, tmp_path / 'aloha_packaged', observations=observations)
    assert report['max_action_difference'] <= 1e-2
    assert (tmp_path / 'aloha_packaged' / 'model.safetensors').is_file()


def _aloha_contract():
    from act_ros.core.contract import load_contract
    from act_ros.sim.tasks import sim_task

    return load_contract(sim_task('aloha_transfer_cube').contract_path())


@pytest.mark.slow
def test_collect_writes_a_lerobot_dataset(tmp_path):
    """One expert episode to a LeRobot v3 dataset with the env's features at 50 fps, which
    LeRobot's own LeRobotDataset opens."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from act_ros.training.drivers.collect import main

    out = tmp_path / 'demos'
    assert main(['--task', 'aloha_transfer_cube', '--output', str(out), '--episodes', '1',
                 '--seed', '0', '--image-size', '48x64', '--no-progress']) == 0
    info = json.loads((out / 'meta' / 'info.json').read_text())
    assert info['fps'] == 50 and info['total_episodes'] == 1 and info['total_frames'] == 400
    features = info['features']
    assert features['observation.state']['shape'] == [14]
    assert features['action']['shape'] == [14]
    assert features['observation.images.top']['shape'] == [48, 64, 3]
    assert features['sim.env_state']['shape'] == [7]
    dataset = LeRobotDataset('local/demos', root=out)
    frame = dataset[10]
    assert tuple(frame['observation.images.top'].shape) == (3, 48, 64)
    assert frame['observation.state'].shape[0] == 14


@pytest.mark.slow
def test_over_ros_evaluation_of_an_aloha_checkpoint(aloha_checkpoint, tmp_path):
    """sim_bridge (task aloha_transfer_cube, lock-step) and act_node (the robot's parameter
    file) as two processes: episodes end with gym-aloha's result."""
    from act_ros.ros.evaluation.ros_eval import main

    out = tmp_path / 'ros.json'
    results = main(['--checkpoint', str(aloha_checkpoint), '--episodes', '1', '--mode',
                    'chunk', '--seed', '2000000', '--episode-steps', '30',
                    '--log-dir', str(tmp_path / 'logs'), '--output', str(out)])
    chunk = results['chunk']
    assert chunk['task'] == 'aloha_transfer_cube' and chunk['count'] == 1
    assert chunk['lockstep_timeouts'] == 0
    assert chunk['episodes'][0]['steps'] == 30 and chunk['episodes'][0]['seed'] == 2000000
    assert json.loads(out.read_text())['chunk']['success_rate'] == 0.0
