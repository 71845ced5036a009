"""``act-ros import-bag``: rosbag2 files written here with ``rosbags`` (MCAP and SQLite3, raw
bgr8 and compressed images, joints in another order with an extra joint, a dropped camera
message) become LeRobot datasets with the expected frames and drops, train, and bad bags
fail with one clear line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('rosbags')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.data.bag_import import BagImportError, import_bags, main  # noqa: E402
from act_ros.data.recording import RecordingSpec  # noqa: E402

from bag_tools import read_dataset, write_episode_bag  # noqa: E402

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
    assert report.episodes[0]['drops'] == {'image/top stale': 1}
    assert report.dropped_ticks == 1
    dataset, store = _read(tmp_path / 'ds')
    assert dataset.meta.total_episodes == 1
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
