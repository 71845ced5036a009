"""One recorded episode as plain arrays, and the dataset layout the contract implies.

Kept free of LeRobot imports so that simulation worker processes can build episodes
without paying for torch and the dataset stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from act_ros.core.contract import Contract

# Privileged simulator state recorded beside each simulated frame: box centre (x, y, z,
# yaw) and pad top centre (x, y, z, yaw), world frame, metres and radians. Never a policy
# input (checkpoints take only the contract's features); the trainer can use it as an
# auxiliary target that teaches the vision backbone where the objects are.
OBJECT_POSES_FEATURE = 'sim.object_poses'
OBJECT_POSE_NAMES = ('box_x', 'box_y', 'box_z', 'box_yaw', 'pad_x', 'pad_y', 'pad_z', 'pad_yaw')
# Where a simulated episode came from, constant over its frames: the DAgger iteration (0
# for scripted-expert demonstrations) and the share of ticks the expert drove (1.0 for a
# demonstration; the recorded action is always the expert's label).
EPISODE_SOURCE_FEATURE = 'sim.episode_source'
EPISODE_SOURCE_NAMES = ('dagger_iteration', 'expert_share')


@dataclass(frozen=True)
class Episode:
    """One episode: frame t holds the images and state observed at t, and the action sent at t.

    Attributes:
        images: camera name (as in the contract, e.g. ``'top'``) -> ``(T, H, W, 3)`` uint8 RGB.
        state: ``(T, n_joints)`` measured joint positions, contract order.
        action: ``(T, n_joints)`` commanded joint position targets, contract order.
        seed: the seed the episode was generated with (for reports; not written).
        extras: further per-frame float features, name -> ``(T, k)`` (the layout's
            ``extra_features``, e.g. ``OBJECT_POSES_FEATURE`` for simulated episodes).
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    seed: int | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state.ndim != 2 or self.action.ndim != 2:
            raise ValueError(f'state and action must be (T, n_joints), got shapes '
                             f'{self.state.shape} and {self.action.shape}')
        if self.state.shape != self.action.shape:
            raise ValueError(f'state {self.state.shape} and action {self.action.shape} '
                             'must have the same shape (one action per observed frame)')
        if self.state.shape[0] < 1:
            raise ValueError('an episode needs at least one frame, got 0')
        for name, frames in self.images.items():
            if frames.ndim != 4 or frames.shape[0] != self.length or frames.shape[-1] != 3:
                raise ValueError(f"camera '{name}': expected ({self.length}, H, W, 3) frames, "
                                 f'got {frames.shape}')
            if frames.dtype != np.uint8:
                raise ValueError(f"camera '{name}': expected uint8 RGB frames, got {frames.dtype}")
        for name, values in self.extras.items():
            if values.ndim != 2 or values.shape[0] != self.length:
                raise ValueError(f"extra feature '{name}': expected ({self.length}, k) values, "
                                 f'got {values.shape}')

    @property
    def length(self) -> int:
        """Number of frames."""
        return int(self.state.shape[0])


# ``robot_type`` in ``meta/info.json`` of the datasets this package writes from its simulations
# and its synthetic generator: ``act-ros train`` picks its preset by it (a dataset of any
# other robot type is a real arm's).
ROBOT_TYPE_SIM = 'so101_sim'
ROBOT_TYPE_ALOHA_SIM = 'aloha_sim'
ROBOT_TYPE_SYNTHETIC = 'synthetic'


@dataclass(frozen=True)
class DatasetLayout:
    """What a dataset written from the contract holds: features, image size, fps, task.

    Attributes:
        contract: the I/O contract (joint names and order, feature keys, fps, task).
        image_height: height of every stored camera image, pixels.
        image_width: width of every stored camera image, pixels.
        use_video: store cameras as MP4 videos (``True``) or as PNG images (``False``).
        robot_type: stored in ``meta/info.json``.
        extra_features: ``(name, value names)`` of further float32 per-frame features
            every episode must carry (its ``extras``).
        task_text: the task string stored with every frame ('' = the contract's task).
    """

    contract: Contract
    image_height: int
    image_width: int
    use_video: bool = True
    robot_type: str = ROBOT_TYPE_SIM
    extra_features: tuple[tuple[str, tuple[str, ...]], ...] = ()
    task_text: str = ''

    def __post_init__(self) -> None:
        if self.image_height < 1 or self.image_width < 1:
            raise ValueError(f'image size must be positive, got '
                             f'{self.image_height}x{self.image_width}')
        if self.use_video and (self.image_height % 2 or self.image_width % 2):
            raise ValueError('video encoding (yuv420p) needs even image sizes, got '
                             f'{self.image_height}x{self.image_width}; use even sizes or '
                             '--no-video')

    @property
    def fps(self) -> int:
        """Frames per second, from the contract."""
        return self.contract.fps

    @property
    def task(self) -> str:
        """Task string stored with every frame (``task_text``, else the contract's)."""
        return self.task_text or self.contract.task

    def features(self) -> dict[str, dict]:
        """LeRobot feature dict: one image/video feature per camera, state and action."""
        image_dtype = 'video' if self.use_video else 'image'
        joints = list(self.contract.joint_names)
        features: dict[str, dict] = {}
        for camera in self.contract.cameras:
            features[camera.feature] = {
                'dtype': image_dtype,
                'shape': (self.image_height, self.image_width, 3),
                'names': ['height', 'width', 'channels'],
            }
        for key in (self.contract.state_feature, self.contract.action_feature):
            features[key] = {'dtype': 'float32', 'shape': (len(joints),), 'names': joints}
        for key, names in self.extra_features:
            features[key] = {'dtype': 'float32', 'shape': (len(names),), 'names': list(names)}
        return features

    def check_episode(self, episode: Episode) -> None:
        """Raise ``ValueError`` if ``episode`` does not fit this layout."""
        expected_cams = set(self.contract.camera_names)
        if set(episode.images) != expected_cams:
            raise ValueError(f'episode cameras {sorted(episode.images)} do not match the '
                             f'contract cameras {sorted(expected_cams)}')
        expected = (self.image_height, self.image_width, 3)
        for name, frames in episode.images.items():
            if frames.shape[1:] != expected:
                raise ValueError(f"camera '{name}': frames are {frames.shape[1:]}, the dataset "
                                 f'stores {expected}')
        n = self.contract.num_joints
        if episode.state.shape[1] != n:
            raise ValueError(f'episode has {episode.state.shape[1]} joints, the contract has '
                             f'{n} ({list(self.contract.joint_names)})')
        for key, values in (('state', episode.state), ('action', episode.action),
                            *episode.extras.items()):
            if not np.all(np.isfinite(values)):
                raise ValueError(f'episode {key} contains NaN or infinite values')
        expected_extras = {name: len(names) for name, names in self.extra_features}
        found = {name: values.shape[1] for name, values in episode.extras.items()}
        if found != expected_extras:
            raise ValueError(f'episode extra features {found} do not match the layout '
                             f'{expected_extras} (name: values per frame)')
