"""An ONNX backend predictor that needs neither torch nor LeRobot, for a fast start-up.

With backend ``openvino`` or ``onnxruntime`` the network runs from its ONNX export, so
once the export exists, the model's torch modules are not needed to compute a chunk;
only the checkpoint's normalization is, which :class:`NumpyProcessors` applies exactly
as LeRobot's processor pipelines do (the same float32 operations in the same order).
The inference child of ``execution='process'`` uses :func:`lean_onnx_predictor` first
and thereby skips importing torch, torchvision and LeRobot and building the ACT model
(together most of its start-up); it falls back to the full
:class:`~act_ros.core.inference.predictor.ChunkPredictor` whenever this is not exactly
reproducible: no valid export yet (the full path exports it), or processor steps or
normalization modes other than those LeRobot's ACT writes.

A valid export carries the content hash of every JSON and safetensors file of the
checkpoint (:func:`~act_ros.core.inference.checkpoint_info.checkpoint_hash`), so the files used
here are byte for byte those the full loader validated when it made the export; the
features and statistics are checked again all the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.contract import Contract
from act_ros.core.errors import CheckpointError, ObservationError
from act_ros.core.inference.checkpoint_info import (
    POSTPROCESSOR_FILE,
    PREPROCESSOR_FILE,
    VISUAL,
    CheckpointInfo,
    checkpoint_hash,
    read_checkpoint_info,
    read_json,
)
from act_ros.core.inference.options import PredictorOptions
from act_ros.core.observation import (
    Observation,
    checked_image,
    environment_state_to_array,
    state_to_array,
    timed_dummy_calls,
)

# LeRobot's key for the action in its postprocessor (whatever the contract calls it).
ACTION_KEY = 'action'
MODES = ('MEAN_STD', 'MIN_MAX', 'IDENTITY')
# Statistics each mode needs (LeRobot's _NormalizationMixin._apply_transform).
NEEDED_STATS = {'MEAN_STD': ('mean', 'std'), 'MIN_MAX': ('min', 'max')}
PRE_STEPS = ('rename_observations_processor', 'to_batch_processor', 'device_processor',
             'normalizer_processor')
POST_STEPS = ('unnormalizer_processor', 'device_processor')


class Unsupported(Exception):
    """The checkpoint needs the full LeRobot path (the reason is the message)."""


@dataclass
class _Normalizer:
    """One (un)normalizer step: feature types, modes per type, eps and float32 stats."""

    feature_types: dict[str, str]
    norm_map: dict[str, str]
    eps: float
    stats: dict[str, dict[str, np.ndarray]]

    def apply(self, value: np.ndarray, key: str, feature_type: str, *,
              inverse: bool) -> np.ndarray:
        """LeRobot's ``_apply_transform`` for float32 arrays (same operations, same order)."""
        mode = self.norm_map.get(feature_type, 'IDENTITY')
        if mode == 'IDENTITY' or key not in self.stats:
            return value
        stats = self.stats[key]
        eps = np.float32(self.eps)
        if mode == 'MEAN_STD':
            mean, std = stats['mean'], stats['std']
            if inverse:
                return value * std + mean
            return (value - mean) / (std + eps)
        low, high = stats['min'], stats['max']
        denom = high - low
        denom = np.where(denom == 0, eps, denom).astype(np.float32)
        if inverse:
            return (value + np.float32(1)) / np.float32(2) * denom + low
        return np.float32(2) * (value - low) / denom - np.float32(1)


class NumpyProcessors:
    """A checkpoint's pre- and post-processing (LeRobot ``policy_preprocessor.json`` and
    ``policy_postprocessor.json``) in numpy, for the steps LeRobot's ACT writes."""

    def __init__(self, pre: _Normalizer, post: _Normalizer, state_key: str) -> None:
        self.pre = pre
        self.post = post
        self.state_key = state_key

    @classmethod
    def load(cls, path: Path, info: CheckpointInfo) -> NumpyProcessors:
        """Read both pipelines; :class:`Unsupported` for anything but ACT's plain steps,
        :class:`CheckpointError` for missing or non-finite statistics (as the full load)."""
        pre = _load_normalizer(path, PREPROCESSOR_FILE, PRE_STEPS, 'normalizer_processor')
        post = _load_normalizer(path, POSTPROCESSOR_FILE, POST_STEPS, 'unnormalizer_processor')
        _check_stats(pre, [info.state_key, *info.image_features], path / PREPROCESSOR_FILE,
                     required=(info.env_state_key,) if info.env_state_key else ())
        _check_stats(post, [ACTION_KEY], path / POSTPROCESSOR_FILE)
        return cls(pre, post, info.state_key)

    def preprocess(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Unbatched float32 arrays keyed by feature -> batched, normalized arrays."""
        out = {}
        for key, value in arrays.items():
            batched = value[None]  # to_batch_processor
            feature_type = self.pre.feature_types.get(key)
            out[key] = batched if feature_type is None or feature_type == 'ACTION' else (
                self.pre.apply(batched, key, feature_type, inverse=False))
        return out

    def image_affine(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, offset)`` with which the normalized image is ``scale * pixels +
        offset`` for uint8 ``pixels`` (3, H, W): LeRobot's ``pixels / 255`` followed by the
        feature's normalization, both affine, folded into one multiply-add (float32;
        the same values up to float32 rounding, a few 1e-7)."""
        feature_type = self.pre.feature_types.get(key)
        unit = np.zeros((2, 3, 1, 1), dtype=np.float32)
        unit[1] = 1.0  # normalized 0 and 1 give the offset and the slope per channel
        if feature_type is not None:  # as preprocess(): a feature without a type passes
            unit = self.pre.apply(unit, key, feature_type, inverse=False)
        zero, one = unit.astype(np.float64)
        scale = ((one - zero) / 255.0).astype(np.float32)
        return scale, zero.astype(np.float32)

    def postprocess(self, actions: np.ndarray) -> np.ndarray:
        """Normalized (1, T, J) float32 actions -> unnormalized, as LeRobot returns them."""
        return self.post.apply(actions, ACTION_KEY, 'ACTION', inverse=True)


def _load_normalizer(path: Path, file: str, allowed: tuple[str, ...], wanted: str) -> _Normalizer:
    from safetensors.numpy import load_file

    spec = read_json(path / file)
    steps = spec.get('steps') or []
    names = [step.get('registry_name') for step in steps]
    if any(name not in allowed for name in names) or names.count(wanted) != 1:
        raise Unsupported(f'{file}: steps {names} (handled here: {list(allowed)}, with one '
                          f'{wanted})')
    normalizer = None
    for step in steps:
        config = step.get('config') or {}
        name = step['registry_name']
        if name == 'rename_observations_processor' and config.get('rename_map'):
            raise Unsupported(f'{file}: a rename_map {config["rename_map"]}')
        if name == 'device_processor' and config.get('float_dtype') not in (None, 'float32'):
            raise Unsupported(f"{file}: device_processor float_dtype {config['float_dtype']}")
        if name != wanted:
            continue
        extra = sorted(set(config) - {'eps', 'features', 'norm_map'})
        if extra and any(config.get(key) is not None for key in extra):
            raise Unsupported(f'{file}: {wanted} options {extra}')
        norm_map = {str(k): str(v) for k, v in (config.get('norm_map') or {}).items()}
        unknown = sorted(set(norm_map.values()) - set(MODES))
        if unknown:
            raise Unsupported(f'{file}: normalization modes {unknown} (handled here: {MODES})')
        features = {str(k): str(v['type']) for k, v in (config.get('features') or {}).items()}
        stats: dict[str, dict[str, np.ndarray]] = {}
        if step.get('state_file'):
            for flat_key, value in load_file(str(path / step['state_file'])).items():
                key, stat = flat_key.rsplit('.', 1)
                stats.setdefault(key, {})[stat] = np.asarray(value, dtype=np.float32)
        for key, feature_type in features.items():  # (C,) visual stats broadcast as (C, 1, 1)
            if feature_type == VISUAL:
                for stat, value in stats.get(key, {}).items():
                    if value.ndim == 1:
                        stats[key][stat] = value.reshape(-1, 1, 1)
        normalizer = _Normalizer(features, norm_map, float(config.get('eps', 1e-8)), stats)
    assert normalizer is not None  # names.count(wanted) == 1
    return normalizer


def _check_stats(normalizer: _Normalizer, keys: list[str], where: Path,
                 required: tuple[str, ...] = ()) -> None:
    """As :func:`act_ros.core.inference.checkpoint._check_stats`: no feature passes unnormalized
    (``required`` keys must be normalized: listed, and not ``IDENTITY``)."""
    for key in (*keys, *required):
        feature_type = normalizer.feature_types.get(key)
        if feature_type is None and key in required:
            raise CheckpointError(f"{where}: the normalizer does not list '{key}': it would "
                                  'reach the model unnormalized')
        if feature_type is None:
            continue
        mode = normalizer.norm_map.get(feature_type, 'IDENTITY')
        if mode == 'IDENTITY' and key in required:
            raise CheckpointError(f"{where}: '{key}' has normalization mode IDENTITY: it would "
                                  'reach the model unnormalized')
        if mode == 'IDENTITY':
            continue
        stats = normalizer.stats.get(key)
        needed = NEEDED_STATS[mode]
        if not stats or any(name not in stats for name in needed):
            raise CheckpointError(f"{where}: normalization stats for '{key}' ({mode}) are "
                                  'missing: the feature would pass through unnormalized')
        for name in needed:
            if not np.isfinite(stats[name]).all():
                raise CheckpointError(f"{where}: stats '{name}' of '{key}' are not finite")


class LeanOnnxPredictor:
    """Observation -> postprocessed ``(T, J)`` chunk from an ONNX export, in numpy.

    The interface of :class:`~act_ros.core.inference.predictor.ChunkPredictor` as the inference
    child uses it (``predict``, ``warmup``, ``backend``, ``device``, ``compile_seconds``).
    """

    device = 'cpu'
    lean = True  # no torch model behind it (the inference child reports it)

    def __init__(self, info: CheckpointInfo, contract: Contract, processors: NumpyProcessors,
                 backend: Any) -> None:
        self.info = info
        self.contract = contract
        self.processors = processors
        self.backend = backend
        self.compile_seconds = backend.load_seconds
        self.last_timing: dict[str, float] = {}  # seconds of the last predict()'s parts
        by_feature = {cam.feature: cam.name for cam in contract.cameras}
        # (contract camera name, feature key, (H, W)) in the model's camera order.
        self.cameras = [(by_feature[key], key, info.image_shapes[key])
                        for key in info.image_features]
        self._affine = {key: processors.image_affine(key) for key in info.image_features}

    def predict(self, obs: Observation) -> np.ndarray:
        """One model call: the (T, J) action chunk, unnormalized, in contract order;
        ``last_timing`` receives the seconds of its parts."""
        start = time.perf_counter()
        feed = self._feed(obs)
        preprocessed = time.perf_counter()
        normalized = self.backend.run(feed).astype(np.float32)
        modelled = time.perf_counter()
        chunk = self.processors.postprocess(normalized)[0].astype(np.float64)
        self.last_timing = {'preprocess_s': preprocessed - start, 'model_s': modelled - preprocessed,
                            'postprocess_s': time.perf_counter() - modelled}
        return chunk

    def normalized(self, obs: Observation) -> np.ndarray:
        """The model's normalized ``(1, T, J)`` output for ``obs`` (precision checks)."""
        return self.backend.run(self._feed(obs)).astype(np.float32)

    def model_times(self, obs: Observation, iterations: int) -> list[float]:
        """Seconds of ``iterations`` model calls alone on ``obs`` preprocessed once."""
        feed = self._feed(obs)
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            self.backend.run(feed)
            times.append(time.perf_counter() - start)
        return times

    def use_backend(self, backend: Any) -> None:
        """Run on another backend of the same export (precision auto)."""
        self.backend = backend

    def _feed(self, obs: Observation) -> dict[str, np.ndarray]:
        """The backend's batched inputs for ``obs``: normalized float32, and uint8 pixels for
        the images the backend normalizes itself (``uint8_images``)."""
        missing = [name for name, _, _ in self.cameras if name not in obs.images]
        if missing:
            raise ObservationError(f'observation lacks cameras {missing} (has {sorted(obs.images)})')
        arrays = {self.info.state_key: state_to_array(obs.state, self.contract.num_joints)}
        if self.info.env_state_key is not None:
            arrays[self.info.env_state_key] = environment_state_to_array(
                obs.environment_state, self.info.env_state_dim)
        batch = self.processors.preprocess(arrays)
        # The images: checked and resized as uint8; a backend that normalizes them itself
        # (OpenVINO's pre-processing, in the compiled model) takes these pixels as they
        # are; else they are converted and normalized in one multiply-add per pixel into
        # the batch array: one pass over the pixels instead of a conversion, a division and
        # the normalizer's two passes, each a new array.
        uint8_images = self.backend.uint8_images
        for name, feature, size in self.cameras:
            pixels = checked_image(obs.images[name], size, name)
            if feature in uint8_images:
                batch[feature] = np.ascontiguousarray(pixels)[None]
                continue
            scale, offset = self._affine[feature]
            out = np.empty((1, 3, *pixels.shape[:2]), dtype=np.float32)
            np.multiply(pixels.transpose(2, 0, 1), scale, out=out[0], casting='unsafe')
            out[0] += offset
            batch[feature] = out
        return {name: batch[name] if name in uint8_images
                else np.ascontiguousarray(batch[name], dtype=np.float32)
                for name in self.backend.input_names}

    def warmup(self, iterations: int = 1) -> float:
        """Run the model on a dummy observation; returns seconds."""
        return timed_dummy_calls(self.predict, self.cameras, self.contract.lower,
                                 self.contract.upper, iterations, self.info.env_state_dim)


def lean_onnx_predictor(path: str | Path, contract: Contract, options: PredictorOptions,
                        events: dict[str, float] | None = None
                        ) -> tuple[LeanOnnxPredictor | None, str]:
    """The lean predictor for ``options.backend`` (``openvino``/``onnxruntime``), or
    ``(None, why)`` when the full path is needed. ``events`` receives the moments its
    imports, the checkpoint read and the backend build finished
    (:mod:`act_ros.core.startup` names). Errors in the checkpoint raise as in the full
    load; a missing backend package raises with the pip extra to install."""
    from act_ros.core.inference.backends import BACKEND_CLASSES, import_backend
    from act_ros.core.inference.export import OnnxExport, find_export, info_signature, read_metadata

    events = {} if events is None else events
    if options.backend not in BACKEND_CLASSES:
        return None, f"backend '{options.backend}' has no ONNX export"
    import_backend(options.backend)
    events['model_imported'] = time.monotonic()
    path = Path(path).expanduser()
    info = read_checkpoint_info(path, contract)
    try:
        processors = NumpyProcessors.load(path, info)
    except Unsupported as exc:
        return None, str(exc)
    events['checkpoint_loaded'] = time.monotonic()
    inputs, output = info_signature(info)
    export_path, reason = find_export(path, ckpt_hash=checkpoint_hash(path), inputs=inputs,
                                      output=output)
    if reason is not None:
        return None, f'ONNX export {export_path}: {reason}'
    export = OnnxExport(path=export_path, metadata=read_metadata(export_path), exported=False,
                        seconds=0.0)
    extra: dict[str, Any] = {}
    if options.backend == 'openvino':  # the images normalized in the compiled model
        extra['image_affine'] = {key: processors.image_affine(key) for key in info.image_features}
    backend = BACKEND_CLASSES[options.backend](export, precision=options.precision,
                                               threads=options.threads, **extra)
    events['backend_built'] = time.monotonic()
    return LeanOnnxPredictor(info, contract, processors, backend), ''


__all__ = ['LeanOnnxPredictor', 'NumpyProcessors', 'Unsupported', 'lean_onnx_predictor']
