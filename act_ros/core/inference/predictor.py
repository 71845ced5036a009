"""The inference model: normalized observation tensors in, a normalized action chunk out.

:class:`ACTInferenceModel` is a tensor-only ``forward`` around LeRobot's ``ACT`` network
(no ``.item()``, no Python-side state), so ``torch.compile(fullgraph=True)`` traces it
without graph breaks. :class:`ChunkPredictor` adds what every backend shares: LeRobot's
pre/post-processors (normalization), precision (autocast) and optional compilation, and
turns an :class:`~act_ros.core.observation.Observation` into a ``(T, J)`` numpy chunk.
With ``backend`` ``openvino`` or ``onnxruntime`` the network itself runs from its ONNX
export instead (:mod:`act_ros.core.inference.backends`); the processors stay the same.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from act_ros.core.contract import Contract
from act_ros.core.errors import DeviceUnavailableError, ObservationError
from act_ros.core.inference import precision as precision_rules
from act_ros.core.inference.backends import create_backend
from act_ros.core.inference.checkpoint import LoadedCheckpoint
from act_ros.core.inference.network import ACTInferenceModel

# Torch-free (act_ros.core.inference.options); re-exported here, where they were first defined.
from act_ros.core.inference.options import BACKEND_PRECISIONS, COMPILE_MODES, PRECISIONS, PredictorOptions  # noqa: F401
from act_ros.core.observation import (
    Observation,
    environment_state_to_array,
    image_to_tensor,
    state_to_tensor,
    timed_dummy_calls,
)


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bfloat16 natively (AVX512-BF16 or AMX on x86): the one
    detection of :func:`act_ros.core.inference.precision.cpu_has_native_bf16`, which ``precision:
    auto`` uses too.

    Without it, bf16 autocast is emulated in software, so it is refused rather than run
    slowly (``act-ros bench runtime`` measures what native bf16 gives where it exists).
    """
    return precision_rules.cpu_has_native_bf16()


def native_reduced_precision(device: torch.device) -> str | None:
    """'bf16' where ``device`` computes bfloat16 natively (a CPU with AVX512-BF16 or AMX, a
    CUDA GPU that supports it), else None."""
    if device.type == 'cpu':
        return 'bf16' if cpu_has_native_bf16() else None
    if device.type == 'cuda':
        return 'bf16' if torch.cuda.is_bf16_supported() else None
    return None


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Autocast for reduced precision; a null context for fp32."""
    if precision not in BACKEND_PRECISIONS['torch']:  # int8 is a quantized OpenVINO model
        raise ValueError(f"precision '{precision}' is not one torch runs, expected one of "
                         f"{BACKEND_PRECISIONS['torch']}")
    if precision == 'fp32':
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == 'bf16' else torch.float16
    if device.type == 'cpu' and precision == 'fp16':
        raise ValueError("precision 'fp16' needs a CUDA or MPS device; use 'bf16' on CPU")
    if device.type == 'cpu' and not cpu_has_native_bf16():
        raise DeviceUnavailableError(
            "precision 'bf16' was requested but this CPU has no native bfloat16 (AVX512-BF16 "
            'or AMX), so it would be emulated in software; use fp32')
    return torch.autocast(device_type=device.type, dtype=dtype)


def compile_inference_model(model: nn.Module, *, mode: str = 'default',
                            freeze: bool = True) -> nn.Module:
    """``torch.compile(fullgraph=True)``; with ``freeze`` (mode 'default' only) inductor
    folds the inference-only weights into constants (call it under ``no_grad``)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode '{mode}', expected one of {COMPILE_MODES}")
    if freeze and mode == 'default':
        return torch.compile(model, fullgraph=True, dynamic=False, options={'freezing': True})
    return torch.compile(model, fullgraph=True, dynamic=False, mode=mode)


class ChunkPredictor:
    """Observation -> postprocessed action chunk ``(T, J)`` with a loaded checkpoint."""

    def __init__(self, checkpoint: LoadedCheckpoint, contract: Contract, device: torch.device,
                 options: PredictorOptions | None = None) -> None:
        self.checkpoint = checkpoint
        self.contract = contract
        self.device = device
        self.options = options or PredictorOptions()
        # (contract camera name, feature key, (H, W)), in the model's camera order: the
        # cameras the checkpoint takes (any subset of the contract's, possibly none).
        by_feature = {cam.feature: cam.name for cam in contract.cameras}
        self.cameras = [(by_feature[key], key, checkpoint.image_shapes[key])
                        for key in checkpoint.config.image_features]
        self.env_state_key = checkpoint.env_state_key  # None: no environment state input
        self.env_state_dim = checkpoint.env_state_dim
        self.model = ACTInferenceModel(checkpoint.policy.model).to(device).eval()
        self.compile_seconds = 0.0
        self.backend = None
        self.last_timing: dict[str, float] = {}  # seconds of the last predict()'s parts
        if self.options.backend != 'torch':
            if device.type != 'cpu':
                raise ValueError(f"backend '{self.options.backend}' runs on the CPU, the "
                                 f'predictor was given {device}')
            # ONNX export (when missing or stale) + the backend's compilation.
            self.backend = create_backend(self.options.backend, checkpoint, model=self.model,
                                          precision=self.options.precision,
                                          threads=self.options.threads)
            self.forward = self.backend
            self.compile_seconds = self.backend.load_seconds
            return
        # Validate the precision for this device up front (fp16 on CPU is an error).
        autocast_context(device, self.options.precision)
        self.forward = (compile_inference_model(self.model, mode=self.options.compile_mode,
                                                freeze=self.options.freeze)
                        if self.options.compile_model else self.model)

    # -- observation -> tensors --------------------------------------------------------
    def observation_tensors(self, obs: Observation) -> dict[str, torch.Tensor]:
        """Unbatched float tensors keyed by policy feature (what LeRobot's processors take)."""
        missing = [name for name, _, _ in self.cameras if name not in obs.images]
        if missing:
            raise ObservationError(f'observation lacks cameras {missing} (has {sorted(obs.images)})')
        out = {self.contract.state_feature: state_to_tensor(obs.state, self.contract.num_joints)}
        if self.env_state_key is not None:
            out[self.env_state_key] = torch.from_numpy(
                environment_state_to_array(obs.environment_state, self.env_state_dim))
        for name, feature, size in self.cameras:
            out[feature] = image_to_tensor(obs.images[name], size, name)
        return out

    # -- model -------------------------------------------------------------------------
    @torch.no_grad()
    def normalized_chunk(self, batch: dict[str, Any]) -> torch.Tensor:
        """Preprocessed batch -> normalized (1, T, J) chunk."""
        state = batch[self.contract.state_feature]
        inputs = [batch[self.env_state_key]] if self.env_state_key is not None else []
        inputs += [batch[feature] for _, feature, _ in self.cameras]
        precision = self.options.precision if self.backend is None else 'fp32'  # set at compile
        with autocast_context(self.device, precision):
            actions = self.forward(state, *inputs)
        return actions.float()

    @torch.no_grad()
    def predict_tensors(self, tensors: dict[str, torch.Tensor],
                        started: float | None = None) -> np.ndarray:
        """Tensors -> chunk; ``last_timing`` receives the seconds of its parts (from
        ``started``, a ``time.perf_counter()`` moment, when the tensors were made for it)."""
        start = time.perf_counter() if started is None else started
        batch = self.checkpoint.preprocessor(tensors)
        preprocessed = time.perf_counter()
        actions = self.normalized_chunk(batch)
        modelled = time.perf_counter()
        actions = self.checkpoint.postprocessor(actions)
        chunk = actions[0].detach().to('cpu', torch.float64).numpy()
        self.last_timing = {'preprocess_s': preprocessed - start, 'model_s': modelled - preprocessed,
                            'postprocess_s': time.perf_counter() - modelled}
        return chunk

    def predict(self, obs: Observation) -> np.ndarray:
        """One model call: the (T, J) action chunk, unnormalized, in contract order."""
        start = time.perf_counter()
        return self.predict_tensors(self.observation_tensors(obs), started=start)

    @torch.no_grad()
    def normalized(self, obs: Observation) -> np.ndarray:
        """The model's normalized ``(1, T, J)`` output for ``obs`` (precision checks)."""
        batch = self.checkpoint.preprocessor(self.observation_tensors(obs))
        return self.normalized_chunk(batch).detach().to('cpu', torch.float32).numpy()

    @torch.no_grad()
    def model_times(self, obs: Observation, iterations: int) -> list[float]:
        """Seconds of ``iterations`` model calls alone on ``obs`` preprocessed once."""
        batch = self.checkpoint.preprocessor(self.observation_tensors(obs))
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            self.normalized_chunk(batch)
            times.append(time.perf_counter() - start)
        return times

    def use_backend(self, backend: Any) -> None:
        """Run the network on another ONNX backend of the same export, or, on the torch
        backend, in another autocast precision (``None``: fp32, or 'bf16'/'fp16'): what
        the precision check switches between (:mod:`act_ros.core.inference.precision`)."""
        if self.backend is None:
            if backend is not None and not isinstance(backend, str):
                raise ValueError('the torch backend is the predictor\'s own model: no ONNX '
                                 'backend replaces it')
            precision = backend or 'fp32'
            autocast_context(self.device, precision)  # refuses what this device cannot run
            self.options = replace(self.options, precision=precision)
            return
        self.backend = backend
        self.forward = backend

    def warmup(self, iterations: int = 2) -> float:
        """Run the model on a dummy observation (compiles when asked); returns seconds."""
        elapsed = timed_dummy_calls(self.predict, self.cameras, self.contract.lower,
                                    self.contract.upper, iterations, self.env_state_dim)
        if self.options.compile_model:
            self.compile_seconds = elapsed
        return elapsed
