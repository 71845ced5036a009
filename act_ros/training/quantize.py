"""``act-ros export``: the ONNX export, and with ``--int8`` its INT8 quantization with NNCF.

``act-ros export --checkpoint DIR --int8 --calibration-dataset DATASET_DIR
[--calibration-samples N]`` makes the model ``precision: int8`` runs (backend ``openvino``,
:mod:`act_ros.core.inference.quantized`): the checkpoint's ONNX export (made or reused, at the input
size the runtime uses), then NNCF's post-training quantization of it, calibrated on
observations of a real LeRobot dataset, never on noise:

- ``N`` frames (default 300, NNCF's own calibration size; every frame of a smaller
  dataset) spread evenly over the whole dataset, so every episode and every phase of a
  task is represented, chosen by position alone (the same dataset gives the same frames);
- each frame as the runtime would see it: the camera images the checkpoint takes, as
  stored (decoded to uint8, at the recorded size), the joint state and, for a checkpoint
  that takes them, the object poses (``observation.environment_state``), made into an
  :class:`~act_ros.core.observation.Observation`;
- turned into model inputs by the runtime's own preprocessing
  (:class:`~act_ros.core.inference.predictor.ChunkPredictor`: resize, LeRobot's normalizer), the
  inputs its ONNX backend is given (:func:`~act_ros.core.inference.backends.backend_inputs`).

The dataset must follow the contract the checkpoint was trained for (its cameras, joints
in order, object poses where the checkpoint takes them), as for training. The quantized
model and its record (the dataset, its frames, NNCF settings, versions) land beside the
fp32 export.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from act_ros.core.contract import Contract, load_contract
from act_ros.core.errors import ActRosError
from act_ros.core.inference.export import build_parser as export_parser
from act_ros.core.inference.export import ensure_onnx_export, metadata_path
from act_ros.core.inference.export import run as export_run
from act_ros.core.inference.quantized import (
    DEFAULT_LAYERS,
    DEFAULT_SAMPLES,
    LAYERS,
    Int8Model,
    quantize_export,
)
from act_ros.core.logs import setup_logging
from act_ros.core.object_state import ENVIRONMENT_STATE_FEATURE
from act_ros.core.observation import Observation

if TYPE_CHECKING:
    from act_ros.core.inference.checkpoint import LoadedCheckpoint

logger = logging.getLogger(__name__)
DATASET_OPTION = '--calibration-dataset'


def calibration_frames(total: int, samples: int) -> np.ndarray:
    """Dataset indices of ``samples`` frames spread evenly over ``total`` (all of them when
    there are fewer), first and last included."""
    if samples < 1:
        raise ValueError(f'--calibration-samples must be >= 1, got {samples}')
    if total < 1:
        raise ValueError('the calibration dataset has no frames')
    return np.unique(np.linspace(0, total - 1, min(samples, total)).round().astype(np.int64))


def calibration_observations(root: Path, contract: Contract, checkpoint: LoadedCheckpoint,
                             samples: int = DEFAULT_SAMPLES
                             ) -> tuple[list[Observation], dict[str, Any]]:
    """Observations of ``samples`` frames of the LeRobot dataset at ``root`` (the inputs
    ``checkpoint`` takes, as a robot would send them) and a record of what they are."""
    from act_ros.training.data import column, decode_episode_frames, open_dataset

    root = Path(root).expanduser()
    features = set(checkpoint.config.image_features)
    cameras = tuple(cam for cam in contract.cameras if cam.feature in features)
    environment_state = checkpoint.env_state_key is not None
    dataset = open_dataset(root, contract, cameras=cameras, environment_state=environment_state,
                           option=DATASET_OPTION)
    hf = dataset.hf_dataset
    rows = calibration_frames(len(hf), samples)
    state = column(hf, contract.state_feature)[rows]
    env_state = column(hf, ENVIRONMENT_STATE_FEATURE)[rows] if environment_state else None
    for key, values in ((contract.state_feature, state), (ENVIRONMENT_STATE_FEATURE, env_state)):
        if values is not None and not np.all(np.isfinite(values)):
            raise ValueError(f"{DATASET_OPTION} {root}: column '{key}' holds NaN or infinite "
                             'values among the calibration frames')
    episode_index = hf.data.column('episode_index').to_numpy()[rows]
    timestamps = hf.data.column('timestamp').to_numpy()[rows]
    images: dict[str, list[np.ndarray | None]] = {cam.name: [None] * rows.size for cam in cameras}
    for ep in sorted(set(episode_index.tolist())):
        at = np.flatnonzero(episode_index == ep)
        decoded = decode_episode_frames(dataset, [cam.feature for cam in cameras], ep,
                                        timestamps[at].tolist(), rows=rows[at].tolist())
        for cam in cameras:
            frames = decoded[cam.feature]
            if frames.shape[0] != at.size:
                raise ValueError(f"{DATASET_OPTION} {root}: episode {ep}, camera "
                                 f"'{cam.feature}': decoded {frames.shape[0]} frames, expected "
                                 f'{at.size}')
            for i, frame in zip(at, frames):
                images[cam.name][i] = frame
    observations = [Observation(images={name: frames[i] for name, frames in images.items()},
                                state=state[i].astype(np.float64),
                                environment_state=None if env_state is None else env_state[i])
                    for i in range(rows.size)]
    info = root / 'meta' / 'info.json'
    record = {
        'dataset': str(root.resolve()),
        'dataset_info_sha256': hashlib.sha256(info.read_bytes()).hexdigest(),
        'dataset_frames': len(hf),
        'dataset_episodes': int(dataset.meta.total_episodes),
        'frames': rows.tolist(),  # dataset indices
        'episodes': sorted({int(ep) for ep in episode_index.tolist()}),
        'selection': 'evenly spaced over the whole dataset, first and last frame included',
        'inputs': {'cameras': {cam.name: cam.feature for cam in cameras},
                   'state': contract.state_feature,
                   'environment_state': ENVIRONMENT_STATE_FEATURE if environment_state else None},
        'preprocessing': "the runtime's (ChunkPredictor: resize to the checkpoint's input "
                         "size, LeRobot's normalizer), as the ONNX backend receives it",
    }
    return observations, record



def save_dataset_check_observations(checkpoint_dir: Path, dataset_root: Path,
                                    contract: Contract, count: int | None = None) -> Path:
    """Save ``count`` frames of the LeRobot dataset at ``dataset_root`` (evenly spaced,
    the inputs the checkpoint takes) beside ``checkpoint_dir`` as the start-up precision
    check's real observations (:func:`act_ros.core.inference.precision.save_check_observations`)."""
    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.core.inference.precision import SAVED_CHECK_OBSERVATIONS, save_check_observations

    checkpoint = load_checkpoint(checkpoint_dir, device='cpu', contract=contract)
    observations, _ = calibration_observations(dataset_root, contract, checkpoint,
                                               samples=count or SAVED_CHECK_OBSERVATIONS)
    return save_check_observations(checkpoint_dir, observations)


def make_int8_model(checkpoint: LoadedCheckpoint, dataset_root: Path, *,
                    samples: int = DEFAULT_SAMPLES, contract: Contract | None = None,
                    force_export: bool = False, layers: str = DEFAULT_LAYERS) -> Int8Model:
    """The INT8 model of ``checkpoint`` (loaded on the CPU), calibrated on ``samples``
    frames of the dataset at ``dataset_root``; written beside its ONNX export."""
    import torch

    from act_ros.core.inference.backends import backend_inputs
    from act_ros.core.inference.options import PredictorOptions
    from act_ros.core.inference.predictor import ChunkPredictor

    contract = contract or load_contract()
    start = time.perf_counter()
    # Before any export work: a missing or mismatched dataset fails first.
    observations, record = calibration_observations(dataset_root, contract, checkpoint, samples)
    logger.info('calibration: %d frames of %s (%d episodes) read in %.1f s', len(observations),
                record['dataset'], len(record['episodes']), time.perf_counter() - start)
    ensure_onnx_export(checkpoint, force=force_export)
    # The runtime's predictor on the fp32 export: its preprocessing makes the model inputs.
    predictor = ChunkPredictor(checkpoint, contract, torch.device('cpu'),
                               PredictorOptions(backend='openvino'))
    export = predictor.backend.export

    def model_inputs(obs: Observation) -> dict[str, np.ndarray]:
        return backend_inputs(predictor, obs)

    return quantize_export(export, observations, model_inputs, calibration=record,
                           layers=layers)


def build_parser() -> argparse.ArgumentParser:
    """``act-ros export``'s parser with the INT8 options."""
    parser = export_parser()
    group = parser.add_argument_group(
        'INT8 (precision int8 with backend openvino)',
        'quantize the export with NNCF, calibrated on frames of a LeRobot dataset; the model '
        'and a record of its calibration go beside the fp32 export')
    group.add_argument('--int8', action='store_true',
                       help='also write the INT8 model (needs --calibration-dataset)')
    group.add_argument(DATASET_OPTION, type=Path, default=None, metavar='DATASET_DIR',
                       help='LeRobot v3 dataset directory to calibrate on (recorded with the '
                       'cameras, joints and object poses the checkpoint takes, e.g. its '
                       'training data)')
    group.add_argument('--calibration-samples', type=int, default=DEFAULT_SAMPLES, metavar='N',
                       help='frames to calibrate on, spread evenly over the dataset '
                       '(default %(default)s, NNCF\'s own; every frame of a smaller dataset)')
    group.add_argument('--int8-layers', choices=LAYERS, default=DEFAULT_LAYERS,
                       help='layers that run on 8-bit integers: the convolutions (backbones '
                       'and their projection; the transformer stays f32) or all (default '
                       '%(default)s: with all, the shipped object-state policy aligned 0.43 '
                       'against 0.91 in fp32)')
    group.add_argument('--contract', type=Path, default=None,
                       help="contract YAML of the dataset and checkpoint (default: the "
                       "package's config/contract.yaml)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``act-ros export``: export a checkpoint's inference model (normalized tensors in and
    out); with ``--int8``, also its INT8 quantization (precision int8)."""
    setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.int8:
        if args.calibration_dataset is not None:
            parser.error(f'{DATASET_OPTION} applies to --int8 only')
        return export_run(args)
    if args.calibration_dataset is None:
        parser.error(f'--int8 needs {DATASET_OPTION} DATASET_DIR: a LeRobot dataset whose '
                     'frames calibrate the quantization (recorded with the inputs this '
                     'checkpoint takes, e.g. its training data); it is never calibrated on noise')
    if args.calibration_samples < 1:
        parser.error(f'--calibration-samples must be >= 1, got {args.calibration_samples}')
    if args.image_size is not None:
        parser.error("--int8 quantizes the export the runtime runs (the checkpoint's input "
                     'size): leave out --image-size')
    from act_ros.core.inference.checkpoint import load_checkpoint

    try:
        contract = load_contract(args.contract)
        checkpoint = load_checkpoint(args.checkpoint, contract=contract, device='cpu')
        model = make_int8_model(checkpoint, args.calibration_dataset,
                                samples=args.calibration_samples, contract=contract,
                                force_export=args.force, layers=args.int8_layers)
    except (ActRosError, OSError, ValueError) as exc:
        print(f'act-ros export: {exc}', file=sys.stderr)
        return 2
    record = model.record
    source = model.paths.xml.parent / record['quantized_from']['onnx']
    print(f"{model.paths.xml} (int8 {record['quantization']['layers']}, quantized in "
          f"{record['quantize_seconds']:.1f} s from "
          f"{source.name}; calibrated on {record['calibration']['samples']} frames of "
          f"{record['calibration']['dataset']}; record {model.paths.record.name}; fp32 export "
          f'metadata {metadata_path(source).name})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
