"""ProcessSet: children in their own process groups, stopped with escalation, descendants
that left the group killed too, and a wait with a time limit."""

import sys
import time

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
