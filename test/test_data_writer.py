"""Dataset writers: synthetic data loads in LeRobot; writes are atomic; no silent overwrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from act_ros.core.contract import load_contract, parse_image_size
from act_ros.data import synthetic
from act_ros.data.episode import DatasetLayout, Episode
from act_ros.data.video_backend import video_backend
from act_ros.data.writer import AtomicDatasetWriter

pytest.importorskip('lerobot.datasets.lerobot_dataset')

H, W, FRAMES = 48, 64, 20
CHUNK = 30


def _load(root: Path, **kwargs):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f'local/{root.name}', root=root, video_backend=video_backend(),
                          **kwargs)


def _generate(output: Path, *extra: str, episodes: int = 3, frames: int = FRAMES) -> int:
    return synthetic.main(['--output', str(output), '--episodes', str(episodes),
                           '--frames-per-episode', str(frames), '--image-size', f'{H}x{W}',
                           '--seed', '7', *extra])


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if '.partial-' in p.name)


@pytest.fixture(scope='module')
def contract():
    return load_contract()


@pytest.fixture(scope='module')
def video_dataset(module_tmp) -> Path:
    output = module_tmp('synthetic') / 'syn_video'
    assert _generate(output) == 0
    return output


def test_synthetic_video_dataset_matches_the_contract(video_dataset, contract):
    ds = _load(video_dataset)
    assert ds.num_episodes == 3
    assert ds.num_frames == 3 * FRAMES
    assert ds.fps == contract.fps == 30
    joints = list(contract.joint_names)
    for key in (contract.state_feature, contract.action_feature):
        assert ds.features[key]['dtype'] == 'float32'
        assert tuple(ds.features[key]['shape']) == (6,)
        assert ds.features[key]['names'] == joints
    for cam in contract.cameras:
        assert ds.features[cam.feature]['dtype'] == 'video'
        assert tuple(ds.features[cam.feature]['shape']) == (H, W, 3)
        assert ds.features[cam.feature]['names'] == ['height', 'width', 'channels']
    item = ds[FRAMES + 3]  # episode 1, frame 3
    assert item['task'] == contract.task
    assert int(item['episode_index']) == 1 and int(item['frame_index']) == 3
    for cam in contract.cameras:
        assert tuple(item[cam.feature].shape) == (3, H, W)


def test_synthetic_values_round_trip(video_dataset, contract):
    layout = DatasetLayout(contract=contract, image_height=H, image_width=W)
    expected = synthetic.synthetic_episode(layout, FRAMES, seed=7 + 2)  # episode 2
    ds = _load(video_dataset)
    for t in (0, 11, FRAMES - 1):
        item = ds[2 * FRAMES + t]
        np.testing.assert_allclose(item['observation.state'].numpy(), expected.state[t], atol=1e-6)
        np.testing.assert_allclose(item['action'].numpy(), expected.action[t], atol=1e-6)
        top = item['observation.images.top'].permute(1, 2, 0).numpy() * 255.0
        # AV1 is lossy: the decoded frame is close to what was drawn, not equal.
        assert np.abs(top - expected.images['top'][t]).mean() < 12.0
    # The images follow the state: frames of different states differ.
    assert np.abs(expected.images['top'][0].astype(int) - expected.images['top'][-1]).sum() > 0


def test_action_chunks_pad_at_episode_ends(video_dataset):
    delta = {'action': [i / 30 for i in range(CHUNK)]}
    ds = _load(video_dataset, delta_timestamps=delta)
    first = ds[0]
    assert tuple(first['action'].shape) == (CHUNK, 6)
    pad = first['action_is_pad'].numpy()
    assert pad.shape == (CHUNK,)
    assert not pad[:FRAMES].any() and pad[FRAMES:].all()
    last = ds[FRAMES - 1]  # last frame of episode 0: only its own action is real
    assert not last['action_is_pad'][0] and last['action_is_pad'][1:].all()
    # The chunk of frame 0 holds the actions of frames 0..FRAMES-1 of the same episode.
    actions = np.stack([ds.hf_dataset[i]['action'] for i in range(FRAMES)])
    np.testing.assert_allclose(first['action'][:FRAMES].numpy(), actions, atol=1e-6)


def test_image_dataset_is_lossless(tmp_path, contract):
    output = tmp_path / 'syn_images'
    assert _generate(output, '--no-video', episodes=2, frames=8) == 0
    ds = _load(output)
    assert ds.features['observation.images.wrist']['dtype'] == 'image'
    assert ds.num_episodes == 2 and ds.num_frames == 16
    layout = DatasetLayout(contract=contract, image_height=H, image_width=W, use_video=False)
    expected = synthetic.synthetic_episode(layout, 8, seed=7 + 1)
    wrist = ds[8 + 5]['observation.images.wrist'].permute(1, 2, 0).numpy() * 255.0
    np.testing.assert_allclose(wrist, expected.images['wrist'][5], atol=0.51)
    assert not (output / 'images').exists()  # LeRobot's frame staging area is cleaned up


@pytest.mark.parametrize('error', [RuntimeError('simulated crash'), KeyboardInterrupt()])
def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch, error):
    """A failure in the middle of episode 2 (video encoder running) leaves no trace."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    original = LeRobotDataset.add_frame
    calls = {'n': 0}
    staging: list[Path] = []

    def add_frame_then_fail(self, frame):
        calls['n'] += 1
        if calls['n'] == FRAMES + 5:  # episode 0 saved, episode 1 half-way
            staging.append(Path(self.root).parent)
            assert (Path(self.root) / 'meta' / 'info.json').is_file()
            assert self.meta.total_episodes == 1
            raise error
        original(self, frame)

    monkeypatch.setattr(LeRobotDataset, 'add_frame', add_frame_then_fail)
    output = tmp_path / 'broken'
    with pytest.raises(type(error)):
        _generate(output)
    assert staging, 'the failure was never injected'
    assert not output.exists()
    assert not staging[0].exists()
    assert _leftovers(tmp_path) == []


def test_interrupted_overwrite_keeps_the_previous_dataset(tmp_path, monkeypatch):
    output = tmp_path / 'keep'
    assert _generate(output, episodes=1, frames=5) == 0
    before = sorted(str(p.relative_to(output)) for p in output.rglob('*'))

    def fail(self, episode):
        raise RuntimeError('simulated crash')

    monkeypatch.setattr(AtomicDatasetWriter, 'add_episode', fail)
    with pytest.raises(RuntimeError, match='simulated crash'):
        _generate(output, '--overwrite', episodes=2, frames=5)
    assert sorted(str(p.relative_to(output)) for p in output.rglob('*')) == before
    assert _load(output).num_episodes == 1
    assert _leftovers(tmp_path) == []


def test_refuses_to_overwrite_without_flag(tmp_path, capsys):
    output = tmp_path / 'taken'
    output.mkdir()
    (output / 'precious.txt').write_text('keep me')
    assert _generate(output, episodes=1, frames=4) == 2
    err = capsys.readouterr().err
    assert 'not empty' in err and '--overwrite' in err
    assert (output / 'precious.txt').read_text() == 'keep me'
    assert _leftovers(tmp_path) == []
    assert _generate(output, '--overwrite', episodes=1, frames=4) == 0
    assert not (output / 'precious.txt').exists()
    assert _load(output).num_frames == 4
    assert _leftovers(tmp_path) == []


def test_empty_existing_directory_is_accepted(tmp_path):
    output = tmp_path / 'empty'
    output.mkdir()
    assert _generate(output, '--no-video', episodes=1, frames=3) == 0
    assert _load(output).num_frames == 3


def test_writer_refuses_an_empty_dataset(tmp_path, contract):
    layout = DatasetLayout(contract=contract, image_height=H, image_width=W)
    with pytest.raises(RuntimeError, match='no episode'), \
            AtomicDatasetWriter(layout, tmp_path / 'nothing'):
        pass
    assert list(tmp_path.iterdir()) == []


def test_episode_and_layout_validation(contract):
    state = np.zeros((4, 6), np.float32)
    images = {'top': np.zeros((4, H, W, 3), np.uint8), 'wrist': np.zeros((4, H, W, 3), np.uint8)}
    with pytest.raises(ValueError, match='same shape'):
        Episode(images=images, state=state, action=np.zeros((3, 6), np.float32))
    with pytest.raises(ValueError, match='uint8'):
        Episode(images={'top': np.zeros((4, H, W, 3), np.float32)}, state=state, action=state)
    layout = DatasetLayout(contract=contract, image_height=H, image_width=W)
    with pytest.raises(ValueError, match='stores'):
        layout.check_episode(Episode(
            images={k: np.zeros((4, H, W + 2, 3), np.uint8) for k in images},
            state=state, action=state))
    with pytest.raises(ValueError, match='contract cameras'):
        layout.check_episode(Episode(images={'top': images['top']}, state=state, action=state))
    bad = state.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match='NaN'):
        layout.check_episode(Episode(images=images, state=bad, action=state))
    with pytest.raises(ValueError, match='even'):
        DatasetLayout(contract=contract, image_height=47, image_width=W, use_video=True)
    assert DatasetLayout(contract=contract, image_height=47, image_width=W, use_video=False)


@pytest.mark.parametrize('text,expected', [('480x640', (480, 640)), (' 48X64 ', (48, 64))])
def test_parse_image_size(text, expected):
    assert parse_image_size(text) == expected


@pytest.mark.parametrize('text', ['480', '0x640', 'axb', '480x640x3'])
def test_parse_image_size_rejects(text):
    with pytest.raises(ValueError, match='HEIGHTxWIDTH|positive'):
        parse_image_size(text)


def test_fast_image_embedding_writes_the_table_lerobot_writes(tmp_path):
    """The batched embedding (installed by the writer and the join) gives the same Arrow
    table as LeRobot's row-by-row one: image bytes read from the files, other columns as
    they were; a table without images comes back untouched."""
    import datasets
    from lerobot.datasets import io_utils
    from PIL import Image

    from act_ros.data import writer

    rng = np.random.default_rng(0)
    paths = []
    for i in range(70):  # more rows than one batch
        paths.append(str(tmp_path / f'{i}.png'))
        Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(paths[-1])
    features = datasets.Features({'image': datasets.Image(), 'x': datasets.Value('float32')})
    table = datasets.Dataset.from_dict({'image': paths, 'x': list(np.arange(70.0))},
                                       features=features)
    writer.fast_image_embedding()  # what AtomicDatasetWriter and the join install
    writer.fast_image_embedding()  # installing twice keeps one wrapper
    fast = io_utils.embed_images
    original = fast._act_ros_original
    assert fast._act_ros_fast and not getattr(original, '_act_ros_fast', False)
    got = fast(table).with_format('arrow')[:]
    assert got.equals(original(table).with_format('arrow')[:])
    assert got.column('image')[0]['bytes'].as_py() == Path(paths[0]).read_bytes()
    plain = datasets.Dataset.from_dict({'x': [1.0, 2.0]})
    assert fast(plain) is plain
