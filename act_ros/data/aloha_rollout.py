"""Scripted-expert episodes of the gym-aloha tasks, as arrays for a LeRobot dataset.

An episode is first planned in the end-effector task and replayed in the joint-space task
without a camera (a second or so); only a replay that succeeds is replayed again with the
cameras rendered (the same episode: the simulation is deterministic), so failed attempts
cost no rendering. Imported by collection worker processes: MuJoCo, dm_control and numpy,
never torch or the dataset stack.
"""

from __future__ import annotations

import numpy as np

from act_ros.data.episode import EPISODE_SOURCE_FEATURE, EPISODE_SOURCE_NAMES, Episode
from act_ros.data.rollout import RolloutResult

# gym-aloha's privileged object state (its ``env_state``: the cube's free joint, position and
# quaternion w x y z, world frame) recorded beside each frame. Not a policy input (LeRobot's
# evaluation of the task gives the policy the top camera and the joints only).
ALOHA_ENV_STATE_FEATURE = 'sim.env_state'
ALOHA_ENV_STATE_NAMES = ('cube_x', 'cube_y', 'cube_z', 'cube_qw', 'cube_qx', 'cube_qy', 'cube_qz')
ALOHA_EXTRA_FEATURES = ((ALOHA_ENV_STATE_FEATURE, ALOHA_ENV_STATE_NAMES),
                        (EPISODE_SOURCE_FEATURE, EPISODE_SOURCE_NAMES))


def run_aloha_expert_episode(env, seed: int, camera_names: tuple[str, ...]) -> RolloutResult:
    """Plan and replay episode ``seed`` in ``env`` (an :class:`~act_ros.sim.aloha.env.AlohaEnv`
    that does not stop at success); record it when the joint-space replay succeeds.

    Frame t holds the images and joints observed at step t and the joint targets sent at t.
    """
    from act_ros.sim.aloha.env import ALOHA_JOINTS
    from act_ros.sim.aloha.expert import end_effector_rollout, replay

    if env.terminate_on_success:
        raise ValueError('demonstrations keep whole episodes: build the AlohaEnv with '
                         'terminate_on_success=False')
    trajectory = end_effector_rollout(env.spec.name, seed, env.episode_steps)
    result = replay(env, trajectory)  # no camera read: nothing rendered
    detail = (f'end-effector plan reward {trajectory.ee_max_reward:g}, joint-space replay '
              f'reward {result.max_reward:g} (4 = transferred)')
    if not result.success:
        return RolloutResult(seed=seed, success=False, frames=result.steps, episode=None,
                             detail=detail)
    steps = env.episode_steps
    images = {name: np.empty((steps, *env.image_size, 3), dtype=np.uint8) for name in camera_names}
    states = np.empty((steps, len(ALOHA_JOINTS)), dtype=np.float32)
    actions = np.empty_like(states)
    env_state = np.empty((steps, len(ALOHA_ENV_STATE_NAMES)), dtype=np.float32)

    def record(obs, action) -> None:
        t = obs.step_index
        for name in camera_names:
            images[name][t] = obs.images[name]
        states[t] = obs.joint_positions
        actions[t] = action
        env_state[t] = obs.env_state[:len(ALOHA_ENV_STATE_NAMES)]

    replayed = replay(env, trajectory, on_step=record)
    t = replayed.steps
    if replayed.success != result.success or replayed.max_reward != result.max_reward:
        raise RuntimeError(f'seed {seed}: the rendered replay ended otherwise than the first '
                           f'(reward {replayed.max_reward:g} against {result.max_reward:g}); '
                           'the simulation is not deterministic here')
    source = np.tile(np.array([0, 1.0], dtype=np.float32), (t, 1))
    episode = Episode(images={name: frames[:t] for name, frames in images.items()},
                      state=states[:t], action=actions[:t], seed=seed,
                      extras={ALOHA_ENV_STATE_FEATURE: env_state[:t],
                              EPISODE_SOURCE_FEATURE: source})
    return RolloutResult(seed=seed, success=True, frames=t, episode=episode, detail=detail)


def aloha_env(task: str, camera_names: tuple[str, ...], image_size: tuple[int, int],
              episode_steps: int | None):
    """A gym-aloha simulation for collection (the whole episode plays; see
    :func:`act_ros.data.rollout.init_worker`)."""
    from act_ros.sim.aloha.env import AlohaEnv

    return AlohaEnv(task, cameras=camera_names, image_size=image_size,
                    episode_steps=episode_steps, terminate_on_success=False)
