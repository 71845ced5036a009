"""The real-arm trainer preset (``act-ros train --preset arm``).

docs/training.md's "check your dataset" command, read from the page, runs on a dataset
written the way ``record_node`` writes one (the recording session's episode store) and on
one ``act-ros import-bag`` made from a rosbag2 file: neither holds anything the
simulation records (object poses), and ``best/`` is selected by validation L1, with no
closed-loop episode.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import time
from pathlib import Path

import extras
import pytest

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.data.episode import DatasetLayout  # noqa: E402
from act_ros.data.synthetic import synthetic_episode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = load_contract()
H, W = 48, 64
FRAMES = 40


def check_command() -> list[str]:
    """The page's command that checks a dataset with ten steps (its arguments)."""
    text = (ROOT / 'docs' / 'training.md').read_text()
    lines = [line for line in text.splitlines()
             if line.startswith('act-ros train ') and '--output-dir runs/check' in line]
    assert len(lines) == 1, lines
    args = shlex.split(lines[0])[1:]
    assert args[args.index('--preset') + 1] == 'arm' and '--steps' in args, args
    return args


def _layout(robot_type: str) -> DatasetLayout:
    return DatasetLayout(contract=CONTRACT, image_height=H, image_width=W,
                         robot_type=robot_type, task_text='pick the box, place it on the pad')


def recorder_dataset(root: Path) -> Path:
    """Two episodes saved as a record_node session saves them: its dataset layout, each
    episode's frames streamed into a writer of its episode store (H.264, record_node's
    video_codec) and committed."""
    from act_ros.data.episode_store import EpisodeStore

    layout = _layout('ros2')
    store = EpisodeStore(root, layout)
    for seed in (1, 2):
        episode = synthetic_episode(layout, FRAMES, seed)
        writer = store.begin(video_codec='h264')
        for t in range(FRAMES):
            while not writer.add_frame({cam: frames[t] for cam, frames in episode.images.items()},
                                       episode.state[t], episode.action[t]):
                time.sleep(0.01)  # the writer's queue is full: wait, record_node would drop
        store.commit(writer.finish())
    return root


def imported_dataset(root: Path, tmp: Path) -> Path:
    """Two episodes of one rosbag2 file (an episode marker between them), imported."""
    extras.skip_unless(importlib.util.find_spec('rosbags') is not None, 'rosbags', 'bag')
    import numpy as np
    from bag_tools import write_episode_bag

    from act_ros.data.bag_import import import_bags
    from act_ros.data.episode import Episode
    from act_ros.data.recording import RecordingSpec

    layout = _layout('ros2')
    first, second = (synthetic_episode(layout, FRAMES, seed) for seed in (3, 4))
    both = Episode(images={cam: np.concatenate([first.images[cam], second.images[cam]])
                           for cam in first.images},
                   state=np.concatenate([first.state, second.state]),
                   action=np.concatenate([first.action, second.action]))
    split_at = 100.0 + (FRAMES - 1) / CONTRACT.fps + 0.005  # just after the first's last tick
    bag = write_episode_bag(tmp / 'bag', both, CONTRACT, extra_topics={'/episode_end': [split_at]})
    spec = RecordingSpec.for_contract(
        CONTRACT, joint_states_topic='/joint_states',
        camera_topics={cam: f'/camera/{cam}/image_raw' for cam in CONTRACT.camera_names},
        action_topic='/arm_controller/joint_trajectory', image_height=H, image_width=W,
        tolerance_s=0.02)
    report = import_bags([bag], root, spec, split='marker', marker_topic='/episode_end',
                         progress=False)
    assert [e['frames'] for e in report.episodes] == [FRAMES, FRAMES], report.episodes
    return root


# Each run takes tens of seconds: the imported dataset's among the slow checks.
@pytest.mark.parametrize('source', ['record_node',
                                    pytest.param('import-bag', marks=pytest.mark.slow)])
def test_the_documented_check_runs_on_real_arm_data(source, tmp_path):
    from act_ros.cli import main

    data = tmp_path / 'data'
    if source == 'record_node':
        recorder_dataset(data)
    else:
        imported_dataset(data, tmp_path)
    features = json.loads((data / 'meta' / 'info.json').read_text())['features']
    assert not [name for name in features if name.startswith('sim.')], features
    args = check_command()
    args[args.index('--dataset-root') + 1] = str(data)
    run = tmp_path / 'check'
    args[args.index('--output-dir') + 1] = str(run)
    assert main(args + ['--device', 'cpu', '--torch-threads', '1', '--no-progress']) == 0

    metrics = json.loads((run / 'training_metrics.json').read_text())
    assert metrics['config']['preset'] == 'arm'
    assert metrics['config']['aux_object_pose_weight'] == 0.0
    assert metrics['history']['closed_loop'] == []
    assert metrics['history']['val'], 'no validation: nothing to select best/ by'
    assert list(metrics['best']) == ['val_l1'] and metrics['best']['val_l1']['path'] == 'best'
    assert (run / 'best' / 'model.safetensors').is_file()


def test_without_a_preset_the_dataset_decides(tmp_path, caplog):
    """No ``--preset``: a recorder's dataset (and any robot this package does not simulate)
    trains with ``arm``; the datasets of the package's own simulations and generator with
    theirs; an unreadable dataset gets ``arm`` and is refused later by what opens it."""
    from act_ros.data.episode import ROBOT_TYPE_ALOHA_SIM, ROBOT_TYPE_SIM, ROBOT_TYPE_SYNTHETIC
    from act_ros.training.config import build_parser, config_from_args, preset_for_dataset

    recorded = recorder_dataset(tmp_path / 'recorded')
    args = check_command()[1:]  # after 'train'
    args = args[:args.index('--preset')] + args[args.index('--preset') + 2:]
    args[args.index('--dataset-root') + 1] = str(recorded)
    with caplog.at_level('INFO', logger='act_ros.training.config'):
        config = config_from_args(build_parser().parse_args(args))
    assert config.preset == 'arm' and config.aux_object_pose_weight == 0.0
    assert config.closed_loop_val_episodes == 0
    assert "preset arm (not given; the dataset's robot_type is 'ros2': a real arm's data)" \
        in caplog.text

    for robot_type, expected in ((ROBOT_TYPE_SIM, 'sim'), (ROBOT_TYPE_ALOHA_SIM, 'aloha'),
                                 (ROBOT_TYPE_SYNTHETIC, 'synthetic'), ('so101_follower', 'arm'),
                                 (None, 'arm')):
        root = tmp_path / f'info_{robot_type}'
        (root / 'meta').mkdir(parents=True)
        (root / 'meta' / 'info.json').write_text(json.dumps({'robot_type': robot_type}))
        assert preset_for_dataset(root) == expected, robot_type
    assert preset_for_dataset(tmp_path / 'missing') == 'arm'
    (tmp_path / 'broken' / 'meta').mkdir(parents=True)
    (tmp_path / 'broken' / 'meta' / 'info.json').write_text('{not json')
    assert preset_for_dataset(tmp_path / 'broken') == 'arm'
    # Given, the preset wins over the dataset's robot type.
    args += ['--preset', 'synthetic']
    assert config_from_args(build_parser().parse_args(args)).preset == 'synthetic'
