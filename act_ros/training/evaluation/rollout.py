"""Closed-loop episodes of a checkpoint in the MuJoCo simulation, without ROS.

Every tick runs the node's own control step (:class:`~act_ros.core.control.loop.ControlLoop`):
the policy runtime (``execution='sync'``, so results do not depend on the CPU's speed),
the whole-chunk check, the safety chain and the release gate, with the limits, gate and
end-effector source (forward kinematics of the measured joints) of ``config/act.yaml``.
The simulation's observations reach it through the same input store the node's
subscriptions fill, stamped with simulated time, and the pad position arrives as a pose
stream, as ``sim_bridge`` publishes it to the node. A checkpoint that takes the object poses
(``observation.environment_state``) gets ``SimObservation.environment_state`` through the
store as one more required input; one without cameras gets no rendering. A tick without a command (rejected,
or no chunk yet) sends nothing: the arm keeps the previous target, as a position
controller does when no command arrives.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.contract import Contract, load_contract
from act_ros.core.control.loop import SafetySettings
from act_ros.core.control.seams import SeamMeter, SeamSamples
from act_ros.sim.config import GRIPPER_EMPTY_EFFORT_N

log = logging.getLogger(__name__)

EVAL_MODES = ('chunk', 'ensemble', 'blend')
# n_action_steps per mode: the ACT paper's chunk execution and per-tick ensembling; the
# blended handover plays chunks as chunk mode does and crossfades them in (chunk and blend
# modes: the checkpoint's own n_action_steps, as LeRobot's select_action plays it).
MODE_SETTINGS = {'chunk': {}, 'ensemble': {'n_action_steps': 1}, 'blend': {}}


def sim_safety(contract: Contract, path: str | Path | None = None) -> SafetySettings:
    """The node's safety settings (:meth:`SafetySettings.from_node_config`) for a simulated
    arm: the simulation gives the gripper's effort (``SimObservation.joint_efforts``), the
    release gate's evidence of an empty close, unless the file sets its own."""
    return SafetySettings.from_node_config(
        contract, path, gate_defaults={'empty_effort': GRIPPER_EMPTY_EFFORT_N})


@dataclass
class ModeResult:
    """Closed-loop results of one execution mode."""

    mode: str
    summary: dict[str, float | int]
    episodes: list[dict[str, Any]] = field(default_factory=list)
    suppressed_releases: int = 0
    rejected_commands: int = 0
    seconds: float = 0.0
    # The precision the policy ran in, as settled (act_ros.core.inference.precision.PrecisionCheck
    # values: precision, precision.requested, the auto check's figures).
    precision: dict[str, Any] = field(default_factory=dict)
    task: str = 'port_pick_align'  # act_ros.sim.tasks.SIM_TASKS
    # The seams of the commands sent (act_ros.core.control.seams), over every episode.
    seam_samples: SeamSamples | None = None

    def to_dict(self, *, samples: bool = False) -> dict[str, Any]:
        """The result file's record of the mode; ``samples``: with the seams' samples too
        (``seam_samples``, for :func:`merge_mode_results`; not for a file)."""
        seams = self.seam_samples
        return {'mode': self.mode, 'task': self.task, **self.summary,
                'suppressed_releases': self.suppressed_releases,
                'rejected_commands': self.rejected_commands, 'seconds': self.seconds,
                **({'precision': self.precision} if self.precision else {}),
                **({'seams': seams.summary()} if seams is not None else {}),
                **({'seam_samples': seams.to_dict()} if samples and seams is not None else {}),
                'episodes': self.episodes}


def merge_mode_results(mode: str, parts: list[dict[str, Any] | None], *,
                       with_episodes: bool = False) -> dict[str, Any]:
    """One mode's closed-loop result from the processes' parts (``ModeResult.to_dict()``
    each, ``None`` for a process without episodes), in rank order, so in seed order: the
    summary over all episodes, counters summed, ``seconds`` of the slowest process, and the
    seams over every process's commands when each part carries its ``seam_samples``
    (``ModeResult.to_dict(samples=True)``). ``with_episodes`` keeps the per-episode
    records (``episodes``). Used by data-parallel training and by ``act-ros evaluate
    --workers``."""
    from act_ros.sim.tasks import DEFAULT_TASK, sim_task

    parts = [p for p in parts if p is not None]
    if not parts:
        raise ValueError(f'closed loop ({mode}): no process ran an episode')
    task = sim_task(parts[0].get('task', DEFAULT_TASK))
    if task.is_aloha:
        from act_ros.sim.aloha.env import AlohaEpisodeResult as Result
    else:
        from act_ros.sim import EpisodeResult as Result
    episodes = [Result(**e) for p in parts for e in p['episodes']]
    seams = {}
    if all('seam_samples' in p for p in parts):
        seams = {'seams': SeamSamples.merge([SeamSamples.from_dict(p['seam_samples'])
                                             for p in parts]).summary()}
    return {'mode': mode, 'task': task.name, **summarize_task_results(task, episodes),
            'suppressed_releases': sum(p['suppressed_releases'] for p in parts),
            'rejected_commands': sum(p['rejected_commands'] for p in parts),
            'seconds': max(p['seconds'] for p in parts),
            **({'precision': parts[0]['precision']} if 'precision' in parts[0] else {}),
            **seams,
            **({'episodes': [e for p in parts for e in p['episodes']]} if with_episodes else {})}


def checkpoint_render_size(checkpoint: str | Path) -> tuple[int, int] | None:
    """Image size the checkpoint's training data was recorded at (``training_info.json``).

    ``checkpoint``: a directory or a Hub id (:func:`~act_ros.core.inference.hub.resolve_checkpoint`).
    """
    from act_ros.core.inference.hub import resolve_checkpoint

    info = resolve_checkpoint(checkpoint).path / 'training_info.json'
    if not info.is_file():
        return None
    size = json.loads(info.read_text()).get('dataset_image_size')
    return (int(size[0]), int(size[1])) if size else None


def make_sim_config(checkpoint: str | Path, render_size: tuple[int, int] | None = None,
                    sim_config_path: str | Path | None = None,
                    episode_steps: int | None = None) -> Any:
    """``config/sim.yaml`` rendered at ``render_size``, by default at the size the
    checkpoint's training images were recorded (the policy then sees what it was trained on).
    ``episode_steps`` shortens episodes (quick checks; the task needs the full length)."""
    from act_ros.sim import SimConfig

    size = render_size or checkpoint_render_size(checkpoint)
    overrides: dict[str, Any] = {'camera_height': size[0], 'camera_width': size[1]} if size else {}
    if episode_steps is not None:
        overrides['episode_steps'] = episode_steps
    return SimConfig.from_yaml(sim_config_path, **overrides)


class SimPolicy:
    """A checkpoint driving the simulation tick by tick through the node's control step.

    :meth:`act` hands the simulation's observation to the same input store the node's
    subscriptions fill (stamped with simulated time, so every input is fresh), runs
    :class:`~act_ros.core.control.loop.ControlLoop` and returns the joint targets to send: the
    new command, or the previous one when the tick produced none (a position controller
    keeps its last target). Used by the closed-loop evaluator and by DAgger collection.
    """

    def __init__(self, checkpoint: str | Path, *, mode: str = 'chunk', device: str = 'cpu',
                 contract: Contract | None = None, safety: SafetySettings | None = None,
                 ensemble_coeff: float = 0.01, backend: str = 'torch',
                 latency_ticks: int | None = None, precision: str = 'fp32',
                 precision_tolerance: float | None = None,
                 n_action_steps: int | None = None, blend_ticks: int | None = None) -> None:
        from act_ros.core.control.inputs import ENVIRONMENT_STATE, InputStore
        from act_ros.core.control.loop import build_control_loop, environment_state_from_stream
        from act_ros.core.inference.runtime import RuntimeConfig

        if mode not in EVAL_MODES:
            raise ValueError(f"unknown mode '{mode}', expected one of {EVAL_MODES}")
        steps = dict(MODE_SETTINGS[mode])
        if n_action_steps is not None:
            if mode == 'ensemble':
                raise ValueError('n_action_steps applies to chunk and blend modes (ensemble '
                                 'mode queries every tick)')
            steps['n_action_steps'] = n_action_steps
        if blend_ticks is not None:
            if mode != 'blend':
                raise ValueError(f'blend_ticks applies to blend mode, got mode {mode!r}')
            steps['blend_ticks'] = blend_ticks
        self.contract = contract or load_contract()
        safety = safety or sim_safety(self.contract)
        timing = (dict(execution='sync') if latency_ticks is None else
                  dict(execution='simulated', simulated_latency_ticks=latency_ticks))
        # The gates need the end effectors (forward kinematics) and the pad; a task without
        # a place-on-pad step runs with the gate off and needs neither.
        self.loop = build_control_loop(
            RuntimeConfig(
                model_path=checkpoint, device=device, mode=mode, ensemble_coeff=ensemble_coeff,
                contract=self.contract, warmup=False, backend=backend, **timing,
                precision=precision, **({} if precision_tolerance is None else
                                        dict(precision_tolerance=precision_tolerance)),
                **steps),
            self.contract, safety, environment_state=environment_state_from_stream(ENVIRONMENT_STATE),
            period_s=1.0 / self.contract.fps,
            gate_off=lambda why: log.warning(f'release gate off: {why}'))
        self.runtime = self.loop.runtime
        self.cameras = self.runtime.cameras  # the checkpoint's (maybe none)
        self.takes_poses = self.loop.takes_environment_state
        self.gated = bool(self.loop.gates)
        self.store = InputStore(self.loop.required_inputs, safety.max_obs_age_s)
        self.period_s = 1.0 / self.contract.fps
        self.command: np.ndarray | None = None
        self.tick = 0
        # The images handed to the runtime on the last tick that read them (a tick whose
        # action comes from the queue gets these again: a simulation that renders on
        # demand then renders only what the model sees).
        self._images: dict[str, np.ndarray] = {}
        self.images_read = 0

    @property
    def counters(self):
        """The control step's :class:`~act_ros.core.control.loop.ControlCounters`."""
        return self.loop.counters

    @property
    def seams(self) -> SeamMeter:
        """The seams of the commands this policy sent (every episode since it was made)."""
        return self.loop.seams

    def reset(self, obs: Any) -> None:
        """Start an episode at observation ``obs`` (the arm holds where it is until the
        first command)."""
        self.loop.reset()
        self.store.clear()
        self.command = np.asarray(obs.joint_positions, dtype=np.float64).copy()
        self.tick = 0
        self._images = {}

    def act(self, obs: Any) -> np.ndarray:
        """Joint targets to send for ``obs`` (a :class:`~act_ros.sim.env.SimObservation`)."""
        from act_ros.core.control.inputs import (
            ENVIRONMENT_STATE,
            JOINT_EFFORTS,
            JOINT_STATES,
            PAD_POSE,
            image_stream,
        )

        if self.command is None:
            raise RuntimeError('SimPolicy.act() before reset()')
        now = self.tick * self.period_s  # simulated time: every input is fresh
        store = self.store
        store.put(JOINT_EFFORTS, getattr(obs, 'joint_efforts', None), now, now)
        store.put(JOINT_STATES, np.asarray(obs.joint_positions, dtype=np.float64), now, now)
        fresh = self.runtime.will_predict() or not self._images
        for cam in self.cameras:
            if fresh:
                self._images[cam] = obs.images[cam]
                self.images_read += 1
            store.put(image_stream(cam), self._images[cam], now, now)
        if self.gated:
            store.put(PAD_POSE, np.asarray(obs.pad_pose, dtype=np.float64)[:3], now, now)
        if self.takes_poses:
            store.put(ENVIRONMENT_STATE, obs.environment_state, now, now)
        result = self.loop.tick(store.snapshot(now))
        if result.command is not None:
            self.command = result.command
        self.tick += 1
        return self.command

    def close(self) -> None:
        """End the runtime (and its inference child, if any)."""
        self.runtime.close()


def run_policy_episodes(checkpoint: str | Path, *, episodes: int, mode: str = 'chunk',
                        seed: int = 0, device: str = 'cpu', sim_config: Any = None,
                        contract: Contract | None = None, safety: SafetySettings | None = None,
                        ensemble_coeff: float = 0.01,
                        frame_sink: Callable[[int, dict[str, np.ndarray]], None] | None = None,
                        sink_episodes: Sequence[int] = (), env: Any = None,
                        progress: bool = False, backend: str = 'torch',
                        latency_ticks: int | None = None, precision: str = 'fp32',
                        precision_tolerance: float | None = None,
                        n_action_steps: int | None = None,
                        episode_steps: int | None = None,
                        blend_ticks: int | None = None) -> ModeResult:
    """Run ``episodes`` episodes (seeds ``seed``, ``seed + 1``, ...) of one mode and score them.

    ``frame_sink(episode, images)`` receives the camera images of every tick of the
    episodes listed in ``sink_episodes`` (for videos). ``env`` may be given to reuse a
    simulation (its config then wins over ``sim_config``). ``latency_ticks``: run the
    node's background schedule against simulated time, each chunk arriving that many ticks
    after its observation (``None``: synchronous, LeRobot's ``select_action`` semantics).
    ``precision``: fp32, bf16, fp16 or auto (as ``act_node``'s parameter, with
    ``precision_tolerance``: act_ros.core.inference.precision). ``n_action_steps``: actions played
    from each chunk in chunk and blend modes before the next query (``None``: the
    checkpoint's own, as ``MODE_SETTINGS``). ``blend_ticks``: blend mode's crossfade
    (``None``: the runtime's default). The result carries the seams of the commands sent
    (:mod:`act_ros.core.control.seams`).
    """
    import time

    from tqdm import tqdm

    from act_ros.core.inference.hub import resolve_checkpoint

    if episodes < 1:
        raise ValueError(f'episodes must be >= 1, got {episodes}')
    # Resolved once: the task, the policy's runtime and the simulation read this directory.
    checkpoint = resolve_checkpoint(checkpoint)
    task = _checkpoint_task(checkpoint)
    if contract is None and task.is_aloha:
        contract = load_contract(task.contract_path())
    if safety is None and task.is_aloha:
        safety = sim_safety(contract, task.node_params_path())
    policy = SimPolicy(checkpoint, mode=mode, device=device, contract=contract, safety=safety,
                       ensemble_coeff=ensemble_coeff, backend=backend,
                       latency_ticks=latency_ticks, precision=precision,
                       precision_tolerance=precision_tolerance, n_action_steps=n_action_steps,
                       blend_ticks=blend_ticks)
    own_env = env is None
    try:
        if own_env:
            env = make_task_env(task, checkpoint, policy, sim_config=sim_config,
                                render=bool(policy.cameras) or frame_sink is not None,
                                episode_steps=episode_steps)
    except BaseException:
        policy.close()
        raise
    results = []
    start = time.perf_counter()
    try:
        for k in tqdm(range(episodes), desc=f'closed loop ({mode})', unit='episode',
                      disable=not progress, leave=False):
            obs = env.reset(seed=seed + k)
            policy.reset(obs)
            sink = frame_sink if frame_sink is not None and k in sink_episodes else None
            while not env.done:
                if sink is not None:
                    sink(k, obs.images)
                obs = env.step(policy.act(obs))
            results.append(env.evaluate())
    finally:
        policy.close()
        if own_env:
            env.close()
    counters = policy.counters
    check = policy.runtime.precision_check
    return ModeResult(mode=mode, task=task.name, summary=summarize_task_results(task, results),
                      precision=check.as_values() if check is not None else {},
                      episodes=[r.to_dict() for r in results],
                      suppressed_releases=counters.suppressed_releases,
                      rejected_commands=counters.commands_rejected,
                      seconds=time.perf_counter() - start,
                      seam_samples=policy.seams.samples())


def _checkpoint_task(checkpoint: str | Path) -> Any:
    """The :class:`~act_ros.sim.tasks.SimTask` a checkpoint (directory or Hub id) was trained
    for."""
    from act_ros.core.inference.hub import resolve_checkpoint
    from act_ros.sim.tasks import checkpoint_task

    return checkpoint_task(resolve_checkpoint(checkpoint).path)


def make_task_env(task: Any, checkpoint: str | Path, policy: SimPolicy, *,
                  sim_config: Any = None, render: bool = True,
                  episode_steps: int | None = None) -> Any:
    """The simulation of ``task`` for ``policy``: the package's own (``sim_config`` or the
    checkpoint's render size; no rendering when nothing looks at the images), or a
    gym-aloha task at its native camera size, ending at success as LeRobot's evaluation
    ends it, rendering a camera only when the policy reads it (``episode_steps``: shorter
    episodes of it, for checks; the package's task takes them from ``sim_config``)."""
    import dataclasses

    if task.is_aloha:
        from act_ros.sim.aloha.env import AlohaEnv

        return AlohaEnv(task.aloha_task, cameras=policy.cameras, image_size=task.image_size,
                        episode_steps=episode_steps, terminate_on_success=True)
    from act_ros.sim import PortPickAlignEnv

    config = sim_config or make_sim_config(checkpoint)
    if not render:
        config = dataclasses.replace(config, render=False)
    return PortPickAlignEnv(config, policy.contract)


def summarize_task_results(task: Any, results: Sequence[Any]) -> dict[str, Any]:
    """A mode's summary: the task's own figures and ``success_rate`` (every task has it: the
    package's task's ``align_rate``, gym-aloha's reward reaching its maximum)."""
    if task.is_aloha:
        from act_ros.sim.aloha.env import summarize_aloha_results

        return summarize_aloha_results(results)
    from act_ros.sim import summarize_results

    summary = summarize_results(results)
    return {**summary, 'success_rate': summary['align_rate']}
