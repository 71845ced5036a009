"""The research probe research/input_probe.py: the chunk from true inputs against inputs
swapped between seeds."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip('mujoco')

from research import input_probe  # noqa: E402

pytestmark = pytest.mark.sim

COMMON = ['--render-size', '48x64', '--episode-steps', '40', '--every', '20', '--no-progress']
# The weight of ACT's projection that reads each input group: zeroed, that input cannot reach
# the chunk (the projection's bias and the positional embeddings stay, the same for every input).
PROJECTIONS = {'cameras': 'model.encoder_img_feat_input_proj.weight',
               'joints': 'model.encoder_robot_state_input_proj.weight'}


def _blind_to(checkpoint, group, root):
    from safetensors.torch import load_file, save_file

    out = root / f'without_{group}'
    shutil.copytree(checkpoint, out)
    weights = load_file(out / 'model.safetensors')
    weights[PROJECTIONS[group]].zero_()
    save_file(weights, out / 'model.safetensors', metadata={'format': 'pt'})
    return out


@pytest.mark.parametrize('cut', ['cameras', 'joints'])
def test_an_input_the_policy_cannot_read_changes_nothing_when_swapped(tiny_checkpoint, tmp_path,
                                                                      cut, capsys):
    kept = 'joints' if cut == 'cameras' else 'cameras'
    out = tmp_path / 'probe.json'
    assert input_probe.main(['--checkpoint', str(_blind_to(tiny_checkpoint, cut, tmp_path)),
                             '--episodes', '2', '--output', str(out), *COMMON]) == 0
    printed = capsys.readouterr().out
    assert f'{cut} swapped' in printed and 'first frame' in printed
    data = json.loads(out.read_text())
    assert data['groups'] == ['cameras', 'joints', 'all inputs']  # no object-pose input
    assert data['provenance']['command'].startswith('python -m research.input_probe')
    assert data['expert_align_rate'] == 0.0  # 40 ticks: too short for the task
    rows = data['rows']
    assert [(r['seed'], r['tick']) for r in rows] == [(3000000, 0), (3000000, 20),
                                                     (3000001, 0), (3000001, 20)]
    for r in rows:
        assert r[f'{cut} swapped'] < 1e-6
        assert r[f'{kept} swapped'] > 1e-4
        assert r['all inputs swapped'] == pytest.approx(r[f'{kept} swapped'], abs=1e-6)
        assert np.isfinite([v for k, v in r.items() if isinstance(v, float)]).all()
    kinds = {row['frames']: row for row in data['summary']}
    assert kinds['first frame']['n'] == 2
    assert kinds['first frame'][f'{cut} swapped'] < 1e-6


def test_pose_inputs_are_a_group_of_their_own(tiny_pose_checkpoint):
    data = input_probe.probe_inputs(tiny_pose_checkpoint, episodes=2, seed=7, every=40,
                                    episode_steps=10, render_size=(48, 64))
    assert data['groups'] == ['cameras', 'joints', 'object poses', 'all inputs']
    assert len(data['rows']) == 2
    assert all(r['object poses swapped'] > 1e-6 for r in data['rows'])  # another layout's


def test_bad_arguments_are_refused(tiny_checkpoint, capsys):
    assert input_probe.main(['--checkpoint', str(tiny_checkpoint), '--episodes', '1',
                             *COMMON]) == 2
    assert 'episodes must be >= 2' in capsys.readouterr().err
