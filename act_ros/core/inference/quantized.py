"""INT8 models: the ONNX export quantized with NNCF, kept beside it and never used stale.

``precision: int8`` (backend ``openvino`` only) runs a post-training quantization of the
export (:mod:`act_ros.core.inference.export`) made ahead of time by ``act-ros export --int8
--calibration-dataset DATASET_DIR`` (:mod:`act_ros.training.quantize`): NNCF's
``nncf.quantize`` on the OpenVINO model read from the ONNX file, its activation ranges
calibrated on observations of a real LeRobot dataset turned into model inputs by the
runtime's own preprocessing, never on noise. Layout, beside the export it was quantized
from::

    export/model_<H>x<W>_int8.xml    OpenVINO IR of the quantized network
    export/model_<H>x<W>_int8.bin    its weights
    export/model_<H>x<W>_int8.json   record: the ONNX export it came from (sha256), the
                                     checkpoint hash, what it was calibrated on (dataset,
                                     frames), NNCF settings, versions, sha256 of both files

The IR files are written to temporary siblings and renamed into place, the record last,
after the old record is removed: a quantized model is valid only when its record matches
the ONNX export the runtime would run in fp32 (its sha256, so a new checkpoint or input
size makes it stale) and both IR files. A missing or stale one is an error that says how
to make it (:class:`~act_ros.core.errors.QuantizedModelError`): int8 never falls back
silently. Torch-free; OpenVINO and NNCF are imported only to quantize.

Weights are quantized with NNCF's overflow fix on every layer (7-bit weights): an x86 CPU
without 8-bit dot products (no AVX-512 VNNI, AVX-VNNI or AMX; an AVX2 one) multiplies
unsigned activations by signed weights a pair at a time and sums each pair in 16 bits,
which saturates when both use all 8 bits. NNCF's default fixes the first layer only; on a
2-core AVX2 CPU, every layer quantized, the test model's actions were off from fp32's by
85 % of how much fp32's actions differ between frames, against 16 % with the fix on every
layer. A model made without it (an older record) is refused as stale on such a CPU and
used on others.
"""

from __future__ import annotations

import datetime
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.atomic import write_json_atomic
from act_ros.core.errors import DeviceUnavailableError, QuantizedModelError
from act_ros.core.inference.export import OnnxExport, file_sha256
from act_ros.core.inference.precision import cpu_saturates_int8
from act_ros.core.signal_stack import kept_signal_stack

RECORD_VERSION = 1
SUFFIX = '_int8'
QUANTIZER_EXTRA = 'openvino'  # the pip extra that brings nncf beside OpenVINO
# NNCF's own default calibration subset size.
DEFAULT_SAMPLES = 300
# What nncf.quantize is given (and the record says): ACT is a transformer behind a ResNet
# backbone; NNCF's transformer settings keep the attention's sensitive operations in
# floating point and apply SmoothQuant. Preset: NNCF's default for transformers (mixed).
MODEL_TYPE = 'transformer'
TARGET_DEVICE = 'CPU'
# NNCF's OverflowFix, on every layer (module docstring): the model runs right on any CPU.
OVERFLOW_FIX = 'enable'
# Which layers run on 8-bit integers: 'convolutions' (the ResNet backbones and the 1x1
# projection of their maps; the transformer's linear layers, the state and pose
# projections and the action head stay f32) or 'all'. The shipped object-state policy on
# 100 unseen seeds: fp32 0.91, convolutions 0.92, all 0.43 (docs/performance.md).
LAYERS = ('convolutions', 'all')
DEFAULT_LAYERS = 'convolutions'


@dataclass(frozen=True)
class Int8Paths:
    """The three files of a quantized model beside its ONNX export."""

    xml: Path
    bin: Path
    record: Path


@dataclass(frozen=True)
class Int8Model:
    """A valid quantized model: its files and its record."""

    paths: Int8Paths
    record: dict[str, Any]

    @property
    def digest(self) -> str:
        """A short content key (the IR files' sha256): OpenVINO's compiled-model cache folder."""
        return str(self.record['xml_sha256'])[:8] + str(self.record['bin_sha256'])[:8]


def int8_paths(onnx_path: Path) -> Int8Paths:
    """``model_<H>x<W>_int8.{xml,bin,json}`` beside ``model_<H>x<W>.onnx``."""
    stem = Path(onnx_path).stem + SUFFIX
    directory = Path(onnx_path).parent
    return Int8Paths(directory / f'{stem}.xml', directory / f'{stem}.bin',
                     directory / f'{stem}.json')


def read_record(paths: Int8Paths) -> dict[str, Any] | None:
    """The record of a quantized model, or ``None`` when it is missing or unreadable."""
    try:
        data = json.loads(paths.record.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def stale_reason(export: OnnxExport, *, flags: Iterable[str] | None = None) -> str | None:
    """Why the quantized model beside ``export`` cannot be used; ``None`` if it can.

    ``flags``: the CPU flags it would run on (default: this machine's).
    """
    paths = int8_paths(export.path)
    if not paths.xml.is_file() and not paths.record.is_file():
        return 'there is none'
    record = read_record(paths)
    if record is None:
        return f'{paths.record.name} is missing or unreadable'
    if record.get('record_version') != RECORD_VERSION:
        return (f"record version {record.get('record_version')!r}, this act_ros writes "
                f'{RECORD_VERSION}')
    source = record.get('quantized_from') or {}
    if source.get('onnx_sha256') != export.metadata.get('onnx_sha256'):
        return ('it was quantized from another export of the checkpoint (the checkpoint or '
                'its input size changed since)')
    for name, path in (('xml_sha256', paths.xml), ('bin_sha256', paths.bin)):
        if not path.is_file():
            return f'{path.name} is missing'
        if record.get(name) != file_sha256(path):
            return f'{path.name} does not match its record (sha256)'
    fix = (record.get('quantization') or {}).get('overflow_fix')
    if fix != OVERFLOW_FIX and cpu_saturates_int8(flags):
        return ('it was quantized with 8-bit weights past the first layer (overflow fix '
                f'{fix or "first layer only"!r}), and this CPU has no 8-bit dot products '
                '(no avx512_vnni, avx_vnni or amx_int8): its int8 sums saturate and the '
                'actions would be wrong; this act_ros quantizes with 7-bit weights')
    return None


def how_to_make(export: OnnxExport) -> str:
    """The command that makes the quantized model of ``export``'s checkpoint: the
    checkpoint the export folder is in, else (an export in the user cache) the one its
    metadata names."""
    holder = export.path.parent.parent
    checkpoint = (holder if (holder / 'config.json').is_file()
                  else export.metadata.get('checkpoint') or 'CHECKPOINT')
    return f'act-ros export --checkpoint {checkpoint} --int8 --calibration-dataset DATASET_DIR'


def find_int8_model(export: OnnxExport) -> Int8Model:
    """The valid quantized model beside ``export``; :class:`QuantizedModelError` (one line:
    what is wrong and the command that makes it) when there is none or it is stale."""
    reason = stale_reason(export)
    paths = int8_paths(export.path)
    if reason is not None:
        raise QuantizedModelError(
            f'precision int8 needs a model quantized from {export.path.name} at {paths.xml}, '
            f'but {reason}: make it with {how_to_make(export)} (a LeRobot dataset recorded '
            'with the cameras and joints this policy takes)')
    return Int8Model(paths=paths, record=read_record(paths))


def _import_quantizer() -> tuple[Any, Any]:
    """``(nncf, openvino)``; a missing one names the pip extra that installs both."""
    try:
        import nncf
        import openvino
    except ImportError as exc:
        raise DeviceUnavailableError(
            f'INT8 quantization needs nncf and openvino ({exc}): pip install '
            f"'act_ros[{QUANTIZER_EXTRA}]' (in a source checkout: pip install -e "
            f"'.[{QUANTIZER_EXTRA}]')") from exc
    return nncf, openvino


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {}
    for package in ('nncf', 'openvino'):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = 'not installed'
    return versions


def quantize_export(export: OnnxExport, items: Sequence[Any],
                    model_inputs: Callable[[Any], dict[str, np.ndarray]], *,
                    calibration: dict[str, Any], layers: str = DEFAULT_LAYERS) -> Int8Model:
    """Quantize ``export`` to INT8 with NNCF, calibrated on ``items``, and write it beside
    the export (atomically, the record last); returns the model as written.

    ``model_inputs(item)`` turns one calibration item (an observation) into the backend's
    normalized float32 inputs by name, computed lazily: NNCF passes over the data more
    than once and the inputs of hundreds of camera frames would not fit in memory.
    ``calibration``: what the items are (the dataset, the frames), kept in the record.
    ``layers``: which layers run on 8-bit integers (:data:`LAYERS`).
    """
    if not items:
        raise ValueError('INT8 calibration needs at least one observation')
    if layers not in LAYERS:
        raise ValueError(f'int8 layers must be one of {LAYERS}, got {layers!r}')
    nncf, ov = _import_quantizer()
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix
    start = time.perf_counter()
    with kept_signal_stack():
        # convert_model, unlike Core.read_model, folds what the exporter left between each
        # linear layer and its weights (a Transpose, the split of attention's packed
        # projection) into constants: NNCF quantizes only weights it sees as constants, and
        # from read_model the transformer's linear layers ran in f32 behind fake-quantized
        # inputs (only the backbone's convolutions in int8).
        model = ov.convert_model(str(export.path))
        quantized = nncf.quantize(
            model, nncf.Dataset(list(items), model_inputs), subset_size=len(items),
            model_type=nncf.ModelType.TRANSFORMER, target_device=nncf.TargetDevice.CPU,
            advanced_parameters=AdvancedQuantizationParameters(
                overflow_fix=OverflowFix(OVERFLOW_FIX)),
            # Linear layers are MatMul operations in the OpenVINO model, convolutions not.
            ignored_scope=(nncf.IgnoredScope(types=['MatMul']) if layers == 'convolutions'
                           else None))
    paths = int8_paths(export.path)
    tag = f'.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}'
    tmp_xml = paths.xml.with_name(f'.{paths.xml.stem}{tag}.xml')
    tmp_bin = tmp_xml.with_suffix('.bin')  # OpenVINO writes the weights beside the XML
    try:
        # fp16 compression would round the weights NNCF left in floating point.
        ov.save_model(quantized, str(tmp_xml), compress_to_fp16=False)
        paths.record.unlink(missing_ok=True)  # until the new record: no valid model here
        os.replace(tmp_bin, paths.bin)
        os.replace(tmp_xml, paths.xml)
    finally:
        tmp_xml.unlink(missing_ok=True)
        tmp_bin.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    record = {
        'record_version': RECORD_VERSION,
        'format': 'openvino_ir',
        'precision': 'int8',
        'quantized_from': {'onnx': export.path.name,
                           'onnx_sha256': export.metadata.get('onnx_sha256')},
        'checkpoint_hash': export.metadata.get('checkpoint_hash'),
        'checkpoint': export.metadata.get('checkpoint'),
        'inputs': export.metadata.get('inputs'),
        'output': export.metadata.get('output'),
        'calibration': {**calibration, 'samples': len(items)},
        'quantization': {'tool': 'nncf.quantize (post-training, OpenVINO backend)',
                         'model': 'openvino.convert_model of the ONNX export',
                         'model_type': MODEL_TYPE, 'target_device': TARGET_DEVICE,
                         'subset_size': len(items), 'preset': 'NNCF default (mixed for '
                         'transformers)', 'overflow_fix': OVERFLOW_FIX, 'layers': layers,
                         'compress_to_fp16': False},
        'versions': _versions(),
        'xml_sha256': file_sha256(paths.xml),
        'bin_sha256': file_sha256(paths.bin),
        'quantize_seconds': round(seconds, 2),
        'created': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
    }
    write_json_atomic(paths.record, record)
    return Int8Model(paths=paths, record=record)


__all__ = ['DEFAULT_LAYERS', 'DEFAULT_SAMPLES', 'LAYERS', 'OVERFLOW_FIX', 'Int8Model',
           'Int8Paths', 'find_int8_model', 'how_to_make', 'int8_paths', 'quantize_export',
           'read_record', 'stale_reason']
