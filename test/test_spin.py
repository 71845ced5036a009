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

