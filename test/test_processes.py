"""ProcessSet: children in their own process groups, stopped with escalation, descendants
that left the group killed too, a wait with a time limit, and a stage's own datasets cache."""

import contextlib
import os
import sys
import time
from pathlib import Path

import pytest

from act_ros.core.processes import ProcessSet, wait_gone

# A child that starts a grandchild in a session of its own (outside its process group)
# and ignores SIGINT, so stopping it needs the escalation.
ESCAPER = ('import os, signal, subprocess, sys, time\n'
           'signal.signal(signal.SIGINT, signal.SIG_IGN)\n'
           'p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], '
           'start_new_session=True)\n'
           'print(p.pid, flush=True)\n'
           'time.sleep(600)\n')


def test_stop_reaches_descendants_that_left_the_group(tmp_path):
    procs = ProcessSet(tmp_path, {})
    child = procs.start('escaper', [sys.executable, '-c', ESCAPER])
    deadline = time.monotonic() + 30
    while not child.log_path.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(child.log_path.read_text().split()[0])
    time.sleep(0.3)
    procs.stop_all(grace_s=0.5)
    assert wait_gone([child.pid, grandchild], 10.0) == []
    assert procs.children == []


def test_wait_with_a_time_limit_stops_the_child(tmp_path):
    procs = ProcessSet(tmp_path, {})
    quick = procs.start('quick', [sys.executable, '-c', 'raise SystemExit(3)'])
    assert procs.wait(quick, 30.0) == 3
    slow = procs.start('slow', [sys.executable, '-c', 'import time; time.sleep(600)'])
    with pytest.raises(TimeoutError, match='slow did not finish within 1 s'):
        procs.wait(slow, 1.0)
    assert wait_gone([slow.pid], 10.0) == []


# A stage that records the stop signals it gets, says it is ready, and exits 0.5 s after
# the first (as a trainer saving its checkpoint does); or, with IGNORE set, ignores them.
LEAF = ('import os, signal, sys, time\n'
        'log, ready = sys.argv[1], sys.argv[2]\n'
        'got = []\n'
        'def handler(signum, frame):\n'
        '    got.append(signal.Signals(signum).name)\n'
        '    open(log, "a").write(got[-1] + "\\n")\n'
        'for s in (signal.SIGINT, signal.SIGTERM):\n'
        '    signal.signal(s, signal.SIG_IGN if os.environ.get("IGNORE") else handler)\n'
        'open(ready, "w").write(str(os.getpid()))\n'
        'deadline = time.monotonic() + 600\n'
        'while not got and time.monotonic() < deadline:\n'
        '    time.sleep(0.02)\n'
        'time.sleep(0.5)\n')
# A command that runs its arguments as a stage (act-ros recipe and dagger do so).
STAGE = ('import sys\n'
         'from act_ros.core.processes import run_continuable, run_stage\n'
         'sys.exit(run_continuable("stage", lambda: run_stage(sys.argv[1:]))[0])\n')


def _nested(tmp_path, env=None):
    """recipe -> dagger -> training, as three processes: the outer two run_stage."""
    import os
    import subprocess

    log, ready = tmp_path / 'signals.log', tmp_path / 'ready'
    leaf = [sys.executable, '-c', LEAF, str(log), str(ready)]
    outer = subprocess.Popen([sys.executable, '-c', STAGE, sys.executable, '-c', STAGE, *leaf],
                             stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 60
    while not (ready.is_file() and ready.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.is_file(), outer.stderr.read() if outer.poll() is not None else 'no stage'
    return outer, int(ready.read_text()), log


def test_a_stop_reaches_a_nested_stage_once_and_the_command_says_how_to_continue(tmp_path):
    import signal

    outer, leaf, log = _nested(tmp_path)
    outer.send_signal(signal.SIGTERM)
    assert outer.wait(timeout=60) == 130
    assert 'interrupted; run the same command to continue' in outer.stderr.read()
    # Exactly one SIGINT, though two processes passed it on: the stage saves, not stops.
    assert log.read_text().split() == ['SIGINT']
    assert wait_gone([leaf], 10.0) == []


def test_a_third_stop_kills_a_nested_stage_that_ignores_signals(tmp_path):
    import signal

    outer, leaf, _log = _nested(tmp_path, {'IGNORE': '1'})
    for _ in range(3):
        outer.send_signal(signal.SIGTERM)
        time.sleep(0.5)
    assert outer.wait(timeout=60) == 130
    assert wait_gone([leaf], 10.0) == []


def test_stop_signals_that_come_together_are_one_request():
    import signal

    from act_ros.core.processes import StopRequests

    requests = StopRequests(together_s=60.0)
    assert requests(signal.SIGTERM) is True and requests.first == 'SIGTERM'
    assert requests(signal.SIGINT) is False  # the same stop, passed on by the parent
    later = StopRequests(together_s=0.0)  # every second signal comes later than this
    assert later(signal.SIGINT) is True
    with pytest.raises(KeyboardInterrupt):
        later(signal.SIGINT)


_CACHE_PROBE = '''
import os, sys
import datasets
import pyarrow as pa, pyarrow.parquet as pq
path = os.path.join(sys.argv[1], 'rows.parquet')
pq.write_table(pa.table({'x': list(range(50))}), path)
datasets.Dataset.from_parquet(path)
print(os.environ['HF_DATASETS_CACHE'])
print(sum(len(files) for _, _, files in os.walk(os.environ['HF_DATASETS_CACHE'])))
'''


def test_a_stage_gets_a_datasets_cache_of_its_own_and_it_is_removed(tmp_path, monkeypatch):
    """LeRobot's parquet reads leave Arrow copies in HF_DATASETS_CACHE: a stage's child (and
    each child of a stage, in turn) writes them to a temporary cache removed afterwards; a
    cache the user chose is left as it is."""
    pytest.importorskip('datasets')
    from act_ros.core.processes import run_stage, stage_environment

    monkeypatch.delenv('HF_DATASETS_CACHE', raising=False)
    monkeypatch.delenv('ACT_ROS_STAGE_DATASETS_CACHE', raising=False)
    script = tmp_path / 'probe.py'
    script.write_text(_CACHE_PROBE)

    def stage(env):
        out = tmp_path / 'out.txt'
        with open(out, 'w') as f:
            assert run_stage([sys.executable, str(script), str(tmp_path)], env=env,
                             stdout=f) == 0
        cache, files = out.read_text().split()
        return cache, int(files)

    with stage_environment() as env:
        cache, files = stage(env)
        assert cache == env['HF_DATASETS_CACHE'] and files > 0  # datasets wrote there
        monkeypatch.setattr('os.environ', env)  # as inside that stage: its own child
        with stage_environment() as inner:
            assert inner['HF_DATASETS_CACHE'] != cache
            inner_cache = inner['HF_DATASETS_CACHE']
        assert not os.path.exists(inner_cache)
    assert not os.path.exists(cache)
    chosen = tmp_path / 'chosen'
    monkeypatch.setattr('os.environ', {**env, 'HF_DATASETS_CACHE': str(chosen)})
    with stage_environment() as env:
        assert stage(env)[0] == str(chosen)
    assert any(chosen.iterdir())


POOL_PARENT = '''
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from act_ros.core.processes import die_with_parent

def busy(_):
    print(os.getpid(), flush=True)  # the worker's pid, for the test
    time.sleep(120)  # a long episode block: the worker reads no queue meanwhile

if __name__ == '__main__':
    init = die_with_parent if sys.argv[1] == 'die' else None
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn'),
                             initializer=init) as pool:
        list(pool.map(busy, range(2)))
'''


@pytest.mark.parametrize('initializer', ['die', 'none'])
def test_pool_workers_busy_in_a_task_die_with_a_killed_parent(tmp_path, initializer):
    """die_with_parent (the initializer of act-ros evaluate's, collect's and DAgger's
    pools): a parent killed with SIGKILL leaves no worker running its task; without it the
    workers run on (the orphans this prevents)."""
    import signal
    import subprocess

    script = tmp_path / 'pool_parent.py'
    script.write_text(POOL_PARENT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get('PYTHONPATH', '')]))
    parent = subprocess.Popen([sys.executable, str(script), initializer], stdout=subprocess.PIPE,
                              text=True, env=env)
    workers: list[int] = []
    try:
        workers += [int(parent.stdout.readline()) for _ in range(2)]
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        left = wait_gone(workers, 30.0 if initializer == 'die' else 2.0)
        if initializer == 'die':
            assert left == [], f'workers {left} outlived their killed parent'
        else:
            assert left == workers  # the control: without it they are orphans
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
