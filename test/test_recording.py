"""The recording rules without ROS: pairing within a tolerance, drops by reason, the episode
store that keeps every saved episode readable and continues across sessions."""

from __future__ import annotations

import numpy as np
import pytest

from act_ros.core.contract import load_contract
from act_ros.core.control.inputs import JOINT_STATES, image_stream
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


# -- issue 25 -------------------------------------------------------------------------
def test_stamp_matcher_counts_a_lost_instant_whichever_stream_it_lacks():
    from act_ros.data.recording import StampMatcher

    matcher = StampMatcher(['a', 'b', 'c'], tolerance_s=1e-3)
    for stream in ('b', 'c'):  # instant 1.0 lacks only the first stream
        assert matcher.put(stream, 1.0, f'{stream}1') is None
    for stream in ('a', 'c'):  # instant 2.0 lacks only 'b'
        assert matcher.put(stream, 2.0, f'{stream}2') is None
    for stream in ('a', 'b'):
        assert matcher.put(stream, 3.0, f'{stream}3') is None
    assert matcher.put('c', 3.0, 'c3') == {'a': 'a3', 'b': 'b3', 'c': 'c3', 'stamp_s': 3.0}
    assert matcher.dropped == 2
    assert matcher.put('b', 2.0, 'late') is None  # a lost instant is not counted twice
    for stream in ('a', 'b', 'c'):
        frame = matcher.put(stream, 4.0, stream)
    assert frame is not None and matcher.dropped == 2


def test_each_camera_has_its_own_transport():
    spec = _spec(camera_transports={'wrist': 'compressed'})
    streams = spec.topic_streams()
    assert streams['camera/top/image_raw'] == (image_stream('top'), 'sensor_msgs/msg/Image')
    assert streams['camera/wrist/image_raw/compressed'] == (
        image_stream('wrist'), 'sensor_msgs/msg/CompressedImage')
    with pytest.raises(ValueError, match="camera 'wrist': transport must be one of"):
        _spec(camera_transports={'wrist': 'jpeg'})
    with pytest.raises(ValueError, match="names camera 'side'"):
        _spec(camera_transports={'side': 'raw'})


def _layout(use_video=False, size=16):
    from act_ros.data.episode import DatasetLayout
    return DatasetLayout(contract=CONTRACT, image_height=size, image_width=size,
                         use_video=use_video, robot_type='test', task_text='a task')


def _open(root):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from act_ros.data.video_backend import video_backend
    return LeRobotDataset(f'local/{root.name}', root=root, video_backend=video_backend())


def test_a_save_appends_without_touching_the_episodes_already_saved(tmp_path):
    pytest.importorskip('lerobot.datasets.lerobot_dataset')
    from act_ros.data.episode_store import EpisodeStore
    from act_ros.data.synthetic import synthetic_episode

    layout = _layout()
    out = tmp_path / 'demos'
    store = EpisodeStore(out, layout)
    episodes = [synthetic_episode(layout, n, seed) for seed, n in enumerate((7, 5, 9))]
    assert store.save(episodes[0]) == 0
    assert store.save(episodes[1]) == 1
    before = {p.relative_to(out): (p.stat().st_ino, p.stat().st_mtime_ns)
              for p in out.rglob('*.parquet') if 'chunk-' in p.as_posix()}
    assert store.save(episodes[2]) == 2
    after = {p.relative_to(out): (p.stat().st_ino, p.stat().st_mtime_ns)
             for p in out.rglob('*.parquet') if 'chunk-' in p.as_posix()}
    assert {k: after[k] for k in before} == before  # earlier files neither read nor rewritten
    assert len(after) == len(before) + 2  # one data file and one metadata file more
    ds = _open(out)
    assert (ds.meta.total_episodes, ds.meta.total_frames) == (3, 21)
    for index, episode in enumerate(episodes):
        frames = [ds[i] for i in range(len(ds)) if int(ds[i]['episode_index']) == index]
        assert len(frames) == episode.length
        np.testing.assert_allclose(np.stack([f['observation.state'].numpy() for f in frames]),
                                   episode.state, atol=1e-6)
        assert [int(f['index']) for f in frames] == sorted(int(f['index']) for f in frames)
    stats = ds.meta.stats['observation.state']
    every = np.concatenate([e.state for e in episodes])
    np.testing.assert_allclose(stats['mean'], every.mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(stats['max'], every.max(axis=0), atol=1e-6)
    assert int(np.asarray(stats['count']).ravel()[0]) == 21


def test_an_append_cut_short_is_repaired_by_the_next_session(tmp_path):
    pytest.importorskip('lerobot.datasets.lerobot_dataset')
    import shutil

    from act_ros.data.episode_store import EpisodeStore
    from act_ros.data.synthetic import synthetic_episode

    layout = _layout()
    out = tmp_path / 'demos'
    store = EpisodeStore(out, layout)
    for seed in range(2):
        store.save(synthetic_episode(layout, 6, seed))
    # A session killed in the middle of appending its third episode: the shard is saved,
    # the dataset got the episode's data file but not its metadata nor info.json.
    from act_ros.data.writer import AtomicDatasetWriter
    shard = store.shards / 'episode_000002'
    with AtomicDatasetWriter(layout, shard) as writer:
        writer.add_episode(synthetic_episode(layout, 4, 9))
    shutil.copy(out / 'data' / 'chunk-000' / 'file-001.parquet',
                out / 'data' / 'chunk-000' / 'file-002.parquet')
    again = EpisodeStore(out, layout)
    assert again.needs_rebuild()
    assert again.sync() == 1
    ds = _open(out)
    assert (ds.meta.total_episodes, ds.meta.total_frames) == (3, 16)
    assert len(ds) == 16
    np.testing.assert_allclose(ds[12]['observation.state'].numpy(),
                               synthetic_episode(layout, 4, 9).state[0], atol=1e-6)


def test_an_episode_streams_to_disk_and_opens_with_its_video(tmp_path):
    pytest.importorskip('lerobot.datasets.lerobot_dataset')
    from act_ros.data.episode import DatasetLayout
    from act_ros.data.episode_store import EpisodeStore
    from act_ros.data.synthetic import synthetic_episode

    layout = DatasetLayout(contract=CONTRACT, image_height=48, image_width=64, use_video=True,
                           robot_type='test', task_text='a task')
    out = tmp_path / 'demos'
    store = EpisodeStore(out, layout)
    episode = synthetic_episode(layout, 40, 5)
    kept = store.begin(queue_frames=4)
    dropped = store.begin(queue_frames=4)
    for t in range(episode.length):
        images = {cam: episode.images[cam][t] for cam in CONTRACT.camera_names}
        while not kept.add_frame(images, episode.state[t], episode.action[t]):
            pass  # the queue holds 4 frames: wait for the writer (a recorder drops the tick)
        dropped.add_frame(images, episode.state[t], episode.action[t])
    assert dropped.discard() > 0
    assert store.commit(kept.finish()) == 0
    assert [p.name for p in store.shards.iterdir()] == [kept.path.name]  # nothing else left
    ds = _open(out)
    assert (ds.meta.total_episodes, ds.meta.total_frames) == (1, 40)
    frame = ds[17]['observation.images.top'].permute(1, 2, 0).numpy() * 255
    assert np.abs(frame - episode.images['top'][17]).mean() < 12  # lossy video
    np.testing.assert_allclose(ds[17]['observation.state'].numpy(), episode.state[17],
                               atol=1e-6)


# -- issue 42 -------------------------------------------------------------------------
def test_frames_keep_their_ticks_and_a_gap_is_refused_and_counted():
    """LeRobot places frame i at i / fps: a frame after missing ticks is refused (the
    recorder continues in a new episode there) and the ticks never sampled are counted."""
    from act_ros.data.recording import TICK_MISSED

    spec = _spec()
    store, buffer = make_store(spec), EpisodeBuffer(spec, CONTRACT)
    t0 = 100.0
    for k in range(3):
        _put_all(store, t0 + k / 30)
        assert buffer.sample(store.snapshot(t0 + k / 30), at=t0 + k / 30 + 0.004)
    assert buffer.start_s == pytest.approx(t0 + 0.004)
    assert buffer.gap_before(t0 + 3 / 30 + 0.01) == 0  # the next tick, a little late
    assert not buffer.sample(store.snapshot(t0 + 3 / 30 + 0.2))  # stale: dropped, counted
    at = t0 + 6 / 30 + 0.004  # ticks 3 (dropped), 4, 5 (never sampled) are missing
    _put_all(store, at)
    assert buffer.gap_before(at) == 3
    with pytest.raises(ValueError, match='3 tick'):
        buffer.sample(store.snapshot(at), at=at)
    assert buffer.close_gap(at) == 3
    assert buffer.dropped_ticks == 3 and buffer.drops.by_reason[TICK_MISSED] == 2
    summary = buffer.summary()
    assert (summary['frames'], summary['ticks'], summary['dropped_ticks']) == (3, 6, 3)
    assert summary['drop_fraction'] == pytest.approx(0.5)
    nxt = EpisodeBuffer(spec, CONTRACT, chain_frames=buffer.frames)
    assert nxt.sample(store.snapshot(at), at=at) and nxt.start_s == at
    assert not nxt.add_frame({s: store.snapshot(at).value(s) for s in spec.streams()},
                             at=at + 0.01)  # within the same tick: too early
    assert nxt.drops.as_dict() == {'too early': 1}
    # Before its first frame an episode counts the ticks it dropped and those between them
    # it never sampled (a continuation waiting for its writer).
    late = EpisodeBuffer(spec, CONTRACT)
    late.drop('no writer yet', at=at)
    late.drop('no writer yet', at=at + 3 / 30)  # ticks at + 1/30, + 2/30 never sampled
    _put_all(store, at + 5 / 30)
    assert late.sample(store.snapshot(at + 5 / 30), at=at + 5 / 30)  # + 4/30 never sampled
    assert late.drops.as_dict() == {'no writer yet': 2, TICK_MISSED: 3}
    assert late.summary()['ticks'] == 6
