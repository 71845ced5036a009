"""Closed-loop evaluation in the simulation: the evaluator CLI and the trainer's sim preset.

Short episodes (``--episode-steps``) keep these quick; the task itself needs the full
length, so the numbers here say nothing about a policy's quality.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip('mujoco')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

pytestmark = [pytest.mark.sim, pytest.mark.slow]
H, W = 48, 64


@pytest.fixture(autouse=True, scope='module')
def one_torch_thread():
    """One PyTorch thread: fastest on a 2-core machine shared with other test processes."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope='module')
def dataset(module_tmp) -> Path:
    from act_ros.data.synthetic import write_synthetic_dataset

    root = module_tmp('data') / 'syn'
    write_synthetic_dataset(root, episodes=3, frames=30, image_size=(H, W), video=False)
    return root


def test_evaluate_cli_both_modes_with_video(tiny_checkpoint, tmp_path, capsys):
    from act_ros.training.evaluation.evaluate import main

    out = tmp_path / 'eval.json'
    code = main(['--checkpoint', str(tiny_checkpoint), '--episodes', '1', '--mode', 'both',
                 '--seed', '3', '--render-size', '96x128', '--episode-steps', '20',
                 '--video', str(tmp_path / 'ep.mp4'), '--video-episodes', '0',
                 '--output', str(out), '--no-progress'])
    assert code == 0
    printed = capsys.readouterr().out
    assert 'chunk' in printed and 'ensemble' in printed and 'align_rate' in printed
    data = json.loads(out.read_text())
    for mode in ('chunk', 'ensemble'):
        result = data['modes'][mode]
        episode = result['episodes'][0]
        # The summary is what the episode measured; 20 ticks never place the box.
        assert result['count'] == 1 and result['align_rate'] == 0.0 and not episode['success']
        assert result['mean_position_error'] == pytest.approx(episode['position_error_m'])
        assert result['mean_yaw_error'] == pytest.approx(episode['yaw_error_deg'])
        assert episode['position_error_m'] > 0.05  # the box never left its start pose
        assert result['failures']['grasp'] == 1
        assert result['episodes'][0]['steps'] == 20 and result['episodes'][0]['seed'] == 3
        video = Path(result['video'])
        assert video.name == f'ep_{mode}.mp4' and video.stat().st_size > 1000
        assert f'video: {video} (episodes 0)' in printed  # where the video went


def test_evaluate_workers_give_the_results_of_one_process(tiny_checkpoint, tmp_path, capsys):
    from act_ros.training.evaluation.evaluate import _blocks, main

    assert _blocks(5, 2) == [(0, 3), (3, 2)] and _blocks(1, 4) == [(0, 1)]
    common = ['--checkpoint', str(tiny_checkpoint), '--episodes', '3', '--mode', 'chunk',
              '--seed', '11', '--render-size', '48x64', '--episode-steps', '12', '--no-progress']
    assert main(common + ['--output', str(tmp_path / 'one.json')]) == 0
    assert main(common + ['--workers', '2', '--output', str(tmp_path / 'two.json')]) == 0
    one, two = (json.loads((tmp_path / f'{n}.json').read_text())['modes']['chunk']
                for n in ('one', 'two'))
    assert [e['seed'] for e in two['episodes']] == [11, 12, 13]
    for a, b in zip(one['episodes'], two['episodes']):
        assert a['seed'] == b['seed'] and a['steps'] == b['steps']
        assert a['position_error_m'] == pytest.approx(b['position_error_m'], abs=1e-9)
    for key in ('count', 'align_rate', 'mean_position_error', 'mean_yaw_error', 'failures'):
        assert one[key] == two[key], key
    with pytest.raises(SystemExit):  # one process writes a video
        main(common + ['--workers', '2', '--video', str(tmp_path / 'v.mp4')])
    assert '--workers at 1 with --video' in capsys.readouterr().err


def test_evaluate_gif_and_bad_device(tiny_checkpoint, tmp_path, capsys):
    from act_ros.training.evaluation.evaluate import main

    gif = tmp_path / 'ep.gif'
    assert main(['--checkpoint', str(tiny_checkpoint), '--episodes', '1', '--mode', 'chunk',
                 '--render-size', '48x64', '--episode-steps', '6', '--video', str(gif),
                 '--no-progress']) == 0
    assert gif.read_bytes()[:3] == b'GIF'
    import torch
    if not torch.cuda.is_available():
        assert main(['--checkpoint', str(tiny_checkpoint), '--device', 'cuda',
                     '--no-progress']) == 2
        assert "'cuda' was requested" in capsys.readouterr().err


def test_sim_preset_records_both_closed_loop_modes(dataset, tmp_path):
    from act_ros.training.config import TrainConfig
    from act_ros.training.train import run

    out = tmp_path / 'run'
    config = TrainConfig(dataset_root=dataset, output_dir=out, preset='sim', model_preset='tiny',
                         image_size=(H, W), steps=4, batch_size=2, lr=1e-4, warmup_steps=0,
                         val_interval=2, max_val_batches=1, checkpoint_interval=100,
                         early_stop_patience=1, min_steps=100, closed_loop_val_episodes=1,
                         torch_threads=1,
                         closed_loop_te_episodes=1, closed_loop_episode_steps=15, device='cpu',
                         progress=False, skip_infer=True)
    metrics = run(config)
    assert metrics['status'] == 'completed' and metrics['steps_completed'] == 4
    rows = metrics['history']['closed_loop']
    assert [r['step'] for r in rows] == [2, 4]
    for row in rows:
        for mode in ('chunk', 'ensemble'):
            assert {'align_rate', 'mean_position_error', 'mean_yaw_error'} <= set(row[mode])
            assert row[mode]['count'] == 1
    assert {'closed_loop_chunk', 'closed_loop_ensemble'} <= set(metrics['best'])
    assert metrics['best']['closed_loop_chunk']['path'] == 'best'
    assert metrics['best']['closed_loop_ensemble']['path'] == 'best_te'
    for name in ('best', 'best_te', 'last'):
        assert (out / name / 'model.safetensors').is_file(), name
    assert not (out / '.closed_loop_candidate').exists()
    assert (out / 'plot_align_rate.png').is_file()
    # Early stop only after min_steps, although patience (1) ran out.
    assert metrics['stopped_early'] is False


def test_n_action_steps_sets_how_often_chunk_mode_queries(tiny_checkpoint, tmp_path, capsys):
    """--n-action-steps k plays k actions of each chunk: 12 ticks are 3 chunks at k = 4 and
    one at the default (the whole chunk); it is recorded, checked against the chunk size,
    and refused where it has no meaning (ensemble mode queries every tick)."""
    from act_ros.sim import PortPickAlignEnv
    from act_ros.training.evaluation.evaluate import main
    from act_ros.training.evaluation.rollout import SimPolicy, make_sim_config

    chunk_size = json.loads((Path(tiny_checkpoint) / 'config.json').read_text())['chunk_size']
    assert chunk_size >= 12  # one chunk covers the 12 ticks below
    env = PortPickAlignEnv(make_sim_config(tiny_checkpoint, (48, 64), episode_steps=12))
    try:
        counts = {}
        for k in (4, None):
            policy = SimPolicy(tiny_checkpoint, mode='chunk', n_action_steps=k)
            try:
                obs = env.reset(seed=5)
                policy.reset(obs)
                while not env.done:
                    obs = env.step(policy.act(obs))
                counts[k] = policy.counters.chunks_checked
            finally:
                policy.close()
    finally:
        env.close()
    assert counts == {4: 3, None: 1}
    with pytest.raises(ValueError, match='chunk and blend modes'):
        SimPolicy(tiny_checkpoint, mode='ensemble', n_action_steps=4)

    common = ['--checkpoint', str(tiny_checkpoint), '--episodes', '1', '--render-size', '48x64',
              '--episode-steps', '6', '--no-progress']
    out = tmp_path / 'k.json'
    assert main(common + ['--mode', 'chunk', '--n-action-steps', '3', '--output', str(out)]) == 0
    assert json.loads(out.read_text())['n_action_steps'] == 3
    assert main(common + ['--mode', 'chunk', '--n-action-steps', str(chunk_size + 1)]) == 2
    assert 'cannot exceed' in capsys.readouterr().err
    assert main(common + ['--mode', 'both', '--n-action-steps', '3']) == 2
    assert '--mode chunk' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(common + ['--n-action-steps', '0'])
    assert '--n-action-steps must be >= 1' in capsys.readouterr().err


SEAM_KEYS = ('handovers', 'over_within_p99', 'velocity_jump_median', 'velocity_jump_max',
             'within_chunk_velocity_step_p99')


def test_every_mode_records_the_seams_of_its_commands(tiny_checkpoint, tmp_path, capsys):
    """modes.<mode>.seams for chunk, ensemble and blend: a handover per chunk played (chunk
    mode every chunk, blend mode every chunk less the window, ensemble every tick; those
    too near an episode's ends to measure left out), the figures the docs quote, and the
    same figures from two worker processes as from one."""
    from act_ros.training.evaluation.evaluate import main

    common = ['--checkpoint', str(tiny_checkpoint), '--episodes', '2', '--render-size', '48x64',
              '--episode-steps', '34', '--seed', '7', '--no-progress']

    def measured(stride, fade=1):
        # A handover at h is measured through tick h + 2 of the episode, a crossfade of
        # `fade` ticks through its last tick + 2 (core.control.seams: judged over all its ticks).
        return 2 * len(range(stride, 34 - 2 - (fade - 1), stride))
    out = tmp_path / 'all.json'
    assert main(common + ['--mode', 'all', '--output', str(out)]) == 0
    printed = capsys.readouterr().out
    assert 'handovers over the within-chunk p99' in printed
    data = json.loads(out.read_text())
    assert data['blend_window'] == '0.2s' and data['blend_ticks'] == 6
    modes = data['modes']
    for mode in ('chunk', 'ensemble', 'blend'):
        seams = modes[mode]['seams']
        assert all(key in seams for key in SEAM_KEYS), mode
        assert seams['ticks'] > 0 and seams['chunks'] > 0
        assert set(seams['per_joint']) == set(modes[mode]['seams']['per_joint'])
    chunk = json.loads((Path(tiny_checkpoint) / 'config.json').read_text())['chunk_size']
    assert modes['chunk']['seams']['handovers'] == measured(chunk) > 0
    assert modes['ensemble']['seams']['handovers'] == measured(1) - 2 * 2  # ticks 1, 2: no
    assert modes['blend']['seams']['handovers'] == measured(chunk - 6, fade=6) > 0
    # Two processes: the same seams (samples merged, not summaries averaged).
    two = tmp_path / 'two.json'
    assert main(common + ['--mode', 'blend', '--blend-window', '4', '--n-action-steps', '10',
                          '--output', str(tmp_path / 'one.json')]) == 0
    assert main(common + ['--mode', 'blend', '--blend-window', '4', '--n-action-steps', '10',
                          '--workers', '2', '--output', str(two)]) == 0
    one, both = (json.loads(p.read_text())['modes']['blend']['seams']
                 for p in (tmp_path / 'one.json', two))
    assert one['handovers'] == measured(10, fade=4)
    for key in SEAM_KEYS:
        assert one[key] == pytest.approx(both[key]), key
    assert 'seam_samples' not in json.loads(two.read_text())['modes']['blend']


def test_evaluate_help_says_what_checkpoint_takes_and_where_videos_go():
    from act_ros.training.evaluation.evaluate import build_parser

    text = ' '.join(build_parser().format_help().split())
    assert 'pretrained_model directory, or a Hugging Face Hub id' in text
    assert 'NAME_chunk.mp4, NAME_ensemble.mp4); each path is printed' in text
    assert '--episodes EPISODES default: 10' in text
