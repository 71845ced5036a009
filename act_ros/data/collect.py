"""Scripted-expert demonstrations in the simulation, recorded to a LeRobot dataset (the
command: ``act-ros collect``, :mod:`act_ros.training.drivers.collect`).

Episode k of a run is simulated with seed ``seed + k``; attempts continue with the next
seeds until ``--episodes`` successful episodes are recorded (failed expert episodes are
counted, reported and not written). With ``--workers`` > 1 the simulation and rendering
run in worker processes while the main process writes the episodes in seed order, so the
dataset is the same for a given seed whatever the number of workers. ``--join DATASET``
writes that dataset plus the new episodes to the output (:mod:`act_ros.data.join`).
"""

from __future__ import annotations

import functools
import multiprocessing
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from act_ros.core.contract import load_contract
from act_ros.data import rollout
from act_ros.data.episode import ROBOT_TYPE_ALOHA_SIM, DatasetLayout
from act_ros.data.rollout import SIM_EXTRA_FEATURES, RolloutResult

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
        from act_ros.data.aloha_rollout import ALOHA_EXTRA_FEATURES, aloha_env, run_aloha_expert_episode

        layout = DatasetLayout(contract=contract, image_height=config.image_height,
                               image_width=config.image_width, use_video=config.use_video,
                               robot_type=ROBOT_TYPE_ALOHA_SIM, extra_features=ALOHA_EXTRA_FEATURES)
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
    from act_ros.data.episode import EPISODE_SOURCE_FEATURE, EPISODE_SOURCE_NAMES, OBJECT_POSES_FEATURE

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
