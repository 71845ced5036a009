"""``act-ros collect``: record scripted-expert demonstrations in the simulation.

Episode k of a run is simulated with seed ``seed + k``; attempts continue with the next
seeds until ``--episodes`` successful episodes are recorded (failed expert episodes are
counted, reported and not written). With ``--workers`` > 1 the simulation and rendering
run in worker processes while the main process writes the episodes in seed order, so the
dataset is the same for a given seed whatever the number of workers. ``--join DATASET``
writes that dataset plus the new episodes to the output (:mod:`act_ros.data.join`).
"""

from __future__ import annotations

import argparse
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
import functools
import multiprocessing
import os
from pathlib import Path
import sys
import time

from act_ros.core.contract import load_contract
from act_ros.core.contract import parse_image_size
from act_ros.data.episode import DatasetLayout
from act_ros.data import rollout
from act_ros.data.rollout import SIM_EXTRA_FEATURES, RolloutResult
from act_ros.core.arguments import HelpFormatter

# One expert episode takes seconds; a worker silent for this long is hung.
EPISODE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class CollectConfig:
    """Settings of one collection run (see ``act-ros collect --help``)."""

    output: Path
    episodes: int
    seed: int = 0
    image_height: int = 480
    image_width: int = 640
    use_video: bool = False
    workers: int = 1
    max_attempts: int | None = None
    episode_steps: int | None = None
    overwrite: bool = False
    exploration_noise_rad: float = 0.0
    contract_path: Path | None = None
    sim_config_path: Path | None = None
    base_dataset: Path | None = None  # --join: write this dataset plus the new episodes
    task: str = 'port_pick_align'  # act_ros.sim.tasks.SIM_TASKS

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f'episodes must be >= 1, got {self.episodes}')
        if self.workers < 1:
            raise ValueError(f'workers must be >= 1, got {self.workers}')
        if self.max_attempts is not None and self.max_attempts < self.episodes:
            raise ValueError(f'max_attempts ({self.max_attempts}) must be >= episodes '
                             f'({self.episodes})')
        if not self.exploration_noise_rad >= 0:
            raise ValueError(f'exploration_noise_rad must be >= 0, got '
                             f'{self.exploration_noise_rad}')
        if self.episode_steps is not None and self.episode_steps < 1:
            raise ValueError(f'episode_steps must be >= 1, got {self.episode_steps}')
        from act_ros.sim.tasks import sim_task

        task = sim_task(self.task)
        if task.is_aloha and self.exploration_noise_rad:
            raise ValueError(f'--exploration-noise applies to the port_pick_align expert; the '
                             f'{self.task} expert replays a planned trajectory')
        if task.is_aloha and self.sim_config_path is not None:
            raise ValueError(f'--sim-config is the port_pick_align simulation\'s; {self.task} '
                             'is configured by gym-aloha')

    @property
    def attempt_limit(self) -> int:
        """Most seeds tried before giving up: ``max_attempts`` or episodes + max(5, episodes // 2)."""
        if self.max_attempts is not None:
            return self.max_attempts
        return self.episodes + max(5, self.episodes // 2)


@dataclass
class CollectStats:
    """What a collection run did."""

    recorded_seeds: list[int] = field(default_factory=list)
    failed: list[RolloutResult] = field(default_factory=list)
    frames: int = 0
    seconds: float = 0.0

    @property
    def frames_per_second(self) -> float:
        """Recorded frames per wall-clock second (simulation, rendering and writing)."""
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def make_sim_config(config: CollectConfig, fps: int):
    """Simulation settings for a run: the sim config file with image size and length set.

    The file is ``config.sim_config_path`` or the package's ``config/sim.yaml`` (the
    dataclass defaults when the package has none). Its ``fps`` must equal the contract's
    ``fps``, since the dataset is timed by the contract.
    """
    from act_ros.core.paths import config_path
    from act_ros.sim import SimConfig

    overrides: dict = {'camera_height': config.image_height, 'camera_width': config.image_width}
    if config.episode_steps is not None:
        overrides['episode_steps'] = config.episode_steps
    if config.contract_path is not None:
        overrides['contract_path'] = str(config.contract_path)
    path = config.sim_config_path
    if path is None and config_path('sim.yaml').is_file():
        path = config_path('sim.yaml')
    sim_config = SimConfig.from_yaml(path, **overrides) if path else SimConfig(**overrides)
    if sim_config.fps != fps:
        raise ValueError(f'the simulation runs at {sim_config.fps} fps but the contract '
                         f'(dataset) expects {fps} fps; make them equal')
    return sim_config


def _rollouts_in_process(initargs: tuple, seeds: Iterator[int],
                         wanted: Callable[[], int]) -> Iterator[RolloutResult]:
    """Results in seed order from this process, through the same ``init_worker`` and
    ``worker_episode`` as the pool's workers."""
    rollout.init_worker(*initargs, handle_sigint=False)
    try:
        for seed in seeds:
            if wanted() <= 0:
                return
            yield rollout.worker_episode(seed)
    finally:
        rollout.close_worker()  # release the GL context now, not at interpreter exit


def _rollouts_in_pool(initargs: tuple, seeds: Iterator[int], workers: int,
                      wanted: Callable[[], int]) -> Iterator[RolloutResult]:
    """Results in seed order, from ``workers`` processes running
    :func:`act_ros.data.rollout.init_worker` ``(*initargs)`` once and ``worker_episode(seed)``
    per episode.

    At most ``workers + 1`` episodes are in flight (memory stays bounded: one episode at
    480x640 is ~550 MB), and never more than the successes still ``wanted()``, so little
    simulation is thrown away at the end.
    """
    # spawn: MuJoCo's GL contexts and torch's threads do not survive a fork safely.
    ctx = multiprocessing.get_context('spawn')
    pool = ctx.Pool(workers, initializer=rollout.init_worker, initargs=initargs)
    try:
        pending: deque = deque()
        exhausted = False
        while True:
            while not exhausted and len(pending) < min(workers + 1, wanted()):
                seed = next(seeds, None)
                if seed is None:
                    exhausted = True
                else:
                    pending.append(pool.apply_async(rollout.worker_episode, (seed,)))
            if not pending:
                break
            try:
                yield pending.popleft().get(timeout=EPISODE_TIMEOUT_S)
            except multiprocessing.TimeoutError:
                raise RuntimeError(f'a collection worker gave no episode within '
                                   f'{EPISODE_TIMEOUT_S:.0f} s (hung simulation?); stopped, no '
                                   'dataset was written') from None
    finally:
        pool.terminate()  # stops the workers, also on error, Ctrl-C or early close
        pool.join()


def collect(config: CollectConfig, *, progress: bool = True) -> CollectStats:
    """Run the expert until ``config.episodes`` successes and write them atomically.

    With ``config.base_dataset`` the output is that dataset plus the new episodes
    (:mod:`act_ros.data.join`); the base dataset is not modified.
    """
    from act_ros.data.join import check_joinable
    from act_ros.data.writer import check_output

    from act_ros.sim.tasks import sim_task

    task = sim_task(config.task)
    contract = load_contract(config.contract_path or task.contract_path())
    if contract.fps != task.fps:
        raise ValueError(f'the {task.name} simulation runs at {task.fps} fps but the contract '
                         f'{contract.source} says {contract.fps}')
    if task.is_aloha:
        from act_ros.data.aloha_rollout import (ALOHA_EXTRA_FEATURES, aloha_env,
                                                run_aloha_expert_episode)

        layout = DatasetLayout(contract=contract, image_height=config.image_height,
                               image_width=config.image_width, use_video=config.use_video,
                               robot_type='aloha_sim', extra_features=ALOHA_EXTRA_FEATURES)
        initargs: tuple = (
            functools.partial(aloha_env, task.aloha_task, contract.camera_names,
                              (config.image_height, config.image_width), config.episode_steps),
            run_aloha_expert_episode, contract.camera_names)
    else:
        layout = DatasetLayout(contract=contract, image_height=config.image_height,
                               image_width=config.image_width, use_video=config.use_video,
                               extra_features=SIM_EXTRA_FEATURES)
        initargs = (functools.partial(rollout.port_pick_align_env,
                                      make_sim_config(config, contract.fps)),
                    rollout.run_expert_episode, contract.camera_names,
                    {'noise_rad': config.exploration_noise_rad})
    check_output(config.output, config.overwrite)
    if config.base_dataset is not None:
        check_joinable(config.base_dataset, layout.features())
    limit = config.attempt_limit
    stats = CollectStats()
    seeds = iter(range(config.seed, config.seed + limit))

    def wanted() -> int:
        return config.episodes - len(stats.recorded_seeds)

    if config.workers > 1:
        results = _rollouts_in_pool(initargs, seeds, config.workers, wanted)
    else:
        results = _rollouts_in_process(initargs, seeds, wanted)
    try:
        if config.base_dataset is None:
            _write(config, layout, results, stats, wanted, progress, config.output)
        else:
            _write_joined(config, layout, results, stats, wanted, progress)
    finally:
        results.close()
    return stats


def _write_joined(config: CollectConfig, layout: DatasetLayout, results, stats: CollectStats,
                  wanted: Callable[[], int], progress: bool) -> None:
    """The new episodes to a scratch dataset, then the base plus them to the output."""
    import shutil
    import tempfile

    from act_ros.data.join import joined, move_into_place

    config.output.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f'.{config.output.name}.join-',
                                    dir=config.output.parent))
    try:
        new = scratch / 'new'
        card = _write(config, layout, results, stats, wanted, progress, new)
        start = time.perf_counter()
        built = joined(Path(config.base_dataset), new, scratch, card)
        move_into_place(built, config.output, config.overwrite, scratch)
        stats.seconds += time.perf_counter() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write(config: CollectConfig, layout: DatasetLayout, results, stats: CollectStats,
           wanted: Callable[[], int], progress: bool, output: Path) -> str:
    """Record successful episodes from ``results`` to ``output``; returns the card."""
    from tqdm import tqdm

    from act_ros.data.writer import AtomicDatasetWriter

    limit = config.attempt_limit
    start = time.perf_counter()
    bar = tqdm(total=config.episodes, unit='ep', disable=not progress, dynamic_ncols=True)
    try:
        with AtomicDatasetWriter(layout, output, overwrite=config.overwrite) as writer:
            for result in results:
                if not result.success:
                    stats.failed.append(result)
                    bar.write(f'expert failed with seed {result.seed} '
                              f'({result.detail or "not aligned"}); not recorded', file=sys.stderr)
                else:
                    writer.add_episode(result.episode)
                    stats.recorded_seeds.append(result.seed)
                    stats.frames += result.frames
                    bar.update(1)
                elapsed = time.perf_counter() - start
                bar.set_postfix(frames=stats.frames, failed=len(stats.failed),
                                fps=f'{stats.frames / max(elapsed, 1e-9):.1f}')
                if wanted() <= 0:
                    break
            stats.seconds = time.perf_counter() - start
            writer.card = card = dataset_card(layout, config, stats)
            if wanted() > 0:
                raise RuntimeError(
                    f'the expert succeeded in only {len(stats.recorded_seeds)} of {limit} '
                    f'attempts (seeds {config.seed}..{config.seed + limit - 1}); '
                    f'{config.episodes} were requested. No dataset was written; raise '
                    '--max-attempts or check the simulation.')
    finally:
        bar.close()
    stats.seconds = time.perf_counter() - start
    return card


def frame_storage_text(layout: DatasetLayout) -> str:
    """How the camera frames are stored, and what that means for training."""
    if layout.use_video:
        return ("MP4 video (LeRobot's default encoder: AV1, crf 30, yuv420p). Lossy: a decoded "
                'frame differs from the render (about 10/255 on the box in the top camera at '
                '96x128), so a policy trained on it sees other pixels than in closed loop.')
    return ('PNG images, lossless: a decoded frame equals the rendered one, pixel for pixel, '
            'so training sees exactly what the policy sees in the simulation.')


def dataset_card(layout: DatasetLayout, config: CollectConfig, stats: CollectStats, *,
                 title: str = 'Scripted-expert demonstrations', extra: str = '') -> str:
    """The dataset card (README.md) of a simulated dataset."""
    from act_ros.core.object_state import ENVIRONMENT_STATE_FEATURE, ENVIRONMENT_STATE_NAMES
    from act_ros.data.episode import (EPISODE_SOURCE_FEATURE, EPISODE_SOURCE_NAMES,
                                      OBJECT_POSES_FEATURE)

    seeds = stats.recorded_seeds
    lines = [
        f'# {title}: port pick-align (act_ros simulation)', '',
        f'- Episodes: {len(seeds)} ({stats.frames} frames at {layout.fps} fps), seeds '
        f'{min(seeds) if seeds else "-"}..{max(seeds) if seeds else "-"} '
        f'(failed expert episodes are not recorded: {len(stats.failed)}).',
        f'- Cameras: {", ".join(layout.contract.camera_names)} at '
        f'{layout.image_height}x{layout.image_width}, rendered at that size.',
        f'- Frame storage: {frame_storage_text(layout)}',
        f'- Exploration noise on the executed arm targets: {config.exploration_noise_rad} rad '
        '(the recorded action is always the expert\'s label).',
        f'- `{ENVIRONMENT_STATE_FEATURE}`: object poses as a policy input, '
        f'{list(ENVIRONMENT_STATE_NAMES)} (positions in metres in the robot base frame, yaw '
        'as cos/sin of 4 x yaw: the cube and the pad repeat every 90 degrees).',
        f'- `{OBJECT_POSES_FEATURE}`: raw box and pad poses (x, y, z, yaw), for auxiliary '
        'losses; never a policy input.',
        f'- `{EPISODE_SOURCE_FEATURE}`: {list(EPISODE_SOURCE_NAMES)} per frame: 0 / 1.0 for a '
        'scripted-expert demonstration; DAgger episodes carry their iteration and the share '
        'of ticks the expert drove.',
        f'- Made by `act-ros collect` in {stats.seconds:.0f} s.',
    ]
    if extra:
        lines += ['', extra]
    return '\n'.join(lines) + '\n'


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
    from act_ros.data.writer import quiet_library_output

    args = build_parser().parse_args(argv)
    os.environ.setdefault('MUJOCO_GL', 'egl')  # headless rendering unless the user chose
    if args.dagger is not None:
        return _main_dagger(args)
    try:
        (height, width), use_video = _frame_layout(args)
        config = CollectConfig(
            output=args.output, episodes=args.episodes, seed=args.seed, image_height=height,
            image_width=width, use_video=use_video, workers=args.workers,
            max_attempts=args.max_attempts, episode_steps=args.episode_steps,
            overwrite=args.overwrite, exploration_noise_rad=args.exploration_noise,
            contract_path=args.contract, sim_config_path=args.sim_config,
            base_dataset=args.join, task=args.task)
    except (ValueError, FileNotFoundError) as exc:
        print(f'act-ros collect: {exc}', file=sys.stderr)
        return 2
    quiet_library_output()
    try:
        stats = collect(config, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as exc:
        print(f'act-ros collect: {exc}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('act-ros collect: interrupted; no dataset was written', file=sys.stderr)
        return 130
    attempts = len(stats.recorded_seeds) + len(stats.failed)
    print(f'recorded {len(stats.recorded_seeds)} episodes ({stats.frames} frames, '
          f'{height}x{width}, {"video" if config.use_video else "images"}) to {config.output} '
          f'in {stats.seconds:.1f} s ({stats.frames_per_second:.1f} frames/s, '
          f'{config.workers} worker(s)); expert failures: {len(stats.failed)} of {attempts}'
          + (f' (seeds {[r.seed for r in stats.failed]})' if stats.failed else ''))
    return 0


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
    from act_ros.data.dagger import DaggerConfig, collect_dagger
    from act_ros.data.writer import quiet_library_output

    try:
        config = DaggerConfig(
            checkpoint=args.dagger, output=args.output, episodes=args.episodes, seed=args.seed,
            iteration=args.dagger_iteration, beta=args.beta, base_dataset=args.join,
            mode=args.mode, workers=args.workers, overwrite=args.overwrite,
            episode_steps=args.episode_steps, contract_path=args.contract,
            sim_config_path=args.sim_config)
    except (ValueError, FileNotFoundError) as exc:
        print(f'act-ros collect: {exc}', file=sys.stderr)
        return 2
    quiet_library_output()
    try:
        stats = collect_dagger(config, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as exc:
        print(f'act-ros collect: {exc}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('act-ros collect: interrupted; no dataset was written', file=sys.stderr)
        return 130
    summary = stats.summary(config)
    print(f'DAgger iteration {config.iteration}: {summary["episodes"]} episodes labelled '
          f'({stats.frames} frames) in {stats.seconds:.1f} s; the policy aligned '
          f'{summary["align_rate"]:.2f} with the expert driving {summary["expert_share"]:.0%} of '
          f'the ticks (beta {config.beta}); failures {summary["failures"]}; written to '
          f'{config.output}' + (f' with {config.base_dataset}' if config.base_dataset else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
