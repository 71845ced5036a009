"""Frozen-backbone training: the backbone's feature maps computed once, reused every step.

On a CPU, ACT's training step is dominated by the ResNet backbone (convolutions forward
and backward over every camera image of the batch; see ``docs/training.md``). Once the
backbone has learned what it needs (the first ``backbone_freeze_step`` steps train it
end to end), it is frozen: its feature map of every training frame and camera is
computed once with the frozen weights and kept in memory, and each later step runs only
the rest of ACT (projection, transformer, VAE encoder, action head) on the stored maps.
The result is exactly the step the full network would take with a frozen backbone
(same tensors, same gradients for the other parameters), several times cheaper.

The checkpoint is unchanged: LeRobot's ACT with its backbone (the frozen weights), so it
loads in LeRobot and runs on images as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import contextlib
import logging
import time

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)


class PassthroughBackbone(nn.Module):
    """Stands in for ACT's backbone while its outputs come from the cache: returns its input
    as the ``feature_map`` that LeRobot's ``IntermediateLayerGetter`` would return."""

    def forward(self, feature_map: torch.Tensor) -> dict[str, torch.Tensor]:
        return {'feature_map': feature_map}


@contextlib.contextmanager
def backbone_bypassed(model: nn.Module) -> Iterator[None]:
    """Inside, ``model.backbone`` (LeRobot's ``ACT``) takes feature maps instead of images.

    The real backbone is put back on exit, also on error, so ``state_dict()`` and saved
    checkpoints always hold it.
    """
    real = model.backbone
    model.backbone = PassthroughBackbone()
    try:
        yield
    finally:
        model.backbone = real


def freeze(module: nn.Module) -> int:
    """Stop gradients to ``module``'s parameters (AdamW then skips them); returns how many
    parameters were frozen."""
    count = 0
    for param in module.parameters():
        param.requires_grad_(False)
        param.grad = None
        count += param.numel()
    module.eval()
    return count


class FeatureCache:
    """Backbone feature maps of chosen dataset frames, per camera feature key.

    ``rows[i]`` is the cache row of dataset frame ``i`` (-1: not cached). ``lookup``
    refuses frames that were not cached rather than returning stale or empty maps.
    """

    def __init__(self, maps: dict[str, torch.Tensor], frames: np.ndarray, num_frames: int,
                 seconds: float) -> None:
        self.maps = maps
        self.rows = torch.full((num_frames,), -1, dtype=torch.long)
        self.rows[torch.as_tensor(frames, dtype=torch.long)] = torch.arange(len(frames))
        self.seconds = seconds

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.maps.values())

    def lookup(self, indices: np.ndarray | torch.Tensor) -> dict[str, torch.Tensor]:
        rows = self.rows[torch.as_tensor(indices, dtype=torch.long)]
        if bool((rows < 0).any()):
            missing = torch.as_tensor(indices)[rows < 0][:5].tolist()
            raise KeyError(f'frames {missing} are not in the feature cache (it holds the '
                           'training frames only)')
        return {key: maps[rows] for key, maps in self.maps.items()}


@torch.no_grad()
def build_feature_cache(backbone: nn.Module, frames: np.ndarray, num_frames: int,
                        load_images: Callable[[np.ndarray], dict[str, torch.Tensor]],
                        keys: Sequence[str], *, batch_size: int = 64,
                        device: torch.device | str = 'cpu', progress: bool = False
                        ) -> FeatureCache:
    """Run the (frozen) ``backbone`` over ``frames`` once per camera key.

    ``load_images(indices)`` returns the normalized camera batches, as the training step
    feeds them to the model (the preprocessor's output). Maps are kept in float32 on the
    CPU (device memory is not assumed to hold them) and moved per batch.
    """
    from tqdm import tqdm

    start = time.perf_counter()
    frames = np.asarray(frames, dtype=np.int64)
    was_training = backbone.training
    backbone.eval()
    maps: dict[str, torch.Tensor] = {}
    try:
        for first in tqdm(range(0, len(frames), batch_size), desc='feature cache',
                          unit='batch', disable=not progress, leave=False):
            chunk = frames[first:first + batch_size]
            images = load_images(chunk)
            for key in keys:
                out = backbone(images[key].to(device))['feature_map'].float().cpu()
                if key not in maps:
                    maps[key] = torch.empty((len(frames), *out.shape[1:]), dtype=torch.float32)
                maps[key][first:first + len(chunk)] = out
    finally:
        backbone.train(was_training)
    cache = FeatureCache(maps, frames, num_frames, time.perf_counter() - start)
    logger.info('feature cache: %d frames x %d cameras, maps %s, %.0f MB, built in %.0f s',
                len(frames), len(keys), tuple(next(iter(maps.values())).shape[1:]),
                cache.nbytes / 1e6, cache.seconds)
    return cache
