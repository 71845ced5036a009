"""Random still scenes (act_ros.sim.pose_scenes) and act-ros pose-pretrain on them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip('mujoco')

from act_ros.sim import PortPickAlignEnv, SimConfig  # noqa: E402
from act_ros.sim.ik import gripper_yaw  # noqa: E402
from act_ros.sim.pose_scenes import SCENE_KINDS, PoseScenes, SceneMix  # noqa: E402
from act_ros.training import pose_pretrain  # noqa: E402

pytestmark = pytest.mark.sim


@pytest.fixture(scope='module')
def env():
    env = PortPickAlignEnv(SimConfig.from_yaml(camera_height=48, camera_width=64))
    yield env
    env.close()


def _quarter_diff_deg(a: float, b: float) -> float:
    return abs(math.degrees(math.remainder(a - b, math.pi / 2)))


def test_scenes_are_reproducible_cover_every_kind_and_keep_the_layout(env):
    scenes = PoseScenes(env)
    kinds = {}
    for seed in range(40):
        obs, kind = scenes.scene(seed)
        kinds.setdefault(kind, seed)
        first = env.reset(seed=seed)
        # The layout is the episode's: the pad never moves; the box moves only when held.
        np.testing.assert_allclose(obs.pad_pose, first.pad_pose)
        if kind != 'held':
            np.testing.assert_allclose(obs.box_pose, first.box_pose, atol=1e-9)
    assert set(kinds) == set(SCENE_KINDS)
    for kind, seed in kinds.items():
        a, kind_a = scenes.scene(seed)
        b, kind_b = scenes.scene(seed)
        assert kind_a == kind_b == kind
        for camera in a.images:
            np.testing.assert_array_equal(a.images[camera], b.images[camera])
        np.testing.assert_array_equal(a.joint_positions, b.joint_positions)
    # The first frame of an episode is a start scene as it is.
    start, _ = scenes.scene(kinds['start'])
    first = env.reset(seed=kinds['start'])
    for camera in start.images:
        np.testing.assert_array_equal(start.images[camera], first.images[camera])


def test_reach_and_held_scenes_place_a_downward_gripper_and_the_box_between_the_fingers(env):
    mix = SceneMix()
    for kind in ('reach', 'held'):
        scenes = PoseScenes(env, SceneMix(start=0.0, reach=float(kind == 'reach'),
                                          held=float(kind == 'held')))
        placed = 0
        for seed in range(100, 110):
            obs, got = scenes.scene(seed)
            if got == 'start':  # no reachable pose in TRIES draws (rare)
                continue
            assert got == kind
            placed += 1
            position, rotation = scenes.ik.forward(obs.joint_positions[env.arm_index])
            np.testing.assert_allclose(position, obs.ee_position, atol=1e-9)
            assert rotation[2, 2] < -0.99, 'the gripper points down'
            assert mix.low_m - 0.006 <= obs.ee_position[2] <= mix.high_m + 0.006
            if kind == 'held':
                np.testing.assert_allclose(obs.box_pose[:3], obs.ee_position, atol=1e-6)
                # The box's faces along the fingers (3 deg std of noise).
                assert _quarter_diff_deg(obs.box_pose[3], gripper_yaw(rotation)) < 12.0
                assert obs.joint_positions[env.gripper_index] == pytest.approx(
                    min(1.0, env.config.box_size_m / 2 / env.finger_open_m), abs=1e-6)
            else:
                assert 0.0 < obs.joint_positions[env.gripper_index] <= 1.0
        assert placed >= 8, f'{kind}: only {placed} of 10 scenes placed the arm'


def test_pose_scene_refuses_bad_input(env):
    with pytest.raises(ValueError, match='expected 5 finite values'):
        env.reset(seed=0)
        env.pose_scene(np.array([0.0, 0.1, float('nan'), 0.0, 0.0]), 1.0)
    with pytest.raises(ValueError, match='expected 5 finite values'):
        env.pose_scene(np.zeros(6), 1.0)
    with pytest.raises(ValueError, match='non-negative probabilities'):
        SceneMix(start=-1.0).probabilities()
    fresh = PortPickAlignEnv(SimConfig.from_yaml(camera_height=48, camera_width=64))
    try:
        with pytest.raises(RuntimeError, match='reset'):
            fresh.pose_scene(np.zeros(5), 1.0)
    finally:
        fresh.close()


ARGS = ['--batch-size', '2', '--val-scenes', '6', '--val-interval', '2',
        '--checkpoint-interval', '2', '--torch-threads', '1', '--no-progress']


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / 'model.safetensors'))


def test_pretrain_changes_only_the_backbone_and_resumes_as_one_run(tiny_checkpoint, tmp_path,
                                                                   capsys):
    import torch

    from act_ros.core.inference.checkpoint import load_checkpoint

    whole, parts = tmp_path / 'whole', tmp_path / 'parts'
    base = ['--checkpoint', str(tiny_checkpoint), *ARGS]
    assert pose_pretrain.main([*base, '--output-dir', str(whole), '--steps', '4']) == 0
    assert 'held-out scenes' in capsys.readouterr().out
    assert pose_pretrain.main([*base, '--output-dir', str(parts), '--steps', '2']) == 0
    saved = torch.load(parts / 'last' / 'training_state.pt',
                       weights_only=False)[pose_pretrain.STATE_KEY]
    assert saved['seconds'] >= saved['history'][-1]['seconds'] > 0
    assert pose_pretrain.main([*base, '--output-dir', str(parts), '--steps', '4',
                               '--resume']) == 0
    # The run's time goes on from what the interrupted process had spent, to its checkpoint.
    times = [row['seconds'] for row in
             json.loads((parts / pose_pretrain.RESULT_FILE).read_text())['history']]
    assert times == sorted(times) and times[-1] > saved['seconds']
    source, trained, resumed = (_weights(tiny_checkpoint), _weights(whole / 'last'),
                                _weights(parts / 'last'))
    changed = {k for k in source if not torch.equal(source[k], trained[k])}
    assert changed and all(k.startswith('model.backbone.') for k in changed)
    # --frozen-up-to layer1 (default): the stem and layer1 as they were.
    assert not any(k.startswith(('model.backbone.conv1', 'model.backbone.layer1'))
                   for k in changed)
    for key in source:  # an interrupted run continues as the uninterrupted one ran
        torch.testing.assert_close(resumed[key], trained[key])
    result = json.loads((whole / pose_pretrain.RESULT_FILE).read_text())
    assert [row['step'] for row in result['history']] == [0, 2, 4]
    command = result['provenance']['command']
    assert command.startswith('act-ros pose-pretrain') and str(whole) not in command
    final = result['history'][-1]
    assert final['all']['n'] == 6 and sum(final[k]['n'] for k in SCENE_KINDS
                                           if k in final) == 6
    assert all(math.isfinite(final['all'][k]) for k in ('box_cm', 'box_deg', 'pad_cm',
                                                        'pad_deg'))
    load_checkpoint(whole / 'last')  # a LeRobot checkpoint the trainer and node load
    # --precision auto (default): bf16 autocast only where the CPU computes it natively.
    from act_ros.core.inference.precision import cpu_has_native_bf16
    assert result['precision'] == ('bf16' if cpu_has_native_bf16() else 'fp32')


def test_trained_norms_are_saved_frozen_and_resume_as_one_run(tiny_checkpoint, tmp_path,
                                                             capsys):
    """--batch-norm train: the statistics and affine of the norms past the frozen stages
    move and are saved in the frozen layout; a resumed run equals the uninterrupted one."""
    import torch

    whole, parts = tmp_path / 'whole', tmp_path / 'parts'
    base = ['--checkpoint', str(tiny_checkpoint), *ARGS, '--batch-norm', 'train']
    assert pose_pretrain.main([*base, '--output-dir', str(whole), '--steps', '4']) == 0
    assert pose_pretrain.main([*base, '--output-dir', str(parts), '--steps', '2']) == 0
    capsys.readouterr()
    assert pose_pretrain.main([*base[:-1], 'frozen', '--output-dir', str(parts),
                               '--steps', '4', '--resume']) == 2
    assert 'was trained with train' in capsys.readouterr().err
    assert pose_pretrain.main([*base, '--output-dir', str(parts), '--steps', '4',
                               '--resume']) == 0
    source, trained, resumed = (_weights(tiny_checkpoint), _weights(whole / 'last'),
                                _weights(parts / 'last'))
    assert set(trained) == set(source)  # LeRobot's layout: no num_batches_tracked
    norms = [k for k in source if k.startswith('model.backbone.')
             and k.endswith(('running_mean', 'running_var'))]
    moved = {k for k in norms if not torch.equal(source[k], trained[k])}
    assert moved == {k for k in norms
                     if not k.startswith(('model.backbone.bn1', 'model.backbone.layer1'))}
    for key in source:
        torch.testing.assert_close(resumed[key], trained[key])
    result = json.loads((whole / pose_pretrain.RESULT_FILE).read_text())
    assert result['batch_norm'] == 'train'
    info = json.loads((whole / 'last' / 'training_info.json').read_text())
    assert info['pose_pretrain']['batch_norm'] == 'train'


def test_a_run_from_an_earlier_runs_checkpoint_records_what_it_continues(tiny_checkpoint,
                                                                         tmp_path):
    first, cont = tmp_path / 'first', tmp_path / 'cont'
    assert pose_pretrain.main(['--checkpoint', str(tiny_checkpoint), '--output-dir', str(first),
                               *ARGS, '--steps', '2']) == 0
    assert json.loads((first / pose_pretrain.RESULT_FILE).read_text())['continues'] is None
    base = ['--checkpoint', str(first / 'last'), '--output-dir', str(cont), *ARGS,
            '--lr', '5e-5']
    assert pose_pretrain.main([*base, '--steps', '2']) == 0
    # Interrupted and resumed: the record of the run it continues stays the first run's.
    assert pose_pretrain.main([*base, '--steps', '4', '--resume']) == 0
    result = json.loads((cont / pose_pretrain.RESULT_FILE).read_text())
    assert result['step'] == 4 and result['lr'] == 5e-5
    assert result['continues'] == {'step': 2, 'source': str(tiny_checkpoint),
                                   'frozen_up_to': 'layer1', 'batch_norm': 'frozen',
                                   'continues': None}
    info = json.loads((cont / 'last' / 'training_info.json').read_text())['pose_pretrain']
    assert info['step'] == 4 and info['source'] == str(first / 'last')
    assert info['continues'] == result['continues']


def test_pretrain_refuses_what_would_lose_or_mix_runs(tiny_checkpoint, tmp_path, capsys):
    run = tmp_path / 'run'
    base = ['--checkpoint', str(tiny_checkpoint), '--output-dir', str(run), *ARGS]
    assert pose_pretrain.main([*base, '--steps', '2', '--resume']) == 2
    assert 'no earlier run' in capsys.readouterr().err
    assert pose_pretrain.main([*base, '--steps', '2']) == 0
    before = _weights(run / 'last')
    assert pose_pretrain.main([*base, '--steps', '2']) == 2
    assert 'continue it with --resume' in capsys.readouterr().err
    after = _weights(run / 'last')
    assert all((before[k] == after[k]).all() for k in before)
    with pytest.raises(SystemExit):
        pose_pretrain.main([*base, '--val-seed', '7000001'])
    assert 'overlaps the training scenes' in capsys.readouterr().err


def test_image_size_renders_at_it_and_the_checkpoint_then_expects_it(tiny_checkpoint, tmp_path,
                                                                    capsys):
    import torch

    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.training.evaluation.rollout import checkpoint_render_size

    run = tmp_path / 'run'
    base = ['--checkpoint', str(tiny_checkpoint), '--output-dir', str(run), *ARGS]
    before = load_checkpoint(tiny_checkpoint).image_shapes
    assert set(before.values()) != {(64, 96)}
    assert pose_pretrain.main([*base, '--steps', '2', '--image-size', '64x96']) == 0
    loaded = load_checkpoint(run / 'last')
    assert set(loaded.image_shapes) == set(before)
    assert set(loaded.image_shapes.values()) == {(64, 96)}
    assert checkpoint_render_size(run / 'last') == (64, 96)  # rollouts render at it too
    result = json.loads((run / pose_pretrain.RESULT_FILE).read_text())
    assert result['image_size'] == [64, 96]
    scenes = pose_pretrain.SceneBatches(tiny_checkpoint, load_checkpoint(tiny_checkpoint),
                                        (64, 96))
    try:
        images, _, _ = scenes([0])
    finally:
        scenes.close()
    assert {tuple(v.shape) for v in images.values()} == {(1, 3, 64, 96)}
    # The trained backbone at the new size: a 2x3 grid per camera (stride 32).
    backbone = loaded.policy.model.backbone
    assert backbone(torch.zeros(1, 3, 64, 96))['feature_map'].shape[-2:] == (2, 3)
    # Continuing at another size would mix two runs.
    capsys.readouterr()
    assert pose_pretrain.main([*base, '--steps', '4', '--resume', '--image-size', '96x128']) == 2
    assert 'was trained at (64, 96)' in capsys.readouterr().err
    assert pose_pretrain.main([*base, '--steps', '4', '--resume', '--image-size', '64x96',
                               '--yaw-readout', 'flatten']) == 2
    assert 'was trained with attention' in capsys.readouterr().err
    assert pose_pretrain.main([*base, '--steps', '4', '--resume', '--image-size', '64x96']) == 0
    assert json.loads((run / pose_pretrain.RESULT_FILE).read_text())['yaw_readout'] == 'attention'
    for bad in ('64', '16x16', 'axb'):
        with pytest.raises(SystemExit):
            pose_pretrain.main([*base, '--image-size', bad])
        assert 'expected' in capsys.readouterr().err
