"""``act-ros import-bag``: rosbag2 files written here with ``rosbags`` (MCAP and SQLite3, raw
bgr8 and compressed images, joints in another order with an extra joint, a dropped camera
message) become LeRobot datasets with the expected frames and drops, train, and bad bags
fail with one clear line."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('rosbags')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

from bag_tools import read_dataset, write_episode_bag  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.data.bag_import import BagImportError, import_bags, main  # noqa: E402
from act_ros.data.recording import RecordingSpec  # noqa: E402

CONTRACT = load_contract()
H, W = 48, 64


@pytest.fixture(scope='module')
def episode():
    """A real scripted-expert episode of the simulation (48x64 cameras)."""
    from act_ros.data.rollout import run_expert_episode
    from act_ros.sim import PortPickAlignEnv, SimConfig

    with PortPickAlignEnv(SimConfig.from_yaml(None, camera_height=H, camera_width=W)) as env:
        result = run_expert_episode(env, 11, CONTRACT.camera_names)
    assert result.success
    return result.episode


def _spec(**values) -> RecordingSpec:
    base = dict(joint_states_topic='/joint_states',
                camera_topics={cam: f'/camera/{cam}/image_raw' for cam in CONTRACT.camera_names},
                action_topic='/arm_controller/joint_trajectory', image_height=H, image_width=W,
                tolerance_s=0.02)
    base.update(values)
    return RecordingSpec.for_contract(CONTRACT, **base)


def _read(root: Path):
    return read_dataset(root, CONTRACT, (H, W))


def test_mcap_with_raw_bgr_images_and_a_dropped_frame(tmp_path, episode):
    bag = write_episode_bag(tmp_path / 'raw_bag', episode, CONTRACT, storage='mcap',
                            drop_camera_ticks=(('top', 50),))
    report = import_bags([bag], tmp_path / 'ds', _spec(), use_video=False, progress=False)
    assert report.frames == episode.length - 1
    # Frames keep their times: the dropped tick ends an episode, the next frame starts one
    # (not one period after frame 49, where LeRobot would place it in the same episode).
    first, second = report.episodes
    assert (first['frames'], second['frames']) == (50, episode.length - 51)
    assert first['drops'] == {'image/top stale': 1} and second['drops'] == {}
    assert first['ended_by'] == 'a gap of 1 tick(s)' and second['ended_by'] == 'end of the bag'
    fps = CONTRACT.fps
    assert second['start_time_s'] - first['start_time_s'] == pytest.approx(51 / fps, abs=1e-6)
    assert report.dropped_ticks == 1
    dataset, store = _read(tmp_path / 'ds')
    assert dataset.meta.total_episodes == 2
    keep = np.delete(np.arange(episode.length), 50)
    np.testing.assert_allclose(store.state.numpy(), episode.state[keep], atol=1e-6)
    np.testing.assert_allclose(store.action.numpy(), episode.action[keep], atol=1e-6)
    top = store.images['observation.images.top'].permute(0, 2, 3, 1).numpy()
    assert np.array_equal(top, episode.images['top'][keep])  # bgr8 came back as RGB


def test_sqlite_with_compressed_images_and_training(tmp_path, episode):
    from act_ros.training.config import TrainConfig
    from act_ros.training.train import run

    bag = write_episode_bag(tmp_path / 'png_bag', episode, CONTRACT, storage='sqlite3',
                            compressed=True)
    report = import_bags([bag], tmp_path / 'ds', _spec(image_transport='compressed'),
                         progress=False)
    assert report.frames == episode.length and report.dropped_ticks == 0
    _, store = _read(tmp_path / 'ds')
    np.testing.assert_allclose(store.state.numpy(), episode.state, atol=1e-6)
    wrist = store.images['observation.images.wrist'].permute(0, 2, 3, 1).numpy().astype(int)
    assert np.abs(wrist - episode.images['wrist']).mean() < 6  # video storage is lossy
    metrics = run(TrainConfig(dataset_root=tmp_path / 'ds', output_dir=tmp_path / 'run',
                              preset='synthetic', model_preset='tiny', image_size=(32, 48),
                              steps=3, batch_size=2, val_ratio=0.0, val_interval=3,
                              checkpoint_interval=3, early_stop_patience=0, min_steps=0,
                              device='cpu', torch_threads=1, progress=False, skip_infer=True))
    assert metrics['steps_completed'] == 3


def test_marker_topic_splits_episodes(tmp_path, episode):
    split_at = 100.0 + 120 / CONTRACT.fps + 0.005  # just after tick 120
    bag = write_episode_bag(tmp_path / 'marked', episode, CONTRACT,
                            extra_topics={'/episode_end': [split_at]})
    report = import_bags([bag], tmp_path / 'ds', _spec(), split='marker',
                         marker_topic='/episode_end', use_video=False, progress=False)
    assert [e["frames"] for e in report.episodes] == [121, episode.length - 121], report.episodes


def test_bad_bags_fail_with_one_clear_line(tmp_path, episode, capsys):
    bag = write_episode_bag(tmp_path / 'bag', episode, CONTRACT)
    with pytest.raises(BagImportError, match="topic '/camera/top/raw' .* is not in the bag"):
        import_bags([bag], tmp_path / 'a', _spec(camera_topics={
            'top': '/camera/top/raw', 'wrist': '/camera/wrist/image_raw'}), progress=False)
    with pytest.raises(BagImportError, match='has type trajectory_msgs/msg/JointTrajectory, '
                                             'expected std_msgs/msg/Float64MultiArray'):
        import_bags([bag], tmp_path / 'b', _spec(command_type='Float64MultiArray'),
                    progress=False)
    renamed = tuple(f'arm_{name}' for name in CONTRACT.joint_names)
    with pytest.raises(BagImportError, match=r"every joint_states message is rejected: .*"
                                             r"missing joint\(s\) \['arm_shoulder_pan'"):
        import_bags([bag], tmp_path / 'c', _spec(joint_names=renamed), progress=False)
    for name in ('a', 'b', 'c'):
        assert not (tmp_path / name).exists()  # nothing half-written
    code = main([str(tmp_path / 'missing_bag'), '--output', str(tmp_path / 'd'),
                 '--no-progress'])
    assert code == 2
    assert 'no such bag' in capsys.readouterr().err


# -- issue 25: gaps, jitter, per-camera transport, bags cut short -----------------------
def test_split_gap_keeps_the_last_frame_before_each_gap(tmp_path, episode):
    # A 3 s pause after tick 99: two episodes, every tick of each (the frame just before
    # the pause included).
    bag = write_episode_bag(tmp_path / 'paused', episode, CONTRACT, gap_after=99, gap_s=3.0)
    report = import_bags([bag], tmp_path / 'ds', _spec(), split='gap', gap_s=1.0,
                         use_video=False, progress=False)
    assert [e['frames'] for e in report.episodes] == [100, episode.length - 100]
    assert report.dropped_ticks == 0
    _, store = _read(tmp_path / 'ds')
    np.testing.assert_allclose(store.state.numpy(), episode.state, atol=1e-6)


def test_jittered_stamps_between_streams_pair_the_same_instant(tmp_path, episode):
    # Each publisher logs the same instant a few milliseconds apart (up to +-8 ms, a
    # quarter of a period): every frame still pairs the images, state and action of one
    # instant, none is dropped at a tolerance of 20 ms.
    rng = np.random.default_rng(3)
    n = episode.length
    offsets = {'joint_states': rng.uniform(-0.008, 0.008, n),
               'command': rng.uniform(-0.008, 0.008, n),
               'top': rng.uniform(-0.008, 0.008, n), 'wrist': rng.uniform(-0.008, 0.008, n)}
    for values in offsets.values():
        values[0] = 0.0  # the first instant logged together: ticks fall on the instants
    bag = write_episode_bag(tmp_path / 'jitter', episode, CONTRACT, offsets_s=offsets)
    report = import_bags([bag], tmp_path / 'ds', _spec(), use_video=False, progress=False)
    assert report.dropped_ticks == 0, report.episodes
    assert report.frames == n
    _, store = _read(tmp_path / 'ds')
    np.testing.assert_allclose(store.state.numpy(), episode.state, atol=1e-6)
    np.testing.assert_allclose(store.action.numpy(), episode.action, atol=1e-6)
    for cam in CONTRACT.camera_names:
        got = store.images[f'observation.images.{cam}'].permute(0, 2, 3, 1).numpy()
        assert np.array_equal(got, episode.images[cam]), cam


def test_one_camera_raw_and_one_compressed(tmp_path, episode):
    bag = write_episode_bag(tmp_path / 'mixed', episode, CONTRACT, compressed_cameras=('wrist',))
    out = tmp_path / 'ds'
    code = main([str(bag), '--output', str(out), '--joint-states-topic', '/joint_states',
                 '--camera-topic', 'top=/camera/top/image_raw',
                 '--camera-topic', 'wrist=/camera/wrist/image_raw',
                 '--camera-transport', 'wrist=compressed',
                 '--action-topic', '/arm_controller/joint_trajectory', '--tolerance', '0.02',
                 '--image-size', f'{H}x{W}', '--no-video', '--no-progress'])
    assert code == 0
    _, store = _read(out)
    assert len(store) == episode.length
    for cam in CONTRACT.camera_names:  # PNG is lossless: both cameras exactly
        got = store.images[f'observation.images.{cam}'].permute(0, 2, 3, 1).numpy()
        assert np.array_equal(got, episode.images[cam]), cam
    with pytest.raises(ValueError, match="NAME=raw or NAME=compressed, got 'wrist=jpeg'"):
        from act_ros.data.bag_import import build_parser, spec_from_args
        spec_from_args(build_parser().parse_args([str(bag), '--output', 'x',
                                                  '--camera-transport', 'wrist=jpeg']),
                       CONTRACT)


def _mcap_file(bag: Path) -> Path:
    (file,) = bag.glob('*.mcap')
    return file


def _truncate(src: Path, dst: Path, size: int) -> Path:
    import shutil
    shutil.copytree(src, dst)
    with _mcap_file(dst).open('r+b') as f:
        f.truncate(size)
    return dst


def _chunk_starts(file: Path) -> list[int]:
    """Byte offsets of the chunk records of an MCAP file."""
    data = file.read_bytes()
    at, starts = 8, []
    while at + 9 <= len(data):
        op, length = data[at], struct.unpack_from('<Q', data, at + 1)[0]
        if op == 0x06:
            starts.append(at)
        if op == 0x02:
            break
        at += 9 + length
    return starts


@pytest.mark.parametrize('zstd_chunks', [False, True], ids=['plain', 'zstd'])
def test_truncated_mcap_imports_every_whole_message_up_to_the_cut(tmp_path, episode,
                                                                  zstd_chunks):
    full = write_episode_bag(tmp_path / 'full', episode, CONTRACT, zstd_chunks=zstd_chunks)
    file = _mcap_file(full)
    size = file.stat().st_size
    chunks = _chunk_starts(file)
    assert len(chunks) >= 3, chunks  # several chunks: cuts between and inside them
    # The end of the data section: everything but the summary (index) and footer.
    data = file.read_bytes()
    end = chunks[-1]
    while data[end] in (0x06, 0x07):  # the last chunk and its message indexes
        end += 9 + struct.unpack_from('<Q', data, end + 1)[0]
    cuts = {'no footer or index': end,
            'inside the second chunk': chunks[1] + (chunks[2] - chunks[1]) // 2,
            'at a chunk boundary': chunks[2],
            'half the file': size // 2}
    frames = {}
    for name, cut in cuts.items():
        bag = _truncate(full, tmp_path / name.replace(' ', '_'), cut)
        with pytest.raises(BagImportError, match='--strict refuses bags cut short'):
            import_bags([bag], tmp_path / f'strict_{len(frames)}', _spec(), use_video=False,
                        progress=False, strict=True)
        out = tmp_path / f'ds_{len(frames)}'
        report = import_bags([bag], out, _spec(), use_video=False, progress=False)
        (line,) = report.recovered  # one line: what was recovered and where the file ends
        assert 'recovered' in line and 'message(s)' in line, line
        if name in ('no footer or index', 'at a chunk boundary'):
            assert f'ends between two records at byte {cut} (no footer or index)' in line, line
        elif name == 'inside the second chunk':
            assert 'ends inside a chunk' in line, line
        else:
            assert 'ends inside a' in line, line
        _, store = _read(out)
        n = len(store)
        # A prefix of the episode, exactly: no frame invented, none out of order.
        np.testing.assert_allclose(store.state.numpy(), episode.state[:n], atol=1e-6)
        top = store.images['observation.images.top'].permute(0, 2, 3, 1).numpy()
        assert np.array_equal(top, episode.images['top'][:n])
        frames[name] = n
    assert frames['no footer or index'] == episode.length  # every message was there
    assert 0 < frames['inside the second chunk'] < frames['at a chunk boundary'] \
        < episode.length
    assert frames['half the file'] < episode.length


def test_truncated_mcap_keeps_the_messages_of_a_cut_chunk(tmp_path, episode):
    # Cut inside the second chunk: the first chunk's ticks and the whole messages of the
    # second one before the cut are imported, no more.
    full = write_episode_bag(tmp_path / 'full', episode, CONTRACT)
    chunks = _chunk_starts(_mcap_file(full))
    inside = _truncate(full, tmp_path / 'inside', chunks[1] + (chunks[2] - chunks[1]) // 2)
    boundary = _truncate(full, tmp_path / 'boundary', chunks[1])
    a = import_bags([inside], tmp_path / 'a', _spec(), use_video=False, progress=False)
    b = import_bags([boundary], tmp_path / 'b', _spec(), use_video=False, progress=False)
    assert a.frames > b.frames > 0
    assert a.messages > b.messages


def test_sqlite_bag_without_metadata_yaml(tmp_path, episode):
    bag = write_episode_bag(tmp_path / 'db_bag', episode, CONTRACT, storage='sqlite3')
    (bag / 'metadata.yaml').unlink()
    with pytest.raises(BagImportError, match='--strict'):
        import_bags([bag], tmp_path / 'strict', _spec(), use_video=False, progress=False,
                    strict=True)
    report = import_bags([bag], tmp_path / 'ds', _spec(), use_video=False, progress=False)
    (line,) = report.recovered
    assert 'no metadata.yaml' in line and f'{4 * episode.length} message(s)' in line, line
    assert report.frames == episode.length and report.dropped_ticks == 0
    _, store = _read(tmp_path / 'ds')
    np.testing.assert_allclose(store.state.numpy(), episode.state, atol=1e-6)


def test_a_file_that_is_not_a_bag_is_refused_with_what_was_found(tmp_path):
    bag = tmp_path / 'junk'
    bag.mkdir()
    (bag / 'junk_0.mcap').write_bytes(b'not an mcap file at all')
    with pytest.raises(BagImportError, match=r"not an MCAP file \(its first bytes are"):
        import_bags([bag], tmp_path / 'ds', _spec(), use_video=False, progress=False)


# -- issue 42: only a bag cut short is imported in part --------------------------------
def _import_line(bag: Path, out: Path, capsys) -> str:
    """Run the command on ``bag``; its one error line (exit status 2, nothing written)."""
    code = main([str(bag), '--output', str(out), '--no-progress', '--no-video',
                 '--image-size', f'{H}x{W}', '--tolerance', '0.02',
                 '--joint-states-topic', '/joint_states',
                 '--action-topic', '/arm_controller/joint_trajectory',
                 *[f'--camera-topic={cam}=/camera/{cam}/image_raw'
                   for cam in CONTRACT.camera_names]])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f'.{out.name}.')]
    assert '\n' not in err, err
    return err


def test_a_bag_that_is_whole_but_unreadable_is_refused_not_recovered(tmp_path, episode, capsys):
    import shutil

    full = write_episode_bag(tmp_path / 'full', episode, CONTRACT, zstd_chunks=True)
    # A corrupt header: the file's first bytes are not MCAP's magic.
    header = tmp_path / 'corrupt_header'
    shutil.copytree(full, header)
    data = bytearray(_mcap_file(header).read_bytes())
    data[:8] = b'\x00' * 8
    _mcap_file(header).write_bytes(bytes(data))
    line = _import_line(header, tmp_path / 'a', capsys)
    assert line.startswith(f'act-ros import-bag: {header}: not a readable rosbag2 recording ('), line
    assert "is not an MCAP file (its first bytes are b'\\x00" in line, line
    assert 'not a recording cut short' in line, line
    # The magic is whole but the first record is not a header: rosbags' reason stands.
    record = tmp_path / 'corrupt_record'
    shutil.copytree(full, record)
    data = bytearray(_mcap_file(record).read_bytes())
    data[8] = 0x7f
    _mcap_file(record).write_bytes(bytes(data))
    line = _import_line(record, tmp_path / 'b', capsys)
    assert f'{record}: not a readable rosbag2 recording (AnyReaderError: ' in line, line
    # A whole chunk damaged in the middle of a whole bag: a read error, not a recovery.
    middle = tmp_path / 'damaged_chunk'
    shutil.copytree(full, middle)
    chunks = _chunk_starts(_mcap_file(middle))
    data = bytearray(_mcap_file(middle).read_bytes())
    # The second chunk's zstd frame starts after its record header (9 bytes), times,
    # sizes and CRC (28), the compression name (4 + 4) and the records' size (8).
    at = chunks[1] + 9 + 28 + 8 + 8
    assert data[at:at + 4] == b'\x28\xb5\x2f\xfd'  # zstd's frame magic
    data[at:at + 4] = b'\xff' * 4
    _mcap_file(middle).write_bytes(bytes(data))
    line = _import_line(middle, tmp_path / 'c', capsys)
    assert f'{middle}: reading its messages failed (' in line, line
    assert 'not cut short: nothing is imported' in line, line


def test_a_bag_of_another_format_is_refused_with_what_it_is(tmp_path, episode, capsys):
    import shutil

    ros1 = tmp_path / 'old.bag'
    ros1.write_bytes(b'#ROSBAG V2.0\n' + bytes(4096))
    line = _import_line(ros1, tmp_path / 'a', capsys)
    assert f'{ros1}: not a readable rosbag2 recording' in line, line
    assert 'a ROS 1 bag, expected rosbag2 (MCAP or SQLite3)' in line, line
    folder = tmp_path / 'csv_export'
    folder.mkdir()
    (folder / 'joint_states.csv').write_text('t,q0\n0,0\n')
    line = _import_line(folder, tmp_path / 'b', capsys)
    assert 'expected a rosbag2 directory or an .mcap / .db3 file, found joint_states.csv' in line
    # A SQLite3 bag whose metadata.yaml is there but of a version rosbags does not read:
    # whole, not cut short, so its .db3 is not read behind the metadata's back.
    db = write_episode_bag(tmp_path / 'db_bag', episode, CONTRACT, storage='sqlite3')
    (db / 'metadata.yaml').write_text('rosbag2_bagfile_information: {version: 99}\n')
    line = _import_line(db, tmp_path / 'c', capsys)
    assert f'{db}: not a readable rosbag2 recording (AnyReaderError: Rosbag2 version 99' in line
    # Two bags, the second unreadable: refused before the first is imported.
    good = write_episode_bag(tmp_path / 'good', episode, CONTRACT)
    out = tmp_path / 'd'
    assert main([str(good), str(ros1), '--output', str(out), '--no-progress']) == 2
    assert not out.exists()
    shutil.rmtree(db)
