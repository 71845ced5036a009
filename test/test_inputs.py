"""The input store (act_ros.core.inputs): which streams make a snapshot unusable."""

from act_ros.core.inputs import JOINT_STATES, PAD_POSE, InputStore


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
