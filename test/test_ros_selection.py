"""``make test-ros`` (CI: the ROS tests again on Jazzy) selects every test module that uses
ROS 2, by the rule of ``conftest.is_ros_test_module``: what it imports, anywhere in the
module, and the ROS executables it starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import is_ros_test_module

TEST_DIR = Path(__file__).resolve().parent


@pytest.mark.parametrize('source, uses_ros', [
    ('import rclpy\n', True),
    ('from sensor_msgs.msg import Image\n', True),
    ('import pytest\nrclpy = pytest.importorskip("rclpy")\n', True),
    ('def test_x():\n    from act_ros.ros.harness import RobotHarness\n', True),
    ('def test_x():\n    run(["act_node", "--ros-args"])\n', True),
    ('CMD = [sys.executable, "-m", "act_ros.ros.recording.record_node"]\n', True),
    ('def test_x():\n    main(["evaluate", "--over-ros"])\n', True),
    ('from launch_ros.actions import Node\n', True),
    ('import numpy as np\nfrom act_ros.core.control.safety import clamp\n', False),
    ('"""Rosbag2 files through act-ros import-bag."""\nimport rosbags\n', False),
    ('from act_ros.core.contract import load_contract\n', False),
])
def test_the_rule_tells_ros_test_modules(tmp_path, source, uses_ros):
    path = tmp_path / 'test_probe.py'
    path.write_text(source)
    assert is_ros_test_module(path) == uses_ros


def test_the_node_tests_are_selected_and_the_core_tests_are_not():
    modules = {p.name: is_ros_test_module(p) for p in TEST_DIR.glob('test_*.py')}
    for name in ('test_node_act.py', 'test_record_node.py', 'test_ros_eval.py',
                 'test_sim_bridge.py', 'test_spin.py', 'test_colcon.py', 'test_startup.py'):
        assert modules[name], name
    for name in ('test_safety.py', 'test_chunking.py', 'test_train.py', 'test_bag_import.py',
                 'test_sim_expert.py'):
        assert not modules[name], name
