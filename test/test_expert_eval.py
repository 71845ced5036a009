"""``act-ros expert-eval --output FILE --run NAME``: the scripted expert's
runs written into one result file, atomically, each with its provenance, in the form
``act-ros report`` reads (``docs/results/expert/expert_eval.json``)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip('mujoco')

from act_ros import report  # noqa: E402
from act_ros.sim import expert_eval  # noqa: E402

pytestmark = pytest.mark.sim


def _run(capsys, *argv: str) -> dict:
    assert expert_eval.main([*argv, '--json']) == 0
    out, err = capsys.readouterr()
    assert 'wrote ' in err
    return json.loads(out)


def test_two_runs_merge_into_one_file_with_their_provenance(tmp_path, capsys):
    rel = report.definitions()['expert_runs']['file']  # where the report reads it
    out = tmp_path / rel
    plain = _run(capsys, '--episodes', '2', '--seed', '2000000', '--output', str(out),
                 '--run', 'plain')
    perturbed = _run(capsys, '--perturb', '--episodes', '3', '--seed', '3000000',
                     '--perturbation-seed', '0', '--output', str(out), '--run', 'perturbed')
    data = json.loads(out.read_text())
    assert list(data['runs']) == ['plain', 'perturbed']
    for name, summary in (('plain', plain), ('perturbed', perturbed)):
        record = data['runs'][name]
        for key in ('count', 'align_rate', 'mean_position_error', 'mean_yaw_error',
                    'failures', 'failed_seeds'):
            assert record[key] == summary[key], (name, key)
        assert 0 <= record['mean_position_error'] < 0.01 and record['mean_yaw_error'] >= 0
    assert data['runs']['plain']['count'] == 2
    assert data['runs']['plain']['args'] == '--episodes 2 --seed 2000000 --json'
    by_kind = data['runs']['perturbed']['by_perturbation']
    assert {k: v['count'] for k, v in by_kind.items()} == {
        'push_box': 1, 'open_gripper': 1, 'displace_arm': 1}
    assert sum(v['aligned'] for v in by_kind.values()) == round(
        perturbed['align_rate'] * perturbed['count'])

    prov = data['provenance']
    assert set(prov['runs']) == {'plain', 'perturbed'}
    for name, entry in prov['runs'].items():
        assert entry['command'] == f"{expert_eval.COMMAND} {data['runs'][name]['args']}"
        assert str(out) not in entry['command'] and '--run' not in entry['command']
        assert entry['commit'] and entry['machine'] and 'mujoco' in entry['versions']
    assert prov['command'] == '; '.join(e['command'] for e in prov['runs'].values())
    assert 'assembled_by_hand' not in prov

    # Rerunning one run replaces it and keeps the other.
    again = _run(capsys, '--episodes', '1', '--seed', '2000005', '--output', str(out),
                 '--run', 'plain')
    data = json.loads(out.read_text())
    assert data['runs']['plain']['count'] == again['count'] == 1
    assert data['runs']['perturbed']['count'] == 3
    assert list(data['provenance']['runs']) == ['plain', 'perturbed']
    assert sorted(p.name for p in out.parent.iterdir()) == ['expert_eval.json']

    # The report reads the file as it reads the committed one, and says nothing of a hand.
    assert report.check_provenance(tmp_path, rel)['runs'].keys() == {'plain', 'perturbed'}
    page = tmp_path / 'page.md'
    page.write_text('')
    body, read = report.render_part(tmp_path, page, 'expert_runs')
    assert read == [rel] and '| `--episodes 1 --seed 2000005 --json` | 1 |' in body
    assert 'assembled by hand' not in body
    body, _ = report.render_part(tmp_path, page, 'expert_perturbations')
    assert '| `push_box` |' in body


def _canned(*_args, **_kwargs) -> dict:
    return {'align_rate': 1.0, 'mean_position_error': 0.001, 'mean_yaw_error': 0.1,
            'count': 1, 'failures': {}, 'tumbles': 0, 'gate_tripped_episodes': 0,
            'max_ik_error_m': 0.0, 'failed_seeds': [], 'steps_per_s_with_expert': 1.0}


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path, capsys, monkeypatch):
    out = tmp_path / 'expert_eval.json'
    monkeypatch.setattr(expert_eval, 'evaluate_nominal', _canned)
    assert expert_eval.main(['--episodes', '1', '--output', str(out), '--run', 'a']) == 0
    before = out.read_text()

    def fail(_fd):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'fsync', fail)  # the new file is half written when this fails
    with pytest.raises(OSError, match='No space'):
        expert_eval.main(['--episodes', '1', '--output', str(out), '--run', 'b'])
    assert out.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ['expert_eval.json']  # no temporary left
    with pytest.raises(OSError, match='No space'):
        expert_eval.main(['--episodes', '1', '--output', str(tmp_path / 'new.json')])
    assert [p.name for p in tmp_path.iterdir()] == ['expert_eval.json']
    capsys.readouterr()


def test_a_file_it_cannot_merge_into_is_refused_before_any_episode(tmp_path, capsys,
                                                                    monkeypatch):
    def never(*_args, **_kwargs):
        raise AssertionError('an episode ran')

    monkeypatch.setattr(expert_eval, 'evaluate_nominal', never)
    by_hand = tmp_path / 'by_hand.json'
    by_hand.write_text(json.dumps({
        'provenance': {'command': 'c', 'commit': 'x', 'machine': 'm',
                       'assembled_by_hand': 'transcribed'},
        'runs': {'perturbed': {'count': 1}}}))
    single = tmp_path / 'single.json'
    single.write_text(json.dumps({'provenance': {}, 'count': 1}))
    broken = tmp_path / 'broken.json'
    broken.write_text('{"runs": {')
    for path, reason in ((by_hand, 'no provenance of their own'), (single, 'no "runs"'),
                         (broken, 'not a JSON file')):
        text = path.read_text()
        assert expert_eval.main(['--output', str(path), '--run', 'plain']) == 2
        assert reason in capsys.readouterr().err
        assert path.read_text() == text
    with pytest.raises(SystemExit):
        expert_eval.main(['--run', 'plain'])
    assert '--run needs --output' in capsys.readouterr().err
