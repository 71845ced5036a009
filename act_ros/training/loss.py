"""ACT training loss, tensors only (no ``.item()``), so a training step compiles whole.

For predicted chunks :math:`\\hat a`, targets :math:`a` (B, T, D), a padding mask
:math:`p` (B, T) and per-dimension weights :math:`w` (D,):

.. math::

    m_{bt} = 1 - p_{bt}, \\qquad
    L_1 = \\frac{\\sum_{b,t,d} w_d\\, m_{bt}\\, |a_{btd} - \\hat a_{btd}|}
               {\\sum_{b,t,d} w_d\\, m_{bt}}

    KL = \\frac{1}{B} \\sum_b \\sum_l -\\tfrac12 (1 + s_{bl} - \\mu_{bl}^2 - e^{s_{bl}})
    \\quad (s = \\log \\sigma^2)

    loss = L_1 + \\beta\\, KL

With unit weights this is exactly LeRobot's ACT loss. ``reduction='none'`` returns the
per-sample loss (B,) (L1 normalized per sample), ``'sum'`` its sum; ``'mean'`` the
batch-pooled value above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

REDUCTIONS = ('mean', 'sum', 'none')


@dataclass
class ACTLossOutput:
    """The differentiable ``loss`` and detached terms for logging."""

    loss: Tensor
    l1: Tensor
    kl: Tensor

    def detached(self) -> dict[str, Tensor]:
        return {'loss': self.loss.detach(), 'l1': self.l1.detach(), 'kl': self.kl.detach()}


def dimension_weights(num_dims: int, *, grippers: Sequence[int] = (),
                      gripper_weight: float = 5.0) -> Tensor:
    """Per-dimension L1 weights: 1 everywhere, ``gripper_weight`` on each gripper (its
    index in ``grippers``)."""
    if gripper_weight <= 0:
        raise ValueError(f'gripper_weight must be > 0, got {gripper_weight}')
    weights = torch.ones(num_dims)
    for i in grippers:
        weights[i] = gripper_weight
    return weights


def act_loss(actions_hat: Tensor, actions: Tensor, *, action_is_pad: Tensor | None = None,
             mu: Tensor | None = None, log_sigma_x2: Tensor | None = None,
             dim_weights: Tensor | None = None, kl_weight: float = 10.0,
             reduction: str = 'mean') -> ACTLossOutput:
    """Masked, weighted L1 plus ``kl_weight`` x KL (see module docstring)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction '{reduction}', expected one of {REDUCTIONS}")
    if actions_hat.shape != actions.shape or actions.ndim != 3:
        raise ValueError(f'predicted and target chunks must both be (B, T, D); got '
                         f'{tuple(actions_hat.shape)} and {tuple(actions.shape)}')
    batch, steps, dims = actions.shape
    valid = (torch.ones(batch, steps, dtype=actions.dtype, device=actions.device)
             if action_is_pad is None else (~action_is_pad).to(actions.dtype))
    weights = (torch.ones(dims, dtype=actions.dtype, device=actions.device)
               if dim_weights is None else dim_weights.to(actions.device, actions.dtype))
    if weights.shape != (dims,):
        raise ValueError(f'dim_weights must have shape ({dims},), got {tuple(weights.shape)}')
    mask = valid.unsqueeze(-1) * weights  # (B, T, D)
    err = (actions_hat - actions).abs() * mask
    if reduction == 'mean':
        l1 = err.sum() / mask.sum().clamp_min(1e-12)
    else:
        l1 = err.sum(dim=(1, 2)) / mask.sum(dim=(1, 2)).clamp_min(1e-12)

    if mu is not None and log_sigma_x2 is not None:
        kl_per_sample = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1)
    else:
        kl_per_sample = torch.zeros(batch, dtype=actions.dtype, device=actions.device)
    kl = kl_per_sample.mean() if reduction == 'mean' else kl_per_sample
    loss = l1 + kl_weight * kl
    if reduction == 'sum':
        loss, l1, kl = loss.sum(), l1.sum(), kl.sum()
    return ACTLossOutput(loss=loss, l1=l1, kl=kl)


def act_training_loss(model: torch.nn.Module, batch: dict[str, Tensor], *,
                      image_features: list[str] | tuple[str, ...],
                      dim_weights: Tensor | None = None, kl_weight: float = 10.0,
                      reduction: str = 'mean') -> ACTLossOutput:
    """Run LeRobot's ``ACT`` network (train mode) on a normalized batch and return the loss.

    ``batch`` holds ``observation.state``, the camera features (none for a policy without
    cameras), ``observation.environment_state`` when the model takes the object poses,
    ``action`` (B, T, D) and ``action_is_pad`` (B, T), as LeRobot's preprocessor and
    dataset produce them.
    """
    inputs = dict(batch)
    if image_features:  # LeRobot's ACT reads the batch size from the first image if present
        inputs['observation.images'] = [batch[key] for key in image_features]
    actions_hat, (mu, log_sigma_x2) = model(inputs)
    return act_loss(actions_hat, batch['action'], action_is_pad=batch.get('action_is_pad'),
                    mu=mu, log_sigma_x2=log_sigma_x2, dim_weights=dim_weights,
                    kl_weight=kl_weight, reduction=reduction)
