"""Resumable training state: checkpoints with optimizer/scheduler/RNG, and the batch order.

``last/`` is a LeRobot ``pretrained_model`` directory plus ``training_state.pt`` (step,
optimizer, scheduler, RNG states, history, best values). Both are written into a staging
directory first and renamed into place together, so ``last/`` is always one consistent
step. The batch order is a pure function of (seed, step), so a resumed run draws exactly
the batches an uninterrupted run would have drawn. Under N processes the global batch of a
step is N x batch_size consecutive samples of the epoch's permutation, of which process
``rank`` takes the ``rank``-th block: within an epoch the processes see disjoint shards,
and together exactly the batch one process with batch N x batch_size would draw.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from act_ros.core.atomic import replace_dir
from act_ros.core.inference.checkpoint import save_checkpoint

TRAINING_STATE_FILE = 'training_state.pt'
TRAINING_INFO_FILE = 'training_info.json'


def capture_rng() -> dict[str, Any]:
    """RNG states of Python, NumPy and torch (CPU and CUDA)."""
    state = {'python': random.getstate(), 'numpy': np.random.get_state(),
             'torch': torch.get_rng_state()}
    if torch.cuda.is_available():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class BatchOrder:
    """Batches drawn from consecutive seeded permutations of the training frames.

    ``indices(step)`` is the same for a given (seed, frames, batch size, processes)
    whether the run was interrupted or not; no sampler state needs saving. With
    ``world_size`` > 1 it is process ``rank``'s share of the global batch (see the module
    docstring).
    """

    def __init__(self, frames: np.ndarray, batch_size: int, seed: int, *, rank: int = 0,
                 world_size: int = 1) -> None:
        if frames.size == 0:
            raise ValueError('no training frames to draw batches from')
        if not 0 <= rank < world_size:
            raise ValueError(f'rank must be in [0, world_size), got rank {rank} of {world_size}')
        self.frames = np.asarray(frames, dtype=np.int64)
        self.batch_size = batch_size
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self._cache: dict[int, np.ndarray] = {}

    def _epoch(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            rng = np.random.default_rng([self.seed, epoch])
            self._cache[epoch] = self.frames[rng.permutation(self.frames.size)]
        return self._cache[epoch]

    def indices(self, step: int) -> np.ndarray:
        """Frame indices of the batch for 0-based ``step`` (this process's share)."""
        n = self.frames.size
        start = (step * self.world_size + self.rank) * self.batch_size
        out = []
        while len(out) < self.batch_size:
            epoch, offset = divmod(start + len(out), n)
            take = min(self.batch_size - len(out), n - offset)
            out.extend(self._epoch(epoch)[offset:offset + take].tolist())
        return np.asarray(out, dtype=np.int64)


def save_model(path: Path, policy: Any, preprocessor: Any, postprocessor: Any, *,
               info_json: str, training_state: dict[str, Any] | None = None) -> Path:
    """Write a LeRobot checkpoint (plus ``training_state.pt`` when given) atomically."""
    path = Path(path)
    staging = path.parent / f'.{path.name}.staging-{os.getpid()}'
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save_checkpoint(staging, policy, preprocessor, postprocessor,
                        extra_files={TRAINING_INFO_FILE: info_json})
        if training_state is not None:
            torch.save(training_state, staging / TRAINING_STATE_FILE)
        replace_dir(staging, path)  # last/ is never missing, not even for an instant
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def copy_checkpoint(source: Path, path: Path) -> Path:
    """Copy a checkpoint directory (without training state) atomically to ``path``."""
    staging = path.parent / f'.{path.name}.staging-{os.getpid()}'
    shutil.rmtree(staging, ignore_errors=True)
    try:
        shutil.copytree(source, staging, ignore=shutil.ignore_patterns(TRAINING_STATE_FILE))
        replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def load_training_state(last_dir: Path) -> dict[str, Any]:
    """The state saved beside ``last/``; a clear error when it is missing."""
    file = Path(last_dir) / TRAINING_STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f'--resume: {file} is missing (expected a last/ checkpoint '
                                'written by act-ros train in --output-dir)')
    return torch.load(file, map_location='cpu', weights_only=False)
