"""Pose inputs are checked to be in the expected frame (``pose_frame_id``, by default
``visualization.frame_id``), over real rclpy topics: a pose in another frame is rejected
like a malformed message, no command goes out while it is the newest on its topic, and
/diagnostics names the topic, the frame received and the frame expected."""

import time

import pytest
from diagnostic_msgs.msg import DiagnosticStatus

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')

from test_node_act import (  # noqa: E402
    BOX,
    DISCOVERY_S,
    PAD,
    assert_silent_once_stale,
    make_harness,
    make_node,
    wait_commands,
    wait_diagnostics,
)

from act_ros.ros.harness import spinning  # noqa: E402


def _rejected(topic: str, frame: str, expected: str = 'base_link') -> str:
    return (f"pose on {topic} is in frame '{frame}', expected '{expected}' (poses are not "
            'transformed: publish them in that frame, or set pose_frame_id)')


@pytest.fixture(scope='module')
def image():
    import numpy as np

    return np.random.default_rng(7).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)


def test_an_object_pose_in_a_camera_frame_stops_commands_until_one_in_the_base_frame(
        rclpy_context, tiny_pose_checkpoint, image):
    node = make_node(rclpy_context, str(tiny_pose_checkpoint))
    harness = make_harness(rclpy_context, image)
    harness.poses = {'box_pose': BOX, 'pad_pose': PAD}
    harness.frames = {'box_pose': 'camera_color_optical_frame'}
    line = _rejected('/box_pose', 'camera_color_optical_frame')
    with spinning(rclpy_context, node, harness):
        assert node.start(), node.last_configure_error
        wait_diagnostics(harness, lambda level, msg, values: level == DiagnosticStatus.ERROR
                         and f'object_pose/box: rejected ({line})' in values['input_problems']
                         and values['last_rejection'] == f'object_pose/box: {line}',
                         timeout=DISCOVERY_S)
        assert not harness.commands  # the only box pose there is was in the wrong frame
        harness.frames.clear()
        wait_commands(harness, 0.0, 3)
        harness.frames['box_pose'] = 'map'
        assert_silent_once_stale(node, harness, 'the box pose in the map frame')
        assert node.inputs.rejections_by_stream['object_pose/box'] >= 2


@pytest.mark.parametrize('which', ['pad', 'ee'])
def test_a_gate_pose_in_another_frame_stops_commands(which, rclpy_context, tiny_checkpoint,
                                                     image):
    """The release gate's pad (pad_source: topic) and end-effector (ee_source: topic) poses:
    optional inputs (never received: the pad counts as far away), but one in another frame
    stops the commands until a pose in the base frame comes."""
    topic, params = {'pad': ('pad_pose', {'pad_source': 'topic'}),
                     'ee': ('ee_pose', {'ee_source': 'topic'})}[which]
    node = make_node(rclpy_context, str(tiny_checkpoint), **params)
    harness = make_harness(rclpy_context, image)
    harness.frames[topic] = 'tool0' if which == 'ee' else 'map'
    line = _rejected(f'/{topic}', harness.frames[topic])
    with spinning(rclpy_context, node, harness):
        assert node.start(), node.last_configure_error
        wait_commands(harness, 0.0, 3)  # no pose yet: commands, the gate holds
        setattr(harness, f'{which}_position', (0.25, 0.0, 0.05))
        assert_silent_once_stale(node, harness, f'the {which} pose in another frame')
        wait_diagnostics(harness, lambda level, msg, values: level == DiagnosticStatus.ERROR
                         and f'{topic}: rejected ({line})' in values['input_problems']
                         and line in msg)
        harness.frames.clear()
        wait_commands(harness, time.monotonic(), 3)


@pytest.mark.parametrize('params, expected', [
    ({}, 'base_link'),
    ({'visualization.frame_id': 'world'}, 'world'),
    ({'visualization.frame_id': 'world', 'pose_frame_id': 'table'}, 'table'),
])
def test_the_expected_frame_is_pose_frame_id_else_the_visualization_frame(
        params, expected, rclpy_context, tiny_checkpoint):
    from act_ros.ros.node.parameters import read_settings

    node = make_node(rclpy_context, str(tiny_checkpoint), **params)
    try:
        assert read_settings(node, node.specs, node.contract).pose_frame_id == expected
    finally:
        node.destroy_node()


def test_poses_in_a_configured_frame_are_accepted_and_the_base_frame_then_refused(
        rclpy_context, tiny_pose_checkpoint, image):
    node = make_node(rclpy_context, str(tiny_pose_checkpoint), pose_frame_id='table')
    harness = make_harness(rclpy_context, image)
    harness.poses = {'box_pose': BOX, 'pad_pose': PAD}
    harness.frames = {'box_pose': 'table', 'pad_pose': 'table'}
    with spinning(rclpy_context, node, harness):
        assert node.start(), node.last_configure_error
        wait_commands(harness, 0.0, 3)
        del harness.frames['pad_pose']
        assert_silent_once_stale(node, harness, 'the pad pose in base_link')
        wait_diagnostics(harness, lambda level, msg, values: _rejected(
            '/pad_pose', 'base_link', 'table') in values['last_rejection'])


def test_sim_bridge_publishes_its_poses_in_the_frame_act_node_expects_by_default():
    """Both nodes' defaults, and both shipped parameter files, agree on the pose frame."""
    from pathlib import Path

    import yaml

    from act_ros.core.contract import load_contract
    from act_ros.ros.node.parameters import parameter_specs
    from act_ros.ros.sim_bridge.params import BRIDGE_PARAMETERS

    node = {s.name: s.default for s in parameter_specs(load_contract())}
    bridge = {s.name: s.default for s in BRIDGE_PARAMETERS}
    assert node['pose_frame_id'] == ''  # -> visualization.frame_id
    assert bridge['frame_id'] == node['visualization.frame_id'] == 'base_link'
    config = Path(__file__).resolve().parents[1] / 'config'
    act = yaml.safe_load((config / 'act.yaml').read_text())['/**/act_node']['ros__parameters']
    sim = yaml.safe_load((config / 'sim_bridge.yaml').read_text())['/**/sim_bridge'][
        'ros__parameters']
    assert sim['frame_id'] == (act['pose_frame_id'] or act['visualization']['frame_id'])
