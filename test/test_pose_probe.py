"""The research probe research/pose_probe.py: the run's pose head on policy and expert
states; heads fit on maps."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

pytest.importorskip('mujoco')

from research import pose_probe  # noqa: E402

pytestmark = pytest.mark.sim

COMMON = ['--render-size', '48x64', '--no-progress']


@pytest.fixture(scope='module')
def run_last(tiny_checkpoint, module_tmp):
    """The tiny checkpoint as a run's last/: with a training state holding an (untrained)
    encoder pose head and its statistics, as the trainer saves them."""
    import torch

    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.training.auxiliary import ObjectPoseAuxiliary

    last = module_tmp('run') / 'last'
    shutil.copytree(tiny_checkpoint, last)
    loaded = load_checkpoint(last)
    shapes = [tuple(loaded.policy.config.input_features[k].shape)
              for k in loaded.config.image_features]
    poses = torch.rand(64, 8) * torch.tensor([0.2, 0.2, 0.03, 3.0, 0.2, 0.2, 0.01, 3.0])
    torch.manual_seed(0)
    aux = ObjectPoseAuxiliary(loaded.policy.model, shapes, poses, torch.device('cpu'),
                              source='encoder')
    torch.save({'aux_head': aux.head.state_dict(), 'aux_source': 'encoder',
                'aux_position_mean': aux.mean, 'aux_position_std': aux.std},
               last / 'training_state.pt')
    return last


def test_rollouts_read_the_runs_head_where_each_driver_queries(run_last, tmp_path, capsys):
    out = tmp_path / 'probe.json'
    assert pose_probe.main(['rollouts', '--checkpoint', str(run_last), '--episodes', '1',
                            '--seed', '5', '--episode-steps', '40', '--output', str(out),
                            *COMMON]) == 0
    printed = capsys.readouterr().out
    assert 'first frame' in printed and 'align rate while probing' in printed
    data = json.loads(out.read_text())
    assert data['head_source'] == 'encoder' and data['provenance']['command'].startswith(
        'python -m research.pose_probe rollouts')
    rows = data['rows']
    # Chunk execution: a query on ticks 0 and 30 of the 40, whoever drives.
    for driver in ('expert', 'policy'):
        assert [r['tick'] for r in rows if r['driver'] == driver] == [0, 30]
    first = {r['driver']: r for r in rows if r['tick'] == 0}
    for key in pose_probe.ERROR_KEYS:  # the same frame and head under both drivers
        assert first['expert'][key] == pytest.approx(first['policy'][key], abs=1e-4)
        assert all(math.isfinite(r[key]) and r[key] >= 0 for r in rows)
    assert all(r[k] <= 45.0 for r in rows for k in ('box_deg', 'pad_deg'))
    by_group = {(s['driver'], s['frames']): s['n'] for s in data['summary']}
    assert by_group[('expert', 'first frame')] == by_group[('policy', 'first frame')] == 1
    assert sum(by_group.values()) == len(rows)
    assert set(data['align_rate']) == {'expert', 'policy'}


def test_a_run_without_a_pose_head_or_state_is_refused(tiny_checkpoint, tmp_path, capsys):
    import torch

    assert pose_probe.main(['rollouts', '--checkpoint', str(tiny_checkpoint), *COMMON]) == 2
    assert 'no training state' in capsys.readouterr().err
    state = tmp_path / 'training_state.pt'
    torch.save({'aux_head': None}, state)
    assert pose_probe.main(['rollouts', '--checkpoint', str(tiny_checkpoint),
                            '--training-state', str(state), *COMMON]) == 2
    assert 'trained no pose head' in capsys.readouterr().err


def _maps_encoding(poses: np.ndarray, informative: bool, rng) -> np.ndarray:
    """(N, C=9, 2, 2) maps: the standardized targets on every cell, or noise."""
    import torch

    from act_ros.training.auxiliary import pose_targets

    p = torch.from_numpy(poses)
    if informative:
        mean, std = p[:, [0, 1, 2, 4, 5]].mean(0), p[:, [0, 1, 2, 4, 5]].std(0)
        t = pose_targets(p, mean, std).numpy()
    else:
        t = rng.normal(size=(len(poses), 9))
    return np.repeat(np.repeat(t[:, :, None, None], 2, axis=2), 2, axis=3)


def test_heads_fit_on_maps_find_poses_a_camera_holds_and_not_others():
    """The top camera's maps carry the poses, the wrist one's are noise: the fit finds
    the poses from the top maps (held-out errors far under chance) and not from the wrist's."""
    rng = np.random.default_rng(0)
    n = 300
    poses = np.zeros((n, 8), np.float32)
    poses[:, [0, 1, 4, 5]] = rng.uniform(-0.1, 0.1, (n, 4))
    poses[:, [2, 6]] = rng.uniform(0.014, 0.016, (n, 2))
    poses[:, [3, 7]] = rng.uniform(-np.pi, np.pi, (n, 2))
    maps = np.stack([_maps_encoding(poses, True, rng), _maps_encoding(poses, False, rng)],
                    axis=1).astype(np.float16)
    fits = {f['cameras']: f for f in pose_probe.fit_layout_heads(maps, poses, ['top', 'wrist'],
                                                                 epochs=30)}
    assert set(fits) == set(pose_probe.CAMERA_SETS)
    top, wrist = fits['top only']['held_out'], fits['wrist only']['held_out']
    assert fits['top only']['layouts_held_out'] == 30
    assert top['box_cm'] < 1.0 and top['pad_cm'] < 1.0
    assert top['box_deg'] < 5.0 and top['pad_deg'] < 5.0
    assert wrist['box_deg'] > 12.0 and wrist['pad_deg'] > 12.0   # near chance (22.5)
    assert wrist['box_cm'] > 3 * top['box_cm']
    with pytest.raises(ValueError, match='cannot be split'):
        pose_probe.fit_layout_heads(maps[:1], poses[:1], ['top', 'wrist'], epochs=1)


def test_layouts_capture_the_maps_the_image_projection_reads(tiny_checkpoint, tmp_path):
    maps, poses, cameras = pose_probe.capture_layouts(tiny_checkpoint, layouts=3, seed=11,
                                                      render_size=(48, 64))
    assert cameras == ['top', 'wrist'] and maps.shape[:2] == (3, 2) and poses.shape == (3, 8)
    assert np.isfinite(maps.astype(np.float32)).all()
    assert not np.array_equal(maps[0], maps[1])              # other layouts, other maps
    again, poses_again, _ = pose_probe.capture_layouts(tiny_checkpoint, layouts=1, seed=11,
                                                       render_size=(48, 64))
    np.testing.assert_array_equal(again[0], maps[0])        # a seed is one layout
    np.testing.assert_array_equal(poses_again[0], poses[0])
