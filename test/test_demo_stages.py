"""``make demo``'s stage runner: children queued into a number of slots, failures and time
limits stop the stage and every child it started."""

import sys
import pytest

from act_ros.demo import SHIPPED_MODELS, Stages


def _child(marker_dir, name, seconds, code=0):
    """A child that notes when it starts and ends (wall-clock stamps in files)."""
    script = ('import pathlib, sys, time\n'
              f'd = pathlib.Path({str(marker_dir)!r})\n'
              f'(d / "{name}.start").write_text(repr(time.time()))\n'
              f'time.sleep({seconds})\n'
              f'(d / "{name}.end").write_text(repr(time.time()))\n'
              f'sys.exit({code})\n')
    return [sys.executable, '-c', script]


def _interval(marker_dir, name):
    return (float((marker_dir / f'{name}.start').read_text()),
            float((marker_dir / f'{name}.end').read_text()))


def test_queue_never_runs_more_than_its_slots_and_runs_every_child(tmp_path):
    stages = Stages(tmp_path / 'logs')
    commands = {f'job{k}': _child(tmp_path, f'job{k}', 0.6) for k in range(5)}
    stages.run_parallel('queue', commands, slots=2)
    intervals = [_interval(tmp_path, name) for name in commands]
    # At every child's start, at most 2 children (itself included) are between start and end.
    for start, _ in intervals:
        overlapping = sum(1 for s, e in intervals if s <= start < e)
        assert overlapping <= 2
    # The queue is kept full: the third child starts only after one of the first two ended,
    # and the slots were used in parallel (the first two overlap).
    (s0, e0), (s1, e1), (s2, _) = intervals[:3]
    assert s1 < e0 and s0 < e1
    assert s2 >= min(e0, e1)
    assert 'queue' in stages.timings


def test_a_failing_child_fails_the_stage_and_stops_the_others(tmp_path):
    stages = Stages(tmp_path / 'logs')
    commands = {'slow': _child(tmp_path, 'slow', 60), 'bad': _child(tmp_path, 'bad', 0.2, code=3),
                'never': _child(tmp_path, 'never', 0.1)}
    with pytest.raises(SystemExit, match=r"bad': 3"):
        stages.run_parallel('failing', commands, slots=2)
    assert not (tmp_path / 'slow.end').exists()  # the 60 s child was stopped
    assert not (tmp_path / 'never.start').exists()  # queued children never start
    assert all(not child.running() for child in stages.procs.children)


def test_the_stage_time_limit_stops_its_children(tmp_path):
    stages = Stages(tmp_path / 'logs')
    with pytest.raises(SystemExit, match='did not finish'):
        stages.run_parallel('limited', {'sleeper': _child(tmp_path, 'sleeper', 60)},
                            timeout_s=1.0)
    assert all(not child.running() for child in stages.procs.children)


def test_shipped_models_name_their_default_modes():
    for name, label, modes in SHIPPED_MODELS:
        assert modes and set(modes) <= {'chunk', 'ensemble'}, (name, label, modes)
    # The object-state policy, the one that does the task, is shown in both modes.
    assert SHIPPED_MODELS[0][2] == ('chunk', 'ensemble')
