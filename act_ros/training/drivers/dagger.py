"""DAgger in the simulation: the policy drives, the scripted expert labels every state.

``act-ros collect --dagger CHECKPOINT`` runs episodes in which a trained policy acts
through the node's control step (:class:`~act_ros.training.evaluation.rollout.SimPolicy`: safety
chain and release gate included) while the state-feedback expert
(:class:`~act_ros.sim.expert.ScriptedExpert`) says, at every tick, what it would command
from there. The frames are recorded with the expert's command as the action: the dataset
then holds the states the *policy* reaches, each labelled with the way to complete the
task from it (Ross et al., 2011). A beta mixture decides who acts: at the start of every
window of ``window_ticks`` ticks (one action chunk) the expert takes over with probability
``beta``; with ``beta = 0`` the policy drives throughout.

Every episode is recorded, successful or not (the failures are the states worth
labelling), marked per frame in ``sim.episode_source`` with the iteration and the share of
ticks the expert drove. With ``--join BASE`` the new episodes are appended to a copy of
the dataset ``BASE`` (LeRobot's aggregation) and written to ``--output``; ``BASE`` itself is
never modified. The output appears only when complete.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from act_ros.core.processes import die_with_parent
from act_ros.data.episode import OBJECT_POSE_NAMES, Episode
from act_ros.data.join import DAGGER_LOG, frame_layout, joined, move_into_place

EPISODE_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class DaggerConfig:
    """One DAgger collection iteration (see ``act-ros collect --help``)."""

    checkpoint: Path
    output: Path
    episodes: int
    seed: int = 0
    iteration: int = 1
    beta: float = 0.0
    base_dataset: Path | None = None
    mode: str = 'chunk'
    window_ticks: int = 30
    workers: int = 1
    device: str = 'cpu'
    episode_steps: int | None = None  # None: config/sim.yaml
    overwrite: bool = False
    contract_path: Path | None = None
    sim_config_path: Path | None = None

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f'episodes must be >= 1, got {self.episodes}')
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f'beta (the expert\'s share) must be in [0, 1], got {self.beta}')
        if self.iteration < 1:
            raise ValueError(f'the DAgger iteration must be >= 1 (0 marks expert '
                             f'demonstrations), got {self.iteration}')
        if self.window_ticks < 1:
            raise ValueError(f'window_ticks must be >= 1, got {self.window_ticks}')
        if self.workers < 1:
            raise ValueError(f'workers must be >= 1, got {self.workers}')
        if not Path(self.checkpoint).is_dir():
            raise FileNotFoundError(f'--dagger {self.checkpoint}: not a checkpoint directory '
                                    '(expected a LeRobot pretrained_model directory)')
        if self.base_dataset is not None and not (Path(self.base_dataset) / 'meta' /
                                                  'info.json').is_file():
            raise FileNotFoundError(f'--join {self.base_dataset}: not a LeRobot dataset '
                                    '(no meta/info.json)')


@dataclass
class DaggerEpisode:
    """One labelled episode and how it went."""

    seed: int
    episode: Episode
    success: bool
    failure_phase: str | None
    expert_ticks: int


@dataclass
class DaggerStats:
    """What an iteration collected."""

    episodes: list[dict] = field(default_factory=list)
    frames: int = 0
    seconds: float = 0.0

    @property
    def align_rate(self) -> float:
        return float(np.mean([e['success'] for e in self.episodes])) if self.episodes else 0.0

    @property
    def expert_share(self) -> float:
        ticks = sum(e['frames'] for e in self.episodes)
        return sum(e['expert_ticks'] for e in self.episodes) / ticks if ticks else 0.0

    def summary(self, config: DaggerConfig) -> dict:
        failures: dict[str, int] = {}
        for e in self.episodes:
            if e['failure_phase']:
                failures[e['failure_phase']] = failures.get(e['failure_phase'], 0) + 1
        return {'iteration': config.iteration, 'checkpoint': str(config.checkpoint),
                'beta': config.beta, 'mode': config.mode, 'episodes': len(self.episodes),
                'seeds': [config.seed, config.seed + config.episodes - 1],
                'align_rate': self.align_rate, 'expert_share': self.expert_share,
                'failures': failures, 'frames': self.frames,
                'seconds': round(self.seconds, 1)}


class DaggerWorker:
    """Simulation, expert and policy of one process; :meth:`episode` runs one seed."""

    def __init__(self, config: DaggerConfig, sim_config, cameras: tuple[str, ...]) -> None:
        from act_ros.core.contract import load_contract
        from act_ros.sim import PortPickAlignEnv, ScriptedExpert
        from act_ros.training.evaluation.rollout import SimPolicy

        self.config = config
        contract = load_contract(config.contract_path)
        self.cameras = cameras
        self.env = PortPickAlignEnv(sim_config, contract)
        self.expert = ScriptedExpert(self.env)
        self.policy = SimPolicy(config.checkpoint, mode=config.mode, device=config.device,
                                contract=contract)

    def episode(self, seed: int) -> DaggerEpisode:
        from act_ros.core.object_state import ENVIRONMENT_STATE_DIM
        from act_ros.data.rollout import sim_extras

        cfg, env, expert, policy = self.config, self.env, self.expert, self.policy
        rng = np.random.default_rng([seed, cfg.iteration, 0xDA66])
        obs = env.reset(seed=seed)
        expert.reset(obs)
        policy.reset(obs)
        steps = int(env.config.episode_steps)
        images = {name: np.empty((steps, *np.shape(obs.images[name])), dtype=np.uint8)
                  for name in self.cameras}
        states = np.empty((steps, len(obs.joint_positions)), dtype=np.float32)
        labels = np.empty_like(states)
        poses = np.empty((steps, len(OBJECT_POSE_NAMES)), dtype=np.float32)
        env_state = np.empty((steps, ENVIRONMENT_STATE_DIM), dtype=np.float32)
        expert_drives = False
        expert_ticks = 0
        t = 0
        while not env.done:
            label = np.asarray(expert.act(obs), dtype=np.float64)
            command = policy.act(obs)   # every tick: the policy's queue stays its own
            if t % cfg.window_ticks == 0:
                expert_drives = bool(cfg.beta > 0.0 and rng.random() < cfg.beta)
            expert_ticks += expert_drives
            for name in self.cameras:
                images[name][t] = obs.images[name]
            states[t] = obs.joint_positions
            labels[t] = label
            poses[t, :4], poses[t, 4:] = obs.box_pose, obs.pad_pose
            env_state[t] = obs.environment_state
            obs = env.step(label if expert_drives else command)
            t += 1
        result = env.evaluate()
        extras = sim_extras(poses[:t], env_state[:t], dagger_iteration=cfg.iteration,
                            expert_share=expert_ticks / max(t, 1))
        episode = Episode(images={n: f[:t] for n, f in images.items()}, state=states[:t],
                          action=labels[:t], seed=seed, extras=extras)
        return DaggerEpisode(seed, episode, result.success, result.failure_phase, expert_ticks)

    def close(self) -> None:
        self.policy.close()
        self.env.close()


_worker: DaggerWorker | None = None
_worker_error: str | None = None


def _init_worker(config: DaggerConfig, sim_config, cameras: tuple[str, ...]) -> None:
    global _worker, _worker_error
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()  # a killed driver leaves no worker running episodes
    try:
        import torch

        torch.set_num_threads(1)
        _worker = DaggerWorker(config, sim_config, cameras)
    except Exception as exc:  # noqa: BLE001 - reported by the first task
        _worker_error = f'{type(exc).__name__}: {exc}'


def _worker_episode(seed: int) -> DaggerEpisode:
    if _worker_error is not None:
        raise RuntimeError(f'a DAgger worker could not start: {_worker_error}')
    assert _worker is not None
    return _worker.episode(seed)


def _episodes(config: DaggerConfig, sim_config, cameras) -> Iterator[DaggerEpisode]:
    seeds = range(config.seed, config.seed + config.episodes)
    if config.workers == 1:
        worker = DaggerWorker(config, sim_config, cameras)
        try:
            for seed in seeds:
                yield worker.episode(seed)
        finally:
            worker.close()
        return
    ctx = multiprocessing.get_context('spawn')
    pool = ctx.Pool(config.workers, initializer=_init_worker,
                    initargs=(config, sim_config, cameras))
    try:
        pending = [pool.apply_async(_worker_episode, (seed,)) for seed in seeds]
        for job in pending:
            try:
                yield job.get(timeout=EPISODE_TIMEOUT_S)
            except multiprocessing.TimeoutError:
                raise RuntimeError(f'a DAgger worker gave no episode within '
                                   f'{EPISODE_TIMEOUT_S:.0f} s; stopped, nothing was written'
                                   ) from None
    finally:
        pool.terminate()
        pool.join()


def render_size_of(checkpoint: Path, base: Path | None) -> tuple[int, int]:
    """Image size to record at: the base dataset's (episodes must match it), else the size
    the checkpoint was trained on."""
    from act_ros.core.contract import load_contract
    from act_ros.training.evaluation.rollout import checkpoint_render_size

    if base is not None:
        height, width, _ = frame_layout(Path(base), load_contract().cameras[0].feature)
        return height, width
    size = checkpoint_render_size(Path(checkpoint))
    if size is None:
        raise ValueError(f'{checkpoint}: no training_info.json with the image size it was '
                         'trained on; give --join with the dataset it was trained on')
    return size


def collect_dagger(config: DaggerConfig, *, progress: bool = True) -> DaggerStats:
    """Run one iteration and write the dataset (see the module docstring)."""
    from tqdm import tqdm

    from act_ros.core.contract import load_contract
    from act_ros.data.collect import CollectConfig, make_sim_config
    from act_ros.data.episode import DatasetLayout
    from act_ros.data.rollout import SIM_EXTRA_FEATURES
    from act_ros.data.writer import AtomicDatasetWriter, check_output

    contract = load_contract(config.contract_path)
    check_output(config.output, config.overwrite)
    height, width = render_size_of(config.checkpoint, config.base_dataset)
    layout = DatasetLayout(contract=contract, image_height=height, image_width=width,
                           use_video=False, extra_features=SIM_EXTRA_FEATURES)
    sim_config = make_sim_config(
        CollectConfig(output=config.output, episodes=config.episodes, image_height=height,
                      image_width=width, contract_path=config.contract_path,
                      episode_steps=config.episode_steps,
                      sim_config_path=config.sim_config_path), contract.fps)
    stats = DaggerStats()
    start = time.perf_counter()
    config.output.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f'.{config.output.name}.dagger-',
                                    dir=config.output.parent))
    try:
        new = scratch / 'new'
        bar = tqdm(total=config.episodes, unit='ep', disable=not progress, dynamic_ncols=True,
                   desc=f'DAgger iteration {config.iteration}')
        episodes = _episodes(config, sim_config, contract.camera_names)
        try:
            with AtomicDatasetWriter(layout, new) as writer:
                for item in episodes:
                    writer.add_episode(item.episode)
                    stats.frames += item.episode.length
                    stats.episodes.append({'seed': item.seed, 'success': item.success,
                                           'failure_phase': item.failure_phase,
                                           'expert_ticks': item.expert_ticks,
                                           'frames': item.episode.length})
                    bar.update(1)
                    bar.set_postfix(aligned=f'{stats.align_rate:.2f}')
                stats.seconds = time.perf_counter() - start
                writer.card = _card(config, stats)
        finally:
            bar.close()
            episodes.close()
        log = [stats.summary(config)]
        if config.base_dataset is not None:
            built = joined(Path(config.base_dataset), new, scratch, _card(config, stats))
            previous = Path(config.base_dataset) / DAGGER_LOG
            if previous.is_file():
                log = [json.loads(line) for line in previous.read_text().splitlines()
                       if line.strip()] + log
        else:
            built = new
        (built / DAGGER_LOG).write_text(''.join(json.dumps(entry) + '\n' for entry in log))
        move_into_place(built, config.output, config.overwrite, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    stats.seconds = time.perf_counter() - start
    return stats


def _card(config: DaggerConfig, stats: DaggerStats) -> str:
    s = stats.summary(config)
    return (f'## DAgger iteration {config.iteration}\n\n'
            f'- {s["episodes"]} episodes (seeds {s["seeds"][0]}..{s["seeds"][1]}) driven by '
            f'`{config.checkpoint.name}` ({config.mode} execution) with beta {config.beta}: the '
            f'expert drove {s["expert_share"]:.0%} of the ticks, labelled every frame.\n'
            f'- Aligned: {s["align_rate"]:.2f}; failures {s["failures"]}.\n'
            f'- Frames stored as lossless PNG images; {stats.frames} frames.\n')
