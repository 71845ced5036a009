"""Training throughput: this trainer's step vs LeRobot's own update step, side by side.

``act-ros bench training`` (or ``python -m act_ros.bench.training``). One ACT config, the
same initial weights and the same batches in the same order for every arm:

- LeRobot: ``lerobot.scripts.lerobot_train.update_policy`` with what ``lerobot-train``
  builds for it: the policy's optimizer preset (AdamW, no scheduler), an
  ``accelerate.Accelerator`` (CPU when the device is, no mixed precision) that prepares
  the policy and optimizer, and a ``MetricsTracker``; the batch is normalized by the same
  preprocessor just before the call, as ``lerobot-train`` does.
- act_ros: :meth:`~act_ros.training.loop.Trainer.train_step` (batch assembly,
  normalization, loss, backward, clipping, AdamW, scheduler), eager and, with
  ``--compile``, with the loss step compiled as ``act-ros train --compile`` does.
- act_ros with cached backbone stages (:mod:`act_ros.training.feature_cache`): the stem
  to ``layer2`` frozen (``--early-freeze-layer layer2``; ``layer3``, ``layer4`` and the
  rest train), and the whole backbone frozen (``--backbone-freeze-step 0``); each cache is
  built during the warm-up and its build time is reported per frame.

Each iteration runs every arm once on the same batch (A/B interleaved); times are
medians and a speed-up is the median of the per-iteration ratios. The first step's loss
(same weights, batch and seed; the trainer with unit gripper weight, so both compute
LeRobot's loss) checks that the arms do the same work.

``--processes 1,2`` measures data-parallel scaling instead: the trainer's step in 1, 2, ...
processes under ``accelerate launch``, steps/s and samples/s side by side
(:mod:`act_ros.bench.data_parallel`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from act_ros.bench.data_parallel import parse_processes
from act_ros.bench.report import machine_description, markdown_table
from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.inference.checkpoint import PRESETS, parse_image_size

TOLERANCE = 1e-5
COLUMNS = ('training step', 'ms / step (median)', 'samples / s', 'speed-up vs LeRobot',
           'loss at step 1', 'abs loss diff vs LeRobot (step 1)')
LEROBOT = 'LeRobot update_policy (eager)'
EARLY = 'act_ros train_step (stem..layer2 frozen, cached; layer3-4 train)'
FROZEN = 'act_ros train_step (backbone frozen, cached maps)'


class LeRobotStep:
    """One call of LeRobot's ``update_policy`` per :meth:`step`, set up as ``lerobot-train``
    sets it up (optimizer preset, Accelerator, MetricsTracker) on a copy of the trainer's
    initial weights."""

    def __init__(self, trainer: Any) -> None:
        try:
            from accelerate import Accelerator
        except ImportError as exc:
            raise RuntimeError("LeRobot's update_policy needs an accelerate.Accelerator, and "
                               "accelerate is not installed: pip install -e '.[bench]'") from exc
        from lerobot.policies.act.modeling_act import ACTPolicy
        from lerobot.utils.logging_utils import AverageMeter, MetricsTracker

        device = trainer.inputs.device
        self.trainer = trainer
        self.accelerator = Accelerator(step_scheduler_with_optimizer=False, mixed_precision='no',
                                       cpu=device.type == 'cpu')
        policy = ACTPolicy(trainer.policy.config)
        policy.load_state_dict(trainer.policy.state_dict())
        policy.to(device).train()
        optimizer_config = policy.config.get_optimizer_preset()
        optimizer = optimizer_config.build(policy.get_optim_params())
        self.grad_clip_norm = optimizer_config.grad_clip_norm
        self.policy, self.optimizer = self.accelerator.prepare(policy, optimizer)
        store = trainer.inputs.store
        meters = {'loss': AverageMeter('loss', ':.3f'), 'grad_norm': AverageMeter('grdn', ':.3f'),
                  'lr': AverageMeter('lr', ':0.1e'), 'update_s': AverageMeter('updt_s', ':.3f')}
        self.tracker = MetricsTracker(trainer.config.batch_size, len(store), 1, meters,
                                      accelerator=self.accelerator)
        self.losses: list[float] = []

    def step(self, indices: np.ndarray) -> None:
        from lerobot.scripts.lerobot_train import update_policy

        batch = self.trainer.preprocessor(self.trainer.inputs.store.batch(indices))
        self.tracker, _ = update_policy(self.tracker, self.policy, batch, self.optimizer,
                                        self.grad_clip_norm, accelerator=self.accelerator)
        self.losses.append(float(self.tracker.metrics['loss'].val))


def _timed(device: torch.device, fn: Any, *args: Any) -> float:
    if device.type == 'cuda':
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    if device.type == 'cuda':
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(*, model_preset: str, image_size: tuple[int, int], batch_size: int, iters: int,
            warmup: int, compile_step: bool, device: str = 'cpu', seed: int = 0,
            early_freeze_arm: bool = True) -> list[dict]:
    """Per arm: median seconds per step, speed-up vs LeRobot and the first step's loss
    (``early_freeze_arm=False`` leaves out the stem..layer2 cached arm)."""
    from act_ros.training.loop import Trainer
    from act_ros.training.speed import synthetic_config, synthetic_inputs

    inputs = synthetic_inputs(image_size=image_size, batch_size=batch_size, device=device,
                              seed=seed)
    total = warmup + iters
    with tempfile.TemporaryDirectory() as tmp:
        fields = dict(model_preset=model_preset, batch_size=batch_size, steps=total, seed=seed,
                      gripper_loss_weight=1.0)
        ours = {'act_ros train_step (eager)': Trainer(synthetic_config(inputs, Path(tmp),
                                                                       **fields), inputs)}
        if compile_step:
            ours['act_ros train_step (compiled)'] = Trainer(
                synthetic_config(inputs, Path(tmp), compile=True, **fields), inputs)
        if early_freeze_arm:
            ours[EARLY] = Trainer(synthetic_config(inputs, Path(tmp),
                                                   early_freeze_layer='layer2', **fields), inputs)
        ours[FROZEN] = Trainer(synthetic_config(inputs, Path(tmp), backbone_freeze_step=0,
                                                **fields), inputs)
        reference = next(iter(ours.values()))
        lerobot = LeRobotStep(reference)
        times: dict[str, list[float]] = {LEROBOT: [], **{name: [] for name in ours}}
        for i in range(total):  # every arm once per iteration, same batch, same seed
            indices = reference.order.indices(i)
            torch.manual_seed(seed + i)
            times[LEROBOT].append(_timed(inputs.device, lerobot.step, indices))
            for name, trainer in ours.items():
                torch.manual_seed(seed + i)
                times[name].append(_timed(inputs.device, trainer.train_step))
        first_loss = {LEROBOT: lerobot.losses[0]}
        for name, trainer in ours.items():
            trainer.history.flush()
            first_loss[name] = trainer.history.train[0]['loss']
        cache_s_per_frame = {}
        for name, cut in ((EARLY, 'layer2'), (FROZEN, 'layer4')):
            if name not in ours:
                continue
            cache = ours[name].feature_cache_info[cut]
            cache_s_per_frame[name] = cache['build_s'] / cache['cached_frames']
    base = np.asarray(times[LEROBOT][warmup:])
    results = []
    for name, seconds in times.items():
        timed = np.asarray(seconds[warmup:])
        median = float(np.median(timed))
        results.append({'name': name, 'median_s': median, 'samples_per_s': batch_size / median,
                        'speedup': float(np.median(base / timed)),
                        'first_loss': first_loss[name],
                        'loss_diff': abs(first_loss[name] - first_loss[LEROBOT]),
                        'warmup_s': float(sum(seconds[:warmup])),
                        'cache_s_per_frame': cache_s_per_frame.get(name)})
    return results


def json_rows(results: list[dict]) -> list[dict]:
    """The arms as ``--json`` writes them: milliseconds and samples per step, the speed-up
    over LeRobot (median of per-iteration ratios, not the ratio of the medians), step-1 loss."""
    return [{'step': r['name'], 'ms_per_step': round(r['median_s'] * 1e3, 1),
             'samples_per_s': round(r['samples_per_s'], 2),
             'speedup_vs_lerobot': round(r['speedup'], 3), 'first_loss': r['first_loss'],
             'loss_diff': r['loss_diff'],
             'cache_ms_per_frame': (None if r['cache_s_per_frame'] is None
                                    else round(r['cache_s_per_frame'] * 1e3, 2))}
            for r in results]


def render(results: list[dict], *, model_preset: str, image_size: tuple[int, int],
           batch_size: int, iters: int, warmup: int, device: str, header: bool = True) -> str:
    rows = []
    for r in results:
        diff = f"{r['loss_diff']:.1e}" + (' !' if r['loss_diff'] > TOLERANCE else '')
        rows.append((r['name'], f"{r['median_s'] * 1e3:.1f}", f"{r['samples_per_s']:.1f}",
                     f"{r['speedup']:.2f}x", f"{r['first_loss']:.6f}",
                     '-' if r['name'] == LEROBOT else diff))
    title = '# act_ros training benchmark\n\n' + machine_description() + '\n\n' if header else ''
    compiled = [r for r in results if 'compiled' in r['name']]
    frozen = [r for r in results if r.get('cache_s_per_frame') is not None]
    frozen_note = ''.join(
        f"\n- {r['name']}: its cache took {r['cache_s_per_frame'] * 1e3:.1f} ms per frame (every "
        'camera) to build, once per run.' for r in frozen)
    if frozen:
        frozen_note += ("\n- The cached arms' step-1 loss equals the full step's: the frozen "
                        'stages have not moved yet.')
    compile_note = frozen_note + (
                    f"\n- The compiled arm's warm-up ({compiled[0]['warmup_s']:.0f} s) includes "
                    'compilation. Its step-1 loss differs from eager when compiled code draws '
                    'dropout masks differently (see `act-ros bench compile --disable-dropout`).'
                    if compiled else '')
    return (f'{title}## Training throughput: act_ros vs LeRobot update_policy\n\n'
            f'device {device}; model preset {model_preset}; cameras {image_size[0]}x'
            f'{image_size[1]}; batch {batch_size}; {iters} timed iterations after {warmup} '
            'warm-up, every arm once per iteration on the same batch (interleaved A/B).\n'
            '- A step here is batch assembly + normalization + forward + loss + backward + '
            'clipping + AdamW (+ the scheduler for act_ros); times are medians, a speed-up is the '
            'median of per-iteration LeRobot/arm ratios.\n'
            '- LeRobot: `update_policy` from `lerobot.scripts.lerobot_train`, with the optimizer '
            'preset, Accelerator and MetricsTracker `lerobot-train` builds. act_ros: the trainer '
            f'with gripper loss weight 1, so both compute the same loss; `!` marks a step-1 loss '
            f'difference above {TOLERANCE:.0e}.' + compile_note + '\n\n'
            + markdown_table(COLUMNS, rows) + '\n')


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros bench training', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--device', default='auto', help='auto, cpu, cuda, cuda:N, mps')
    p.add_argument('--model-preset', choices=sorted(PRESETS), default='default')
    p.add_argument('--image-size', type=parse_image_size, default=(480, 640),
                   help='camera size HxW (default 480x640)')
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--iters', type=int, default=10, help='timed iterations per arm')
    p.add_argument('--warmup', type=int, default=1, help='untimed iterations first')
    p.add_argument('--compile', action='store_true', help='add the compiled trainer step')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--torch-threads', type=int, default=None)
    p.add_argument('--processes', type=parse_processes, metavar='N,M,...',
                   help='measure data-parallel scaling instead: the trainer step in N, M, ... '
                   'processes (accelerate launch, --batch-size each), e.g. 1,2')
    p.add_argument('--no-header', action='store_true', help='omit the machine description '
                   '(act-ros bench all writes it once)')
    p.add_argument('--output', type=Path, help='also write the report (markdown) here')
    p.add_argument('--json', type=Path, help='also write the figures as JSON, with the command, '
                   'commit and machine that made them (what `act-ros report` reads)')
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 1 or args.batch_size < 1:
        p.error('--iters, --warmup and --batch-size must be >= 1')
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    from act_ros.core.device import select_device
    device = str(select_device(args.device))
    print(f'[bench training] {args.model_preset} ACT, {args.image_size[0]}x{args.image_size[1]}, '
          f'batch {args.batch_size} ...', file=sys.stderr, flush=True)
    if args.processes:
        if args.compile:
            p.error('--compile is not measured with --processes (eager steps only)')
        from act_ros.bench import data_parallel
        try:
            scaling = data_parallel.measure(
                processes=args.processes, model_preset=args.model_preset,
                image_size=args.image_size, batch_size=args.batch_size, iters=args.iters,
                warmup=args.warmup, device=device, seed=args.seed,
                torch_threads=args.torch_threads)
        except RuntimeError as exc:
            print(f'act-ros bench training: {exc}', file=sys.stderr)
            return 1
        title = '# act_ros training benchmark\n\n' + machine_description() + '\n\n'
        figures = {'data_parallel': scaling}
        report = (title if not args.no_header else '') + data_parallel.render(
            scaling, model_preset=args.model_preset, image_size=args.image_size,
            iters=args.iters, warmup=args.warmup, device=device)
    else:
        results = measure(model_preset=args.model_preset, image_size=args.image_size,
                          batch_size=args.batch_size, iters=args.iters, warmup=args.warmup,
                          compile_step=args.compile, device=device, seed=args.seed)
        figures = {'rows': json_rows(results)}
        report = render(results, model_preset=args.model_preset, image_size=args.image_size,
                        batch_size=args.batch_size, iters=args.iters, warmup=args.warmup,
                        device=device, header=not args.no_header)
    print(report, flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.output, report)
    if args.json:
        from act_ros.provenance import result_provenance

        provenance = result_provenance('act-ros bench training',
                                       argv if argv is not None else sys.argv[1:],
                                       output_path=args.json, omit=('--output',))
        settings = {'device': device, 'model_preset': args.model_preset,
                    'image_size': list(args.image_size), 'batch_size': args.batch_size,
                    'iters': args.iters, 'warmup': args.warmup}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps({'provenance': provenance, 'settings': settings,
                                                 **figures}, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
