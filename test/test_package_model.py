"""``act-ros package-model``: a checkpoint becomes a deployable folder with fp16 weights that
loads in LeRobot and in the runtime, acts like the source, and appears only when checked."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip('lerobot')


def test_fp16_package_loads_everywhere_and_acts_like_the_source(tiny_checkpoint, tmp_path):
    import torch
    from lerobot.policies.act.modeling_act import ACTPolicy
    from safetensors.torch import load_file

    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.training.package_model import package

    out = tmp_path / 'models' / 'shipped'
    report = package(tiny_checkpoint, out, dtype='fp16', card='# card\n')
    weights = load_file(str(out / 'model.safetensors'))
    assert all(v.dtype == torch.float16 for v in weights.values() if v.is_floating_point())
    assert report['bytes_after'] < 0.6 * report['bytes_before']
    assert 0 < report['max_action_difference'] < 1e-2
    assert (out / 'MODEL_CARD.md').read_text() == '# card\n'
    assert json.loads((out / 'packaging.json').read_text())['dtype'] == 'fp16'
    # Real observations for the start-up precision check go with the model.
    from act_ros.core.inference.precision import load_check_observations
    saved = load_check_observations(out, ['top', 'wrist'])
    assert saved is not None and len(saved) == 8, report
    # The tiny checkpoint's training dataset is gone: frames along scripted-expert episodes
    # of its task, not the episodes' first frames alone.
    assert report['precision_check_observations'] == (
        'the task simulation (2 scripted-expert episodes from seed 1000000)'), report
    states = np.stack([o.state for o in saved])
    assert np.ptp(states, axis=0).max() > 0.1, 'the frames do not follow the episodes'
    policy = ACTPolicy.from_pretrained(str(out))  # LeRobot, unchanged
    assert next(policy.parameters()).dtype == torch.float32
    load_checkpoint(out, device='cpu')


def test_a_package_that_fails_its_check_leaves_nothing(tiny_checkpoint, tmp_path):
    from act_ros.training.package_model import package

    out = tmp_path / 'shipped'
    with pytest.raises(ValueError, match='differs'):
        package(tiny_checkpoint, out, dtype='fp16', tolerance=0.0)
    assert not out.exists()
    assert not any(p.name.startswith('.shipped') for p in tmp_path.iterdir())
    with pytest.raises(FileNotFoundError, match='model.safetensors'):
        package(tmp_path, tmp_path / 'other')
    package(tiny_checkpoint, out, dtype='fp32')
    with pytest.raises(FileExistsError, match='--overwrite'):
        package(tiny_checkpoint, out, dtype='fp32')


@pytest.mark.parametrize('cameras', [None, ()])
def test_a_checkpoint_that_takes_the_object_poses_packages(tiny_pose_checkpoint, tmp_path,
                                                          cameras):
    """Its check observations carry the object poses (and no camera is needed)."""
    from act_ros.core.inference.checkpoint import create_checkpoint, load_checkpoint
    from act_ros.training.package_model import package

    source = tiny_pose_checkpoint if cameras is None else create_checkpoint(
        tmp_path / 'no_camera', cameras=cameras, environment_state=True)
    report = package(source, tmp_path / 'shipped', dtype='fp16')
    assert 0 < report['max_action_difference'] < 1e-2
    assert load_checkpoint(tmp_path / 'shipped', device='cpu').env_state_dim == 10


def test_the_run_s_metrics_plots_and_evaluation_go_with_the_model(tiny_checkpoint, tmp_path):
    from act_ros.training.package_model import package

    run = tmp_path / 'run'
    run.mkdir()
    (run / 'training_metrics.json').write_text('{"best": {"step": 10}}\n')
    for name in ('plot_loss.png', 'plot_align_rate.png'):
        (run / name).write_bytes(b'\x89PNG ' + name.encode())
    (run / 'notes.png').write_bytes(b'not a plot of the run')
    evaluation = tmp_path / 'evaluation.json'
    evaluation.write_text('{"modes": {}}\n')
    out = tmp_path / 'shipped'
    report = package(tiny_checkpoint, out, run_dir=run, evaluation=evaluation)
    assert report['plots'] == ['plot_align_rate.png', 'plot_loss.png']
    for name in report['plots']:
        assert (out / name).read_bytes() == (run / name).read_bytes()
    assert not (out / 'notes.png').exists()
    assert json.loads((out / 'training_metrics.json').read_text()) == {'best': {'step': 10}}
    assert json.loads((out / 'evaluation.json').read_text()) == {'modes': {}}
    assert json.loads((out / 'packaging.json').read_text())['plots'] == report['plots']
    with pytest.raises(FileNotFoundError, match='training_metrics.json'):
        package(tiny_checkpoint, tmp_path / 'other', run_dir=tmp_path / 'no_run')
