"""Runtime benchmark: LeRobot's ``select_action`` loop vs this runtime, at a fixed tick rate.

``act-ros bench runtime`` (or ``python -m act_ros.bench.runtime``). One checkpoint, one
process, side by side:

1. Control loops at 30 Hz for ``--duration`` seconds each: LeRobot's ``select_action``
   (chunk queue; the tick that refills the queue waits for the model) vs the runtime in
   async chunk mode and async ensembling mode. Per-tick latency median/p99/max and the
   number of ticks that overran the period.
2. Model time per chunk, interleaved A/B: LeRobot eager vs this runtime eager, compiled
   fp32 (inductor, frozen weights) and reduced precision, and the ONNX backends
   (``--backends``: OpenVINO fp32 and bf16, ONNX Runtime fp32, from one ONNX export), with
   the max action difference against LeRobot eager in normalized units and the start-up
   cost (compilation; export + compilation for the ONNX backends).

Each camera size in ``--image-size`` (default 240x320 and 480x640) gets its own sections,
with a checkpoint made for that size unless ``--checkpoint`` is given.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from act_ros.bench.report import latency_summary, machine_description, markdown_table
from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.contract import load_contract
from act_ros.core.errors import DeviceUnavailableError
from act_ros.core.inference.backends import BACKENDS, installed_backends
from act_ros.core.inference.checkpoint import (
    create_checkpoint,
    load_checkpoint,
    parse_image_size,
    read_policy_config,
)
from act_ros.core.inference.hub import resolve_checkpoint
from act_ros.core.inference.predictor import ChunkPredictor, PredictorOptions, cpu_has_native_bf16
from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
from act_ros.core.observation import Observation


def sample_observations(contract, size, count, seed=0):
    rng = np.random.default_rng(seed)
    h, w = size
    base = {c: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for c in contract.camera_names}
    obs = []
    for i in range(count):
        images = {c: np.roll(img, i, axis=1) for c, img in base.items()}
        obs.append(Observation(images=images, state=rng.uniform(-0.5, 0.5, contract.num_joints)))
    return obs


def lerobot_tensors(obs, contract, shapes):
    from act_ros.core.observation import image_to_tensor, state_to_tensor
    out = {contract.state_feature: state_to_tensor(obs.state, contract.num_joints)}
    for cam in contract.cameras:
        out[cam.feature] = image_to_tensor(obs.images[cam.name], shapes[cam.feature], cam.name)
    return out


def control_loop(step, observations, duration_s, fps):
    """Call ``step(obs)`` once per period for ``duration_s``; return per-tick durations."""
    period = 1.0 / fps
    ticks = int(duration_s * fps)
    durations = []
    next_t = time.perf_counter()
    for i in range(ticks):
        start = time.perf_counter()
        step(observations[i % len(observations)])
        durations.append(time.perf_counter() - start)
        next_t += period
        delay = next_t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            next_t = time.perf_counter()  # overrun: restart the schedule, as a robot loop would
    return durations, period


def run_control_loops(path, contract, observations, duration_s, device, compile_model):
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    rows = []
    config = read_policy_config(path)
    config.pretrained_backbone_weights = None
    config.device = str(device)
    policy = ACTPolicy.from_pretrained(path, config=config)
    pre, post = make_pre_post_processors(config, pretrained_path=str(path))
    shapes = load_checkpoint(path, contract=contract).image_shapes
    policy.reset()

    def lerobot_step(obs):
        post(policy.select_action(pre(lerobot_tensors(obs, contract, shapes))))

    lerobot_step(observations[0])  # warm-up, as for the runtime
    policy.reset()
    durations, period = control_loop(lerobot_step, observations, duration_s, contract.fps)
    rows.append(('LeRobot select_action (chunk, eager)', durations, None))

    for mode in ('chunk', 'ensemble'):
        rt = PolicyRuntime(RuntimeConfig(model_path=path, device=str(device), mode=mode,
                                         execution='async', compile_model=compile_model,
                                         contract=contract))
        rt.reset()
        durations, _ = control_loop(rt.act, observations, duration_s, contract.fps)
        rt.wait_idle(30)
        label = f'act_ros async {mode}' + (' (compiled)' if compile_model else '')
        rows.append((label, durations, rt.stats))
        rt.close()

    table = []
    for label, durations, stats in rows:
        s = latency_summary(durations)
        overruns = sum(d > period for d in durations)
        chunks = stats.chunks_computed if stats else 'n/a'
        late = stats.chunks_late if stats else 'n/a'
        empty = stats.empty_ticks if stats else 0
        table.append((label, len(durations), s['median_ms'], s['p99_ms'], s['max_ms'], overruns,
                      empty, chunks, late))
    return markdown_table(['loop', 'ticks', 'median ms', 'p99 ms', 'max ms',
                           f'overruns (>{period * 1000:.1f} ms)', 'ticks without action',
                           'chunks', 'chunks too late to play'], table, digits=2)


def _onnx_variants(ckpt, contract, device, backends, reduced):
    """ChunkPredictors of the ONNX backends (one export, shared), their start-up seconds
    (export included for the variant that exported) and notes on what was skipped."""
    variants, startup, notes = {}, {}, []
    onnx_backends = [b for b in backends if b != 'torch']
    if onnx_backends and device.type != 'cpu':
        return variants, startup, [f'ONNX backend rows skipped: they run on the CPU, this run '
                                   f'is on {device} (--device cpu)']
    for backend in onnx_backends:
        precisions = ['fp32'] + ([reduced] if backend == 'openvino' and reduced != 'fp32' else [])
        for precision in precisions:
            name = f'act_ros {backend} {precision}'
            try:
                pred = ChunkPredictor(ckpt, contract, device,
                                      PredictorOptions(backend=backend, precision=precision))
            except DeviceUnavailableError as exc:
                notes.append(f'{name} skipped: {exc}')
                continue
            variants[name] = pred
            startup[name] = pred.compile_seconds
            export = pred.backend.export
            if export.exported:
                notes.append(f'ONNX export: {export.seconds:.1f} s, once, shared by the ONNX '
                             f'backends (included in the start-up of {name})')
    return variants, startup, notes


def run_model_timing(path, contract, observations, iters, device, reduced, backends=('torch',)):
    from lerobot.policies.act.modeling_act import ACTPolicy

    ckpt = load_checkpoint(path, contract=contract, device=str(device))
    variants = {'LeRobot eager fp32': None}
    notes = []
    if 'torch' in backends:
        variants['act_ros eager fp32'] = ChunkPredictor(ckpt, contract, device)
        variants['act_ros compiled fp32'] = ChunkPredictor(ckpt, contract, device,
                                                           PredictorOptions(compile_model=True))
        if reduced == 'bf16' and device.type == 'cpu' and not cpu_has_native_bf16():
            notes.append('torch bf16 rows skipped: this CPU has no native bfloat16 (AVX512-BF16 '
                         'or AMX, detected from the CPU flags by act_ros.core.inference.precision), '
                         'so the runtime refuses bf16 here.')
        else:
            variants[f'act_ros eager {reduced}'] = ChunkPredictor(
                ckpt, contract, device, PredictorOptions(precision=reduced))
            variants[f'act_ros compiled {reduced}'] = ChunkPredictor(
                ckpt, contract, device, PredictorOptions(precision=reduced, compile_model=True))
    compile_s = {}
    for name, pred in variants.items():
        if pred is not None and pred.options.compile_model:
            compile_s[name] = pred.warmup(2)
    onnx_variants, startup, onnx_notes = _onnx_variants(ckpt, contract, device, backends, reduced)
    variants.update(onnx_variants)
    compile_s.update(startup)
    notes += onnx_notes
    lerobot = ACTPolicy(ckpt.config).to(device).eval()
    lerobot.load_state_dict(ckpt.policy.state_dict())

    batches = [ckpt.preprocessor(lerobot_tensors(o, contract, ckpt.image_shapes))
               for o in observations[:iters]]

    def run(name, batch):
        with torch.no_grad():
            if variants[name] is None:
                return lerobot.predict_action_chunk(batch)
            return variants[name].normalized_chunk(batch)

    for name in variants:  # warm every variant once before timing
        run(name, batches[0])
    times = {name: [] for name in variants}
    diffs = {name: 0.0 for name in variants}
    for batch in batches:  # interleaved A/B: each variant sees the same inputs in turn
        reference = None
        for name in variants:
            if device.type == 'cuda':
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = run(name, batch)
            if device.type == 'cuda':
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
            if reference is None:
                reference = out
            diffs[name] = max(diffs[name], float((out.float() - reference.float()).abs().max()))
    base = float(np.median(times['LeRobot eager fp32']))
    rows = []
    for name in variants:
        med = float(np.median(times[name]))
        rows.append((name, med * 1000, base / med, diffs[name], compile_s.get(name, 0.0)))
    table = markdown_table(['model', 'ms / chunk (median)', 'speed-up vs LeRobot',
                            'max |action diff| (normalized)', 'start-up s (export + compile)'],
                           rows, digits=2)
    return table + ''.join(f'\n\n{line}' for line in notes)


def _parse_backends(text: str) -> list[str]:
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f'expected a comma-separated subset of {BACKENDS}, '
                                         f"got '{text}'")
    missing = [name for name in names if name not in installed_backends()]
    if missing:
        raise argparse.ArgumentTypeError(f'backends {missing} are not installed '
                                         f"(pip install -e '.[{','.join(missing)}]')")
    return names


def _parse_sizes(text: str) -> list[tuple[int, int]]:
    try:
        return [parse_image_size(part.strip()) for part in text.split(',') if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='act-ros bench runtime', description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument('--checkpoint', type=Path, help='checkpoint directory or Hub id to use '
                        '(default: an untrained default-size ACT written to a temporary '
                        'directory)')
    parser.add_argument('--preset', default='default', help='model preset when no checkpoint')
    parser.add_argument('--image-size', type=_parse_sizes, default='240x320,480x640',
                        help='camera sizes HxW, comma-separated; each gets its own sections '
                        '(default 240x320,480x640)')
    parser.add_argument('--duration', type=float, default=20.0, help='seconds per control loop')
    parser.add_argument('--iters', type=int, default=10, help='model timing iterations')
    parser.add_argument('--device', default='auto')
    parser.add_argument('--reduced-precision', default=None, choices=['bf16', 'fp16'],
                        help='default: bf16 on CPU, fp16 on CUDA')
    parser.add_argument('--compile-loops', action='store_true',
                        help='also compile the model used in the async loops')
    parser.add_argument('--skip-loops', action='store_true')
    parser.add_argument('--skip-model', action='store_true')
    parser.add_argument('--backends', type=_parse_backends, default=None,
                        help=f'model-timing backends, comma-separated subset of {BACKENDS} '
                        '(default: every installed one; LeRobot eager is always the reference)')
    parser.add_argument('--output', type=Path, help='also write the report (markdown) here')
    args = parser.parse_args(argv)

    from act_ros.core.device import select_device
    device = select_device(args.device)
    contract = load_contract()
    sizes = args.image_size  # argparse applies the type to the default too
    backends = args.backends or installed_backends()
    reduced = args.reduced_precision or ('fp16' if device.type == 'cuda' else 'bf16')
    sections = [f'# act_ros runtime benchmark\n\n{machine_description()}; device {device}; '
                f"cameras {', '.join(f'{h}x{w}' for h, w in sizes)}; backends "
                f"{', '.join(backends)}\n"]
    print(sections[0], flush=True)
    for size in sizes:
        label = f'cameras {size[0]}x{size[1]}'
        with tempfile.TemporaryDirectory() as tmp:
            # A Hub id: its cached snapshot (LeRobot's own loader below reads the directory).
            path = (resolve_checkpoint(args.checkpoint).path if args.checkpoint else
                    create_checkpoint(Path(tmp) / 'ckpt', preset=args.preset, image_size=size,
                                      seed=0))
            observations = sample_observations(contract, size, max(args.iters, 30))
            if not args.skip_loops:
                print(f'{label}: control loops, {args.duration:.0f} s each at {contract.fps} Hz ...',
                      file=sys.stderr, flush=True)
                sections.append(f'## Control loop at {contract.fps} Hz, {args.duration:.0f} s each, '
                                f'{label}\n\n'
                                + run_control_loops(path, contract, observations, args.duration,
                                                    device, args.compile_loops))
                print(sections[-1] + '\n', flush=True)  # each section as soon as it is measured
            if not args.skip_model:
                print(f'{label}: model timing (compiling and exporting first) ...',
                      file=sys.stderr, flush=True)
                sections.append(f'## Model time per chunk, {label} (interleaved A/B)\n\n'
                                + run_model_timing(path, contract, observations, args.iters,
                                                   device, reduced, backends))
                print(sections[-1] + '\n', flush=True)
    report = '\n\n'.join(sections) + '\n'
    if args.output:
        write_text_atomic(args.output, report)
    return 0


if __name__ == '__main__':
    sys.exit(main())
