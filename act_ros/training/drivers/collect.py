"""``act-ros collect``: demonstrations in the simulation, by the scripted expert
(:mod:`act_ros.data.collect`) or, with ``--dagger CHECKPOINT``, by a trained policy whose
every state the expert labels (:mod:`act_ros.training.drivers.dagger`). The command sits here,
above both, since the second needs the trained policy's in-process wiring
(:class:`~act_ros.training.evaluation.rollout.SimPolicy`); the data layer knows nothing of training.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter
from act_ros.core.contract import load_contract, parse_image_size
from act_ros.data import collect


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of ``act-ros collect``."""
    parser = argparse.ArgumentParser(
        prog='act-ros collect',
        description='Record scripted-expert demonstrations of a simulated task (the '
                    "package's port pick-align, or gym-aloha's transfer cube: --task) into a "
                    'LeRobot v3 dataset. Only successful '
                    'episodes are written; the dataset appears at --output only when complete.',
        formatter_class=HelpFormatter)
    parser.add_argument('--task', default='port_pick_align',
                        choices=('port_pick_align', 'aloha_transfer_cube'),
                        help='port_pick_align: the package\'s own arm and task; '
                             'aloha_transfer_cube: gym-aloha\'s bimanual transfer cube, its '
                             'scripted expert planned in the end-effector task and replayed in '
                             'joint space (docs/aloha.md)')
    parser.add_argument('--output', required=True, type=Path,
                        help='dataset directory to create (must not exist or be empty)')
    parser.add_argument('--episodes', type=int, required=True,
                        help='number of successful episodes to record')
    parser.add_argument('--seed', type=int, default=0,
                        help='attempt k is simulated with seed SEED+k (default 0)')
    parser.add_argument('--image-size', default=None, type=parse_image_size,
                        help='rendered and stored image size HEIGHTxWIDTH (default 480x640, or '
                             'the --join dataset\'s)')
    parser.add_argument('--video', action=argparse.BooleanOptionalAction, default=None,
                        help='store cameras as lossless PNG images (default: a decoded frame '
                             'equals the render) or as lossy MP4 videos (--video, smaller); '
                             'with --join, as the dataset stores them')
    parser.add_argument('--join', type=Path, default=None, metavar='DATASET',
                        help='write DATASET plus the new episodes to --output (DATASET is not '
                             'modified; the output appears only when complete): more '
                             'demonstrations, or a DAgger iteration, on top of a dataset')
    parser.add_argument('--workers', type=int, default=1,
                        help='simulation worker processes (default 1: simulate in-process)')
    parser.add_argument('--max-attempts', type=int, default=None,
                        help='seeds to try before giving up (default: episodes + max(5, episodes / 2))')
    parser.add_argument('--episode-steps', type=int, default=None,
                        help='control steps per episode (default: from the sim config; the scripted '
                             'expert needs at least 245)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing dataset at --output')
    parser.add_argument('--exploration-noise', type=float, default=0.0, metavar='RAD',
                        help='smooth noise added to the executed arm targets while the recorded '
                             'action stays the expert\'s (DART-style recovery data; standard '
                             'deviation in rad, 3x on wrist_roll; default 0; the CPU recipe '
                             'uses 0.06)'),
    parser.add_argument('--contract', type=Path, default=None,
                        help='contract YAML (default: the package config/contract.yaml)')
    parser.add_argument('--sim-config', type=Path, default=None,
                        help='simulation settings YAML (default: the package config/sim.yaml)')
    parser.add_argument('--no-progress', action='store_true', help='hide the progress bar')
    dagger = parser.add_argument_group(
        'DAgger', 'With --dagger the policy CHECKPOINT drives and the scripted expert labels '
        'every frame (every episode is recorded, successful or not); --episodes, --seed, '
        '--workers and --output keep their meaning, the image size is the dataset\'s or the '
        'checkpoint\'s.')
    dagger.add_argument('--dagger', type=Path, default=None, metavar='CHECKPOINT',
                        help='policy checkpoint that drives (a LeRobot pretrained_model dir)')
    dagger.add_argument('--beta', type=float, default=0.0,
                        help='probability that the expert drives a chunk-long window instead of '
                             'the policy (default 0: the policy drives throughout)')
    dagger.add_argument('--dagger-iteration', type=int, default=1,
                        help='iteration number stored with every new frame (default 1)')
    dagger.add_argument('--mode', choices=('chunk', 'ensemble'), default='chunk',
                        help='how the policy executes its chunks (default chunk)')
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``act-ros collect``."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault('MUJOCO_GL', 'egl')  # headless rendering unless the user chose
    if args.dagger is not None:
        return _main_dagger(args)

    def expert_config() -> collect.CollectConfig:
        (height, width), use_video = _frame_layout(args)
        return collect.CollectConfig(
            output=args.output, episodes=args.episodes, seed=args.seed, image_height=height,
            image_width=width, use_video=use_video, workers=args.workers,
            max_attempts=args.max_attempts, episode_steps=args.episode_steps,
            overwrite=args.overwrite, exploration_noise_rad=args.exploration_noise,
            contract_path=args.contract, sim_config_path=args.sim_config,
            base_dataset=args.join, task=args.task)

    code, config, stats = _run(expert_config, collect.collect, args)
    if code:
        return code
    attempts = len(stats.recorded_seeds) + len(stats.failed)
    print(f'recorded {len(stats.recorded_seeds)} episodes ({stats.frames} frames, '
          f'{config.image_height}x{config.image_width}, '
          f'{"video" if config.use_video else "images"}) to {config.output} '
          f'in {stats.seconds:.1f} s ({stats.frames_per_second:.1f} frames/s, '
          f'{config.workers} worker(s)); expert failures: {len(stats.failed)} of {attempts}'
          + (f' (seeds {[r.seed for r in stats.failed]})' if stats.failed else ''))
    return 0


def _run(make_config: Callable[[], Any], run: Callable[..., Any], args: argparse.Namespace
         ) -> tuple[int, Any, Any]:
    """``(exit code, config, stats)`` of one collection: 2 for a config ``make_config``
    refuses, 1 for a run that fails, 130 for Ctrl-C (nothing written), else 0."""
    from act_ros.data.writer import quiet_library_output

    try:
        config = make_config()
    except (ValueError, FileNotFoundError) as exc:
        print(f'act-ros collect: {exc}', file=sys.stderr)
        return 2, None, None
    quiet_library_output()
    try:
        return 0, config, run(config, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as exc:
        print(f'act-ros collect: {exc}', file=sys.stderr)
        return 1, config, None
    except KeyboardInterrupt:
        print('act-ros collect: interrupted; no dataset was written', file=sys.stderr)
        return 130, config, None


def _frame_layout(args: argparse.Namespace) -> tuple[tuple[int, int], bool]:
    """Image size and storage: as given, else the --join dataset's, else 480x640 images."""
    size, video = args.image_size, args.video
    if args.join is not None and (size is None or video is None):
        from act_ros.data.join import frame_layout

        camera = load_contract(args.contract).cameras[0].feature
        height, width, stored_video = frame_layout(args.join, camera)
        size = size or (height, width)
        video = stored_video if video is None else video
    return size or (480, 640), bool(video)


def _main_dagger(args: argparse.Namespace) -> int:
    from act_ros.training.drivers.dagger import DaggerConfig, collect_dagger

    code, config, stats = _run(lambda: DaggerConfig(
        checkpoint=args.dagger, output=args.output, episodes=args.episodes, seed=args.seed,
        iteration=args.dagger_iteration, beta=args.beta, base_dataset=args.join,
        mode=args.mode, workers=args.workers, overwrite=args.overwrite,
        episode_steps=args.episode_steps, contract_path=args.contract,
        sim_config_path=args.sim_config), collect_dagger, args)
    if code:
        return code
    summary = stats.summary(config)
    print(f'DAgger iteration {config.iteration}: {summary["episodes"]} episodes labelled '
          f'({stats.frames} frames) in {stats.seconds:.1f} s; the policy aligned '
          f'{summary["align_rate"]:.2f} with the expert driving {summary["expert_share"]:.0%} of '
          f'the ticks (beta {config.beta}); failures {summary["failures"]}; written to '
          f'{config.output}' + (f' with {config.base_dataset}' if config.base_dataset else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
