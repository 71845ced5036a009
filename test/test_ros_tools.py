"""``act-ros call``, ``topics``, ``hz`` and ``share-dir``, the pip setup's stand-ins for the
``ros2`` commands the docs use, run as the user runs them (a process of their own in the
test's ROS domain) against real services and publishers in this process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from act_ros.ros.harness import spinning

ROOT = Path(__file__).resolve().parents[1]
RATE_HZ = 20.0


def act_ros(ros_domain_id: int, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    return subprocess.run([sys.executable, '-m', 'act_ros.cli', *argv], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


@pytest.fixture
def services(rclpy_context):
    """A node serving ``/tools_test/ok`` (answers success), ``/tools_test/refuse`` (answers
    failure) and ``/tools_test/count`` (a ``std_msgs/String`` topic, not a service)."""
    import rclpy
    from std_msgs.msg import String
    from std_srvs.srv import Trigger

    node = rclpy.create_node('tools_test', context=rclpy_context)
    calls = []

    def answer(success, message):
        def handle(_request, response):
            calls.append(message)
            response.success, response.message = success, message
            return response
        return handle

    node.create_service(Trigger, '~/ok', answer(True, 'episode 3 started'))
    node.create_service(Trigger, '~/refuse', answer(False, 'no episode to save'))
    node.create_publisher(String, '~/count', 10)
    with spinning(rclpy_context, node, num_threads=1):
        yield calls


def test_call_prints_the_answer_and_exits_by_its_success(services, ros_domain_id):
    proc = act_ros(ros_domain_id, 'call', '/tools_test/ok', '--timeout', '60')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ['success: True', 'message: episode 3 started']
    proc = act_ros(ros_domain_id, 'call', 'tools_test/refuse', '--timeout', '60')
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ['success: False', 'message: no episode to save']
    assert services == ['episode 3 started', 'no episode to save']


def test_call_fails_clearly_on_a_missing_service_or_another_type(services, ros_domain_id):
    proc = act_ros(ros_domain_id, 'call', '/tools_test/nothing', '--timeout', '2')
    assert proc.returncode == 3 and proc.stdout == ''
    assert 'no service /tools_test/nothing appeared within 2 s' in proc.stderr, proc.stderr
    # A service of another type: the node's own parameter services are rcl_interfaces'.
    proc = act_ros(ros_domain_id, 'call', '/tools_test/get_parameters', '--timeout', '60')
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert 'is a rcl_interfaces/srv/GetParameters; act-ros call calls std_srvs/srv/Trigger' \
        in proc.stderr, proc.stderr
    assert services == []


def test_topics_lists_a_topic_with_its_type(services, ros_domain_id):
    proc = act_ros(ros_domain_id, 'topics', '--wait', '3')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '/tools_test/count [std_msgs/msg/String]' in proc.stdout.splitlines(), proc.stdout


def test_hz_measures_a_publishers_rate(rclpy_context, ros_domain_id):
    import rclpy
    from sensor_msgs.msg import JointState

    node = rclpy.create_node('tools_rate', context=rclpy_context)
    publisher = node.create_publisher(JointState, 'rate_test/joint_states', 10)
    sent = []

    def publish():
        publisher.publish(JointState(name=['a'], position=[float(len(sent))]))
        sent.append(time.monotonic())

    node.create_timer(1.0 / RATE_HZ, publish)
    with spinning(rclpy_context, node, num_threads=1):
        proc = act_ros(ros_domain_id, 'hz', '/rate_test/joint_states', '--seconds', '4',
                       '--timeout', '60')
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip()
    assert line.startswith('/rate_test/joint_states: average rate '), line
    hz = float(line.split('average rate ')[1].split()[0])
    # Against the rate the publisher achieved (a busy machine delays its timer), not the
    # nominal one: the average over seconds of arrivals follows the sends.
    achieved = (len(sent) - 1) / (sent[-1] - sent[0])
    assert 0.5 * achieved <= hz <= 1.5 * achieved, (line, achieved)


def test_hz_fails_clearly_on_a_silent_or_missing_topic(services, ros_domain_id):
    proc = act_ros(ros_domain_id, 'hz', '/tools_test/count', '--seconds', '1', '--timeout', '60')
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert '0 message(s) on /tools_test/count in 1 s: no rate' in proc.stderr, proc.stderr
    proc = act_ros(ros_domain_id, 'hz', '/tools_test/nothing', '--timeout', '1')
    assert proc.returncode == 3
    assert 'no topic /tools_test/nothing appeared within 1 s' in proc.stderr, proc.stderr


def test_share_dir_holds_the_config_the_docs_name(ros_domain_id):
    proc = act_ros(ros_domain_id, 'share-dir')
    assert proc.returncode == 0, proc.stderr
    share = Path(proc.stdout.strip())
    assert share.resolve() == ROOT.resolve()
    assert (share / 'config' / 'fastdds_large_images.xml').is_file()
