"""The in-process / over-ROS comparison: episodes matched by seed, differences named."""

from __future__ import annotations

import json

import pytest

from act_ros.ros.evaluation.compare import compare, format_comparison, main


def _episode(seed, mm, success):
    return {'seed': seed, 'position_error_m': mm / 1000, 'success': success,
            'yaw_error_deg': 1.0}


def _summary(episodes):
    n = len(episodes)
    return {'align_rate': sum(e['success'] for e in episodes) / n, 'count': n,
            'mean_position_error': sum(e['position_error_m'] for e in episodes) / n,
            'mean_yaw_error': 1.0, 'failures': {}, 'episodes': episodes}


def _files(tmp_path, local_eps, ros_eps):
    local = {'checkpoint': 'ckpt', 'modes': {'chunk': _summary(local_eps)}}
    ros = {'chunk': {**_summary([{**e, 'commands': {'lockstep_timeouts': 0}} for e in ros_eps]),
                     'lockstep_timeouts': 0, 'commands_rejected': 0}}
    (tmp_path / 'a.json').write_text(json.dumps(local))
    (tmp_path / 'b.json').write_text(json.dumps(ros))
    return local, ros


def test_episodes_are_matched_by_seed_and_differences_counted(tmp_path, capsys):
    local, ros = _files(tmp_path, [_episode(1, 5.0, True), _episode(2, 40.0, False)],
                        [_episode(2, 41.3, False), _episode(1, 5.05, True)])
    result = compare(local, ros)
    chunk = result['modes']['chunk']
    assert chunk['episodes_equal_within_0.1_mm'] == 1
    assert chunk['largest_difference_mm'] == pytest.approx(1.3)
    assert [e['seed'] for e in chunk['episodes']] == [1, 2]
    assert chunk['over_ros']['lockstep_timeouts'] == 0
    assert '1 of 2' in format_comparison(result)
    assert main([str(tmp_path / 'a.json'), str(tmp_path / 'b.json'),
                 '--output', str(tmp_path / 'c.json')]) == 0
    written = json.loads((tmp_path / 'c.json').read_text())
    assert written['modes']['chunk']['episodes_equal_within_0.1_mm'] == 1
    assert written['seeds'] == [1, 2]
    # where it came from: its own command, and the two runs' provenance carried along
    assert written['provenance']['command'].startswith(
        'act-ros compare-evals')
    assert str(tmp_path / 'c.json') not in written['provenance']['command']
    assert written['sources'] == {'in_process': None, 'over_ros': None}


def test_a_different_outcome_is_not_equal_even_at_the_same_position(tmp_path):
    local, ros = _files(tmp_path, [_episode(1, 5.0, True)], [_episode(1, 5.0, False)])
    assert compare(local, ros)['modes']['chunk']['episodes_equal_within_0.1_mm'] == 0


def test_mismatched_files_are_refused_with_what_differs(tmp_path, capsys):
    local, ros = _files(tmp_path, [_episode(1, 5.0, True)], [_episode(3, 5.0, True)])
    with pytest.raises(ValueError, match='different seeds'):
        compare(local, ros)
    with pytest.raises(ValueError, match='act-ros evaluate --output'):
        compare(ros, ros)
    assert main([str(tmp_path / 'b.json'), str(tmp_path / 'a.json')]) == 2
    assert 'compare:' in capsys.readouterr().err
