"""Run the scripted expert in the simulation and return the episode as arrays.

Imported by collection worker processes: it needs MuJoCo and numpy only, never torch or
the LeRobot dataset stack.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from act_ros.core.object_state import (
    ENVIRONMENT_STATE_DIM,
    ENVIRONMENT_STATE_FEATURE,
    ENVIRONMENT_STATE_NAMES,
)
from act_ros.core.processes import die_with_parent
from act_ros.data.episode import (
    EPISODE_SOURCE_FEATURE,
    EPISODE_SOURCE_NAMES,
    OBJECT_POSE_NAMES,
    OBJECT_POSES_FEATURE,
    Episode,
)

# The per-frame features every simulated episode carries beside state, action and cameras.
SIM_EXTRA_FEATURES = ((OBJECT_POSES_FEATURE, OBJECT_POSE_NAMES),
                      (ENVIRONMENT_STATE_FEATURE, ENVIRONMENT_STATE_NAMES),
                      (EPISODE_SOURCE_FEATURE, EPISODE_SOURCE_NAMES))


@dataclass(frozen=True)
class RolloutResult:
    """Outcome of one expert episode; ``episode`` is ``None`` when it failed (not recorded)."""

    seed: int
    success: bool
    frames: int
    episode: Episode | None
    detail: str = ''


# Relative noise per arm joint (contract order without the gripper): the wrist roll sets
# the grasp yaw, the error a learned policy makes most, so it is explored most.
NOISE_JOINT_WEIGHTS = np.array([1.0, 1.0, 1.0, 1.0, 3.0])
NOISE_CORRELATION_TICKS = 15.0


class ExplorationNoise:
    """Smooth random offsets added to the expert's executed arm targets (DART-style).

    The recorded action stays the expert's own: the dataset then holds states off the
    expert's path (and the camera images of them) labelled with the way back to it, which
    a policy needs once its own small errors take it there. Without it, the joint state
    alone predicts the expert's next actions so well that a policy learns to continue the
    arm's motion instead of looking at the box and pad. An Ornstein-Uhlenbeck process per
    joint, standard deviation ``noise_rad`` x ``NOISE_JOINT_WEIGHTS``, scaled by the
    expert's ``noise_gain`` (full in transit, fading to none as the fingers line up over
    the box or the target, none while the gripper closes and releases).

    The expert commands each tick relative to the *measured* arm, so an offset added every
    tick would be integrated into a drift; what is added is the offset's change since the
    previous tick: without the expert's correction the arm would be displaced by the
    offset itself, a bounded excursion that the expert then steers back from.
    """

    def __init__(self, noise_rad: float, seed: int) -> None:
        if noise_rad < 0:
            raise ValueError(f'noise_rad must be >= 0, got {noise_rad}')
        self.scale = noise_rad * NOISE_JOINT_WEIGHTS
        self.rho = float(np.exp(-1.0 / NOISE_CORRELATION_TICKS))
        self.rng = np.random.default_rng([seed, 0xDA27])
        self.state = self.rng.standard_normal(len(self.scale))
        self._applied = np.zeros(len(self.scale))

    def offset(self, gain: float) -> np.ndarray:
        """What to add to this tick's arm targets (radians): the change of the displacement
        ``gain`` x (the process), ``gain`` in [0, 1]."""
        self.state = self.rho * self.state + np.sqrt(1 - self.rho ** 2) * \
            self.rng.standard_normal(len(self.scale))
        displacement = float(np.clip(gain, 0.0, 1.0)) * self.scale * self.state
        change = displacement - self._applied
        self._applied = displacement
        return change


def run_expert_episode(env, seed: int, camera_names: tuple[str, ...], *,
                       noise_rad: float = 0.0) -> RolloutResult:
    """Reset ``env`` with ``seed``, let the scripted expert act until done, and record it.

    Frame t holds the images and joint positions observed at step t and the action
    commanded at step t (in response to that observation). With ``noise_rad`` > 0 the
    arm executes the expert's targets plus :class:`ExplorationNoise`; the recorded
    action is the expert's target.
    """
    from act_ros.sim import ScriptedExpert

    obs = env.reset(seed=seed)
    expert = ScriptedExpert(env)
    expert.reset(obs)
    noise = ExplorationNoise(noise_rad, seed) if noise_rad > 0 else None
    steps = int(env.config.episode_steps)
    # Filled in place: a 10 s episode at 480x640 is ~550 MB of frames, held once.
    images = {name: np.empty((steps, *np.shape(obs.images[name])), dtype=np.uint8)
              for name in camera_names}
    states = np.empty((steps, len(obs.joint_positions)), dtype=np.float32)
    actions = np.empty_like(states)
    poses = np.empty((steps, len(OBJECT_POSE_NAMES)), dtype=np.float32)
    env_state = np.empty((steps, ENVIRONMENT_STATE_DIM), dtype=np.float32)
    t = 0
    while not env.done:
        if t >= steps:
            raise RuntimeError(f'the episode ran past episode_steps={steps}')
        action = np.asarray(expert.act(obs), dtype=np.float64)
        for name in camera_names:
            images[name][t] = obs.images[name]
        states[t] = obs.joint_positions
        actions[t] = action
        poses[t, :4], poses[t, 4:] = obs.box_pose, obs.pad_pose
        env_state[t] = obs.environment_state
        if noise is not None:
            action = action.copy()
            action[env.arm_index] += noise.offset(expert.noise_gain)
        obs = env.step(action)
        t += 1
    result = env.evaluate()
    detail = _describe(result)
    if not result.success or t == 0:
        return RolloutResult(seed=seed, success=False, frames=t, episode=None, detail=detail)
    episode = Episode(images={name: frames[:t] for name, frames in images.items()},
                      state=states[:t], action=actions[:t], seed=seed,
                      extras=sim_extras(poses[:t], env_state[:t], dagger_iteration=0,
                                        expert_share=1.0))
    return RolloutResult(seed=seed, success=True, frames=episode.length, episode=episode,
                         detail=detail)


def sim_extras(poses: np.ndarray, env_state: np.ndarray, *, dagger_iteration: int,
               expert_share: float) -> dict[str, np.ndarray]:
    """The extras of a simulated episode (``SIM_EXTRA_FEATURES``) from its per-frame poses."""
    source = np.tile(np.array([dagger_iteration, expert_share], dtype=np.float32),
                     (len(poses), 1))
    return {OBJECT_POSES_FEATURE: poses, ENVIRONMENT_STATE_FEATURE: env_state,
            EPISODE_SOURCE_FEATURE: source}


def _describe(result) -> str:
    """A short text of why an episode ended as it did (errors, release, resting)."""
    return (f'position error {result.position_error_m * 100:.1f} cm, yaw error '
            f'{result.yaw_error_deg:.1f} deg, on pad {result.box_on_pad}, released '
            f'{result.released}, still {result.box_still}')


# --- worker process side -------------------------------------------------------------
# One simulation per worker process, reused across episodes: ``init_worker(make_env,
# run_episode, camera_names, episode_kwargs)`` builds it with ``make_env()``,
# ``worker_episode(seed)`` plays one with ``run_episode(env, seed, camera_names,
# **episode_kwargs)``. Both are picklable (top-level functions, partials of
# them), so one pool serves every task (act_ros.data.collect).

_worker_env = None
_worker_run: Callable[..., RolloutResult] | None = None
_worker_cameras: tuple[str, ...] = ()
_worker_kwargs: dict[str, Any] = {}
_worker_error: str | None = None


def port_pick_align_env(sim_config):
    """The package's simulation (imported here: in a worker, a failure is reported)."""
    from act_ros.sim import PortPickAlignEnv

    return PortPickAlignEnv(sim_config)


def init_worker(make_env: Callable[[], Any], run_episode: Callable[..., RolloutResult],
                camera_names: tuple[str, ...], episode_kwargs: dict[str, Any] | None = None,
                *, handle_sigint: bool = True) -> None:
    """Pool initializer: build this worker's simulation, reused across episodes.

    Workers ignore SIGINT (``handle_sigint``; off when the collection runs in the main
    process): Ctrl-C is handled once, in the main process, which then terminates the pool.
    A simulation that cannot be built is remembered and reported by the first task (an
    initializer that raises would make the pool respawn the worker forever, and the main
    process would wait forever).
    """
    global _worker_env, _worker_run, _worker_cameras, _worker_kwargs, _worker_error
    if handle_sigint:  # a pool's worker: Ctrl-C is the main process's; its death is ours too
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent()
    _worker_run = run_episode
    _worker_cameras = tuple(camera_names)
    _worker_kwargs = dict(episode_kwargs or {})
    try:
        _worker_env = make_env()
    except Exception as exc:  # noqa: BLE001 - reported to the main process by worker_episode
        _worker_error = f'{type(exc).__name__}: {exc}'


def worker_episode(seed: int) -> RolloutResult:
    """Pool task: one expert episode in this worker's simulation."""
    if _worker_error is not None:
        raise RuntimeError(f'the simulation could not be built in a worker process: '
                           f'{_worker_error}')
    if _worker_env is None or _worker_run is None:
        raise RuntimeError('worker_episode() called in a process where init_worker() did not run')
    return _worker_run(_worker_env, seed, _worker_cameras, **_worker_kwargs)


def close_worker() -> None:
    """Release this process's simulation (its GL context) now."""
    global _worker_env
    if _worker_env is not None:
        _worker_env.close()
        _worker_env = None
