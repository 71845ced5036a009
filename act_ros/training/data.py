"""Training data: a LeRobot v3 dataset checked against the contract, split, held in memory.

The dataset is opened with LeRobot (``LeRobotDataset`` with ``delta_timestamps`` for a
chunk of ``chunk_size`` actions). Every camera frame the run reads (all of them, unless
its backbone is cached from the first step on every k-th frame) is then decoded once, in
episode order, and resized to the model input size with the same OpenCV call the runtime uses at
inference; batches are plain tensor indexing. A sample equals what
``LeRobotDataset.__getitem__`` returns (``action`` chunk, ``action_is_pad``), except
that chunks never run across the train/validation boundary of a frame-level split.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from act_ros.core.contract import CameraSpec, Contract
from act_ros.core.errors import ActRosError
from act_ros.core.inference.checkpoint import IMAGENET_MEAN, IMAGENET_STD
from act_ros.core.inference.checkpoint_info import LEROBOT_ACT_CHUNK_SIZE
from act_ros.core.object_state import (
    ENVIRONMENT_STATE_DIM,
    ENVIRONMENT_STATE_FEATURE,
    ENVIRONMENT_STATE_NAMES,
)
from act_ros.data.video_backend import video_backend

logger = logging.getLogger(__name__)
STD_FLOOR = 1e-3  # normalization std floor for (near-)constant joints


class TrainingDataError(ActRosError, ValueError):
    """The dataset cannot be used for training (missing, empty, or not the contract's)."""


def resize_uint8(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """HxWx3 uint8 -> ``size`` (H, W) with the interpolation the runtime uses."""
    h, w = size
    if image.shape[:2] == (h, w):
        return image
    shrinking = image.shape[0] > h or image.shape[1] > w
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)


def select_cameras(contract: Contract, names: tuple[str, ...] | list[str] | None
                   ) -> tuple[CameraSpec, ...]:
    """The contract cameras named (``None``: all of them), in contract order."""
    if names is None:
        return contract.cameras
    unknown = [name for name in names if name not in contract.camera_names]
    if unknown:
        raise TrainingDataError(f'--cameras {",".join(names)}: {unknown} are not cameras of the '
                                f'contract ({contract.source}: {list(contract.camera_names)})')
    return tuple(cam for cam in contract.cameras if cam.name in names)


def open_dataset(root: Path, contract: Contract, *,
                 cameras: tuple[CameraSpec, ...] | None = None,
                 environment_state: bool = False, option: str = '--dataset-root',
                 chunk_size: int = LEROBOT_ACT_CHUNK_SIZE) -> Any:
    """Open a local LeRobot v3 dataset whose items hold an action chunk of ``chunk_size``.

    ``cameras``: the ones the policy takes (default: every contract camera);
    ``environment_state``: the dataset must hold ``observation.environment_state``.
    Raises :class:`TrainingDataError` before anything is trained when the path is not a
    dataset, the dataset is empty, or its features do not match the contract; the
    message starts with ``option`` (the command-line option that named the dataset).
    """
    root = Path(root).expanduser()
    if not root.exists():
        raise TrainingDataError(f'{option} {root}: does not exist (expected a LeRobot v3 '
                                'dataset directory with meta/info.json)')
    if not root.is_dir():
        raise TrainingDataError(f'{option} {root}: is a file, expected a LeRobot v3 '
                                'dataset directory')
    if not (root / 'meta' / 'info.json').is_file():
        raise TrainingDataError(f'{option} {root}: no meta/info.json, so not a LeRobot v3 '
                                'dataset (create one with act-ros collect or generate-synthetic)')
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    try:
        meta = LeRobotDatasetMetadata(f'local/{root.name}', root=root)
    except (OSError, ValueError, KeyError) as exc:
        raise TrainingDataError(f'{option} {root}: cannot be read as a LeRobot v3 dataset '
                                f'({type(exc).__name__}: {exc})') from exc
    if meta.total_frames < 1 or meta.total_episodes < 1:
        raise TrainingDataError(f'{option} {root}: the dataset is empty ({meta.total_episodes}'
                                f' episodes, {meta.total_frames} frames); record episodes first')
    check_features(meta.features, contract, root, cameras=cameras,
                   environment_state=environment_state, option=option)
    delta = {contract.action_feature: [i / meta.fps for i in range(chunk_size)]}
    return LeRobotDataset(f'local/{root.name}', root=root, delta_timestamps=delta,
                          video_backend=video_backend(), return_uint8=True)


def check_features(features: dict[str, dict], contract: Contract, root: Path, *,
                   cameras: tuple[CameraSpec, ...] | None = None,
                   environment_state: bool = False, option: str = '--dataset-root') -> None:
    """The dataset must hold the contract's state, action and the ``cameras`` the policy
    takes (default: all), joints in order, and with ``environment_state`` the object
    poses (``observation.environment_state``, :data:`ENVIRONMENT_STATE_NAMES`)."""
    problems = []
    joints = list(contract.joint_names)
    for key in (contract.state_feature, contract.action_feature):
        feat = features.get(key)
        if feat is None:
            problems.append(f"'{key}' is missing")
            continue
        if tuple(feat.get('shape', ())) != (contract.num_joints,):
            problems.append(f"'{key}' has shape {tuple(feat.get('shape', ()))}, expected "
                            f'({contract.num_joints},)')
        names = feat.get('names')
        if isinstance(names, dict):  # LeRobot also writes {'motors': [...]}
            names = next(iter(names.values()), None)
        if isinstance(names, list) and len(names) == len(joints) and names != joints:
            problems.append(f"'{key}' joints are {names}, the contract expects {joints} (order "
                            'matters)')
    for cam in contract.cameras if cameras is None else cameras:
        feat = features.get(cam.feature)
        if feat is None:
            problems.append(f"camera '{cam.feature}' is missing")
        elif feat.get('dtype') not in ('video', 'image'):
            problems.append(f"camera '{cam.feature}' has dtype {feat.get('dtype')}, expected "
                            'video or image')
    if environment_state:
        feat = features.get(ENVIRONMENT_STATE_FEATURE)
        names = feat.get('names') if feat is not None else None
        if feat is None:
            problems.append(f"'{ENVIRONMENT_STATE_FEATURE}' (object poses, needed by "
                            '--environment-state) is missing: record the dataset with act-ros '
                            'collect, or train without --environment-state')
        elif tuple(feat.get('shape', ())) != (ENVIRONMENT_STATE_DIM,):
            problems.append(f"'{ENVIRONMENT_STATE_FEATURE}' has shape "
                            f"{tuple(feat.get('shape', ()))}, expected ({ENVIRONMENT_STATE_DIM},)")
        elif isinstance(names, list) and names != list(ENVIRONMENT_STATE_NAMES):
            problems.append(f"'{ENVIRONMENT_STATE_FEATURE}' holds {names}, expected "
                            f'{list(ENVIRONMENT_STATE_NAMES)} (act_ros.core.object_state)')
    if problems:
        present = sorted(k for k in features if k not in ('timestamp', 'frame_index', 'index',
                                                             'episode_index', 'task_index'))
        raise TrainingDataError(f'{option} {root}: features do not match the contract '
                                f'({contract.source}): {"; ".join(problems)}. Dataset features: '
                                f'{present}')


@dataclass
class Split:
    """Which frames train and which validate; ``kind`` is 'episode' or 'frame'."""

    kind: str
    train: np.ndarray
    val: np.ndarray
    train_episodes: list[int] = field(default_factory=list)
    val_episodes: list[int] = field(default_factory=list)
    note: str = ''

    def to_dict(self) -> dict[str, Any]:
        return {'kind': self.kind, 'train_frames': int(self.train.size),
                'val_frames': int(self.val.size), 'train_episodes': self.train_episodes,
                'val_episodes': self.val_episodes, 'note': self.note}


def make_split(episode_index: np.ndarray | None, val_ratio: float, seed: int,
               num_frames: int) -> tuple[Split, np.ndarray, np.ndarray]:
    """Split by episode when there are at least two; otherwise by frame (logged).

    Returns the split and, per frame, the [start, end) segment its action chunk may span:
    the episode, or for a frame-level split the train or validation block of it, so that
    no target crosses from one set into the other.
    """
    if episode_index is None:
        episode_index = np.zeros(num_frames, dtype=np.int64)
    episode_index = np.asarray(episode_index, dtype=np.int64)
    seg_start = np.zeros(num_frames, dtype=np.int64)
    seg_end = np.zeros(num_frames, dtype=np.int64)
    episodes = sorted(set(episode_index.tolist()))
    bounds = {}
    for ep in episodes:
        where = np.flatnonzero(episode_index == ep)
        bounds[ep] = (int(where[0]), int(where[-1]) + 1)
        seg_start[where], seg_end[where] = where[0], where[-1] + 1
    if val_ratio == 0.0:
        split = Split('episode' if len(episodes) > 1 else 'frame', np.arange(num_frames),
                      np.zeros(0, np.int64), episodes, [], 'val_ratio 0: no validation')
        return split, seg_start, seg_end
    if len(episodes) >= 2:
        rng = np.random.default_rng(seed)
        n_val = min(len(episodes) - 1, max(1, round(val_ratio * len(episodes))))
        val_eps = sorted(rng.permutation(episodes)[:n_val].tolist())
        train_eps = [ep for ep in episodes if ep not in val_eps]
        is_val = np.isin(episode_index, val_eps)
        split = Split('episode', np.flatnonzero(~is_val), np.flatnonzero(is_val), train_eps,
                      val_eps)
        return split, seg_start, seg_end
    # Frame-level fallback: the last val_ratio of each episode validates.
    note = (f'the dataset has {len(episodes)} episode(s): no episode-level split is possible, so '
            f'the last {val_ratio:.0%} of the frames validate (frame-level split; validation '
            'frames come from the same episode as training frames)')
    logger.warning('frame-level train/val split: %s', note)
    train, val = [], []
    for ep, (start, end) in bounds.items():
        cut = end - max(1, math.ceil(val_ratio * (end - start)))
        if cut <= start:
            raise TrainingDataError(f'episode {ep} has {end - start} frame(s): too few to split '
                                    f'with val_ratio {val_ratio}')
        train.append(np.arange(start, cut))
        val.append(np.arange(cut, end))
        seg_end[start:cut] = cut
        seg_start[cut:end] = cut
    split = Split('frame', np.concatenate(train), np.concatenate(val), episodes, episodes, note)
    return split, seg_start, seg_end


def evenly_spread(pool: np.ndarray, count: int) -> np.ndarray:
    """``count`` frames of ``pool`` spread evenly over it (all of them when it has fewer)."""
    if pool.size == 0:
        return pool
    return pool[np.linspace(0, pool.size - 1, min(count, pool.size)).round().astype(np.int64)]


def strided_frames(frames: np.ndarray, seg_start: np.ndarray, stride: int) -> np.ndarray:
    """Every ``stride``-th of ``frames``, counted from the start of each frame's segment
    (``seg_start``: the first frame of the episode, or of its validation part); all of
    them with stride 1."""
    if stride == 1:
        return frames
    position = frames - seg_start[frames]
    return frames[position % stride == 0]


class DecodedFrames:
    """The decoded pixels of some of a dataset's frames, indexed by dataset frame as the
    full (N, 3, H, W) uint8 tensor is: ``frames[indices]``. A run that reads the pixels of
    only some frames (a backbone cached from the first step on every k-th frame) decodes and
    keeps only those; reading another frame is an error that names it."""

    def __init__(self, frames: np.ndarray, pixels: torch.Tensor, total: int) -> None:
        self.frames = np.asarray(frames, dtype=np.int64)  # sorted, unique dataset indices
        if pixels.shape[0] != self.frames.size:
            raise ValueError(f'{pixels.shape[0]} decoded frames for {self.frames.size} indices')
        self.pixels = pixels
        self.shape = torch.Size((total, *pixels.shape[1:]))
        self.dtype = pixels.dtype
        self._row = torch.full((total,), -1, dtype=torch.long)
        self._row[torch.from_numpy(self.frames)] = torch.arange(self.frames.size)

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getitem__(self, index: Any) -> torch.Tensor:
        rows = self._row[torch.as_tensor(index, dtype=torch.long)]
        if bool((rows < 0).any()):
            wanted = torch.as_tensor(index, dtype=torch.long).reshape(-1)
            missing = wanted[rows.reshape(-1) < 0].tolist()
            raise IndexError(f'frame(s) {missing[:5]} were not decoded: this run decodes the '
                             f'{self.frames.size} of the dataset\'s {len(self)} frames whose '
                             'pixels it reads')
        return self.pixels[rows]


class FrameStore:
    """All frames of a dataset in memory; ``batch(indices)`` builds a training batch."""

    def __init__(self, *, state: np.ndarray, action: np.ndarray,
                 images: dict[str, torch.Tensor], seg_start: np.ndarray, seg_end: np.ndarray,
                 chunk_size: int, state_key: str, action_key: str,
                 extras: dict[str, np.ndarray] | None = None,
                 env_state: np.ndarray | None = None,
                 env_key: str = ENVIRONMENT_STATE_FEATURE) -> None:
        self.state = torch.from_numpy(np.ascontiguousarray(state, dtype=np.float32))
        # Object poses, a policy input like the state (None: the policy does not take them).
        self.env_state = (None if env_state is None else
                          torch.from_numpy(np.ascontiguousarray(env_state, dtype=np.float32)))
        self.env_key = env_key
        self.action = torch.from_numpy(np.ascontiguousarray(action, dtype=np.float32))
        # feature -> (N, 3, H, W) uint8: a tensor, or DecodedFrames indexed the same way
        self.images = images
        self.seg_start = torch.from_numpy(seg_start)
        self.seg_end = torch.from_numpy(seg_end)
        self.chunk_size = chunk_size
        self.state_key, self.action_key = state_key, action_key
        self._offsets = torch.arange(chunk_size)
        # Further per-frame features (e.g. sim.object_poses), batched for auxiliary losses.
        self.extras = {key: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
                       for key, v in (extras or {}).items()}

    def __len__(self) -> int:
        return int(self.state.shape[0])

    def batch(self, indices: np.ndarray | torch.Tensor, *,
              images: bool = True) -> dict[str, torch.Tensor]:
        """Unnormalized batch: state (B, J), the environment state (B, 10) when the store
        holds it, cameras float (B, 3, H, W) in [0, 1], action chunk (B, T, J) and
        ``action_is_pad`` (B, T), as LeRobot's dataset gives them (``images=False``:
        without the cameras)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        query = idx[:, None] + self._offsets[None, :]
        end = self.seg_end[idx][:, None]
        pad = query >= end
        query = torch.minimum(query, end - 1)
        out = {self.state_key: self.state[idx], self.action_key: self.action[query],
               f'{self.action_key}_is_pad': pad}
        if self.env_state is not None:
            out[self.env_key] = self.env_state[idx]
        for key, frames in (self.images.items() if images else ()):
            out[key] = frames[idx].to(torch.float32).div_(255.0)
        for key, values in self.extras.items():
            out[key] = values[idx]
        return out


def column(hf_dataset: Any, key: str) -> np.ndarray:
    """One float column of the dataset's frames, (N, ...) float32."""
    return np.stack(hf_dataset.data.column(key).to_numpy(zero_copy_only=False)).astype(np.float32)


def decode_episode_frames(dataset: Any, keys: Sequence[str], ep: int, timestamps: list[float],
                          rows: list[int] | None = None) -> dict[str, np.ndarray]:
    """Camera ``key`` -> (T, H, W, 3) uint8 frames of one episode at ``timestamps`` (seconds
    from the episode's start), for each of ``keys``; ``rows``: the dataset indices of those
    frames (cameras stored as images are read by row: every row of the episode when not
    given). The cameras stored as images are read in one pass over the rows, which decodes
    every image column of a row at once."""
    meta = dataset.meta
    out: dict[str, np.ndarray] = {}
    stills = [key for key in keys if key not in meta.video_keys]
    if stills:
        if rows is None:
            info = meta.episodes[ep]
            table = dataset.hf_dataset[int(info['dataset_from_index']):
                                       int(info['dataset_to_index'])]
        else:
            table = dataset.hf_dataset[[int(row) for row in rows]]
        for key in stills:
            out[key] = np.stack([(img.permute(1, 2, 0) * 255.0).round().clamp(0, 255)
                                 .to(torch.uint8).numpy() for img in table[key]])
    for key in keys:
        if key in meta.video_keys:
            from lerobot.datasets.video_utils import decode_video_frames

            info = meta.episodes[ep]
            start = info[f'videos/{key}/from_timestamp']
            path = dataset.root / meta.get_video_file_path(ep, key)
            frames = decode_video_frames(path, [start + t for t in timestamps],
                                         dataset.tolerance_s, video_backend(), return_uint8=True)
            out[key] = frames.permute(0, 2, 3, 1).numpy()
    return {key: out[key] for key in keys}


def frame_buffer(shape: tuple[int, ...], directory: Path | None = None) -> torch.Tensor:
    """A uint8 tensor of ``shape``: in memory, or with ``directory`` backed by a file there
    that is mapped into memory. The file has no name from the start (unlinked on creation),
    so the space returns to the disk when the process ends, however it ends; the page cache
    holds what memory allows and the rest is read from disk as batches ask for it."""
    if directory is None:
        return torch.empty(shape, dtype=torch.uint8)
    import tempfile

    directory.mkdir(parents=True, exist_ok=True)
    size = int(np.prod(shape))
    with tempfile.TemporaryFile(dir=directory, prefix='frames_') as handle:
        problem = None
        try:  # the blocks reserved now: a full disk is this error, not a crash mid-run
            os.posix_fallocate(handle.fileno(), 0, max(size, 1))
        except OSError as exc:
            problem = exc.strerror
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                # A file system that cannot reserve space: a sparse file, after checking
                # that the space is there now.
                enough = shutil.disk_usage(directory).free >= size
                problem = None if enough else os.strerror(errno.ENOSPC)
                if enough:
                    handle.truncate(max(size, 1))
        if problem is not None:
            free = shutil.disk_usage(directory).free
            raise TrainingDataError(
                f'cannot keep the decoded frames on disk in {directory}: they need '
                f'{size / 1e9:.1f} GB and {free / 1e9:.1f} GB are free ({problem}); free '
                f'space, or choose another --output-dir')
        array = np.memmap(handle, dtype=np.uint8, mode='r+', shape=shape)
    # The mapping outlives the file object (and the file its directory entry).
    return torch.from_numpy(array)


def load_frames(dataset: Any, contract: Contract, image_size: tuple[int, int] | None, *,
                seg_start: np.ndarray, seg_end: np.ndarray, progress: bool = False,
                extra_keys: tuple[str, ...] = (),
                cameras: tuple[CameraSpec, ...] | None = None,
                environment_state: bool = False,
                frame_dir: Path | None = None,
                frames: np.ndarray | None = None,
                chunk_size: int = LEROBOT_ACT_CHUNK_SIZE) -> FrameStore:
    """Decode every frame of ``cameras`` (default: all) once, resized to ``image_size``,
    into a FrameStore; with ``environment_state`` the object poses come along as an input.

    ``extra_keys``: further float columns to keep per frame (a missing one is an error).
    ``frame_dir``: keep the frames in a file there mapped into memory (:func:`frame_buffer`)
    instead of in memory. ``frames``: decode only these dataset frames (the store's images
    are then :class:`DecodedFrames`); states, actions and the other columns stay whole.
    """
    from tqdm import tqdm

    hf = dataset.hf_dataset
    n = len(hf)
    state = column(hf, contract.state_feature)
    action = column(hf, contract.action_feature)
    episode_index = hf.data.column('episode_index').to_numpy()
    timestamps = hf.data.column('timestamp').to_numpy()
    cameras = contract.cameras if cameras is None else cameras
    if cameras and image_size is None:
        raise ValueError('load_frames: cameras need an image_size')
    h, w = image_size if image_size else (0, 0)
    wanted = np.ones(n, dtype=bool)
    if frames is not None:
        frames = np.unique(np.asarray(frames, dtype=np.int64))
        if frames.size and (frames[0] < 0 or frames[-1] >= n):
            raise ValueError(f'load_frames: frames must lie in [0, {n}), got {frames[0]}..'
                             f'{frames[-1]}')
        wanted[:] = False
        wanted[frames] = True
    decoded = n if frames is None else frames.size
    # One buffer for every camera: on disk its space is reserved at once, all or nothing.
    shared = frame_buffer((len(cameras), decoded, 3, h, w), frame_dir)
    buffers = {cam.feature: shared[i] for i, cam in enumerate(cameras)}
    episodes = sorted(set(episode_index.tolist())) if cameras else []
    for ep in tqdm(episodes, desc='decoding frames', unit='episode', disable=not progress):
        rows = np.flatnonzero(episode_index == ep)
        whole = bool(wanted[rows].all())
        rows = rows if whole else rows[wanted[rows]]
        if rows.size == 0:
            continue
        target = torch.from_numpy(rows if frames is None else np.searchsorted(frames, rows))
        decoded_ep = decode_episode_frames(dataset, [cam.feature for cam in cameras], ep,
                                           timestamps[rows].tolist(),
                                           rows=None if whole else rows.tolist())
        for cam in cameras:
            pixels = decoded_ep[cam.feature]
            if pixels.shape[0] != rows.size:
                raise TrainingDataError(f"episode {ep}, camera '{cam.feature}': decoded "
                                        f'{pixels.shape[0]} frames, expected {rows.size}')
            resized = np.stack([resize_uint8(f, (h, w)) for f in pixels])
            buffers[cam.feature][target] = torch.from_numpy(resized).permute(0, 3, 1, 2)
    images: dict[str, Any] = (buffers if frames is None else
                              {key: DecodedFrames(frames, pixels, n)
                               for key, pixels in buffers.items()})
    extras = {}
    for key in extra_keys:
        if key not in hf.column_names:
            raise TrainingDataError(f"the dataset has no column '{key}' (it has "
                                    f'{sorted(hf.column_names)})')
        extras[key] = column(hf, key)
    env_state = None
    if environment_state:
        if ENVIRONMENT_STATE_FEATURE not in hf.column_names:
            raise TrainingDataError(f"the dataset has no column '{ENVIRONMENT_STATE_FEATURE}' "
                                    f'(it has {sorted(hf.column_names)})')
        env_state = column(hf, ENVIRONMENT_STATE_FEATURE)
    columns = [(contract.state_feature, state), (contract.action_feature, action),
               *extras.items()]
    if env_state is not None:
        columns.append((ENVIRONMENT_STATE_FEATURE, env_state))
    for key, values in columns:
        if not np.all(np.isfinite(values)):
            raise TrainingDataError(f"dataset column '{key}' contains NaN or infinite values")
    return FrameStore(state=state, action=action, images=images, seg_start=seg_start,
                      seg_end=seg_end, chunk_size=chunk_size,
                      state_key=contract.state_feature, action_key=contract.action_feature,
                      extras=extras, env_state=env_state)


def normalization_stats(meta_stats: dict[str, dict[str, Any]], contract: Contract, *,
                        camera_stats: str = 'imagenet',
                        cameras: tuple[CameraSpec, ...] | None = None,
                        environment_state: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """Stats for LeRobot's normalizer: state, action and (``environment_state``) the object
    poses from the dataset; cameras (default: all) ImageNet (LeRobot's
    ``use_imagenet_stats`` default) or the dataset's. Std is floored at ``STD_FLOOR`` so
    a joint, or an object coordinate, that never changed in the data does not blow up at
    inference."""
    stats: dict[str, dict[str, torch.Tensor]] = {}
    keys = [contract.state_feature, contract.action_feature]
    if environment_state:
        keys.append(ENVIRONMENT_STATE_FEATURE)
    for key in keys:
        if key not in meta_stats:
            raise TrainingDataError(f"meta/stats.json has no statistics for '{key}'")
        entry = {name: torch.as_tensor(np.asarray(meta_stats[key][name]), dtype=torch.float32)
                 for name in ('mean', 'std', 'min', 'max') if name in meta_stats[key]}
        if 'mean' not in entry or 'std' not in entry:
            raise TrainingDataError(f"meta/stats.json: '{key}' lacks mean/std (has "
                                    f'{sorted(meta_stats[key])})')
        entry['std'] = entry['std'].clamp_min(STD_FLOOR)
        stats[key] = entry
    for cam in contract.cameras if cameras is None else cameras:
        if camera_stats == 'imagenet':
            stats[cam.feature] = {'mean': torch.tensor(IMAGENET_MEAN).reshape(3, 1, 1),
                                  'std': torch.tensor(IMAGENET_STD).reshape(3, 1, 1),
                                  'min': torch.zeros(3, 1, 1), 'max': torch.ones(3, 1, 1)}
        else:
            src = meta_stats.get(cam.feature, {})
            if 'mean' not in src or 'std' not in src:
                raise TrainingDataError(f"meta/stats.json has no mean/std for '{cam.feature}'; "
                                        'use --camera-stats imagenet')
            stats[cam.feature] = {
                name: torch.as_tensor(np.asarray(src[name]), dtype=torch.float32).reshape(3, 1, 1)
                for name in ('mean', 'std', 'min', 'max') if name in src}
            stats[cam.feature]['std'] = stats[cam.feature]['std'].clamp_min(STD_FLOOR)
    return stats


def dataset_image_size(meta: Any, contract: Contract,
                       cameras: tuple[CameraSpec, ...] | None = None) -> tuple[int, int] | None:
    """(H, W) of the first camera (of ``cameras``, default all) as stored in the dataset;
    ``None`` without cameras."""
    cameras = contract.cameras if cameras is None else cameras
    if not cameras:
        return None
    shape = meta.features[cameras[0].feature]['shape']
    names = meta.features[cameras[0].feature].get('names') or []
    if names and names[0] == 'channels':
        return int(shape[1]), int(shape[2])
    return int(shape[0]), int(shape[1])
