"""Run the scripted expert in the simulation and return the episode as arrays.

Imported by collection worker processes: it needs MuJoCo and numpy only, never torch or
the LeRobot dataset stack.
"""

from __future__ import annotations

from dataclasses import dataclass
import signal

import numpy as np

from act_ros.data.episode import Episode


@dataclass(frozen=True)
class RolloutResult:
    """Outcome of one expert episode; ``episode`` is ``None`` when it failed (not recorded)."""

    seed: int
    success: bool
    frames: int
    episode: Episode | None
    detail: str = ''


def run_expert_episode(env, seed: int, camera_names: tuple[str, ...]) -> RolloutResult:
    """Reset ``env`` with ``seed``, let the scripted expert act until done, and record it.

    Frame t holds the images and joint positions observed at step t and the action
    commanded at step t (in response to that observation).
    """
    from act_ros.sim import ScriptedExpert

    obs = env.reset(seed=seed)
    expert = ScriptedExpert(env)
    expert.reset(obs)
    steps = int(env.config.episode_steps)
    # Filled in place: a 10 s episode at 480x640 is ~550 MB of frames, held once.
    images = {name: np.empty((steps, *np.shape(obs.images[name])), dtype=np.uint8)
              for name in camera_names}
    states = np.empty((steps, len(obs.joint_positions)), dtype=np.float32)
    actions = np.empty_like(states)
    t = 0
    while not env.done:
        if t >= steps:
            raise RuntimeError(f'the episode ran past episode_steps={steps}')
        action = np.asarray(expert.act(obs), dtype=np.float64)
        for name in camera_names:
            images[name][t] = obs.images[name]
        states[t] = obs.joint_positions
        actions[t] = action
        obs = env.step(action)
        t += 1
    result = env.evaluate()
    detail = _describe(result)
    if not result.success or t == 0:
        return RolloutResult(seed=seed, success=False, frames=t, episode=None, detail=detail)
    episode = Episode(images={name: frames[:t] for name, frames in images.items()},
                      state=states[:t], action=actions[:t], seed=seed)
    return RolloutResult(seed=seed, success=True, frames=episode.length, episode=episode,
                         detail=detail)


def _describe(result) -> str:
    """A short text of why an episode ended as it did (errors, release, resting)."""
    return (f'position error {result.position_error_m * 100:.1f} cm, yaw error '
            f'{result.yaw_error_deg:.1f} deg, on pad {result.box_on_pad}, released '
            f'{result.released}, still {result.box_still}')


# --- worker process side -------------------------------------------------------------

_worker_env = None
_worker_cameras: tuple[str, ...] = ()
_worker_error: str | None = None


def init_worker(sim_config, camera_names: tuple[str, ...]) -> None:
    """Pool initializer: build one simulation per worker process, reused across episodes.

    Workers ignore SIGINT: Ctrl-C is handled once, in the main process, which then
    terminates the pool. A simulation that cannot be built is remembered and reported by
    the first task (an initializer that raises would make the pool respawn the worker
    forever, and the main process would wait forever).
    """
    global _worker_env, _worker_cameras, _worker_error
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_cameras = tuple(camera_names)
    try:
        from act_ros.sim import PortPickAlignEnv

        _worker_env = PortPickAlignEnv(sim_config)
    except Exception as exc:  # noqa: BLE001 - reported to the main process by worker_episode
        _worker_error = f'{type(exc).__name__}: {exc}'


def worker_episode(seed: int) -> RolloutResult:
    """Pool task: one expert episode in this worker's simulation."""
    if _worker_error is not None:
        raise RuntimeError(f'the simulation could not be built in a worker process: '
                           f'{_worker_error}')
    if _worker_env is None:
        raise RuntimeError('worker_episode() called in a process where init_worker() did not run')
    return run_expert_episode(_worker_env, seed, _worker_cameras)
