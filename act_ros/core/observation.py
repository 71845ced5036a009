"""Observations from numpy, checked and converted to the tensors a checkpoint expects.

torch is imported by the conversions only: a process that just schedules observations
(``act_node`` with its model in a child process) never loads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from act_ros.core.errors import ObservationError
from act_ros.core.object_state import ENVIRONMENT_STATE_FEATURE, ENVIRONMENT_STATE_NAMES

if TYPE_CHECKING:
    import torch


@dataclass
class Observation:
    """One synchronized observation.

    ``images`` maps contract camera names (``top``, ``wrist``) to RGB images, HxWx3 uint8
    (HxW or HxWx1 grayscale is expanded to 3 channels), any size: they are resized to the
    checkpoint's input shape. ``state`` holds the joint positions in contract order.
    ``environment_state``: the object poses as
    :func:`~act_ros.core.object_state.environment_state` encodes them (10 values, robot
    base frame); required by a checkpoint that takes ``observation.environment_state``,
    ignored by one that does not. Cameras the checkpoint does not use are ignored too.
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    stamp_s: float | None = None
    extras: dict = field(default_factory=dict)
    environment_state: np.ndarray | None = None


def image_to_array(image: np.ndarray, size: tuple[int, int], name: str = 'image') -> np.ndarray:
    """HxWx3 uint8 RGB (any size) -> float32 (3, H, W) in [0, 1] at ``size`` (H, W)."""
    chw = np.ascontiguousarray(checked_image(image, size, name).transpose(2, 0, 1)).astype(np.float32)
    chw /= np.float32(255.0)
    return chw


def checked_image(image: np.ndarray, size: tuple[int, int], name: str = 'image') -> np.ndarray:
    """HxWx3 uint8 RGB (or HxW grayscale, any size) -> uint8 HxWx3 at ``size`` (H, W):
    checked, grayscale repeated to three channels, resized (area when shrinking)."""
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3) or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ObservationError(f"camera '{name}': expected an HxWx3 RGB (or HxW grayscale) "
                               f'image, got shape {arr.shape}')
    if arr.dtype != np.uint8:
        raise ObservationError(f"camera '{name}': expected uint8 pixels, got {arr.dtype}")
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    h, w = size
    if arr.shape[:2] != (h, w):
        shrinking = arr.shape[0] > h or arr.shape[1] > w
        arr = cv2.resize(arr, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
    return arr


def image_to_tensor(image: np.ndarray, size: tuple[int, int], name: str = 'image') -> torch.Tensor:
    """:func:`image_to_array` as a torch tensor (the same values)."""
    import torch

    return torch.from_numpy(image_to_array(image, size, name))


def state_to_array(state: np.ndarray, num_joints: int) -> np.ndarray:
    """Joint positions (contract order) -> float32 (J,), checked for count and finiteness."""
    arr = np.asarray(state, dtype=np.float64).reshape(-1)
    if arr.size != num_joints:
        raise ObservationError(f'state: expected {num_joints} joint positions, got {arr.size}')
    if not np.all(np.isfinite(arr)):
        bad = [int(i) for i in np.flatnonzero(~np.isfinite(arr))]
        raise ObservationError(f'state: non-finite joint positions at indices {bad}')
    return arr.astype(np.float32)


def environment_state_to_array(value: np.ndarray | None, dim: int) -> np.ndarray:
    """Object poses (:data:`~act_ros.core.object_state.ENVIRONMENT_STATE_NAMES`) -> float32
    ``(dim,)``, checked for presence, count and finiteness (:class:`ObservationError`)."""
    if value is None:
        raise ObservationError(
            f'environment_state: the checkpoint takes {ENVIRONMENT_STATE_FEATURE} (object '
            'poses) but the observation has none (give Observation(environment_state=...), '
            'e.g. from act_ros.core.object_state.environment_state_from_poses)')
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size != dim:
        raise ObservationError(f'environment_state: expected {dim} values '
                               f'{list(ENVIRONMENT_STATE_NAMES)}, got {arr.size} '
                               f'(shape {np.shape(value)})')
    if not np.all(np.isfinite(arr)):
        bad = [ENVIRONMENT_STATE_NAMES[i] if i < len(ENVIRONMENT_STATE_NAMES) else str(i)
               for i in np.flatnonzero(~np.isfinite(arr))]
        raise ObservationError(f'environment_state: non-finite values for {bad}')
    return arr.astype(np.float32)


def state_to_tensor(state: np.ndarray, num_joints: int) -> torch.Tensor:
    """:func:`state_to_array` as a torch tensor."""
    import torch

    return torch.from_numpy(state_to_array(state, num_joints))


def dummy_observation(cameras: Sequence[tuple[str, str, tuple[int, int]]], lower: np.ndarray,
                      upper: np.ndarray, environment_state_dim: int = 0) -> Observation:
    """Black images of each camera's (name, feature, (H, W)), the joint range's middle and,
    when ``environment_state_dim``, zero object features: an observation any checkpoint
    with these inputs accepts (warm-up, latency measurement)."""
    return Observation(
        images={name: np.zeros((h, w, 3), np.uint8) for name, _, (h, w) in cameras},
        state=(lower + upper) / 2.0,
        environment_state=(np.zeros(environment_state_dim, np.float32)
                           if environment_state_dim else None))


def timed_dummy_calls(predict: Callable[[Observation], Any],
                      cameras: Sequence[tuple[str, str, tuple[int, int]]], lower: np.ndarray,
                      upper: np.ndarray, iterations: int, environment_state_dim: int = 0) -> float:
    """Call ``predict`` ``iterations`` times (at least once) on :func:`dummy_observation`;
    returns seconds (the predictors' warm-up)."""
    start = time.perf_counter()
    obs = dummy_observation(cameras, lower, upper, environment_state_dim)
    for _ in range(max(1, iterations)):
        predict(obs)
    return time.perf_counter() - start
