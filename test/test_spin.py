"""run_node, the console-script life every node shares: a Ctrl-C that lands while the
executor builds its wait set is a shutdown (status 0, cleanup in order), a middleware
error with the context still up is not; build errors end with one line.

Each case runs in its own interpreter: run_node initializes rclpy's default context,
which installs rclpy's signal handlers in the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip('rclpy')

SCRIPT = textwrap.dedent('''
    import json
    import sys
    import rclpy
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
    from rclpy.node import Node
    from act_ros.ros.spin import run_node

    case = sys.argv[1]
    events = []

    class Probe(Node):
        def __init__(self):
            if case == 'bad build':
                raise ValueError('mode: expected one of chunk, ensemble')
            super().__init__('probe')

        def destroy_node(self):
            events.append('destroyed')
            super().destroy_node()

    def spin(executor, node):
        if case == 'shutdown race':
            rclpy.shutdown()  # what rclpy's SIGINT handler does, from another thread
        raise _rclpy.RCLError('failed to initialize wait set: the given context is not valid')

    try:
        code = run_node(Probe, name='probe', args=[], spin=spin, errors=(ValueError,),
                        before_shutdown=lambda node: events.append('before_shutdown'),
                        on_exit=lambda node: events.append('on_exit'))
    except _rclpy.RCLError as exc:
        code = f'raised {exc}'
    print('RESULT', json.dumps({'code': code, 'events': events, 'ok': rclpy.ok()}))
''')


CLEANUP = ['before_shutdown', 'on_exit', 'destroyed']


@pytest.mark.parametrize('case, code', [
    ('shutdown race', 0),
    ('middleware error', 'raised failed to initialize wait set: the given context is not valid'),
    ('bad build', 2),
])
def test_run_node_tells_a_shutdown_from_an_error(case, code, ros_domain_id):
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    proc = subprocess.run([sys.executable, '-c', SCRIPT, case], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('RESULT ')]
    assert len(lines) == 1, proc.stdout + proc.stderr[-2000:]
    result = json.loads(lines[0][len('RESULT '):])
    assert result['code'] == code and not result['ok'], result
    if case == 'bad build':
        assert result['events'] == []  # nothing was built, nothing to clean up
        assert proc.stderr.strip().splitlines()[-1] == (
            'probe: mode: expected one of chunk, ensemble')
    else:  # cleanup in order (rclpy's shutdown may destroy the node once before)
        assert result['events'][-3:] == CLEANUP, result


class _RacingExecutor:
    """Stands in for an executor whose spin() meets rclpy's destruction race ``races``
    times (InvalidHandle, ros2/rclpy#1284) before it returns at shutdown."""

    def __init__(self, races):
        self.races = races
        self.spins = 0

    def spin(self):
        from rclpy.exceptions import InvalidHandle
        self.spins += 1
        if self.spins <= self.races:
            raise InvalidHandle('cannot use Destroyable because destruction was requested')


def test_spin_executor_goes_on_past_the_destruction_race_and_stops_at_shutdown():
    from act_ros.ros.spin import spin_executor
    executor = _RacingExecutor(races=3)
    spin_executor(executor)
    assert executor.spins == 4  # three races, then the spin that ended at shutdown


def test_spin_executor_raises_a_lasting_invalid_handle():
    from rclpy.exceptions import InvalidHandle

    from act_ros.ros.spin import MAX_DESTRUCTION_RACES, spin_executor
    executor = _RacingExecutor(races=10 ** 9)
    with pytest.raises(InvalidHandle):
        spin_executor(executor)
    assert executor.spins == MAX_DESTRUCTION_RACES + 1



# -- PoolExecutor --------------------------------------------------------------------------
def _pool_node(context, name):
    from rclpy.node import Node
    return Node(name, context=context)


class _CountingPool:
    """A PoolExecutor that counts its rounds and the callbacks it hands to its pool."""

    @staticmethod
    def make(num_threads, context):
        from act_ros.ros.spin import PoolExecutor

        class Counting(PoolExecutor):
            def __init__(self):
                super().__init__(num_threads, context=context)
                self.rounds = 0
                self.handed = 0
                submit = self._pool.submit

                def counted(*args, **kwargs):
                    self.handed += 1
                    return submit(*args, **kwargs)
                self._pool.submit = counted

            def spin_once(self, timeout_sec=None):
                self.rounds += 1
                super().spin_once(timeout_sec)

        return Counting()


def _spin_until(executor, done, timeout_s):
    import time
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    return done()


def test_pool_executor_hands_a_waiting_callback_over_once_and_does_not_spin(rclpy_context):
    # The only pool thread is held by one callback for BLOCK_S while another is ready, and
    # the executor is woken every millisecond (as callbacks finishing and messages
    # arriving wake it in a node). rclpy's MultiThreadedExecutor (Jazzy, Kilted) queues
    # the waiting callback again on every wake-up, hundreds of times here, and its pool
    # threads then spend the GIL on the copies (ros2/rclpy#1452). The pool queues it once
    # and sleeps between rounds while it waits.
    import threading
    import time

    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

    from act_ros.ros.spin import HANDOVER_WAIT_S, spin_executor
    block_s = 0.5
    node = _pool_node(rclpy_context, 'pool_probe')
    release = threading.Event()
    calls = {'blocker': 0, 'ready': 0}

    def blocker():
        calls['blocker'] += 1
        if calls['blocker'] == 1:
            release.wait(30.0)

    def ready():
        calls['ready'] += 1

    node.create_timer(0.01, blocker, callback_group=MutuallyExclusiveCallbackGroup())
    node.create_timer(0.01, ready, callback_group=MutuallyExclusiveCallbackGroup())
    executor = _CountingPool.make(1, rclpy_context)
    executor.add_node(node)
    spinner = threading.Thread(target=spin_executor, args=(executor,), daemon=True)
    spinner.start()
    stop_waking = threading.Event()

    def waker():
        while not stop_waking.is_set():
            executor.wake()
            time.sleep(0.001)
    try:
        from act_ros.ros.harness import wait_until
        assert wait_until(lambda: calls['blocker'] == 1, 30.0)
        time.sleep(0.05)  # 'ready' is handed over and waits for the held thread
        rounds_before, handed_before = executor.rounds, executor.handed
        waking = threading.Thread(target=waker, daemon=True)
        waking.start()
        time.sleep(block_s)
        stop_waking.set()
        waking.join()
        rounds = executor.rounds - rounds_before
        handed = executor.handed - handed_before
        ready_while_blocked = calls['ready']
        release.set()
        assert wait_until(lambda: calls['ready'] >= 3, 30.0)  # and it runs once freed
    finally:
        stop_waking.set()
        release.set()
        executor.shutdown(timeout_sec=5.0)
        spinner.join(timeout=5.0)
        node.destroy_node()
    assert ready_while_blocked == 0  # one thread, and it was held
    assert handed == 0, handed  # 'ready' was handed over once, before the window
    # Each round while 'ready' waits sleeps up to HANDOVER_WAIT_S (or until the thread
    # frees up); the round after it ends at the next wake-up.
    assert rounds <= 2 * block_s / HANDOVER_WAIT_S + 20, rounds


def test_pool_executor_runs_callbacks_of_different_groups_at_once(rclpy_context):
    # Two threads: a callback that waits for another one to run finishes (on one thread,
    # or with both in one mutually exclusive group, it would wait out its timeout).
    import threading

    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

    node = _pool_node(rclpy_context, 'pool_pair')
    other_ran = threading.Event()
    outcome = []

    def waiter():
        if not outcome:
            outcome.append(other_ran.wait(10.0))

    node.create_timer(0.01, waiter, callback_group=MutuallyExclusiveCallbackGroup())
    node.create_timer(0.05, other_ran.set, callback_group=MutuallyExclusiveCallbackGroup())
    executor = _CountingPool.make(2, rclpy_context)
    executor.add_node(node)
    try:
        assert _spin_until(executor, lambda: bool(outcome), 30.0)
    finally:
        other_ran.set()
        executor.shutdown(timeout_sec=5.0)
        node.destroy_node()
    assert outcome == [True]


def test_pool_executor_raises_a_callback_error_from_spin(rclpy_context):
    from act_ros.ros.spin import PoolExecutor, spin_executor

    node = _pool_node(rclpy_context, 'pool_error')

    def broken():
        raise ValueError('joint 3: expected a finite position, got nan')

    node.create_timer(0.01, broken)
    executor = PoolExecutor(2, context=rclpy_context)
    executor.add_node(node)
    try:
        with pytest.raises(ValueError, match='expected a finite position'):
            spin_executor(executor)
    finally:
        executor.shutdown(timeout_sec=5.0)
        node.destroy_node()


def _blocked_pool(context, name):
    """One pool thread held by callback 'a' (group A) until ``release`` is set, callback
    'b' (group B) ready and handed over behind it; spun in a thread."""
    import threading
    import time

    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

    from act_ros.ros.harness import wait_until
    from act_ros.ros.spin import spin_executor
    node = _pool_node(context, name)
    release, finished = threading.Event(), threading.Event()
    calls = {'a': 0, 'b': 0}

    def a():
        calls['a'] += 1
        if calls['a'] == 1:
            release.wait(30.0)
            finished.set()

    def b():
        calls['b'] += 1

    group_b = MutuallyExclusiveCallbackGroup()
    node.create_timer(0.01, a, callback_group=MutuallyExclusiveCallbackGroup())
    timer_b = node.create_timer(0.01, b, callback_group=group_b)
    executor = _CountingPool.make(1, context)
    executor.add_node(node)
    spinner = threading.Thread(target=spin_executor, args=(executor,), daemon=True)
    spinner.start()
    assert wait_until(lambda: calls['a'] == 1, 30.0)
    time.sleep(0.05)  # 'b' is handed over and waits for the held thread
    return node, executor, spinner, release, finished, calls, (group_b, timer_b)


def test_pool_executor_shutdown_keeps_its_time_limit_and_leaves_waiting_work_untaken(
        rclpy_context):
    # A callback that does not return within timeout_sec: shutdown returns False at the
    # limit (rclpy's executors of this release wait for it without limit). The callback
    # that waited for a thread never runs, and its entity is free for another executor.
    import time
    node, executor, spinner, release, finished, calls, (group_b, timer_b) = \
        _blocked_pool(rclpy_context, 'pool_shutdown_limit')
    try:
        started = time.monotonic()
        all_finished = executor.shutdown(timeout_sec=0.3)
        took = time.monotonic() - started
        # Returned while the callback was still held (it is released only below, or ends
        # its wait by itself after 30 s), having waited out the limit.
        assert not all_finished and not finished.is_set()
        assert took >= 0.3, took
        release.set()
        assert finished.wait(10.0)
        spinner.join(timeout=5.0)
        assert not spinner.is_alive()
        assert calls == {'a': 1, 'b': 0}
        assert not timer_b._executor_event and group_b.can_execute(timer_b)
    finally:
        release.set()
        node.destroy_node()


def test_pool_executor_shutdown_waits_for_running_callbacks(rclpy_context):
    import threading
    node, executor, spinner, release, finished, calls, _ = \
        _blocked_pool(rclpy_context, 'pool_shutdown_wait')
    try:
        threading.Timer(0.3, release.set).start()
        assert executor.shutdown(timeout_sec=20.0)
        assert finished.is_set()  # it returned only once the running callback had
        spinner.join(timeout=5.0)
        assert not spinner.is_alive() and calls['b'] == 0
    finally:
        release.set()
        node.destroy_node()


def test_pool_executor_needs_a_thread():
    from act_ros.ros.spin import PoolExecutor
    with pytest.raises(ValueError, match='num_threads must be >= 1, got 0'):
        PoolExecutor(0)


def test_bench_executor_measures_each_executor_beside_the_node(tmp_path, ros_domain_id,
                                                                monkeypatch):
    # The benchmark's own mechanics, on the two executors without the spin (rclpy's
    # multi-threaded one can take minutes per try when it spins: the benchmark shows that).
    monkeypatch.setenv('ROS_DOMAIN_ID', str(ros_domain_id))
    monkeypatch.setenv('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    from act_ros.bench.executor import main
    result, table = tmp_path / 'executor.json', tmp_path / 'executor.md'
    assert main(['--tries', '1', '--commands', '5', '--kinds', 'pool,single_threaded',
                 '--json', str(result), '--output', str(table), '--no-header']) == 0
    tries = json.loads(result.read_text())['tries']
    assert [t['kind'] for t in tries] == ['pool', 'single_threaded']
    for t in tries:
        assert t['model_median_ms'] > 0 and t['start_s'] > 0 and t['commands_s'] is not None
    assert tries[0]['handed_over'] >= 1 and tries[1]['handed_over'] is None
    text = table.read_text()
    assert '| PoolExecutor (4 threads) | 1 |' in text and '| SingleThreadedExecutor | 1 |' in text
    assert 'rclpy' not in text.split('|---|')[1]  # only the kinds asked for


def test_bench_executor_refuses_unknown_kinds():
    from act_ros.bench.executor import main
    with pytest.raises(SystemExit):
        main(['--kinds', 'pool,events'])
