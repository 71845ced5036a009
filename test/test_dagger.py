"""DAgger collection: the policy drives, the expert labels, the episodes join a dataset."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('mujoco')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

from act_ros.training.drivers import collect  # noqa: E402

pytestmark = pytest.mark.sim

H, W = 48, 64
STEPS = 245
COMMON = ['--episode-steps', str(STEPS), '--no-progress']


def _columns(root: Path, key: str) -> np.ndarray:
    import pandas as pd

    frames = pd.concat(pd.read_parquet(p) for p in sorted((root / 'data').rglob('*.parquet')))
    return np.stack(frames[key].to_numpy())


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob('*') if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope='module')
def base(module_tmp) -> Path:
    output = module_tmp('dagger') / 'demos'
    assert collect.main(['--output', str(output), '--episodes', '1', '--seed', '3',
                         '--image-size', f'{H}x{W}', *COMMON]) == 0
    return output


@pytest.fixture(scope='module')
def joined(base, tiny_pose_checkpoint, module_tmp):
    before = _digest(base)
    output = module_tmp('dagger') / 'joined'
    assert collect.main(['--output', str(output), '--episodes', '2', '--seed', '50',
                         '--dagger', str(tiny_pose_checkpoint), '--join', str(base),
                         '--beta', '0.0', '--dagger-iteration', '2', *COMMON]) == 0
    assert _digest(base) == before            # the base dataset is never modified
    return output


def test_dagger_episodes_join_the_dataset_marked_as_such(joined):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from act_ros.data.episode import EPISODE_SOURCE_FEATURE
    from act_ros.data.video_backend import video_backend

    ds = LeRobotDataset('local/joined', root=joined, video_backend=video_backend())
    assert ds.num_episodes == 3 and ds.num_frames == 3 * STEPS
    source = _columns(joined, EPISODE_SOURCE_FEATURE)
    np.testing.assert_array_equal(source[:STEPS], np.tile([0.0, 1.0], (STEPS, 1)))
    np.testing.assert_array_equal(source[STEPS:], np.tile([2.0, 0.0], (2 * STEPS, 1)))
    log = [json.loads(line) for line in (joined / 'dagger_log.jsonl').read_text().splitlines()]
    assert len(log) == 1 and log[0]['iteration'] == 2 and log[0]['episodes'] == 2
    assert log[0]['expert_share'] == 0.0 and 0.0 <= log[0]['align_rate'] <= 1.0
    card = (joined / 'README.md').read_text()
    assert 'Scripted-expert demonstrations' in card and 'DAgger iteration 2' in card


def test_every_label_is_the_experts_command_for_the_state_the_policy_reached(joined):
    """The untrained policy drives somewhere; each recorded action is what a fresh expert
    commands from the recorded state (the expert acts on the measured state alone)."""
    from act_ros.data.episode import OBJECT_POSES_FEATURE
    from act_ros.sim import PortPickAlignEnv, ScriptedExpert, SimConfig, SimObservation

    state = _columns(joined, 'observation.state')[STEPS:2 * STEPS]
    action = _columns(joined, 'action')[STEPS:2 * STEPS]
    poses = _columns(joined, OBJECT_POSES_FEATURE)[STEPS:2 * STEPS]
    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        expert = ScriptedExpert(env)
        for t in range(0, STEPS, 10):
            q = state[t].astype(np.float64)
            ee, _ = expert.ik.forward(q[env.arm_index])
            obs = SimObservation(images={}, joint_positions=q, ee_position=ee,
                                 box_pose=poses[t, :4].astype(np.float64),
                                 pad_pose=poses[t, 4:].astype(np.float64), step_index=t,
                                 time_s=t / 30)
            expert.reset(obs)
            np.testing.assert_allclose(expert.act(obs), action[t], atol=1e-4)
    # The policy, not the expert, drove: the arm did not follow the labels.
    follow = np.abs(state[1:, :5] - action[:-1, :5]).max()
    assert follow > 0.05


def test_with_beta_one_the_expert_drives_and_aligns(base, tiny_pose_checkpoint, tmp_path):
    from act_ros.data.episode import EPISODE_SOURCE_FEATURE

    output = tmp_path / 'expert_driven'
    assert collect.main(['--output', str(output), '--episodes', '1', '--seed', '4',
                         '--dagger', str(tiny_pose_checkpoint), '--join', str(base),
                         '--beta', '1.0', *COMMON]) == 0
    log = json.loads((output / 'dagger_log.jsonl').read_text().splitlines()[-1])
    assert log['expert_share'] == 1.0 and log['align_rate'] == 1.0
    np.testing.assert_array_equal(_columns(output, EPISODE_SOURCE_FEATURE)[-1], [1.0, 1.0])


def test_dagger_options_are_checked(base, tiny_pose_checkpoint, tmp_path, capsys):
    out = str(tmp_path / 'x')
    assert collect.main(['--output', out, '--episodes', '1', '--dagger', str(tmp_path / 'none'),
                         *COMMON]) == 2
    assert 'not a checkpoint directory' in capsys.readouterr().err
    assert collect.main(['--output', out, '--episodes', '1', '--dagger',
                         str(tiny_pose_checkpoint), '--beta', '1.5', *COMMON]) == 2
    assert 'beta' in capsys.readouterr().err
    assert collect.main(['--output', out, '--episodes', '1', '--dagger',
                         str(tiny_pose_checkpoint), '--join', str(tmp_path), *COMMON]) == 2
    assert 'not a LeRobot dataset' in capsys.readouterr().err
    assert not (tmp_path / 'x').exists()


def test_expert_demonstrations_join_a_dataset_that_stays_as_it_was(joined, tmp_path):
    """--join without --dagger: more expert episodes on top of a dataset (here one that
    already holds a DAgger iteration, whose log and card the result keeps)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from act_ros.data.episode import EPISODE_SOURCE_FEATURE
    from act_ros.data.video_backend import video_backend

    before = _digest(joined)
    output = tmp_path / 'more'
    # No --image-size: the episodes are recorded at the joined dataset's size.
    assert collect.main(['--output', str(output), '--episodes', '1', '--seed', '7',
                         '--join', str(joined), *COMMON]) == 0
    assert _digest(joined) == before
    ds = LeRobotDataset('local/more', root=output, video_backend=video_backend())
    assert ds.num_episodes == 4 and ds.num_frames == 4 * STEPS
    assert tuple(ds[ds.num_frames - 1]['observation.images.top'].shape) == (3, H, W)
    for key in ('action', 'observation.state', EPISODE_SOURCE_FEATURE):
        np.testing.assert_array_equal(_columns(output, key)[:3 * STEPS], _columns(joined, key))
    np.testing.assert_array_equal(_columns(output, EPISODE_SOURCE_FEATURE)[3 * STEPS:],
                                  np.tile([0.0, 1.0], (STEPS, 1)))
    # The new episode is the one a plain collection with that seed records.
    alone = tmp_path / 'alone'
    assert collect.main(['--output', str(alone), '--episodes', '1', '--seed', '7',
                         '--image-size', f'{H}x{W}', *COMMON]) == 0
    np.testing.assert_array_equal(_columns(output, 'action')[3 * STEPS:],
                                  _columns(alone, 'action'))
    assert (output / 'dagger_log.jsonl').read_text() == (joined / 'dagger_log.jsonl').read_text()
    card = (output / 'README.md').read_text()
    assert card.startswith((joined / 'README.md').read_text())
    assert card.count('Scripted-expert demonstrations') == 2 and 'seeds 7..7' in card
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')]  # no scratch left


def test_a_join_that_does_not_fit_or_fails_leaves_nothing(base, tmp_path, monkeypatch, capsys):
    from act_ros.data import join

    output = tmp_path / 'more'
    assert collect.main(['--output', str(output), '--episodes', '1', '--join', str(base),
                         '--image-size', '24x32', *COMMON]) == 1
    err = capsys.readouterr().err
    assert 'features differ' in err and f'image [{H}, {W}, 3]' in err and 'image [24, 32, 3]' in err

    def broken(*args, **kwargs):
        raise OSError('disk full')

    monkeypatch.setattr(join, 'joined', broken)
    before = _digest(base)
    with pytest.raises(OSError, match='disk full'):
        collect.main(['--output', str(output), '--episodes', '1', '--seed', '3',
                      '--join', str(base), *COMMON])
    assert _digest(base) == before
    assert list(tmp_path.iterdir()) == []     # neither an output nor a scratch directory


@pytest.mark.slow
def test_dagger_iterations_collect_train_and_continue_where_they_stopped(base, tmp_path):
    """act-ros dagger: one iteration = a DAgger collection joined to the data, then a
    fine-tuning from the previous policy; running the same command again redoes nothing."""
    from act_ros.training import train
    from act_ros.training.drivers import dagger_loop

    first = tmp_path / 'first'
    common = ['--preset', 'sim', '--cameras', 'none', '--environment-state',
              '--model-preset', 'tiny', '--model', 'use_vae=false', '--val-interval', '10',
              '--checkpoint-interval', '10', '--closed-loop-val-episodes', '0', '--skip-infer',
              '--torch-threads', '1', '--no-progress']
    assert train.main(['--dataset-root', str(base), '--output-dir', str(first), '--steps', '10',
                       *common]) == 0
    run_dir = tmp_path / 'dagger'
    argv = ['--dataset-root', str(base), '--checkpoint', str(first / 'last'), '--run-dir',
            str(run_dir), '--iterations', '1', '--episodes', '1', '--steps', '10',
            '--beta', '0.5', '--', *[a for a in common if a != '--no-progress']]
    assert dagger_loop.main(argv) == 0
    rows = [json.loads(line) for line in (run_dir / 'dagger.jsonl').read_text().splitlines()]
    assert len(rows) == 1 and rows[0]['iteration'] == 1 and rows[0]['episodes'] == 1
    assert rows[0]['dataset_frames'] == 1 * STEPS + 300       # base + one 300-tick episode
    metrics = json.loads((run_dir / 'iter_1' / 'train' / 'training_metrics.json').read_text())
    assert metrics['model']['init_from'] == str(first / 'last')
    stamp = (run_dir / 'iter_1' / 'train' / 'training_metrics.json').stat().st_mtime_ns
    assert dagger_loop.main(argv) == 0                           # nothing left to do
    assert (run_dir / 'iter_1' / 'train' / 'training_metrics.json').stat().st_mtime_ns == stamp
    # The done iteration keeps its one logged line with the times it took.
    assert [json.loads(line) for line in
            (run_dir / 'dagger.jsonl').read_text().splitlines()] == rows
    # More iterations on the same run: only the new one is done and logged.
    more = [*argv[:argv.index('--iterations') + 1], '2', *argv[argv.index('--iterations') + 2:]]
    assert dagger_loop.main(more) == 0
    logged = [json.loads(line) for line in (run_dir / 'dagger.jsonl').read_text().splitlines()]
    assert [r['iteration'] for r in logged] == [1, 2] and logged[0] == rows[0]
    assert logged[1]['dataset_frames'] == 1 * STEPS + 2 * 300
    # Stopped after an iteration's training, before its line: the next run logs it with the
    # times the collection and the training recorded, not the moment it took to skip them.
    (run_dir / 'dagger.jsonl').write_text(json.dumps(logged[0]) + '\n')
    assert dagger_loop.main(more) == 0
    relogged = json.loads((run_dir / 'dagger.jsonl').read_text().splitlines()[1])
    collection = json.loads((run_dir / 'iter_2' / 'dataset' / 'dagger_log.jsonl')
                            .read_text().splitlines()[-1])
    training = json.loads((run_dir / 'iter_2' / 'train' / 'training_metrics.json').read_text())
    assert relogged['collect_s'] == round(collection['seconds'], 1) > 0
    assert relogged['train_s'] == round(training['wall_time_s'], 1) > 0
    # --keep-datasets last: the done iterations' datasets but the newest are deleted (it
    # holds their data); nothing is redone, and a further iteration joins the newest one.
    stamps = {i: (run_dir / f'iter_{i}' / 'train' / 'training_metrics.json').stat().st_mtime_ns
              for i in (1, 2)}
    cut = argv.index('--')
    keep_last = [*more[:cut], '--keep-datasets', 'last', *more[cut:]]
    assert dagger_loop.main(keep_last) == 0
    assert not (run_dir / 'iter_1' / 'dataset').exists()
    assert (run_dir / 'iter_2' / 'dataset' / 'meta' / 'info.json').is_file()
    assert not list(run_dir.glob('iter_*/dataset.pruning'))
    assert {i: (run_dir / f'iter_{i}' / 'train' / 'training_metrics.json').stat().st_mtime_ns
            for i in (1, 2)} == stamps
    assert dagger_loop.main(keep_last) == 0                      # still nothing to redo
    assert {i: (run_dir / f'iter_{i}' / 'train' / 'training_metrics.json').stat().st_mtime_ns
            for i in (1, 2)} == stamps
    three = [*keep_last[:keep_last.index('--iterations') + 1], '3',
             *keep_last[keep_last.index('--iterations') + 2:]]
    assert dagger_loop.main(three) == 0
    logged = [json.loads(line) for line in (run_dir / 'dagger.jsonl').read_text().splitlines()]
    assert [r['iteration'] for r in logged] == [1, 2, 3]
    assert logged[2]['dataset_frames'] == 1 * STEPS + 3 * 300
    assert sorted(p.parent.name for p in run_dir.glob('iter_*/dataset')) == ['iter_3']
    assert [json.loads(line)['iteration'] for line in (run_dir / 'iter_3' / 'dataset' /
            'dagger_log.jsonl').read_text().splitlines()] == [1, 2, 3]
    # A deletion interrupted after its rename is finished by the next run.
    (run_dir / 'iter_2' / 'dataset.pruning').mkdir()
    assert dagger_loop.main(three) == 0
    assert not (run_dir / 'iter_2' / 'dataset.pruning').exists()
    # Trainer options that the loop sets itself are refused, and so is an unknown policy.
    assert dagger_loop.main([*argv, '--steps', '5']) == 2
    with pytest.raises(SystemExit):
        dagger_loop.main([*argv[:cut], '--keep-datasets', 'none', *argv[cut:]])
