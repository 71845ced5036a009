"""The recording rules without ROS: pairing within a tolerance, drops by reason, the episode
store that keeps every saved episode readable and continues across sessions."""

from __future__ import annotations

import numpy as np
import pytest

from act_ros.core.contract import load_contract
from act_ros.core.inputs import JOINT_STATES, image_stream
from act_ros.data.recording import ACTION, EpisodeBuffer, RecordingSpec, make_store

CONTRACT = load_contract()


def _spec(**values):
    return RecordingSpec.for_contract(CONTRACT, image_height=8, image_width=8, tolerance_s=0.05,
                                      **values)


def _put_all(store, t, *, skip=()):
    img = np.full((8, 8, 3), int(t * 10) % 255, np.uint8)
    for stream in store.required:
        if stream in skip:
            continue
        value = img if stream.startswith('image/') else np.full(CONTRACT.num_joints, t)
        store.put(stream, value, t, t)


def test_ticks_pair_fresh_inputs_and_drops_are_counted_by_reason():
    spec = _spec()
    store, buffer = make_store(spec), EpisodeBuffer(spec, CONTRACT)
    assert set(store.required) == {JOINT_STATES, ACTION, image_stream('top'),
                                   image_stream('wrist')}
    assert not buffer.sample(store.snapshot(0.0))  # nothing received yet
    for k in range(10):
        t = k / 30
        _put_all(store, t, skip=(image_stream('top'),) if k >= 5 else ())
        buffer.sample(store.snapshot(t + 0.001))
    # Ticks 5, 6: the last top image (tick 4) is 0.034 / 0.068 s old: 5 is kept, 6.. dropped.
    assert buffer.frames == 6
    assert buffer.drops.as_dict() == {'image/top stale': 4,
                                      'action never': 1, 'image/top never': 1,
                                      'image/wrist never': 1, 'joint_states never': 1}
    episode = buffer.episode()
    np.testing.assert_allclose(episode.state[:, 0], [k / 30 for k in range(6)], rtol=1e-6)
    assert episode.images['top'].shape == (6, 8, 8, 3)


def test_spec_checks_its_settings():
    with pytest.raises(ValueError, match='action_source'):
        _spec(action_source='joystick')
    with pytest.raises(ValueError, match='own topic'):
        _spec(action_topic='joint_states')
    with pytest.raises(ValueError, match='leader_joint_names'):
        _spec(leader_joint_names=('a', 'b'))
    assert _spec(image_transport='compressed').image_topic('top') == \
        'camera/top/image_raw/compressed'


def test_episode_store_keeps_every_save_readable_and_continues(tmp_path):
    pytest.importorskip('lerobot.datasets.lerobot_dataset')
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from act_ros.data.episode import DatasetLayout
    from act_ros.data.episode_store import EpisodeStore
    from act_ros.data.synthetic import synthetic_episode
    from act_ros.data.video_backend import video_backend

    layout = DatasetLayout(contract=CONTRACT, image_height=16, image_width=16, use_video=False,
                           robot_type='test', task_text='a task')
    out = tmp_path / 'demos'
    store = EpisodeStore(out, layout)
    assert store.save(synthetic_episode(layout, 12, 1)) == 0
    assert store.save(synthetic_episode(layout, 9, 2)) == 1
    ds = LeRobotDataset('local/demos', root=out, video_backend=video_backend())
    assert (ds.meta.total_episodes, ds.meta.total_frames) == (2, 21)
    # A save that fails (wrong image size) leaves the dataset as it was.
    bad = DatasetLayout(contract=CONTRACT, image_height=8, image_width=8, use_video=False)
    with pytest.raises(ValueError):
        store.save(synthetic_episode(bad, 5, 3))
    assert LeRobotDataset('local/demos', root=out,
                          video_backend=video_backend()).meta.total_episodes == 2
    # A new session on the same output continues the numbering.
    again = EpisodeStore(out, layout)
    assert again.save(synthetic_episode(layout, 4, 4)) == 2
    ds = LeRobotDataset('local/demos', root=out, video_backend=video_backend())
    assert (ds.meta.total_episodes, ds.meta.total_frames) == (3, 25)
    assert ds.meta.tasks.index.tolist() == ['a task']
    with pytest.raises(FileExistsError, match='not written by a recording session'):
        EpisodeStore(tmp_path, layout)


def test_stamp_matcher_pairs_instants_whatever_the_arrival_order():
    from act_ros.data.recording import StampMatcher

    matcher = StampMatcher(['a', 'b', 'c'], tolerance_s=1e-3)
    assert matcher.put('a', 1.0, 'a1') is None
    assert matcher.put('b', 1.0, 'b1') is None
    assert matcher.put('a', 2.0, 'a2') is None      # the next instant overtakes one stream
    frame = matcher.put('c', 1.0, 'c1')
    assert frame == {'a': 'a1', 'b': 'b1', 'c': 'c1', 'stamp_s': 1.0}
    assert matcher.put('b', 2.0, 'b2') is None
    assert matcher.put('a', 3.0, 'a3') is None
    assert matcher.put('c', 3.0, 'c3') is None
    frame = matcher.put('b', 3.0, 'b3')             # instant 2 never completes: dropped
    assert frame == {'a': 'a3', 'b': 'b3', 'c': 'c3', 'stamp_s': 3.0}
    assert matcher.dropped == 1
    assert matcher.put('c', 2.0, 'late') is None    # too late for a consumed instant
