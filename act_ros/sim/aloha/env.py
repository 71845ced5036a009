"""gym-aloha's bimanual tasks, stepped with joint targets, rendering only what is asked.

:class:`AlohaEnv` builds gym-aloha's own joint-space scene and task class (its reward,
so its success, unchanged) in dm_control, and seeds an episode exactly as gym-aloha's
``AlohaEnv.reset(seed)`` does (``gym_aloha.utils.sample_box_pose(seed)``), so a seed
gives the same object poses here, in LeRobot's ``lerobot-eval --env.type=aloha`` and in
the ROS bridge. gym-aloha's task renders three cameras at 480x640 on every step
(``top``, ``angle``, ``front_close``: about 0.1 s each on 2 cores, against 0.1 ms of
physics); here a step renders nothing, and an observation renders a camera the first time
its image is read (:class:`AlohaObservation`), at the size asked.

Success is gym-aloha's: the task's reward reaches its maximum (4: the left gripper holds
the cube off the table, for transfer cube; the peg touches the pin, for insertion) at
some step; with ``terminate_on_success`` the episode ends there, as LeRobot's evaluation
ends it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np

# gym-aloha's 14 joints in its observation and action order (gym_aloha.constants.JOINTS):
# per arm 6 revolute joints (rad), then the gripper, normalized 0 = closed, 1 = open.
ALOHA_JOINTS = (
    'left_arm_waist', 'left_arm_shoulder', 'left_arm_elbow', 'left_arm_forearm_roll',
    'left_arm_wrist_angle', 'left_arm_wrist_rotate', 'left_arm_gripper',
    'right_arm_waist', 'right_arm_shoulder', 'right_arm_elbow', 'right_arm_forearm_roll',
    'right_arm_wrist_angle', 'right_arm_wrist_rotate', 'right_arm_gripper')
ALOHA_GRIPPERS = ('left_arm_gripper', 'right_arm_gripper')
ALOHA_CAMERAS = ('top', 'angle', 'front_close')
ALOHA_FPS = 50
ALOHA_IMAGE_SIZE = (480, 640)


@dataclass(frozen=True)
class AlohaTaskSpec:
    """One gym-aloha task: LeRobot's settings for it; its scene files and task classes follow
    gym-aloha's naming from ``name`` (``transfer_cube``: ``TransferCubeTask`` in
    ``bimanual_viperx_transfer_cube.xml``; gymnasium id ``gym_aloha/AlohaTransferCube-v0``)."""

    name: str
    # Control steps per episode: LeRobot's AlohaEnv(episode_length=400), which is what
    # lerobot-eval runs (gym-aloha's own registration says 300).
    episode_steps: int = 400
    description: str = ''

    @property
    def _camel(self) -> str:
        return ''.join(word.capitalize() for word in self.name.split('_'))

    def scene_xml(self, end_effector: bool = False) -> str:
        """The joint-space scene in gym_aloha/assets, or the end-effector (mocap) one the
        scripted expert plans in."""
        return f"bimanual_viperx_{'end_effector_' if end_effector else ''}{self.name}.xml"

    def task_class(self, end_effector: bool = False) -> str:
        """The task class in gym_aloha.tasks.sim (or .sim_end_effector)."""
        return f"{self._camel}{'EndEffector' if end_effector else ''}Task"


ALOHA_TASKS: dict[str, AlohaTaskSpec] = {
    'transfer_cube': AlohaTaskSpec(
        'transfer_cube',
        description='the right arm picks the cube from the table and hands it to the left arm'),
    'insertion': AlohaTaskSpec(
        'insertion',
        description='each arm picks one part (peg, socket) and the peg goes into the socket'),
}


def task_spec(name: str) -> AlohaTaskSpec:
    """The spec of task ``name`` (``transfer_cube``, ``insertion``)."""
    try:
        return ALOHA_TASKS[name]
    except KeyError:
        raise ValueError(f"unknown gym-aloha task '{name}', expected one of "
                         f'{sorted(ALOHA_TASKS)}') from None


def import_gym_aloha() -> Any:
    """``gym_aloha``, or an ImportError that says how to install it."""
    try:
        import gym_aloha
        import gym_aloha.tasks.sim  # noqa: F401 (dm_control loads here)
    except ImportError as exc:
        raise ImportError(
            f'the gym-aloha tasks need the packages gym-aloha and dm-control ({exc}); '
            "install them with: pip install 'act_ros[aloha]' && pip install --no-deps "
            "gym-aloha==0.1.5 (make setup does both; docs/aloha.md says why --no-deps)") from exc
    return gym_aloha


def object_poses(spec: AlohaTaskSpec, seed: int) -> np.ndarray:
    """The objects' start poses of episode ``seed``, as gym-aloha's ``AlohaEnv.reset(seed)``
    draws them: transfer cube ``(7,)`` (x, y, z, quaternion w x y z), insertion ``(14,)``
    (peg, then socket)."""
    import_gym_aloha()
    from gym_aloha.utils import sample_box_pose, sample_insertion_pose

    if spec.name == 'transfer_cube':
        return np.asarray(sample_box_pose(seed), dtype=np.float64)
    return np.concatenate(sample_insertion_pose(seed)).astype(np.float64)


def _without_rendering(base: type) -> type:
    """gym-aloha's task class ``base`` whose observation leaves the images out (they are
    rendered on demand by :class:`AlohaEnv`); reward, reset and actions are the base's."""

    class Unrendered(base):
        def get_observation(self, physics):  # noqa: D401 (dm_control's interface)
            obs = collections.OrderedDict()
            obs['qpos'] = self.get_qpos(physics)
            obs['env_state'] = self.get_env_state(physics)
            return obs

    Unrendered.__name__ = Unrendered.__qualname__ = f'{base.__name__}Unrendered'
    return Unrendered


def build_environment(spec: AlohaTaskSpec, *, end_effector: bool = False) -> Any:
    """A dm_control ``control.Environment`` of gym-aloha's scene and task (joint space, or
    the end-effector variant), stepping at 50 Hz, whose observations carry no images."""
    gym_aloha = import_gym_aloha()
    import gym_aloha.tasks.sim as joint_tasks
    import gym_aloha.tasks.sim_end_effector as ee_tasks
    from dm_control import mujoco as dm_mujoco
    from dm_control.rl import control

    assets = Path(gym_aloha.__file__).parent / 'assets'
    xml = assets / spec.scene_xml(end_effector)
    module = ee_tasks if end_effector else joint_tasks
    task = _without_rendering(getattr(module, spec.task_class(end_effector)))()
    physics = dm_mujoco.Physics.from_xml_path(str(xml))
    return control.Environment(physics, task, time_limit=float('inf'),
                               control_timestep=1.0 / ALOHA_FPS, n_sub_steps=None,
                               flat_observation=False)


class LazyImages(Mapping[str, np.ndarray]):
    """Camera images of one simulation state, each rendered the first time it is read.

    Reading an image after the simulation has moved on is an error (it would show a later
    state than the observation it belongs to).
    """

    def __init__(self, env: AlohaEnv, cameras: Sequence[str]) -> None:
        self._env = env
        self._step = env.step_index
        self._episode = env.episode
        self._cameras = tuple(cameras)
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, camera: str) -> np.ndarray:
        if camera not in self._cameras:
            raise KeyError(f"camera '{camera}' is not rendered (have {list(self._cameras)})")
        if camera not in self._cache:
            if self._env.step_index != self._step or self._env.episode != self._episode:
                raise RuntimeError(f"image '{camera}' of step {self._step} read after the "
                                   f'simulation moved on (now step {self._env.step_index})')
            self._cache[camera] = self._env.render(camera)
        return self._cache[camera]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cameras)

    def __len__(self) -> int:
        return len(self._cameras)

    @property
    def rendered(self) -> tuple[str, ...]:
        """The cameras rendered so far."""
        return tuple(self._cache)


@dataclass(frozen=True)
class AlohaObservation:
    """One observation: ``joint_positions`` (14,) in :data:`ALOHA_JOINTS` order (gym-aloha's
    ``qpos``/``agent_pos``), ``images`` camera name -> HxWx3 uint8 RGB (rendered when
    read), ``env_state`` the objects' poses (gym-aloha's ``env_state``), the reward of the
    step that led here."""

    images: Mapping[str, np.ndarray]
    joint_positions: np.ndarray
    env_state: np.ndarray
    reward: float
    step_index: int
    time_s: float


@dataclass(frozen=True)
class AlohaEpisodeResult:
    """How one episode ended: ``success`` when the reward reached the task's maximum."""

    success: bool
    max_reward: float
    final_reward: float
    steps: int
    seed: int | None = None
    success_step: int | None = None  # the first step at the maximum reward

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_aloha_results(results: Sequence[AlohaEpisodeResult]) -> dict[str, Any]:
    """``success_rate`` and the distribution of the highest reward stage reached (gym-aloha's
    stages: 1 touched, 2 lifted, 3 transfer attempted, 4 transferred, for transfer cube)."""
    if not results:
        raise ValueError('no episodes to summarize')
    stages = collections.Counter(int(r.max_reward) for r in results)
    successes = sum(r.success for r in results)
    return {'count': len(results), 'successes': successes,
            'success_rate': successes / len(results),
            'max_reward_counts': {str(k): stages.get(k, 0) for k in range(5)},
            'mean_max_reward': float(np.mean([r.max_reward for r in results]))}


class AlohaEnv:
    """A gym-aloha task stepped with 14 joint targets; see the module docstring.

    ``cameras``: the cameras an observation offers (rendered when read), ``image_size``
    ``(height, width)`` of each (gym-aloha's is 480x640). ``terminate_on_success``: the
    episode is over at the first step at the maximum reward (LeRobot's evaluation), else
    after ``episode_steps`` (demonstrations keep the whole episode).
    """

    def __init__(self, task: str | AlohaTaskSpec = 'transfer_cube', *,
                 cameras: Sequence[str] = ('top',),
                 image_size: tuple[int, int] = ALOHA_IMAGE_SIZE,
                 episode_steps: int | None = None, terminate_on_success: bool = True) -> None:
        self.spec = task if isinstance(task, AlohaTaskSpec) else task_spec(task)
        unknown = [c for c in cameras if c not in ALOHA_CAMERAS]
        if unknown:
            raise ValueError(f'unknown cameras {unknown}, gym-aloha has {list(ALOHA_CAMERAS)}')
        height, width = (int(v) for v in image_size)
        if not (0 < height <= 2048 and 0 < width <= 2048):
            raise ValueError(f'image_size must be within 1..2048 per side, got {image_size}')
        self.cameras = tuple(cameras)
        self.image_size = (height, width)
        self.episode_steps = int(episode_steps or self.spec.episode_steps)
        if self.episode_steps < 1:
            raise ValueError(f'episode_steps must be >= 1, got {self.episode_steps}')
        self.terminate_on_success = terminate_on_success
        self._env = build_environment(self.spec)
        self.physics = self._env.physics
        self.max_reward = float(self._env.task.max_reward)
        self.seed: int | None = None
        self.step_index = 0
        self.episode = 0
        self._rewards: list[float] = []
        self._success_step: int | None = None
        self._qpos = np.zeros(len(ALOHA_JOINTS))
        self._env_state = np.zeros(0)

    @property
    def fps(self) -> int:
        return ALOHA_FPS

    @property
    def succeeded(self) -> bool:
        return self._success_step is not None

    @property
    def done(self) -> bool:
        """True once the episode is over (its steps run, or success with
        ``terminate_on_success``)."""
        return self.seed is not None and (
            self.step_index >= self.episode_steps
            or (self.terminate_on_success and self.succeeded))

    def reset(self, seed: int | None = None) -> AlohaObservation:
        """Start episode ``seed``: gym-aloha's start pose and the object poses it draws for
        that seed (``None``: a fresh random seed)."""
        import_gym_aloha()
        import gym_aloha.tasks.sim as joint_tasks

        if seed is None:
            seed = int(np.random.default_rng().integers(0, 2**31 - 1))
        self.seed = int(seed)
        # gym-aloha's joint-space tasks read the object poses from this module-level slot
        # in their initialize_episode (as gym-aloha's own AlohaEnv.reset sets it).
        joint_tasks.BOX_POSE[0] = object_poses(self.spec, self.seed)
        self._env.task.random.seed(self.seed)
        timestep = self._env.reset()
        self.step_index = 0
        self.episode += 1
        self._rewards = []
        self._success_step = None
        return self._observe(timestep.observation, 0.0)

    def step(self, action: np.ndarray) -> AlohaObservation:
        """Apply 14 joint targets (:data:`ALOHA_JOINTS` order; grippers normalized) for one
        control period (20 ms) and return the next observation."""
        if self.seed is None:
            raise RuntimeError('call reset(seed) before step()')
        if self.done:
            raise RuntimeError(f'episode {self.seed} is over (step {self.step_index}); '
                               'call reset()')
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (len(ALOHA_JOINTS),):
            raise ValueError(f'action must have {len(ALOHA_JOINTS)} joint targets '
                             f'{list(ALOHA_JOINTS)}, got shape {action.shape}')
        if not np.all(np.isfinite(action)):
            raise ValueError(f'action must be finite, got {action.tolist()}')
        timestep = self._env.step(action)
        self.step_index += 1
        reward = float(timestep.reward or 0.0)
        self._rewards.append(reward)
        if self._success_step is None and reward >= self.max_reward:
            self._success_step = self.step_index
        return self._observe(timestep.observation, reward)

    def _observe(self, raw: Mapping[str, Any], reward: float) -> AlohaObservation:
        self._qpos = np.asarray(raw['qpos'], dtype=np.float64).copy()
        self._env_state = np.asarray(raw['env_state'], dtype=np.float64).copy()
        images = LazyImages(self, self.cameras)
        return AlohaObservation(images=images, joint_positions=self._qpos.copy(),
                                env_state=self._env_state.copy(), reward=reward,
                                step_index=self.step_index,
                                time_s=self.step_index / ALOHA_FPS)

    def render(self, camera: str = 'top') -> np.ndarray:
        """Camera ``camera`` of the current state, ``image_size``, uint8 RGB."""
        height, width = self.image_size
        return np.ascontiguousarray(self.physics.render(height=height, width=width,
                                                        camera_id=camera))

    def evaluate(self) -> AlohaEpisodeResult:
        """The episode's result so far (at its end: its result)."""
        if self.seed is None:
            raise RuntimeError('call reset(seed) before evaluate()')
        return AlohaEpisodeResult(
            success=self.succeeded, max_reward=max(self._rewards, default=0.0),
            final_reward=self._rewards[-1] if self._rewards else 0.0, steps=self.step_index,
            seed=self.seed, success_step=self._success_step)

    def close(self) -> None:
        """Free the rendering context."""
        contexts = getattr(self.physics, 'contexts', None)
        if contexts is not None:
            self.physics.free()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
