"""``act-ros pose-pretrain``: train a policy's vision backbone on the object poses of random
still scenes, before the policy trains on demonstrations.

Why: a pose loss on demonstration frames does not teach the backbone the object yaws (the
expert's arm configuration already tells them; the repository's research probe
``research/pose_probe.py`` measures this), and a few hundred demonstrated layouts are too
few for features that generalize to new ones. A scene of :mod:`act_ros.sim.pose_scenes`
costs one layout, one inverse-kinematics solve and two renders (about 25 ms at 96x128), and
needs no expert: every training step draws fresh scenes, so the backbone never sees a
layout twice.

What trains: the checkpoint's ResNet backbone (all stages after ``--frozen-up-to``) and a
fresh :class:`~act_ros.training.auxiliary.ObjectPoseHead` on its per-camera maps, on the
images alone (no joints), with the L1 loss of the trainer's auxiliary pose head and random
shifts. The rest of the policy is left as it was. ``RUN/last/`` is the checkpoint with the
new backbone, a LeRobot ``pretrained_model`` directory: start a policy from it with
``act-ros train --init-from RUN/last --backbone-freeze-step 0 --no-calibrate-backbone-norm``
(keep the backbone's normalization as trained here); from a checkout of the repository,
``python -m research.pose_probe layouts --checkpoint RUN/last`` measures it independently.

Validation: a fixed set of scenes (``--val-seed``, never drawn for training), median errors
per scene kind; ``start`` is the first frame of an episode, where the policy has to find
both objects before it moves. The run resumes from ``RUN/last`` (``--resume``): the scenes
of a step depend only on the seed and the step, so an interrupted run continues as an
uninterrupted one would.

Continuing: ``--checkpoint`` may be an earlier run's ``RUN/last``; its backbone trains on
under a fresh head (``--lr`` may differ), and the new run's result and checkpoint record
the run it continues (``continues``: that run's step, source and settings).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.logs import setup_logging

logger = logging.getLogger(__name__)

RESULT_FILE = 'pose_pretrain.json'
STATE_KEY = 'pose_pretrain'
FROZEN_CHOICES = ('none', 'stem', 'layer1', 'layer2')
BATCH_NORM_CHOICES = ('frozen', 'train')
ERROR_KEYS = ('box_cm', 'box_deg', 'pad_cm', 'pad_deg')


@dataclass
class PoseErrors:
    """Per-frame errors in physical units (cm, deg), ``ERROR_KEYS`` order."""

    values: np.ndarray  # (N, 4)

    @classmethod
    def of(cls, errors: dict[str, Any]) -> PoseErrors:
        """From :func:`~act_ros.training.auxiliary.physical_errors` (m, deg per frame)."""
        return cls(np.stack([100.0 * errors['box_xy_m'].numpy(), errors['box_yaw_deg'].numpy(),
                             100.0 * errors['pad_xy_m'].numpy(), errors['pad_yaw_deg'].numpy()],
                            axis=1))

    def medians(self) -> dict[str, float]:
        if len(self.values) == 0:
            return {k: float('nan') for k in ERROR_KEYS}
        return {k: round(float(np.median(self.values[:, i])), 2)
                for i, k in enumerate(ERROR_KEYS)}


def format_pose_errors(errors: dict[str, float]) -> str:
    """Median errors (``PoseErrors.medians``) as one line."""
    return (f"box {errors['box_cm']:.2f} cm / {errors['box_deg']:.1f} deg, "
            f"pad {errors['pad_cm']:.2f} cm / {errors['pad_deg']:.1f} deg")


def object_poses(obs: Any) -> np.ndarray:
    """(8,) box and pad pose of a simulation observation, in ``OBJECT_POSE_NAMES`` order
    (as ``act-ros collect`` records them)."""
    return np.concatenate([obs.box_pose, obs.pad_pose]).astype(np.float32)


def build_parser() -> argparse.ArgumentParser:
    from act_ros.training.config import TRAIN_PRECISIONS, YAW_READOUTS

    parser = argparse.ArgumentParser(
        prog='act-ros pose-pretrain',
        description='Train a policy\'s vision backbone on the box and pad poses of random '
                    'rendered scenes (no expert); RUN/last is the checkpoint with that '
                    'backbone, for act-ros train --init-from.',
        formatter_class=HelpFormatter)
    parser.add_argument('--checkpoint', type=Path, required=True,
                        help='policy checkpoint whose backbone trains (a LeRobot '
                             'pretrained_model dir with cameras)')
    parser.add_argument('--output-dir', type=Path, required=True, help='run directory')
    parser.add_argument('--steps', type=int, default=1000, help='training steps')
    parser.add_argument('--batch-size', type=int, default=32, help='scenes per step')
    parser.add_argument('--lr', type=float, default=1e-4, help='backbone learning rate')
    parser.add_argument('--head-lr', type=float, default=1e-3, help='pose head learning rate')
    parser.add_argument('--warmup-steps', type=int, default=50)
    parser.add_argument('--weight-decay', type=float, default=1e-4)
    parser.add_argument('--image-size', type=_image_size, default=None, metavar='HxW',
                        help='render the scenes at this size instead of the checkpoint\'s '
                             '(e.g. 192x256; the output checkpoint then expects it: a finer-'
                             'features lever, train on a dataset recorded at that size)')
    parser.add_argument('--yaw-readout', choices=YAW_READOUTS, default='attention',
                        help='how the pose head reads the yaws: attention (per cell, weighted '
                             'where the object is) or flatten (one MLP over the whole grid, '
                             'the first design, whose yaws stayed at chance)')
    parser.add_argument('--image-shift-px', type=int, default=4,
                        help='random shift augmentation in pixels (0: none)')
    parser.add_argument('--frozen-up-to', choices=FROZEN_CHOICES, default='layer1',
                        help='backbone stages kept as they are (stem: conv1; layer1: conv1 '
                             'and layer1, ...); freezing the early stages saves about a '
                             'quarter of the step')
    parser.add_argument('--batch-norm', choices=BATCH_NORM_CHOICES, default='frozen',
                        help='frozen: the normalizations keep the statistics they came with '
                             '(LeRobot ACT\'s FrozenBatchNorm2d); train: they learn as '
                             'BatchNorm2d outside the frozen stages, on batches of every '
                             'camera, and are written back as frozen statistics into each '
                             'checkpoint (same layout)')
    parser.add_argument('--seed', type=int, default=7_000_000,
                        help='first training scene seed (step s draws seed + s * batch ...)')
    parser.add_argument('--val-seed', type=int, default=6_000_000, help='first validation seed')
    parser.add_argument('--val-scenes', type=int, default=256)
    parser.add_argument('--val-interval', type=int, default=100)
    parser.add_argument('--checkpoint-interval', type=int, default=100)
    parser.add_argument('--torch-threads', type=int, default=None)
    parser.add_argument('--precision', choices=TRAIN_PRECISIONS, default='auto',
                        help='autocast precision of the backbone and head; auto = bf16 where '
                             'the CPU computes bfloat16 natively (AVX512-BF16, AMX), else fp32')
    parser.add_argument('--resume', action='store_true', help='continue RUN/last')
    parser.add_argument('--no-progress', action='store_true')
    return parser


def _image_size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected HxW such as 192x256, got {text!r}') from None
    if h < 32 or w < 32:
        raise argparse.ArgumentTypeError(f'expected at least 32x32 (the backbone\'s stride), '
                                         f'got {text!r}')
    return h, w


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ('steps', 'batch_size', 'val_scenes', 'val_interval', 'checkpoint_interval'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1, got {getattr(args, name)}')
    for name in ('warmup_steps', 'image_shift_px'):
        if getattr(args, name) < 0:
            parser.error(f'--{name.replace("_", "-")} must be >= 0, got {getattr(args, name)}')
    for name in ('lr', 'head_lr'):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            parser.error(f'--{name.replace("_", "-")} must be a positive number, got {value}')
    if abs(args.val_seed - args.seed) < args.val_scenes:
        parser.error(f'--val-seed {args.val_seed} overlaps the training scenes from --seed '
                     f'{args.seed}: choose seeds at least --val-scenes apart')


class SceneBatches:
    """Normalized camera batches and poses of the scenes of given seeds."""

    def __init__(self, checkpoint: Path, loaded: Any,
                 size: tuple[int, int] | None = None) -> None:
        import torch

        from act_ros.sim import PortPickAlignEnv
        from act_ros.sim.pose_scenes import PoseScenes
        from act_ros.training.evaluation.rollout import make_sim_config

        self.keys = list(loaded.image_shapes)
        if not self.keys:
            raise ValueError(f'{checkpoint}: the policy takes no camera; nothing to pretrain')
        self.cameras = [k.rsplit('.', 1)[-1] for k in self.keys]
        stats = _camera_stats(loaded.preprocessor, self.keys)
        self.mean = {k: torch.as_tensor(stats[k]['mean']).float().reshape(3, 1, 1)
                     for k in self.keys}
        self.std = {k: torch.as_tensor(stats[k]['std']).float().reshape(3, 1, 1)
                    for k in self.keys}
        sizes = {tuple(loaded.image_shapes[k])[-2:] for k in self.keys} if size is None \
            else {tuple(size)}
        if len(sizes) != 1:
            raise ValueError(f'{checkpoint}: the cameras take different sizes {sorted(sizes)}; '
                             f'the simulation renders every camera at one size')
        self.env = PortPickAlignEnv(make_sim_config(Path(checkpoint), sizes.pop()))
        self.scenes = PoseScenes(self.env)

    def __call__(self, seeds: list[int]) -> tuple[dict[str, Any], Any, list[str]]:
        import torch

        images: dict[str, list[np.ndarray]] = {k: [] for k in self.keys}
        poses, kinds = [], []
        for seed in seeds:
            obs, kind = self.scenes.scene(seed)
            for key, camera in zip(self.keys, self.cameras):
                images[key].append(obs.images[camera])
            poses.append(object_poses(obs))
            kinds.append(kind)
        batch = {}
        for key in self.keys:
            x = torch.from_numpy(np.stack(images[key])).permute(0, 3, 1, 2).float() / 255.0
            batch[key] = (x - self.mean[key]) / self.std[key]
        return batch, torch.from_numpy(np.stack(poses)), kinds

    def close(self) -> None:
        self.env.close()


def _camera_stats(preprocessor: Any, keys: list[str]) -> dict[str, dict[str, Any]]:
    """The normalizer's mean and std of each camera (what the policy divides images by)."""
    for step in preprocessor.steps:
        stats = getattr(step, '_tensor_stats', None)
        if stats and all(k in stats and 'mean' in stats[k] for k in keys):
            return {k: stats[k] for k in keys}
    raise ValueError(f'the checkpoint\'s preprocessor has no mean/std for the cameras {keys}')


def _frozen_modules(backbone: Any, frozen_up_to: str) -> list[Any]:
    order = ['conv1', 'bn1', 'layer1', 'layer2']
    if frozen_up_to == 'none':
        return []
    last = {'stem': 'bn1', 'layer1': 'layer1', 'layer2': 'layer2'}[frozen_up_to]
    return [getattr(backbone, name) for name in order[:order.index(last) + 1]]


def _errors_by_kind(prediction: Any, poses: Any, kinds: list[str], mean: Any,
                    std: Any) -> dict[str, dict[str, float]]:
    from act_ros.training.auxiliary import physical_errors

    errors = PoseErrors.of(physical_errors(prediction, poses, mean, std)).values
    out = {'all': {'n': len(kinds), **PoseErrors(errors).medians()}}
    for kind in sorted(set(kinds)):
        rows = np.array([k == kind for k in kinds])
        out[kind] = {'n': int(rows.sum()), **PoseErrors(errors[rows]).medians()}
    return out


def pretrain(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    """Train as ``args`` say (``argv``: the command line, recorded in the result file)."""
    import torch

    from act_ros.core.atomic import write_json_atomic
    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.core.inference.predictor import autocast_context
    from act_ros.core.processes import StopRequests
    from act_ros.provenance import result_provenance
    from act_ros.training.auxiliary import _POSITIONS, ObjectPoseHead, pose_targets
    from act_ros.training.backbone import TrainableBatchNorm
    from act_ros.training.loop import random_shift, resolve_precision
    from act_ros.training.state import (
        TRAINING_INFO_FILE,
        TRAINING_STATE_FILE,
        capture_rng,
        restore_rng,
        save_model,
    )

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    run = args.output_dir
    last = run / 'last'
    source = last if args.resume else args.checkpoint
    if args.resume and not (last / TRAINING_STATE_FILE).is_file():
        raise FileNotFoundError(f'--resume: {last / TRAINING_STATE_FILE} does not exist (no '
                                f'earlier run in {run})')
    if not args.resume and last.exists():
        raise ValueError(f'{run} already holds a run (last/): continue it with --resume or '
                         f'choose another --output-dir')
    loaded = load_checkpoint(source)
    # The source's training record (the dataset's image size, ...) is carried over.
    info_file = Path(source) / TRAINING_INFO_FILE
    source_info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    # A run that starts from another pose pretraining's checkpoint continues that one: its
    # record (step, source, ...) is kept in this run's, in the checkpoint and the result.
    earlier = source_info.get('pose_pretrain') or {}
    continues = earlier.get('continues') if args.resume else (earlier or None)
    policy = loaded.policy
    backbone = policy.model.backbone
    device = next(backbone.parameters()).device
    precision = resolve_precision(args.precision, device)
    logger.info('precision %s (requested %s)', precision, args.precision)

    def autocast() -> Any:
        return autocast_context(device, precision)
    if args.image_size is not None and not args.resume:
        # The policy's convolutions and sine position embeddings take any size; the config
        # (what a dataset and the node must feed it) and the training record say the new one.
        features = [policy.config.input_features] + [
            step.features for step in loaded.preprocessor.steps
            if isinstance(getattr(step, 'features', None), dict)]
        for key in loaded.image_shapes:
            for table in features:
                if key in table:
                    table[key].shape = (int(table[key].shape[0]), *args.image_size)
        source_info['dataset_image_size'] = list(args.image_size)
        logger.info('rendering at %dx%d (the checkpoint took %s)', *args.image_size,
                    sorted({tuple(v) for v in loaded.image_shapes.values()}))
    elif args.image_size is not None:
        recorded = tuple(source_info.get('dataset_image_size') or ())
        if recorded != tuple(args.image_size):
            raise ValueError(f'--resume with --image-size {args.image_size[0]}x'
                             f'{args.image_size[1]}: {last} was trained at {recorded}')
    scenes = SceneBatches(source, loaded, args.image_size)
    try:
        val_seeds = list(range(args.val_seed, args.val_seed + args.val_scenes))
        val_images, val_poses, val_kinds = scenes(val_seeds)
        positions = val_poses[:, _POSITIONS].double()
        with torch.no_grad():
            grids = [tuple(backbone(v[:1])['feature_map'].shape[-2:])
                     for v in val_images.values()]
            channels = int(backbone(next(iter(val_images.values()))[:1])
                           ['feature_map'].shape[1])
        state = None
        if args.resume:
            state = torch.load(last / TRAINING_STATE_FILE, weights_only=False)[STATE_KEY]
            # Runs from before these choices had them as the defaults below.
            for option, recorded in (('yaw_readout', state.get('yaw_readout', 'flatten')),
                                     ('batch_norm', state.get('batch_norm', 'frozen'))):
                if recorded != getattr(args, option):
                    raise ValueError(f'--resume with --{option.replace("_", "-")} '
                                     f'{getattr(args, option)}: {last} was trained with '
                                     f'{recorded}')
        torch.manual_seed(args.seed)
        head = ObjectPoseHead(channels, grids, yaw_readout=args.yaw_readout)
        if state is not None:
            mean, std = state['position_mean'], state['position_std']
            head.load_state_dict(state['head'])
        else:
            mean = positions.mean(0).float()
            std = positions.std(0).clamp_min(1e-4).float()
        frozen = _frozen_modules(backbone, args.frozen_up_to)
        for module in frozen:
            module.requires_grad_(False)
        norms = (TrainableBatchNorm(backbone, skip=frozen) if args.batch_norm == 'train'
                 else None)
        backbone.train(norms is not None)  # batch statistics only where norms train
        trained = [p for p in backbone.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW([{'params': trained, 'lr': args.lr},
                                       {'params': head.parameters(), 'lr': args.head_lr}],
                                      weight_decay=args.weight_decay)
        warmup = max(1, args.warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup))
        step, history, seconds = 0, [], 0.0
        if state is not None:
            optimizer.load_state_dict(state['optimizer'])
            scheduler.load_state_dict(state['scheduler'])
            step, history = state['step'], state['history']
            # Runs from before the saved time had only that of the last validation.
            seconds = state.get('seconds', history[-1]['seconds'] if history else 0.0)
            restore_rng(state['rng'])
            logger.info('resumed %s at step %d', last, step)
        if step >= args.steps:
            logger.info('%s is at step %d of %d: nothing to do', run, step, args.steps)

        def feature_maps(images: dict[str, Any]) -> list[Any]:
            batches = list(images.values())
            if norms is None or len({tuple(b.shape[1:]) for b in batches}) > 1:
                return [backbone(b)['feature_map'] for b in batches]
            # Training normalizations see every camera in one batch: the running statistics
            # they keep (what the frozen layers will hold) are those of the same mixture.
            maps = backbone(torch.cat(batches))['feature_map']
            return list(maps.split([b.shape[0] for b in batches]))

        def validate() -> dict[str, Any]:
            head.eval()
            backbone.eval()
            with torch.no_grad():
                predictions = []
                for start in range(0, len(val_seeds), 64):
                    with autocast():
                        maps = [backbone(v[start:start + 64])['feature_map']
                                for v in val_images.values()]
                        predictions.append(head(maps).float())
            head.train()
            backbone.train(norms is not None)
            return _errors_by_kind(torch.cat(predictions), val_poses, val_kinds, mean, std)

        started, started_step = time.perf_counter(), step

        def elapsed() -> float:
            """Seconds of this run so far, over every process that continued it (the steps
            an interrupted process did after its last checkpoint are not counted)."""
            return round(seconds + time.perf_counter() - started, 1)

        def save() -> None:
            info = json.dumps({**source_info, 'pose_pretrain': {
                'step': step, 'source': str(args.checkpoint),
                'frozen_up_to': args.frozen_up_to, 'batch_norm': args.batch_norm,
                'continues': continues}}, indent=1)
            with norms.frozen() if norms is not None else contextlib.nullcontext():
                save_model(last, policy, loaded.preprocessor, loaded.postprocessor,
                           info_json=info, training_state={STATE_KEY: {
                               'step': step, 'head': head.state_dict(),
                               'optimizer': optimizer.state_dict(),
                               'scheduler': scheduler.state_dict(), 'rng': capture_rng(),
                               'history': history, 'seconds': elapsed(),
                               'position_mean': mean,
                               'yaw_readout': args.yaw_readout,
                               'batch_norm': args.batch_norm, 'position_std': std}})

        def write_result() -> dict[str, Any]:
            out = {'provenance': result_provenance(
                       'act-ros pose-pretrain', argv if argv is not None else sys.argv[1:],
                       output_path=run, output_option='--output-dir'),
                   'checkpoint': str(args.checkpoint), 'continues': continues,
                   'step': step, 'steps': args.steps,
                   'batch_size': args.batch_size, 'frozen_up_to': args.frozen_up_to,
                   'precision': precision,
                   'image_size': list(args.image_size) if args.image_size else None,
                   'yaw_readout': args.yaw_readout, 'batch_norm': args.batch_norm,
                   'image_shift_px': args.image_shift_px, 'lr': args.lr,
                   'head_lr': args.head_lr, 'val_scenes': args.val_scenes,
                   'val_seeds': [val_seeds[0], val_seeds[-1]], 'history': history}
            write_json_atomic(run / RESULT_FILE, out)
            return out

        stop: list[str] = []
        requests = StopRequests()

        def handler(signum: int, _frame: Any) -> None:
            if not requests(signum):  # one that came with the first; a later one raises
                return
            stop.append(signal.Signals(signum).name)
            logger.warning('%s: stopping after this step and saving %s (again to stop now)',
                           stop[0], last)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if not history:
                history.append({'step': step, 'seconds': 0.0, **validate()})
                _log(history[-1])
            while step < args.steps and not stop:
                first = args.seed + step * args.batch_size
                images, poses, _ = scenes(list(range(first, first + args.batch_size)))
                if args.image_shift_px:
                    images = {k: random_shift(v, args.image_shift_px) for k, v in images.items()}
                with autocast():
                    predicted = head(feature_maps(images)).float()
                loss = (predicted - pose_targets(poses, mean, std)).abs().mean()
                if not torch.isfinite(loss):
                    raise FloatingPointError(f'step {step}: the pose loss is {loss.item()}')
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                if step % 10 == 0 and not args.no_progress:
                    rate = (time.perf_counter() - started) / (step - started_step)
                    print(f'step {step}/{args.steps} loss {loss.item():.4f} '
                          f'({rate:.2f} s/step)', flush=True)
                if step % args.val_interval == 0 or step == args.steps:
                    history.append({'step': step, 'loss': round(loss.item(), 5),
                                    'seconds': elapsed(),
                                    **validate()})
                    _log(history[-1])
                    write_result()
                if step % args.checkpoint_interval == 0 or step == args.steps:
                    save()
            if stop and step % args.checkpoint_interval:
                save()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        return write_result()
    finally:
        scenes.close()


def _log(row: dict[str, Any]) -> None:
    parts = [f"{kind} {format_pose_errors(row[kind])}" for kind in ('start', 'reach', 'held') if kind in row]
    logger.info('step %d (%.0f s): %s', row['step'], row['seconds'], '; '.join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    os.environ.setdefault('MUJOCO_GL', 'egl')
    setup_logging()
    try:
        out = pretrain(args, argv)
    except (FileNotFoundError, ValueError) as exc:
        print(f'act-ros pose-pretrain: {exc}', file=sys.stderr)
        return 2
    final = out['history'][-1]
    print(f"step {out['step']}: held-out scenes: " + '; '.join(
        f"{kind} (n={final[kind]['n']}) " + format_pose_errors(final[kind])
        for kind in ('start', 'reach', 'held', 'all') if kind in final))
    print(f'checkpoint with the trained backbone: {args.output_dir / "last"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
