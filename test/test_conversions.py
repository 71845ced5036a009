"""Message conversions (act_ros.ros.conversions): pure functions over real message objects."""

import math

import numpy as np
import pytest

pytest.importorskip('rclpy')

from builtin_interfaces.msg import Duration  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image, JointState  # noqa: E402

from act_ros.ros import conversions as conv  # noqa: E402

JOINTS = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper']


@pytest.fixture
def rgb() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)


@pytest.mark.parametrize('encoding', ['rgb8', 'bgr8', 'rgba8', 'bgra8'])
@pytest.mark.parametrize('padding', [0, 3])
def test_color_encodings_round_trip_to_rgb(rgb, encoding, padding):
    msg = conv.rgb_to_image(rgb, encoding, row_padding=padding)
    assert msg.step == 5 * len(encoding.replace('8', '')) + padding
    out = conv.image_to_rgb(msg)
    assert out.dtype == np.uint8 and out.flags['C_CONTIGUOUS']
    np.testing.assert_array_equal(out, rgb)


def test_bgr8_is_swapped_to_rgb():
    msg = Image(height=1, width=1, encoding='bgr8', step=3)
    msg.data = bytes([10, 20, 30])  # B, G, R
    assert conv.image_to_rgb(msg)[0, 0].tolist() == [30, 20, 10]


def test_mono8_is_expanded_to_three_channels(rgb):
    out = conv.image_to_rgb(conv.rgb_to_image(rgb, 'mono8', row_padding=2))
    assert out.shape == (6, 5, 3)
    np.testing.assert_array_equal(out[:, :, 0], out[:, :, 2])


@pytest.mark.parametrize('mutate, words', [
    (lambda m: setattr(m, 'encoding', 'yuv422'), ["encoding 'yuv422'"]),
    (lambda m: setattr(m, 'encoding', '16UC1'), ['not supported']),
    (lambda m: setattr(m, 'data', bytes(m.data)[:-1]), ['bytes', 'height*step']),
    (lambda m: setattr(m, 'step', 2), ['step 2']),
    (lambda m: setattr(m, 'height', 0), ['size must be positive']),
])
def test_malformed_images_are_rejected_naming_the_field(rgb, mutate, words):
    msg = conv.rgb_to_image(rgb, 'rgb8')
    mutate(msg)
    with pytest.raises(conv.MalformedMessageError) as info:
        conv.image_to_rgb(msg)
    for word in words:
        assert word in str(info.value)


def test_compressed_png_is_lossless_and_rgb(rgb):
    msg = conv.rgb_to_compressed(rgb, 'png')
    assert msg.format == 'png'
    np.testing.assert_array_equal(conv.compressed_to_rgb(msg), rgb)


def test_compressed_jpeg_decodes_to_rgb_not_bgr():
    red = np.zeros((16, 16, 3), dtype=np.uint8)
    red[..., 0] = 255
    out = conv.compressed_to_rgb(conv.rgb_to_compressed(red, 'jpeg', quality=95))
    assert out[8, 8, 0] > 200 and out[8, 8, 2] < 50


def test_undecodable_compressed_image_is_rejected():
    msg = CompressedImage(format='jpeg')
    msg.data = b'not a jpeg'
    with pytest.raises(conv.MalformedMessageError, match='could not be decoded'):
        conv.compressed_to_rgb(msg)
    with pytest.raises(conv.MalformedMessageError, match='no data'):
        conv.compressed_to_rgb(CompressedImage(format='jpeg'))


def joint_state(names, positions) -> JointState:
    return JointState(name=list(names), position=[float(p) for p in positions])


def test_joints_are_matched_by_name_in_any_order_with_extras():
    values = {name: 0.1 * (i + 1) for i, name in enumerate(JOINTS)}
    names = ['camera_tilt'] + JOINTS[::-1] + ['conveyor']
    msg = joint_state(names, [9.0] + [values[n] for n in JOINTS[::-1]] + [-9.0])
    np.testing.assert_allclose(conv.joint_positions(msg, JOINTS), [values[n] for n in JOINTS])


@pytest.mark.parametrize('names, positions, words', [
    (JOINTS[:-1], [0.0] * 5, ['missing', "'gripper'"]),
    (JOINTS, [0.0] * 5, ['6 names but 5 positions']),
    (JOINTS, [0.0, 0.0, math.nan, 0.0, 0.0, 0.0], ['not finite', "'elbow_flex'"]),
    (JOINTS, [0.0, 0.0, 0.0, 0.0, math.inf, 0.0], ["'wrist_roll'"]),
    (JOINTS + ['gripper'], [0.0] * 7, ["'gripper' twice"]),
])
def test_bad_joint_states_are_rejected_naming_the_joint(names, positions, words):
    with pytest.raises(conv.MalformedMessageError) as info:
        conv.joint_positions(joint_state(names, positions), JOINTS)
    for word in words:
        assert word in str(info.value)


def test_nan_in_an_ignored_extra_joint_is_accepted():
    msg = joint_state(JOINTS + ['camera_tilt'], [0.0] * 6 + [math.nan])
    assert np.all(np.isfinite(conv.joint_positions(msg, JOINTS)))


def test_pose_position():
    msg = PoseStamped()
    msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = 0.1, -0.2, 0.3
    np.testing.assert_allclose(conv.pose_position(msg), [0.1, -0.2, 0.3])
    msg.pose.position.y = math.nan
    with pytest.raises(conv.MalformedMessageError, match='not finite'):
        conv.pose_position(msg)


@pytest.mark.parametrize('frame', ['camera_link', 'map', '', 'Base_link'])
def test_a_pose_in_another_frame_is_rejected_naming_topic_and_frames(frame):
    msg = PoseStamped()
    msg.header.frame_id = frame
    msg.pose.orientation.w = 1.0
    convert = conv.in_frame(conv.pose_components, 'base_link', '/arm/box_pose')
    with pytest.raises(conv.MalformedMessageError) as err:
        convert(msg)
    assert str(err.value) == (
        f"pose on /arm/box_pose is in frame '{frame}', expected 'base_link' (poses are not "
        'transformed: publish them in that frame, or set pose_frame_id)')
    msg.header.frame_id = 'base_link'
    np.testing.assert_allclose(convert(msg), [0, 0, 0, 1, 0, 0, 0])


def test_joint_trajectory_command():
    msg = conv.to_joint_trajectory(np.arange(6) * 0.1, JOINTS, 1.0 / 30.0)
    assert list(msg.joint_names) == JOINTS
    assert len(msg.points) == 1
    np.testing.assert_allclose(msg.points[0].positions, np.arange(6) * 0.1)
    assert msg.points[0].time_from_start == Duration(sec=0, nanosec=33_333_333)
    assert msg.header.stamp.sec == 0 and msg.header.stamp.nanosec == 0  # "start now"


def test_float64_multiarray_command():
    msg = conv.to_float64_multiarray(np.arange(6) * 0.5, 6)
    assert list(msg.data) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_commands_refuse_non_finite_values(bad):
    command = np.zeros(6)
    command[2] = bad
    with pytest.raises(ValueError, match='non-finite'):
        conv.to_joint_trajectory(command, JOINTS, 0.1)
    with pytest.raises(ValueError, match='non-finite'):
        conv.to_float64_multiarray(command, 6)
    with pytest.raises(ValueError, match='expected 6'):
        conv.to_float64_multiarray(np.zeros(5), 6)


def test_seconds_to_duration():
    assert conv.seconds_to_duration(2.5) == Duration(sec=2, nanosec=500_000_000)
