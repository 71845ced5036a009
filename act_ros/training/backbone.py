"""Training aids for ACT's ResNet backbone that leave the architecture unchanged.

LeRobot's ACT builds its ResNet with ``FrozenBatchNorm2d``: every normalization layer is a
fixed affine map whose statistics are buffers, never updated by training. With ImageNet
weights those buffers hold ImageNet's statistics; trained from scratch (no pretrained
weights here: nothing is downloaded) they are the identity, so the backbone is an
unnormalized 20-layer network whose activations drift in scale from layer to layer and
whose early layers learn slowly.

:func:`calibrate_frozen_batchnorm` sets those buffers once, before the first step, from
the training images (a data-dependent initialization in the spirit of LSUV): each
normalization layer standardizes, per channel, what reaches it on a sample of training
frames. The checkpoint keeps LeRobot's layout and loads unchanged in LeRobot; the
calibrated statistics are saved with the weights like any other buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

logger = logging.getLogger(__name__)

# What a FrozenBatchNorm2d holds, and a BatchNorm2d computes with in eval mode.
_NORM_STATE = ('weight', 'bias', 'running_mean', 'running_var')


def frozen_batchnorm_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, layer)`` of every ``FrozenBatchNorm2d`` in ``module``, in registration order."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    return [(name, m) for name, m in module.named_modules() if isinstance(m, FrozenBatchNorm2d)]


@torch.no_grad()
def calibrate_frozen_batchnorm(backbone: nn.Module, images: Iterable[torch.Tensor], *,
                               eps: float = 1e-5) -> dict[str, float]:
    """Standardize every ``FrozenBatchNorm2d`` of ``backbone`` on ``images``.

    ``images``: normalized camera batches (B, 3, H, W) as the backbone sees them in
    training (all cameras share one backbone, so pass every camera). One forward pass over
    their concatenation; a pre-hook on each layer sets ``running_mean`` / ``running_var`` to
    the per-channel mean and variance of its input (weight 1, bias 0) before the layer
    runs, so each layer is calibrated on the already-calibrated output of the layers before
    it. Returns, per layer, the input's standard deviation before calibration (large or
    tiny values show how far the identity initialization was from unit scale).
    """
    layers = frozen_batchnorm_layers(backbone)
    if not layers:
        raise ValueError('the backbone has no FrozenBatchNorm2d layers to calibrate (expected '
                         "LeRobot ACT's torchvision ResNet)")
    batch = torch.cat([img.float() for img in images], dim=0)
    if batch.ndim != 4 or batch.shape[0] < 2:
        raise ValueError(f'need at least 2 images (N, 3, H, W) to calibrate, got '
                         f'{tuple(batch.shape)}')
    device = next(backbone.parameters()).device
    batch = batch.to(device)
    before: dict[str, float] = {}

    def hook_for(name: str):
        def hook(layer: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].float()
            mean = x.mean(dim=(0, 2, 3))
            var = x.var(dim=(0, 2, 3), unbiased=False)
            before[name] = float(var.mean().sqrt())
            layer.running_mean.copy_(mean)
            layer.running_var.copy_(var.clamp_min(eps))
            layer.weight.fill_(1.0)
            layer.bias.zero_()
        return hook

    handles = [layer.register_forward_pre_hook(hook_for(name)) for name, layer in layers]
    was_training = backbone.training
    try:
        backbone.eval()
        backbone(batch)
    finally:
        for handle in handles:
            handle.remove()
        backbone.train(was_training)
    logger.info('calibrated %d FrozenBatchNorm2d layers on %d images (input std before: '
                'min %.3g, max %.3g)', len(layers), batch.shape[0], min(before.values()),
                max(before.values()))
    return before


class TrainableBatchNorm:
    """The backbone's ``FrozenBatchNorm2d`` layers swapped for ``nn.BatchNorm2d`` while a
    pretraining runs, and written back as frozen buffers for every checkpoint.

    In training mode each normalization standardizes its batch and keeps running statistics,
    and its scale and shift are parameters: the backbone stays normalized as its weights
    move (a frozen normalization only holds the scale it was calibrated for). The saved
    checkpoint has LeRobot's layout: inside :meth:`frozen` the original layers are back in
    place holding the running statistics and the learnt affine, which is what
    ``FrozenBatchNorm2d`` computes and what ``nn.BatchNorm2d`` computes in eval mode. Layers
    inside ``skip`` (the stages kept frozen) stay as they are.
    """

    def __init__(self, backbone: nn.Module, skip: Iterable[nn.Module] = (),
                 momentum: float = 0.1) -> None:
        from torchvision.ops.misc import FrozenBatchNorm2d

        skipped = {id(m) for root in skip for m in root.modules()}
        self.swaps: list[tuple[nn.Module, str, nn.Module, nn.BatchNorm2d]] = []
        for parent in list(backbone.modules()):
            if id(parent) in skipped:
                continue
            for name, child in list(parent.named_children()):
                if not isinstance(child, FrozenBatchNorm2d) or id(child) in skipped:
                    continue
                norm = nn.BatchNorm2d(child.weight.numel(), eps=child.eps, momentum=momentum)
                norm.to(child.weight.device)
                with torch.no_grad():
                    for key in _NORM_STATE:
                        getattr(norm, key).copy_(getattr(child, key))
                setattr(parent, name, norm)
                self.swaps.append((parent, name, child, norm))
        if not self.swaps:
            raise ValueError('no FrozenBatchNorm2d outside the frozen stages to train '
                             "(expected LeRobot ACT's torchvision ResNet)")

    def __len__(self) -> int:
        return len(self.swaps)

    @torch.no_grad()
    def write_back(self) -> None:
        """Copy each trained normalization into its frozen layer's buffers."""
        for _parent, _name, frozen, norm in self.swaps:
            for key in _NORM_STATE:
                getattr(frozen, key).copy_(getattr(norm, key).detach())

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The frozen layers in place, up to date, for as long as the block runs (to save)."""
        self.write_back()
        for parent, name, frozen, _norm in self.swaps:
            setattr(parent, name, frozen)
        try:
            yield
        finally:
            for parent, name, _frozen, norm in self.swaps:
                setattr(parent, name, norm)
