"""The network as it is run and exported: a tensor-only ``forward`` around LeRobot's ACT.

Its own module so that the runtime (:mod:`act_ros.core.inference.predictor`), the backends and the
ONNX export (:mod:`act_ros.core.inference.export`) all import it without importing each other.
"""

from __future__ import annotations

import torch
from torch import nn

# LeRobot's batch keys (lerobot.utils.constants OBS_STATE, OBS_ENV_STATE, OBS_IMAGES).
OBS_STATE = 'observation.state'
OBS_ENV_STATE = 'observation.environment_state'
OBS_IMAGES = 'observation.images'


class ACTInferenceModel(nn.Module):
    """``(state, [environment_state], *images) -> actions`` for an ACT network in eval mode
    (latent = 0).

    Inputs are normalized: ``state`` (B, J), then, when the network takes it
    (``config.env_state_feature``), the environment state (B, E), then one (B, 3, H, W)
    tensor per camera in the order of the checkpoint's ``image_features`` (none for a
    policy without cameras). Output: (B, chunk_size, J).
    """

    def __init__(self, act_model: nn.Module) -> None:
        super().__init__()
        self.model = act_model
        config = getattr(act_model, 'config', None)
        self.takes_environment_state = getattr(config, 'env_state_feature', None) is not None

    def forward(self, state: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        batch = {OBS_STATE: state}
        images = inputs
        if self.takes_environment_state:
            batch[OBS_ENV_STATE], images = inputs[0], inputs[1:]
        if images:  # LeRobot's ACT reads the batch size from the first image when present
            batch[OBS_IMAGES] = list(images)
        actions, _ = self.model(batch)
        return actions
