"""``make demo``'s stage runner: children queued into a number of slots, failures and time
limits stop the stage and every child it started."""

import sys

import pytest

from act_ros.demo import SHIPPED_MODELS, Stages


def _child(marker_dir, name, seconds, code=0, partner=''):
    """A child that notes at its start how many children are running (itself included:
    started minus ended, from the marker files), optionally waits up to 60 s for
    ``partner`` to start (notes whether it did), then sleeps, notes its end and exits."""
    script = ('import pathlib, sys, time\n'
              f'd = pathlib.Path({str(marker_dir)!r})\n'
              'running = len(list(d.glob("*.start"))) + 1 - len(list(d.glob("*.end")))\n'
              f'(d / "{name}.start").write_text(str(running))\n'
              f'partner = {partner!r}\n'
              'deadline = time.monotonic() + 60\n'
              'while partner and not (d / f"{partner}.start").exists() '
              'and time.monotonic() < deadline:\n'
              '    time.sleep(0.01)\n'
              'seen = not partner or (d / f"{partner}.start").exists()\n'
              f'time.sleep({seconds})\n'
              f'(d / "{name}.end").write_text(str(seen))\n'
              f'sys.exit({code})\n')
    return [sys.executable, '-c', script]


def test_queue_never_runs_more_than_its_slots_and_runs_every_child(tmp_path):
    stages = Stages(tmp_path / 'logs')
    # The first two wait for each other: they finish only if both slots run at once.
    commands = {f'job{k}': _child(tmp_path, f'job{k}', 0.1,
                                  partner={0: 'job1', 1: 'job0'}.get(k, ''))
                for k in range(5)}
    stages.run_parallel('queue', commands, slots=2)
    for name in commands:
        # Every child ran; at its start at most 2 were running, itself included.
        assert 1 <= int((tmp_path / f'{name}.start').read_text()) <= 2
        assert (tmp_path / f'{name}.end').read_text() == 'True'
    # The first two ran in parallel; the third started only after one of them had ended.
    assert max(int((tmp_path / f'job{k}.start').read_text()) for k in (0, 1)) == 2
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
