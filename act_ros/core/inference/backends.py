"""Inference backends: what turns normalized observation tensors into a normalized chunk.

- ``torch`` (default): :class:`~act_ros.core.inference.predictor.ACTInferenceModel` in PyTorch, on
  any device, optionally ``torch.compile``-d, fp32/bf16/fp16 under autocast.
- ``openvino``: the ONNX export (:mod:`act_ros.core.inference.export`) compiled by OpenVINO's CPU
  plugin. ``precision`` maps to ``INFERENCE_PRECISION_HINT`` (fp32 -> f32, bf16, fp16 ->
  f16); a reduced precision is accepted only when the CPU computes it natively, and the
  precision OpenVINO actually compiled is checked afterwards: OpenVINO would otherwise
  fall back to f32 without a word. ``int8`` compiles the export's quantized model
  (:mod:`act_ros.core.inference.quantized`, made by ``act-ros export --int8``) instead of the ONNX
  file, its layers that NNCF left in floating point in f32; without a valid one it is an
  error saying how to make it.
- ``onnxruntime``: the ONNX export in ONNX Runtime's CPU execution provider, fp32 only.

The non-torch backends run on the CPU, are optional pip extras (``act_ros[openvino]``,
``act_ros[onnxruntime]``), and have the interface of the torch module they replace in
:class:`~act_ros.core.inference.predictor.ChunkPredictor`: ``backend(state, *inputs) -> tensor``
(the environment state, when the checkpoint takes it, then the cameras: the graph's
inputs in order, :func:`~act_ros.core.inference.export.graph_signature`).
Pre- and post-processing (normalization) stay in the predictor, shared by all backends.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from act_ros.core.errors import DeviceUnavailableError
from act_ros.core.inference.export import OnnxExport, cache_export_dir, ensure_onnx_export

# The backend table and option checks live in a torch-free module; re-exported here.
from act_ros.core.inference.options import (  # noqa: F401
    BACKEND_AUTO,
    BACKEND_CHOICES,
    BACKEND_PACKAGES,
    BACKEND_PRECISIONS,
    BACKENDS,
    CPU_DEVICES,
    check_backend_options,
    installed_backends,
    resolve_backend,
)
from act_ros.core.inference.quantized import find_int8_model
from act_ros.core.signal_stack import kept_signal_stack

if TYPE_CHECKING:  # torch only where a backend stands in for a torch module (__call__)
    import torch
    from torch import nn

    from act_ros.core.inference.checkpoint import LoadedCheckpoint

# OpenVINO's compiled models are cached here, inside the export's directory, one folder
# per ONNX file content: a cached blob can never outlive the export it was compiled from.
OPENVINO_CACHE_DIR = 'openvino_cache'


def _load_module(name: str) -> ModuleType:
    """Import a backend's runtime package (the one place backends are imported)."""
    return importlib.import_module(name)


def import_backend(backend: str) -> ModuleType:
    """The runtime package of ``backend``; a missing one names the pip extra to install."""
    module, extra = BACKEND_PACKAGES[backend]
    try:
        return _load_module(module)
    except ImportError as exc:
        raise DeviceUnavailableError(
            f"backend '{backend}' was requested but {module} is not installed ({exc}): "
            f"pip install 'act_ros[{extra}]' (in a source checkout: pip install -e '.[{extra}]')"
        ) from exc


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    import torch

    return np.ascontiguousarray(tensor.detach().to('cpu', torch.float32).numpy())


class OnnxBackend:
    """Common part of the ONNX backends: the export, input names, timing, the call."""

    name = ''

    def __init__(self, export: OnnxExport, precision: str, threads: int | None = None) -> None:
        self.export = export
        self.precision = precision
        self.threads = threads  # as asked (None: the backend's default); a rebuild reuses it
        self.input_names = export.input_names
        self.compile_seconds = 0.0
        self.compiled_cache = 'off'  # a cache of the compiled model: hit | miss | off
        # Image inputs this backend takes as the camera's uint8 pixels, (1, H, W, 3), and
        # normalizes itself (OpenVINOBackend with image_affine); the rest take the
        # normalized float32 (1, 3, H, W) the export was traced with.
        self.uint8_images: frozenset[str] = frozenset()

    def with_precision(self, precision: str) -> OnnxBackend:
        """The same backend (export, threads, options) built for ``precision``."""
        return type(self)(self.export, precision=precision, threads=self.threads)

    @property
    def load_seconds(self) -> float:
        """Start-up cost: ONNX export (0 when reused) plus the backend's compilation."""
        return self.export.seconds + self.compile_seconds

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, state: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """Normalized ``state`` and the further graph inputs in order -> normalized chunk."""
        tensors = (state, *inputs)
        if len(tensors) != len(self.input_names):
            raise ValueError(f'{self.name}: expected {len(self.input_names)} inputs '
                             f'{self.input_names}, got {len(tensors)}')
        import torch

        out = self.run({name: _numpy(t) for name, t in zip(self.input_names, tensors)})
        return torch.from_numpy(out).to(state.device)

    @property
    def cache_note(self) -> str:
        """The start-up caches this backend used: the ONNX export (reused: hit; written
        now: miss) and, where there is one, the compiled model."""
        note = f"export {'miss' if self.export.exported else 'hit'}"
        return note if self.compiled_cache == 'off' else f'{note}, compiled {self.compiled_cache}'



class OpenVINOBackend(OnnxBackend):
    """The ONNX export compiled by OpenVINO for the CPU, at the requested precision."""

    name = 'openvino'
    # int8: the quantized model, whatever NNCF kept in floating point computed in f32.
    HINTS = {'fp32': 'f32', 'bf16': 'bf16', 'fp16': 'f16', 'int8': 'f32'}
    CAPABILITY = {'bf16': 'BF16', 'fp16': 'FP16', 'int8': 'INT8'}

    def __init__(self, export: OnnxExport, *, precision: str = 'fp32',
                 threads: int | None = None, cache: bool = True,
                 image_affine: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        """``image_affine``: for image inputs by name, the per-channel ``(scale, offset)``
        with which the normalized image is ``scale * pixels + offset`` (LeRobot's
        ``pixels / 255`` and the feature's normalization folded into one multiply-add,
        :meth:`~act_ros.core.inference.onnx_predictor.NumpyProcessors.image_affine`): those inputs
        then take the camera's uint8 pixels, (1, H, W, 3), and OpenVINO converts, transposes
        and normalizes them as the first steps of the compiled model (its pre-processing,
        fused with the first layer), instead of a pass over every pixel in numpy before each
        call."""
        check_backend_options(self.name, precision=precision, compile_model=False)
        super().__init__(export, precision, threads)
        self.image_affine = dict(image_affine or {})
        unknown = sorted(set(self.image_affine) - set(self.input_names))
        if unknown:
            raise ValueError(f'image_affine names {unknown}, which are not inputs of the export '
                             f'{self.input_names}')
        # int8: the quantized model beside the export (QuantizedModelError, saying how to
        # make it, when there is none or it is stale), else the ONNX file itself.
        self.int8 = find_int8_model(export) if precision == 'int8' else None
        model_path = self.int8.paths.xml if self.int8 is not None else export.path
        ov = import_backend(self.name)
        import openvino.properties as props
        import openvino.properties.hint as hints

        # The CPU plugin installs its own alternate signal stack on this thread and may free
        # it while still installed: keep ours (act_ros.core.signal_stack).
        with kept_signal_stack():
            core = ov.Core()
            wanted = getattr(ov.Type, self.HINTS[precision])
            capabilities = list(core.get_property('CPU', props.device.capabilities))
            if precision in self.CAPABILITY and self.CAPABILITY[precision] not in capabilities:
                raise DeviceUnavailableError(self._refusal(precision, capabilities))
            config: dict[str, Any] = {hints.inference_precision: wanted,
                                      hints.performance_mode: hints.PerformanceMode.LATENCY}
            if threads:
                config[props.inference_num_threads] = int(threads)
            digest = self.int8.digest if self.int8 is not None else None
            cache_dir = _openvino_cache_dir(export, digest) if cache else None
            start = time.perf_counter()
            if cache_dir is not None:
                # The model with its image pre-processing is written once as OpenVINO IR
                # beside the compiled blobs: compiled from a file, a cached blob is found
                # without hashing the whole graph at each start.
                source = (_preprocessed_ir(ov, core, Path(model_path), self.image_affine,
                                           cache_dir) if self.image_affine else Path(model_path))
                # OpenVINO keys its blobs on the model file, the device and this config; the
                # folder is keyed on the file's content (its sha256, checked with the export
                # or the quantized model's record).
                blobs = set(cache_dir.glob('*.blob'))
                core.set_property({props.cache_dir: str(cache_dir)})
                self._compiled = core.compile_model(str(source), 'CPU', config)
                self.compiled_cache = 'miss' if set(cache_dir.glob('*.blob')) - blobs else 'hit'
            else:
                model = core.read_model(str(model_path))
                if self.image_affine:
                    model = _with_image_preprocessing(ov, model, self.image_affine)
                self._compiled = core.compile_model(model, 'CPU', config)
            self.compile_seconds = time.perf_counter() - start
            compiled_as = self._compiled.get_property(hints.inference_precision)
            if compiled_as != wanted:
                raise DeviceUnavailableError(self._refusal(precision, capabilities, compiled_as))
            self._request = self._compiled.create_infer_request()
        self.uint8_images = frozenset(self.image_affine)

    def with_precision(self, precision: str) -> OpenVINOBackend:
        return type(self)(self.export, precision=precision, threads=self.threads,
                          image_affine=self.image_affine)

    @staticmethod
    def _refusal(precision: str, capabilities: list[str], compiled_as: Any = None) -> str:
        found = f'it compiled {compiled_as} instead' if compiled_as is not None else (
            f'its capabilities are {capabilities}')
        return (f"precision '{precision}' was requested for backend openvino, but OpenVINO "
                f'cannot run it natively on this CPU ({found}); use precision fp32')

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        self._request.infer(feed)
        # The request reuses its output buffer: copy before the next call.
        return np.array(self._request.get_output_tensor(0).data, dtype=np.float32, copy=True)


def _with_image_preprocessing(ov: Any, model: Any,
                              image_affine: dict[str, tuple[np.ndarray, np.ndarray]]) -> Any:
    """``model`` whose image inputs take uint8 (1, H, W, 3) pixels: OpenVINO's
    pre-processing converts them to f32, lays them out as the model's NCHW and applies
    ``scale * pixels + offset`` per channel (as ``(pixels - mean) / scale'`` with
    ``mean = -offset / scale``, ``scale' = 1 / scale``)."""
    from openvino.preprocess import PrePostProcessor

    ppp = PrePostProcessor(model)
    for name, (scale, offset) in image_affine.items():
        scale = np.asarray(scale, dtype=np.float64).reshape(-1)
        offset = np.asarray(offset, dtype=np.float64).reshape(-1)
        if not (scale.shape == offset.shape == (3,)) or not np.all(scale != 0):
            raise ValueError(f"image_affine['{name}']: expected a non-zero scale and an offset "
                             f'per channel (3 each), got {scale} and {offset}')
        stage = ppp.input(name)
        stage.tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout('NHWC'))
        stage.model().set_layout(ov.Layout('NCHW'))
        stage.preprocess().convert_element_type(ov.Type.f32).mean(
            (-offset / scale).tolist()).scale((1.0 / scale).tolist())
    return ppp.build()


def _preprocessed_ir(ov: Any, core: Any, model_path: Path,
                     image_affine: dict[str, tuple[np.ndarray, np.ndarray]],
                     cache_dir: Path) -> Path:
    """``model_path`` with the image pre-processing of ``image_affine``
    (:func:`_with_image_preprocessing`) as OpenVINO IR in ``cache_dir``, keyed on the
    source file's name and the affine values; written once, the ``.bin`` before the
    ``.xml`` (whose presence says the pair is whole), weights as they are (no fp16
    compression)."""
    key = hashlib.sha256(json.dumps(
        [model_path.name, {name: [np.asarray(v, dtype=np.float32).reshape(-1).tolist()
                                  for v in pair] for name, pair in sorted(image_affine.items())}]
    ).encode()).hexdigest()[:16]
    xml = cache_dir / f'preprocessed_{key}.xml'
    if xml.is_file() and xml.with_suffix('.bin').is_file():
        return xml
    model = _with_image_preprocessing(ov, core.read_model(str(model_path)), image_affine)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix='.preprocessed-') as tmp:
        tmp_xml = Path(tmp) / xml.name
        ov.save_model(model, str(tmp_xml), compress_to_fp16=False)
        os.replace(tmp_xml.with_suffix('.bin'), xml.with_suffix('.bin'))
        os.replace(tmp_xml, xml)
    return xml


def _openvino_cache_dir(export: OnnxExport, digest: str | None = None) -> Path | None:
    """A writable folder for OpenVINO's compiled-model cache of ``export`` (or of the model
    whose content key is ``digest``: the quantized one), or ``None``."""
    digest = digest or str(export.metadata.get('onnx_sha256') or '')[:16]
    if not digest:
        return None
    candidates = [export.path.parent / OPENVINO_CACHE_DIR / digest]
    ckpt_hash = export.metadata.get('checkpoint_hash')
    if ckpt_hash:  # a read-only export directory: the user cache
        candidates.append(cache_export_dir(str(ckpt_hash)) / OPENVINO_CACHE_DIR / digest)
    for directory in candidates:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        probe = directory / '.write-test'
        try:
            probe.touch()
            probe.unlink()
        except OSError:
            continue
        return directory
    return None


class OnnxRuntimeBackend(OnnxBackend):
    """The ONNX export in ONNX Runtime's CPU execution provider (fp32)."""

    name = 'onnxruntime'

    def __init__(self, export: OnnxExport, *, precision: str = 'fp32',
                 threads: int | None = None) -> None:
        check_backend_options(self.name, precision=precision, compile_model=False)
        super().__init__(export, precision, threads)
        ort = import_backend(self.name)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = int(threads)
        start = time.perf_counter()
        self._session = ort.InferenceSession(str(export.path), sess_options=options,
                                             providers=['CPUExecutionProvider'])
        self.compile_seconds = time.perf_counter() - start
        self._output = export.output_name

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(self._session.run([self._output], feed)[0], dtype=np.float32)


class InputRecorder(OnnxBackend):
    """A stand-in backend that computes nothing: it keeps the inputs it is given (by name,
    float32 copies) and returns a chunk of zeros. :func:`backend_inputs` uses it."""

    name = 'recorder'

    def __init__(self, backend: OnnxBackend) -> None:
        super().__init__(backend.export, backend.precision, backend.threads)
        self.inputs: dict[str, np.ndarray] | None = None
        self._output_shape = tuple(backend.export.metadata['output']['shape'])

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        self.inputs = {name: np.array(value, dtype=np.float32, copy=True)
                       for name, value in feed.items()}
        return np.zeros(self._output_shape, dtype=np.float32)


def backend_inputs(predictor: Any, obs: Any) -> dict[str, np.ndarray]:
    """The normalized inputs ``predictor``'s ONNX backend receives for the observation
    ``obs``, by graph input name: the runtime's preprocessing exactly as it runs (the
    calibration data of ``act-ros export --int8``).

    ``predictor``: a :class:`~act_ros.core.inference.predictor.ChunkPredictor` with an ONNX backend or
    a :class:`~act_ros.core.inference.onnx_predictor.LeanOnnxPredictor`; its backend is put back after.
    """
    backend = predictor.backend
    recorder = InputRecorder(backend)
    predictor.use_backend(recorder)
    try:
        predictor.normalized(obs)
    finally:
        predictor.use_backend(backend)
    assert recorder.inputs is not None  # normalized() ran the backend once
    return recorder.inputs


BACKEND_CLASSES: dict[str, type[OnnxBackend]] = {'openvino': OpenVINOBackend,
                                                 'onnxruntime': OnnxRuntimeBackend}


def create_backend(backend: str, checkpoint: LoadedCheckpoint, *, model: nn.Module | None = None,
                   precision: str = 'fp32', threads: int | None = None) -> OnnxBackend:
    """A non-torch backend for ``checkpoint``, from its ONNX export (exported when missing
    or stale). ``model`` is the CPU ``ACTInferenceModel`` to export from, if already built."""
    check_backend_options(backend, precision=precision, compile_model=False)
    if backend == 'torch':
        raise ValueError("the torch backend is the predictor's own model, not an ONNX backend")
    import_backend(backend)  # a missing package fails now, not after a long export
    export = ensure_onnx_export(checkpoint, model=model)
    return BACKEND_CLASSES[backend](export, precision=precision, threads=threads)
