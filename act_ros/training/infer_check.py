"""Inference check of a written checkpoint: load it the way the node does and run it.

The checkpoint is loaded by :class:`~act_ros.core.inference.runtime.PolicyRuntime` (the node's and
the evaluator's loader), fed dataset frames as the node would feed camera images, and
its action chunks are compared with the recorded ones.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.observation import Observation
from act_ros.training.data import evenly_spread

INFERENCE_CHECK_FRAMES = 8  # frames a written checkpoint is checked on


def inference_check(checkpoint: Path, inputs: Any, *, frames: int = INFERENCE_CHECK_FRAMES,
                    device: str = 'cpu') -> dict[str, Any]:
    """Run ``frames`` validation (else training) frames through the runtime.

    Returns whether every action was finite, the mean absolute error against the
    recorded chunk (joint units: rad, gripper normalized; padded steps excluded) and the
    mean model latency.
    """
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    split = inputs.split
    picks = evenly_spread(split.val if split.val.size else split.train, frames)
    store = inputs.store
    names = {cam.feature: cam.name for cam in inputs.contract.cameras}
    runtime = PolicyRuntime(RuntimeConfig(model_path=checkpoint, device=device, execution='sync',
                                          contract=inputs.contract, warmup=False))
    errors, finite, latency = [], True, []
    try:
        for index in picks.tolist():
            batch = store.batch(np.array([index]))
            images = {names[key]: store.images[key][index].permute(1, 2, 0).numpy()
                      for key in store.images}
            env = store.env_state[index].numpy() if store.env_state is not None else None
            obs = Observation(images=images, state=store.state[index].numpy(),
                              environment_state=env)
            start = time.perf_counter()
            chunk = runtime.predictor.predict(obs)
            latency.append(time.perf_counter() - start)
            finite &= bool(np.all(np.isfinite(chunk)))
            target = batch[store.action_key][0].numpy()
            valid = ~batch[f'{store.action_key}_is_pad'][0].numpy()
            errors.append(np.abs(chunk - target)[valid])
    finally:
        runtime.close()
    err = np.concatenate(errors) if errors else np.zeros((0,))
    return {'checkpoint': str(checkpoint), 'frames': int(picks.size), 'finite': finite,
            'mean_abs_error': float(err.mean()) if err.size and finite else None,
            'mean_inference_ms': float(np.mean(latency) * 1000.0) if latency else None,
            'source': 'val' if split.val.size else 'train'}
