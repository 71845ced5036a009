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
    images: dict[str, list[np.ndarray]] = {name: [] for name in camera_names}
    states: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    while not env.done:
        action = np.asarray(expert.act(obs), dtype=np.float64)
        for name in camera_names:
            images[name].append(np.array(obs.images[name], dtype=np.uint8))  # copy
        states.append(np.array(obs.joint_positions, dtype=np.float64))
        actions.append(action)
        obs = env.step(action)
    result = env.evaluate()
    detail = _describe(result)
    if not result.success or not states:
        return RolloutResult(seed=seed, success=False, frames=len(states), episode=None,
                             detail=detail)
    episode = Episode(images={name: np.stack(frames) for name, frames in images.items()},
                      state=np.stack(states).astype(np.float32),
                      action=np.stack(actions).astype(np.float32), seed=seed)
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


def init_worker(sim_config, camera_names: tuple[str, ...]) -> None:
    """Pool initializer: build one simulation per worker process, reused across episodes.

    Workers ignore SIGINT: Ctrl-C is handled once, in the main process, which then
    terminates the pool.
    """
    global _worker_env, _worker_cameras
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from act_ros.sim import PortPickAlignEnv

    _worker_env = PortPickAlignEnv(sim_config)
    _worker_cameras = tuple(camera_names)


def worker_episode(seed: int) -> RolloutResult:
    """Pool task: one expert episode in this worker's simulation."""
    if _worker_env is None:
        raise RuntimeError('worker_episode() called in a process where init_worker() did not run')
    return run_expert_episode(_worker_env, seed, _worker_cameras)
