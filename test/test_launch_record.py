"""launch/record.launch.py and config/record.yaml, checked like the policy node's launch file
(see test_launch_act.py): declared arguments with descriptions, executables that are this
package's console scripts, an installed parameter file that a real record_node loads."""

import ast
import importlib
from pathlib import Path

import pytest
import yaml
from test_launch_act import _calls, _flatten, _keyword, _string, console_scripts, package_name, used_arguments

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'record.launch.py'
PARAMS_FILE = ROOT / 'config' / 'record.yaml'


@pytest.fixture(scope='module')
def tree() -> ast.Module:
    return ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))


def test_arguments_are_declared_with_descriptions_and_used(tree):
    declared = {}
    for call in _calls(tree, 'DeclareLaunchArgument'):
        name = _string(call.args[0])
        text = ast.literal_eval(_keyword(call, 'description'))
        assert len(text) > 10, f"'{name}' has no description"
        declared[name] = call
    assert {'output', 'params_file', 'action_source', 'action_topic'} <= set(declared)
    assert used_arguments(tree) == set(declared)


def test_executable_and_parameter_file(tree):
    scripts = console_scripts()
    (node,) = _calls(tree, 'Node')
    assert _string(_keyword(node, 'package')) == package_name()
    module, _, function = scripts[_string(_keyword(node, 'executable'))].partition(':')
    assert callable(getattr(importlib.import_module(module), function))
    (path,) = _calls(tree, 'PathJoinSubstitution')
    parts = [_string(p) for p in path.args[0].elts[1:]]
    assert (ROOT / Path(*parts)) == PARAMS_FILE


def test_params_file_mirrors_the_declared_parameters():
    from act_ros.core.contract import load_contract
    from act_ros.ros.recording.record_node import record_parameters

    data = yaml.safe_load(PARAMS_FILE.read_text())
    (key,) = data
    params = _flatten(data[key]['ros__parameters'])
    names = {s.name for s in record_parameters(load_contract())}
    assert set(params) <= names, f'unknown parameters in record.yaml: {set(params) - names}'
    missing = sorted(names - set(params) - {'contract_path'})
    assert not missing, f'parameters missing from record.yaml: {missing}'


@pytest.mark.ros
def test_params_file_loads_into_the_node(ros_domain_id, tmp_path):
    rclpy = pytest.importorskip('rclpy')
    from act_ros.ros.recording.record_node import RecordNode

    context = rclpy.context.Context()
    rclpy.init(context=context, domain_id=ros_domain_id,
               args=['--ros-args', '--params-file', str(PARAMS_FILE),
                     '-p', f'output:={tmp_path / "demos"}'])
    try:
        node = RecordNode(context=context, namespace='arm')
        assert node.spec.action_source == 'command'
        assert node.spec.camera_topics['top'] == 'camera/top/image_raw'
        assert not node.recording
        node.destroy_node()
        with pytest.raises(ValueError, match="'output' is required"):
            RecordNode(context=context, parameter_overrides=[
                rclpy.parameter.Parameter('output', value='')])
    finally:
        rclpy.shutdown(context=context)


@pytest.mark.ros
def test_given_camera_topics_and_transports_reach_the_node(ros_domain_id, tmp_path):
    """The launch arguments for a camera set its topic and transport parameters (after the
    params file): a compressed camera is then read on ``<topic>/compressed``, the other
    cameras as the file says."""
    rclpy = pytest.importorskip('rclpy')
    from test_launch_parameters import _rcl_arguments

    from act_ros.ros.launch_arguments import RECORD_NODE_ARGUMENTS, parameter_sources
    from act_ros.ros.recording.record_node import RecordNode

    values = {'output': str(tmp_path / 'demos'), 'top_image_topic': '/cam/top',
              'top_image_transport': 'compressed', 'wrist_image_topic': '',
              'wrist_image_transport': '', 'action_source': '', 'max_episode_s': ''}
    sources = parameter_sources([str(PARAMS_FILE)], values, RECORD_NODE_ARGUMENTS)
    assert sources[0] == str(PARAMS_FILE) and sources[1] == {
        'output': str(tmp_path / 'demos'), 'cameras.top.topic': '/cam/top',
        'cameras.top.transport': 'compressed'}
    context = rclpy.context.Context()
    rclpy.init(context=context, domain_id=ros_domain_id, args=_rcl_arguments(sources, tmp_path))
    try:
        node = RecordNode(context=context)
        topics = {sub.topic_name for sub in node.subscriptions}
        assert {'/cam/top/compressed', '/camera/wrist/image_raw'} <= topics, topics
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
