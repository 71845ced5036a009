"""The network as it is run and exported: a tensor-only ``forward`` around LeRobot's ACT.

Its own module so that the runtime (:mod:`act_ros.core.inference`), the backends and the
ONNX export (:mod:`act_ros.core.export`) all import it without importing each other.
"""

from __future__ import annotations

import torch
from torch import nn


class ACTInferenceModel(nn.Module):
    """``(state, *images) -> actions`` for an ACT network in eval mode (latent = 0).

    Inputs are normalized: ``state`` (B, J) and one (B, 3, H, W) tensor per camera, in the
    order of the checkpoint's ``image_features``. Output: (B, chunk_size, J).
    """

    def __init__(self, act_model: nn.Module) -> None:
        super().__init__()
        self.model = act_model

    def forward(self, state: torch.Tensor, *images: torch.Tensor) -> torch.Tensor:
        batch = {'observation.state': state, 'observation.images': list(images)}
        actions, _ = self.model(batch)
        return actions
