"""Frozen backbone stages: their outputs computed once per frame, reused every step.

On a CPU, ACT's training step is dominated by the ResNet backbone (convolutions forward
and backward over every camera image of the batch; see ``docs/training_results.md``). A
stage of the backbone that no longer trains need not run again: once the stages up to ``cut``
(``layer2``, say, or the whole backbone, ``layer4``) are frozen, their output for every
training frame and camera is computed once and kept in memory, and each later step runs
only what follows ``cut`` (the remaining ResNet stages, then projection, transformer,
VAE encoder and action head) on the stored maps. The result is exactly the step the full
network would take with those stages frozen (same tensors, same gradients for the other
parameters), several times cheaper.

The checkpoint is unchanged: LeRobot's ACT with its whole backbone (the frozen weights
included), so it loads in LeRobot and runs on images as before.

The layer4 maps are also kept on disk and reused by a later build with the same frozen
backbone (a ``--resume``, the next DAgger iteration): :mod:`act_ros.training.feature_disk`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)


# The stages of LeRobot's ACT backbone (torchvision ResNet under IntermediateLayerGetter),
# in the order its forward runs them; a cut names the last stage that is cached.
STAGES = ('conv1', 'bn1', 'relu', 'maxpool', 'layer1', 'layer2', 'layer3', 'layer4')
CUTS = ('layer1', 'layer2', 'layer3', 'layer4')


def _check_cut(cut: str) -> None:
    if cut not in CUTS:
        raise ValueError(f"unknown backbone cut '{cut}', expected one of {CUTS}")


def stages_up_to(backbone: nn.Module, cut: str) -> list[nn.Module]:
    _check_cut(cut)
    return [getattr(backbone, name) for name in STAGES[:STAGES.index(cut) + 1]]


def stages_after(backbone: nn.Module, cut: str) -> list[nn.Module]:
    _check_cut(cut)
    return [getattr(backbone, name) for name in STAGES[STAGES.index(cut) + 1:]]


class BackboneTail(nn.Module):
    """Stands in for ACT's backbone while the output of its stages up to ``cut`` comes from
    the cache: runs the remaining stages (the real modules, so they keep training) and
    returns the ``feature_map`` that LeRobot's ``IntermediateLayerGetter`` would return.
    With ``cut='layer4'`` it passes its input through."""

    def __init__(self, backbone: nn.Module, cut: str) -> None:
        super().__init__()
        self._stages = stages_after(backbone, cut)  # a plain list: not registered twice

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        for stage in self._stages:
            x = stage(x)
        return {'feature_map': x}


@contextlib.contextmanager
def backbone_bypassed(model: nn.Module, cut: str = 'layer4') -> Iterator[None]:
    """Inside, ``model.backbone`` (LeRobot's ``ACT``) takes the cached output of the stages
    up to ``cut`` instead of images.

    The real backbone is put back on exit, also on error, so ``state_dict()`` and saved
    checkpoints always hold it.
    """
    real = model.backbone
    model.backbone = BackboneTail(real, cut)
    try:
        yield
    finally:
        model.backbone = real


def freeze(module: nn.Module, cut: str | None = None) -> int:
    """Stop gradients to ``module``'s parameters (AdamW then skips them), or with ``cut`` to
    the backbone stages up to it; returns how many parameters were frozen."""
    modules = [module] if cut is None else stages_up_to(module, cut)
    count = 0
    for part in modules:
        for param in part.parameters():
            param.requires_grad_(False)
            param.grad = None
            count += param.numel()
        part.eval()
    return count


class FeatureCache:
    """Backbone feature maps of chosen dataset frames, per camera feature key.

    ``rows[i]`` is the cache row of dataset frame ``i`` (-1: not cached). ``lookup``
    refuses frames that were not cached rather than returning stale or empty maps.
    """

    def __init__(self, maps: dict[str, torch.Tensor], frames: np.ndarray, num_frames: int,
                 seconds: float, cut: str = 'layer4', *, computed: int | None = None,
                 location: Path | None = None) -> None:
        self.maps = maps
        self.cut = cut
        self.rows = torch.full((num_frames,), -1, dtype=torch.long)
        self.rows[torch.as_tensor(frames, dtype=torch.long)] = torch.arange(len(frames))
        self.seconds = seconds
        # Frames whose maps were computed in this build; the others were read from the
        # directory ``location`` (act_ros.training.feature_disk; None: memory only).
        self.computed = len(frames) if computed is None else computed
        self.location = location

    @property
    def reused(self) -> int:
        """Frames whose maps were read from ``location`` rather than computed."""
        return int((self.rows >= 0).sum()) - self.computed

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.maps.values())

    def lookup(self, indices: np.ndarray | torch.Tensor) -> dict[str, torch.Tensor]:
        rows = self.rows[torch.as_tensor(indices, dtype=torch.long)]
        if bool((rows < 0).any()):
            missing = torch.as_tensor(indices)[rows < 0][:5].tolist()
            raise KeyError(f'frames {missing} are not in the feature cache (it holds the '
                           'training frames only)')
        return {key: maps[rows].float() for key, maps in self.maps.items()}


def run_stages(stages: Sequence[nn.Module], inputs: dict[str, torch.Tensor], keys: Sequence[str],
               device: torch.device | str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One batch through ``stages`` per camera key; the maps on the CPU in ``dtype``."""
    out = {}
    for key in keys:
        x = inputs[key].to(device)
        for stage in stages:
            x = stage(x)
        out[key] = x.to('cpu', dtype)
    return out


@torch.no_grad()
def build_feature_cache(backbone: nn.Module, frames: np.ndarray, num_frames: int,
                        load_images: Callable[[np.ndarray], dict[str, torch.Tensor]],
                        keys: Sequence[str], *, cut: str = 'layer4', batch_size: int = 64,
                        device: torch.device | str = 'cpu', progress: bool = False,
                        source: FeatureCache | None = None,
                        dtype: torch.dtype = torch.float32) -> FeatureCache:
    """Run the (frozen) backbone stages up to ``cut`` over ``frames`` once per camera key.

    ``load_images(indices)`` returns the normalized camera batches, as the training step
    feeds them to the model (the preprocessor's output). With ``source`` (a cache at an
    earlier cut holding the same frames) the stages start from its maps instead of the
    images. Maps are kept on the CPU in ``dtype`` (device memory is not assumed to hold
    them) and moved per batch; they are used in float32.
    """
    from tqdm import tqdm

    start = time.perf_counter()
    frames = np.asarray(frames, dtype=np.int64)
    if source is not None:
        first_stage = STAGES.index(source.cut) + 1
    else:
        first_stage = 0
    stages = [getattr(backbone, name) for name in STAGES[first_stage:STAGES.index(cut) + 1]]
    was_training = backbone.training
    backbone.eval()
    maps: dict[str, torch.Tensor] = {}
    try:
        for first in tqdm(range(0, len(frames), batch_size), desc=f'feature cache ({cut})',
                          unit='batch', disable=not progress, leave=False):
            chunk = frames[first:first + batch_size]
            inputs = source.lookup(chunk) if source is not None else load_images(chunk)
            for key, out in run_stages(stages, inputs, keys, device, dtype).items():
                if key not in maps:
                    maps[key] = torch.empty((len(frames), *out.shape[1:]), dtype=dtype)
                maps[key][first:first + len(chunk)] = out
    finally:
        backbone.train(was_training)
    cache = FeatureCache(maps, frames, num_frames, time.perf_counter() - start, cut=cut)
    logger.info('feature cache (%s): %d frames x %d cameras, maps %s, %.0f MB, built in %.0f s',
                cut, len(frames), len(keys), tuple(next(iter(maps.values())).shape[1:]),
                cache.nbytes / 1e6, cache.seconds)
    return cache
