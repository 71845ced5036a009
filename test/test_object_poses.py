"""Object poses (``observation.environment_state``) as a policy input, end to end without
ROS: a tiny ACT trained a few steps on a synthetic dataset with the feature loads in
LeRobot and in PolicyRuntime and drives the in-process evaluator; a policy on the joints
and the poses alone (no camera) likewise; the trainer's errors name what is wrong.

Tiny model, 3 x 30 frames, a few steps: seconds each on a 2-core CPU. (The node over real
topics: test_node_act.py; parity with LeRobot: test_runtime_parity.py; ONNX backends:
test_backends.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from act_ros.core.contract import load_contract
from act_ros.core.errors import ObservationError
from act_ros.core.object_state import ENVIRONMENT_STATE_FEATURE as ENV
from act_ros.core.object_state import ENVIRONMENT_STATE_NAMES, environment_state
from act_ros.core.observation import Observation
from act_ros.training.config import TrainConfig
from act_ros.training.data import STD_FLOOR, TrainingDataError

pytest.importorskip('lerobot.datasets.lerobot_dataset')

H, W = 48, 64  # stored in the dataset
MH, MW = 32, 48  # model input
CONTRACT = load_contract()


def _write(root: Path, *, poses: bool, episodes: int = 3, frames: int = 30) -> Path:
    from act_ros.data.synthetic import write_synthetic_dataset

    write_synthetic_dataset(root, episodes=episodes, frames=frames, image_size=(H, W),
                            video=False, seed=5, environment_state=poses)
    return root


@pytest.fixture(scope='module')
def pose_dataset(module_tmp) -> Path:
    return _write(module_tmp('data') / 'poses', poses=True)


def _config(dataset: Path, out: Path, **kw) -> TrainConfig:
    values = dict(dataset_root=dataset, output_dir=out, preset='synthetic', model_preset='tiny',
                  image_size=(MH, MW), steps=8, batch_size=2, lr=3e-4, warmup_steps=0,
                  val_interval=4, max_val_batches=2, checkpoint_interval=8,
                  early_stop_patience=0, min_steps=0, device='cpu', torch_threads=1, seed=0,
                  progress=False, skip_infer=False, environment_state=True)
    values.update(kw)
    return TrainConfig(**values)


@pytest.fixture(scope='module')
def pose_run(pose_dataset, module_tmp):
    """Both cameras and the object poses; the backbone frozen and cached half-way (the
    cached steps take the poses from the store, normalized like the state)."""
    from act_ros.training.train import run

    out = module_tmp('run') / 'poses'
    return out, run(_config(pose_dataset, out, backbone_freeze_step=4))


@pytest.fixture(scope='module')
def state_only_run(pose_dataset, module_tmp):
    """No camera: the joints and the object poses alone."""
    from act_ros.training.train import run

    out = module_tmp('run') / 'state_only'
    return out, run(_config(pose_dataset, out, cameras=()))


def _poses(rng: np.random.Generator) -> np.ndarray:
    return environment_state(rng.uniform([0.15, -0.15, 0.0], [0.35, 0.15, 0.03]),
                             rng.uniform(-np.pi, np.pi),
                             rng.uniform([0.15, -0.15, 0.0], [0.35, 0.15, 0.01]),
                             rng.uniform(-np.pi, np.pi))


def _lerobot_action(path: Path, cameras: tuple[str, ...], state: np.ndarray,
                    poses: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LeRobot's own loading and select_action; also the preprocessed batch."""
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    policy = ACTPolicy.from_pretrained(path)
    policy.eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(path))
    raw = {'observation.state': torch.tensor(state, dtype=torch.float32)[None],
           ENV: torch.tensor(poses)[None]}
    for cam in cameras:
        raw[f'observation.images.{cam}'] = torch.full((1, 3, MH, MW), 0.5)
    batch = pre(raw)
    with torch.no_grad():
        return post(policy.select_action(batch)), batch


def _dataset_env_stats(dataset: Path) -> tuple[np.ndarray, np.ndarray]:
    stats = json.loads((dataset / 'meta' / 'stats.json').read_text())[ENV]
    return np.asarray(stats['mean'], np.float32), np.asarray(stats['std'], np.float32)


def test_pose_policy_trains_and_loads_in_lerobot_and_the_runtime(pose_run, pose_dataset):
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    out, metrics = pose_run
    assert metrics['status'] == 'completed' and metrics['inference_check']['finite']
    assert metrics['model']['environment_state'] is True
    assert metrics['model']['cameras'] == ['top', 'wrist']
    assert metrics['feature_cache']['layer4']['frozen_at_step'] == 4
    path = out / 'best'
    feature = json.loads((path / 'config.json').read_text())['input_features'][ENV]
    assert feature == {'type': 'ENV', 'shape': [10]}

    # LeRobot loads it and normalizes the poses with the dataset's statistics (floored).
    rng = np.random.default_rng(0)
    state, poses = np.zeros(6), _poses(rng)
    action, batch = _lerobot_action(path, ('top', 'wrist'), state, poses)
    assert action.shape == (1, 6) and torch.isfinite(action).all()
    mean, std = _dataset_env_stats(pose_dataset)
    assert std.min() < STD_FLOOR  # pad_z never changes in the data: the floor matters
    expected = (poses - mean) / (np.maximum(std, STD_FLOOR) + np.float32(1e-8))
    np.testing.assert_allclose(batch[ENV][0].numpy(), expected, rtol=1e-5, atol=1e-5)

    # The runtime: the poses are required and they change the action.
    image = np.full((96, 128, 3), 128, np.uint8)
    obs = dict(images={'top': image, 'wrist': image}, state=state)
    with PolicyRuntime(RuntimeConfig(model_path=path, device='cpu', execution='sync',
                                     n_action_steps=1, warmup=False)) as runtime:
        assert runtime.cameras == ('top', 'wrist') and runtime.environment_state_dim == 10
        with pytest.raises(ObservationError, match='observation has none'):
            runtime.act(Observation(**obs))
        with pytest.raises(ObservationError, match=r'expected 10 values .*box_x.*got 3'):
            runtime.act(Observation(**obs, environment_state=np.zeros(3)))
        with pytest.raises(ObservationError, match=r"non-finite values for \['box_y'\]"):
            runtime.act(Observation(**obs, environment_state=np.where(
                np.arange(10) == 1, np.nan, poses)))
        assert runtime.stats.ticks == 0  # refused before the tick counts
        first = runtime.act(Observation(**obs, environment_state=poses))
        other = runtime.act(Observation(**obs, environment_state=_poses(rng)))
    assert np.all(np.isfinite(first)) and not np.allclose(first, other, atol=1e-5)


def test_state_only_policy_trains_and_runs_in_lerobot_and_the_runtime(state_only_run):
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    out, metrics = state_only_run
    assert metrics['status'] == 'completed' and metrics['inference_check']['finite']
    assert metrics['model']['cameras'] == [] and metrics['model']['image_size'] is None
    path = out / 'best'
    inputs = json.loads((path / 'config.json').read_text())['input_features']
    assert sorted(inputs) == [ENV, 'observation.state']
    assert json.loads((path / 'training_info.json').read_text())['dataset_image_size'] is None

    state, poses = np.full(6, 0.1), _poses(np.random.default_rng(1))
    action, _ = _lerobot_action(path, (), state, poses)
    assert action.shape == (1, 6) and torch.isfinite(action).all()

    for execution in ('sync', 'async'):
        with PolicyRuntime(RuntimeConfig(model_path=path, device='cpu', execution=execution,
                                         warmup=True)) as runtime:
            assert runtime.cameras == ()
            runtime.reset()
            actions = []
            for _ in range(3):  # no camera at all in the observation
                actions.append(runtime.act(Observation(images={}, state=state,
                                                       environment_state=poses)))
                assert runtime.wait_idle(30.0)
            assert runtime.measure_latency(1).median_s > 0
        if execution == 'sync':  # LeRobot's select_action, exactly
            np.testing.assert_allclose(actions[0], action[0].double().numpy(), atol=1e-5)
        assert np.all(np.isfinite(actions[-1]))


def _evaluate(checkpoint: Path, *, render: bool) -> tuple[object, np.ndarray, np.ndarray]:
    """One short in-process evaluation episode on a simulation of our own; the start and
    end joints (a policy that got no observation would never move the arm)."""
    from act_ros.sim import PortPickAlignEnv, SimConfig
    from act_ros.training.evaluation.rollout import run_policy_episodes

    config = SimConfig.from_yaml(None, episode_steps=12, render=render, camera_height=H,
                                 camera_width=W)
    with PortPickAlignEnv(config, CONTRACT) as env:
        result = run_policy_episodes(checkpoint, episodes=1, mode='chunk', seed=7, env=env,
                                     contract=CONTRACT)
        end = env.joint_positions()
        start = env.reset(seed=7).joint_positions
    return result, np.asarray(start), np.asarray(end)


@pytest.mark.parametrize('which', ['pose_run', 'state_only_run'])
def test_in_process_evaluator_feeds_the_object_poses(request, which):
    out, _ = request.getfixturevalue(which)
    result, start, end = _evaluate(out / 'best', render=which == 'pose_run')
    assert result.summary['count'] == 1 and result.episodes[0]['steps'] == 12
    assert np.abs(end - start).max() > 1e-3, 'the policy never moved the arm'


def test_dataset_without_the_feature_is_refused(tmp_path):
    from act_ros.training.train import run

    plain = _write(tmp_path / 'plain', poses=False, episodes=2, frames=10)
    with pytest.raises(TrainingDataError, match=rf"'{ENV}' \(object poses, needed by "
                       r'--environment-state\) is missing'):
        run(_config(plain, tmp_path / 'out'))


def test_missing_or_constant_statistics(tmp_path):
    from act_ros.training.data import normalization_stats

    joint = {'mean': [0.0] * 6, 'std': [1.0] * 6}
    stats = {'observation.state': joint, 'action': joint}
    with pytest.raises(TrainingDataError, match=f"meta/stats.json has no statistics for '{ENV}'"):
        normalization_stats(stats, CONTRACT, environment_state=True)
    stats[ENV] = {'mean': [0.1] * 10, 'std': [0.0] * 10}
    out = normalization_stats(stats, CONTRACT, environment_state=True, cameras=())
    assert torch.equal(out[ENV]['std'], torch.full((10,), STD_FLOOR))
    assert sorted(out) == sorted([ENV, 'observation.state', 'action'])  # no camera


def test_camera_choice_is_checked(tmp_path, caplog):
    from act_ros.training.config import build_parser, config_from_args
    from act_ros.training.data import select_cameras

    assert [c.name for c in select_cameras(CONTRACT, ('wrist',))] == ['wrist']
    with pytest.raises(TrainingDataError, match=r"\['side'\] are not cameras of the contract"):
        select_cameras(CONTRACT, ('top', 'side'))
    with pytest.raises(ValueError, match='add --environment-state'):
        _config(tmp_path, tmp_path / 'o', cameras=(), environment_state=False)
    with pytest.raises(ValueError, match=r"\['backbone_freeze_step', 'image_shift_px'\] "
                       'cannot apply'):
        _config(tmp_path, tmp_path / 'o', cameras=(), backbone_freeze_step=10, image_shift_px=2)
    args = ['--dataset-root', str(tmp_path), '--output-dir', str(tmp_path / 'o'),
            '--preset', 'sim', '--cameras', 'none', '--environment-state']
    parser = build_parser()
    # The sim preset's image settings are left off without cameras, and said so...
    with caplog.at_level('INFO', logger='act_ros.training.config'):
        config = config_from_args(parser.parse_args(args))
    assert config.cameras == () and config.environment_state
    assert config.backbone_freeze_step is None and config.image_shift_px == 0
    assert config.aux_object_pose_weight == 0 and not config.calibrate_backbone_norm
    assert any('left off' in r.message for r in caplog.records)
    # ... but given on the command line they are an error.
    with pytest.raises(ValueError, match='image_shift_px'):
        config_from_args(parser.parse_args([*args, '--image-shift-px', '4']))
    assert config_from_args(parser.parse_args(
        [*args[:6], '--cameras', 'wrist'])).cameras == ('wrist',)
    assert config.to_dict()['cameras'] == [] and list(ENVIRONMENT_STATE_NAMES)[0] == 'box_x'


def test_process_execution_passes_the_object_poses(tiny_pose_checkpoint):
    """The model in a child process gets the poses with each request: the same chunks as
    in process, and a request without them is refused in the caller, not the child."""
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    observations = [Observation(images={'top': image, 'wrist': image},
                                state=rng.uniform(-0.5, 0.5, 6), environment_state=_poses(rng))
                    for _ in range(3)]
    common = dict(model_path=tiny_pose_checkpoint, device='cpu', torch_threads=1, warmup=False)
    with PolicyRuntime(RuntimeConfig(execution='sync', **common)) as local:
        expected = [local.predictor.predict(obs) for obs in observations]
    with PolicyRuntime(RuntimeConfig(execution='process', **common)) as remote:
        assert remote.environment_state_dim == 10 and remote.cameras == ('top', 'wrist')
        for obs, chunk in zip(observations, expected):
            np.testing.assert_allclose(remote._remote.predict(obs), chunk, atol=1e-5)
        with pytest.raises(ObservationError, match='observation has none'):
            remote.act(Observation(images=observations[0].images, state=np.zeros(6)))
        remote.reset()
        remote.act(observations[0])
        assert remote.wait_idle(60.0)
        assert remote.act(observations[1]) is not None
