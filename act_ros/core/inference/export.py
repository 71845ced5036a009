"""ONNX export of the inference model, kept beside a user's checkpoint and never used stale.

What is exported is :class:`~act_ros.core.inference.network.ACTInferenceModel`: normalized
observation tensors in (``observation.state`` (1, J), then ``observation.environment_state``
(1, 10) when the checkpoint takes object poses, then one (1, 3, H, W) tensor per camera
in the checkpoint's ``image_features`` order), the normalized action chunk
(1, chunk_size, J) out. Normalization stays in the runtime
(:class:`~act_ros.core.inference.predictor.ChunkPredictor`), shared by every backend.

Layout, inside the checkpoint directory (``export/`` is ignored by
:func:`~act_ros.core.inference.checkpoint.checkpoint_hash` and by git)::

    export/model_<H>x<W>.onnx        the graph with its weights (one file)
    export/model_<H>x<W>.onnx.json   metadata: input/output names and shapes, checkpoint
                                     hash, opset, torch/onnx/lerobot versions, ONNX sha256

(cameras of different sizes: every ``<H>x<W>``, joined with ``-``; no camera at all:
``model_nocam.onnx``.) Both files are
written to temporary siblings and renamed into place, the metadata last: an export is
valid only when its metadata matches the checkpoint (hash, input shapes) and the ONNX
file (sha256). Anything else is stale and is exported again, with a log line saying why.
The package's own models (``models/<name>`` of the share directory, tracked by git), a
checkpoint directory that cannot be written (installed read-only), and a Hub snapshot in
the ``huggingface_hub`` cache (:mod:`act_ros.core.inference.hub`) export to
``$XDG_CACHE_HOME/act_ros/export/<checkpoint hash>/`` instead (``~/.cache`` without
``XDG_CACHE_HOME``): an export, and the OpenVINO blobs compiled from it for one CPU, never
land in the repository.

``act-ros export --checkpoint DIR --format onnx [--image-size HxW]`` runs it by hand;
with ``--int8 --calibration-dataset DATASET_DIR`` it also quantizes the export for
``precision: int8`` (:mod:`act_ros.training.quantize`, :mod:`act_ros.core.inference.quantized`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from act_ros.core.arguments import HelpFormatter
from act_ros.core.contract import parse_image_size
from act_ros.core.errors import ActRosError, DeviceUnavailableError
from act_ros.core.inference.checkpoint_info import CheckpointInfo, checkpoint_hash
from act_ros.core.inference.hub import in_hub_cache
from act_ros.core.logs import setup_logging
from act_ros.core.paths import share_dir

if TYPE_CHECKING:  # torch is imported by the export itself only: a lookup needs none
    from torch import nn

    from act_ros.core.inference.checkpoint import LoadedCheckpoint

logger = logging.getLogger(__name__)

EXPORT_DIR = 'export'
FORMATS = ('onnx',)
OPSET = 18  # read by ONNX Runtime >= 1.14 and OpenVINO >= 2023
METADATA_VERSION = 1
EXPORTER = 'torch.onnx.export(dynamo=True, optimize=False)'
ONNX_EXTRA = 'onnx'


@dataclass(frozen=True)
class TensorSpec:
    """Name and static shape of one graph input or output (float32)."""

    name: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {'name': self.name, 'shape': list(self.shape), 'dtype': 'float32'}


@dataclass(frozen=True)
class OnnxExport:
    """A valid export: the ONNX file, its metadata, and whether this call wrote it."""

    path: Path
    metadata: dict[str, Any]
    exported: bool
    seconds: float  # export time; 0 when an existing export was reused

    @property
    def input_names(self) -> list[str]:
        return [spec['name'] for spec in self.metadata['inputs']]

    @property
    def output_name(self) -> str:
        return self.metadata['output']['name']


def graph_signature(checkpoint: LoadedCheckpoint,
                    image_size: tuple[int, int] | None = None) -> tuple[list[TensorSpec], TensorSpec]:
    """Inputs (state, the environment state when the checkpoint takes it, then cameras in
    the model's order) and output of the exported graph.

    ``image_size`` (H, W) overrides every camera's size; by default the checkpoint's.
    """
    from lerobot.configs.types import FeatureType

    config = checkpoint.config
    state_key = next(key for key, feat in config.input_features.items()
                     if feat.type == FeatureType.STATE)
    action_key = next(key for key, feat in config.output_features.items()
                      if feat.type == FeatureType.ACTION)
    env = ((checkpoint.env_state_key, checkpoint.env_state_dim)
           if checkpoint.env_state_key is not None else None)
    return _signature(state_key, action_key, [(key, checkpoint.image_shapes[key])
                                              for key in config.image_features],
                      checkpoint.state_dim, checkpoint.chunk_size, checkpoint.action_dim,
                      image_size, env)


def info_signature(info: CheckpointInfo, image_size: tuple[int, int] | None = None
                   ) -> tuple[list[TensorSpec], TensorSpec]:
    """:func:`graph_signature` from the checkpoint's JSON alone (no LeRobot, no torch)."""
    env = (info.env_state_key, info.env_state_dim) if info.env_state_key is not None else None
    return _signature(info.state_key, info.action_key,
                      [(key, info.image_shapes[key]) for key in info.image_features],
                      info.state_dim, info.chunk_size, info.action_dim, image_size, env)


def _signature(state_key: str, action_key: str, cameras: list[tuple[str, tuple[int, int]]],
               state_dim: int, chunk_size: int, action_dim: int,
               image_size: tuple[int, int] | None, env: tuple[str, int] | None = None
               ) -> tuple[list[TensorSpec], TensorSpec]:
    inputs = [TensorSpec(state_key, (1, state_dim))]
    if env is not None:
        inputs.append(TensorSpec(env[0], (1, int(env[1]))))
    for key, shape in cameras:
        h, w = image_size or shape
        inputs.append(TensorSpec(key, (1, 3, int(h), int(w))))
    return inputs, TensorSpec(action_key, (1, chunk_size, action_dim))


def export_name(inputs: list[TensorSpec]) -> str:
    """``model_<H>x<W>.onnx``; cameras of different sizes: every ``HxW``, ``-``-joined; no
    camera: ``model_nocam.onnx``."""
    sizes = [f'{spec.shape[2]}x{spec.shape[3]}' for spec in inputs if len(spec.shape) == 4]
    if not sizes:
        return 'model_nocam.onnx'
    return f"model_{sizes[0] if len(set(sizes)) == 1 else '-'.join(sizes)}.onnx"


def metadata_path(onnx_path: Path) -> Path:
    return onnx_path.with_name(onnx_path.name + '.json')


def cache_export_dir(ckpt_hash: str) -> Path:
    """Where exports of a read-only checkpoint go: the user cache, keyed by content hash."""
    base = Path(os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache')
    return base / 'act_ros' / EXPORT_DIR / ckpt_hash


def package_model(checkpoint_dir: Path) -> bool:
    """Whether ``checkpoint_dir`` lies in the package's ``models/`` folder (a shipped model,
    or one a user put there): its exports go to the user cache, never into that folder."""
    try:
        models = (share_dir() / 'models').resolve()
    except FileNotFoundError:
        return False
    return Path(checkpoint_dir).resolve().is_relative_to(models)


def _writable_export_dir(checkpoint_dir: Path, ckpt_hash: str) -> Path:
    # A Hub snapshot (act_ros.core.inference.hub) belongs to the huggingface_hub cache and a model of
    # the package's models/ folder to the repository: nothing is added there, their exports
    # go to this package's cache like a read-only checkpoint's.
    hub_snapshot = in_hub_cache(checkpoint_dir)
    shipped = package_model(checkpoint_dir)
    if not hub_snapshot and not shipped:
        directory = checkpoint_dir / EXPORT_DIR
        try:
            directory.mkdir(exist_ok=True)
            if os.access(directory, os.W_OK):
                return directory
        except OSError:  # read-only file system: fall back to the cache below
            pass
    fallback = cache_export_dir(ckpt_hash)
    why = ('is a Hub snapshot' if hub_snapshot else
           "is in the package's models folder" if shipped else 'is not writable')
    logger.info('checkpoint directory %s %s: exports go to %s', checkpoint_dir, why, fallback)
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open('rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a temporary sibling, then rename it to ``path``."""
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}')
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_metadata(onnx_path: Path) -> dict[str, Any] | None:
    """The metadata of an export, or ``None`` when it is missing or unreadable."""
    try:
        data = json.loads(metadata_path(onnx_path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def stale_reason(onnx_path: Path, *, ckpt_hash: str, inputs: list[TensorSpec],
                 output: TensorSpec) -> str | None:
    """Why the export at ``onnx_path`` cannot be used for this checkpoint; ``None`` if it can."""
    if not onnx_path.is_file():
        return 'no export yet'
    meta = read_metadata(onnx_path)
    if meta is None:
        return f'{metadata_path(onnx_path).name} is missing or unreadable'
    if meta.get('metadata_version') != METADATA_VERSION:
        return (f"metadata version {meta.get('metadata_version')!r}, this act_ros writes "
                f'{METADATA_VERSION}')
    if meta.get('checkpoint_hash') != ckpt_hash:
        return (f"the checkpoint changed (hash {meta.get('checkpoint_hash')} in the export, "
                f'{ckpt_hash} now)')
    expected = [spec.to_json() for spec in inputs]
    if meta.get('inputs') != expected:
        found = [(s.get('name'), s.get('shape')) for s in meta.get('inputs') or []]
        return (f'input shapes differ (export {found}, needed '
                f'{[(s.name, list(s.shape)) for s in inputs]})')
    if meta.get('output') != output.to_json():
        return f"output differs (export {meta.get('output')}, needed {output.to_json()})"
    if meta.get('onnx_sha256') != file_sha256(onnx_path):
        return f'{onnx_path.name} does not match its metadata (sha256)'
    return None


def _import_exporter() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise DeviceUnavailableError(
            f'ONNX export needs the onnx and onnxscript packages ({exc}): '
            f"pip install 'act_ros[{ONNX_EXTRA}]' (in a source checkout: "
            f"pip install -e '.[{ONNX_EXTRA}]')") from exc


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {}
    for package in ('torch', 'onnx', 'onnxscript', 'lerobot'):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = 'not installed'
    return versions


def write_onnx_export(model: nn.Module, path: Path, *, ckpt_hash: str, inputs: list[TensorSpec],
                      output: TensorSpec, source: Path | None = None) -> OnnxExport:
    """Export ``model`` (an ``ACTInferenceModel`` on the CPU) to ``path`` with its metadata.

    The graph optimizer of the exporter is off (``optimize=False``): at 480x640 it did not
    finish, and the runtimes (ONNX Runtime, OpenVINO) optimize the graph themselves.
    """
    _import_exporter()
    import onnx
    import torch

    start = time.perf_counter()
    device = next(model.parameters()).device
    if device.type != 'cpu':
        raise ValueError(f'export the model from the CPU (it is on {device})')
    generator = torch.Generator().manual_seed(0)
    example = tuple(torch.randn(spec.shape, generator=generator) for spec in inputs)
    was_training = model.training
    model.eval()
    passes_log = logging.getLogger('onnx_ir')  # one INFO line per graph pass otherwise
    passes_level = passes_log.level
    passes_log.setLevel(logging.WARNING)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch's exporter deep-copies its own tree specs, which trips torch's own
            # deprecation of LeafSpec (torch 2.10): nothing this call can change.
            warnings.filterwarnings('ignore', message=r'`isinstance\(treespec, LeafSpec\)`',
                                    category=FutureWarning)
            program = torch.onnx.export(
                model, example, dynamo=True, optimize=False, external_data=False,
                opset_version=OPSET, input_names=[spec.name for spec in inputs],
                output_names=[output.name], verbose=False)
    finally:
        model.train(was_training)
        passes_log.setLevel(passes_level)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, lambda tmp: program.save(str(tmp), external_data=False))
    opsets = {entry.domain or 'ai.onnx': entry.version
              for entry in onnx.load(str(path), load_external_data=False).opset_import}
    seconds = time.perf_counter() - start
    metadata = {
        'metadata_version': METADATA_VERSION,
        'format': 'onnx',
        'checkpoint_hash': ckpt_hash,
        'checkpoint': str(source) if source else None,
        'inputs': [spec.to_json() for spec in inputs],
        'output': output.to_json(),
        'normalized': True,  # observations and actions as LeRobot's processors produce them
        'opset': opsets.get('ai.onnx', OPSET),
        'exporter': EXPORTER,
        'versions': _versions(),
        'onnx_sha256': file_sha256(path),
        'export_seconds': round(seconds, 2),
        'created': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
    }
    _write_atomic(metadata_path(path), lambda tmp: tmp.write_text(json.dumps(metadata, indent=2)))
    return OnnxExport(path=path, metadata=metadata, exported=True, seconds=seconds)


def find_export(checkpoint_dir: Path, *, ckpt_hash: str, inputs: list[TensorSpec],
                output: TensorSpec, force: bool = False) -> tuple[Path, str | None]:
    """Where the export of this checkpoint and signature is, or is to be written, and why
    it cannot be used as it is (``None``: it is valid, reuse it). Needs no torch.

    A valid export beside the checkpoint is used even where that directory is read-only;
    a read-only checkpoint's (or a Hub snapshot's) export otherwise lives in the user cache.
    A model of the package's ``models/`` folder uses the user cache only (an export left
    beside it by an earlier version is not read).
    """
    name = export_name(inputs)

    def check(path: Path) -> str | None:
        return 'export requested' if force else stale_reason(
            path, ckpt_hash=ckpt_hash, inputs=inputs, output=output)

    if package_model(checkpoint_dir):
        path = cache_export_dir(ckpt_hash) / name
        return path, check(path)
    local = checkpoint_dir / EXPORT_DIR / name
    path, reason = local, check(local)
    if reason is not None:
        directory = _writable_export_dir(checkpoint_dir, ckpt_hash)
        if directory != local.parent:  # a read-only checkpoint: the user cache
            path, reason = directory / name, check(directory / name)
    return path, reason


def ensure_onnx_export(checkpoint: LoadedCheckpoint, *, model: nn.Module | None = None,
                       image_size: tuple[int, int] | None = None, force: bool = False,
                       ckpt_hash: str | None = None) -> OnnxExport:
    """The ONNX export of ``checkpoint``: reused when valid, (re-)exported otherwise.

    ``model`` is the ``ACTInferenceModel`` to export (built from the checkpoint on the CPU
    when not given). A stale export is never used: it is rebuilt and the reason logged.
    """

    ckpt_hash = ckpt_hash or checkpoint_hash(checkpoint.path)
    inputs, output = graph_signature(checkpoint, image_size)
    path, reason = find_export(Path(checkpoint.path), ckpt_hash=ckpt_hash, inputs=inputs,
                               output=output, force=force)
    if reason is None:
        return OnnxExport(path=path, metadata=read_metadata(path), exported=False, seconds=0.0)
    if reason == 'no export yet':
        logger.info('exporting %s to ONNX: %s', checkpoint.path, path)
    else:
        logger.warning('ONNX export %s is stale (%s): exporting it again', path, reason)
    if model is None:
        from act_ros.core.inference.network import ACTInferenceModel
        model = ACTInferenceModel(checkpoint.policy.model)  # load_checkpoint(device='cpu')
    return write_onnx_export(model, path, ckpt_hash=ckpt_hash, inputs=inputs, output=output,
                             source=Path(checkpoint.path))


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of ``act-ros export`` (ONNX; :mod:`act_ros.training.quantize` adds
    ``--int8`` and its calibration options)."""
    parser = argparse.ArgumentParser(prog='act-ros export', description=main.__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument('--checkpoint', type=Path, required=True,
                        help='LeRobot pretrained_model directory, or Hub id '
                        'org/name[@revision][/subfolder] (docs/hub_ids.md)')
    parser.add_argument('--format', choices=FORMATS, default='onnx')
    parser.add_argument('--image-size', type=parse_image_size, default=None,
                        help="HxW for every camera (default: the checkpoint's input sizes, "
                        'the ones the runtime uses)')
    parser.add_argument('--force', action='store_true', help='export even when a valid one exists')
    return parser


def main(argv: list[str] | None = None) -> int:
    """``act-ros export``: export a checkpoint's inference model (normalized tensors in and out)."""
    setup_logging()
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The export :func:`build_parser`'s ``args`` ask for; the exit status."""
    from act_ros.core.inference.checkpoint import load_checkpoint

    try:
        checkpoint = load_checkpoint(args.checkpoint, device='cpu')
        result = ensure_onnx_export(checkpoint, image_size=args.image_size, force=args.force)
    except (ActRosError, OSError, ValueError) as exc:
        print(f'act-ros export: {exc}', file=sys.stderr)
        return 2
    state = f'exported in {result.seconds:.1f} s' if result.exported else 'up to date'
    print(f'{result.path} ({state}; metadata {metadata_path(result.path).name})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
