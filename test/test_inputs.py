"""The input store (act_ros.core.control.inputs): which streams make a snapshot unusable."""

from act_ros.core.control.inputs import JOINT_STATES, PAD_POSE, InputStore, image_stream


def test_a_rejected_optional_stream_stops_commands_until_its_next_good_message():
    """The gate's pad pose is optional: never received or stale it only makes the pad
    unknown (the gate holds), but a rejected message (a pose in the wrong frame) makes the
    snapshot unusable, like a rejected camera image, until a good one arrives."""
    store = InputStore([JOINT_STATES], max_age_s=0.5)
    store.put(JOINT_STATES, [0.0], received_s=10.0, stamp_s=10.0)
    assert store.snapshot(10.1).ok  # the pad pose never came: usable
    store.put(PAD_POSE, [0.2, 0.0, 0.0], received_s=10.0, stamp_s=10.0)
    store.put(JOINT_STATES, [0.0], received_s=11.0, stamp_s=11.0)
    assert store.snapshot(11.1).ok  # the pad pose is stale: still usable
    line = store.reject(PAD_POSE, "pose on /pad_pose is in frame 'map', expected 'base_link'")
    snap = store.snapshot(11.1)
    assert not snap.ok and snap.value(PAD_POSE) is None
    assert snap.describe_problems() == (
        "pad_pose: rejected (pose on /pad_pose is in frame 'map', expected 'base_link')")
    assert line == store.last_rejection and store.rejections_by_stream == {PAD_POSE: 1}
    store.put(PAD_POSE, [0.2, 0.0, 0.0], received_s=11.2, stamp_s=11.2)
    assert store.snapshot(11.3).ok


def test_problems_name_each_stream_with_its_source():
    """The node's waiting line: every unusable input with where it is listened for;
    a stream without a known source is named alone."""
    store = InputStore([JOINT_STATES, image_stream('top'), image_stream('wrist')], max_age_s=0.5)
    store.put(JOINT_STATES, [0.0], received_s=10.0, stamp_s=10.0)
    store.put(image_stream('top'), 'rgb', received_s=9.0, stamp_s=9.0)
    sources = {image_stream('top'): '/cam/top (sensor_msgs/Image, best effort, depth 5)',
               JOINT_STATES: '/joint_states (sensor_msgs/JointState, best effort, depth 5)'}
    snap = store.snapshot(10.2)
    assert snap.describe_problems(sources) == (
        'image/top on /cam/top (sensor_msgs/Image, best effort, depth 5): stale (1.200 s old, '
        'max 0.500 s); image/wrist: never received')
    assert snap.describe_problems() == ('image/top: stale (1.200 s old, max 0.500 s); '
                                        'image/wrist: never received')
