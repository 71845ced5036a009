"""Compile benchmark: eager vs ``torch.compile`` for ACT inference and the training step.

``act-ros bench compile`` (or ``python -m act_ros.bench.compile``). Same weights, same
inputs, eager and compiled side by side (A/B interleaved, medians):

- inference: :class:`~act_ros.core.inference.predictor.ACTInferenceModel` (normalized observation ->
  action chunk, batch 1 as the runtime runs it), compiled as the runtime compiles it
  (:func:`~act_ros.core.inference.predictor.compile_inference_model`: inductor, frozen weights in
  mode 'default');
- training: the trainer's step (:meth:`~act_ros.training.loop.Trainer.train_step`: batch
  assembly, normalization, loss, backward, clipping, AdamW, scheduler), once with the loss
  step eager and once compiled, from identical weights and optimizer state, seeded
  identically before every step; loss and grad norm are compared step by step.

One table row per combination of settings; ``--matrix`` runs dropout x matmul precision x
cuDNN TF32 where they apply to the device. With ``--fullgraph`` a graph break is an error:
its row says FAIL and the exit status is 1.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from act_ros.bench.report import machine_description, markdown_table
from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.inference.checkpoint import PRESETS, parse_image_size
from act_ros.core.inference.predictor import ACTInferenceModel, compile_inference_model

TOLERANCE = 1e-5  # differences above this are marked (actions in normalized units, loss)
MARK = ' !'
BENCH_COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune-no-cudagraphs')
MATMUL_PRECISIONS = ('highest', 'high', 'medium')
BACKENDS = ('inductor', 'aot_eager')
COLUMNS = ('setting', 'max abs action diff', 'loss diff step 1 (abs / rel)', 'infer eager ms',
           'infer compiled ms', 'infer speed-up', 'train eager ms', 'train compiled ms',
           'train speed-up', 'loss max rel diff (all steps)', 'grad-norm rel diff (step 1 / max)',
           'graph breaks', 'compile s (infer + train)')


@dataclass(frozen=True)
class Setting:
    """The numerics of one row. ``cudnn_tf32`` is ``None`` where cuDNN does not apply."""

    dropout: bool = True
    matmul_precision: str = 'highest'
    cudnn_tf32: bool | None = None

    def __post_init__(self) -> None:
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"unknown matmul precision '{self.matmul_precision}', expected one "
                             f'of {MATMUL_PRECISIONS}')

    def label(self) -> str:
        tf32 = 'n/a' if self.cudnn_tf32 is None else ('on' if self.cudnn_tf32 else 'off')
        return (f"dropout {'on' if self.dropout else 'off'}, matmul {self.matmul_precision}, "
                f'cuDNN TF32 {tf32}')


@dataclass(frozen=True)
class CompileBenchConfig:
    """What one run compares (every row shares these)."""

    device: str = 'auto'
    compile_mode: str = 'default'
    fullgraph: bool = False
    backend: str = 'inductor'
    model_preset: str = 'default'
    image_size: tuple[int, int] = (480, 640)
    batch_size: int = 8
    iters: int = 10
    seed: int = 0
    inject_graph_break: bool = False

    def __post_init__(self) -> None:
        if self.compile_mode not in BENCH_COMPILE_MODES:
            raise ValueError(f"unknown compile mode '{self.compile_mode}', expected one of "
                             f'{BENCH_COMPILE_MODES}')
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend '{self.backend}', expected one of {BACKENDS}")
        if self.backend != 'inductor' and self.compile_mode != 'default':
            raise ValueError(f"compile mode '{self.compile_mode}' is an inductor mode; backend "
                             f"'{self.backend}' takes only 'default'")
        if self.model_preset not in PRESETS:
            raise ValueError(f"unknown model preset '{self.model_preset}', expected one of "
                             f'{sorted(PRESETS)}')
        if self.iters < 2 or self.batch_size < 1:
            raise ValueError(f'iters must be >= 2 and batch_size >= 1, got {self.iters} and '
                             f'{self.batch_size}')


@dataclass
class RowResult:
    """One row: ``error`` is set when compiling failed (a graph break under fullgraph)."""

    setting: Setting
    error: str | None = None
    values: dict[str, float] = field(default_factory=dict)


# -- settings ---------------------------------------------------------------------------------
def settings_for(device: torch.device, *, matrix: bool, dropout: bool, matmul_precision: str,
                 cudnn_tf32: bool) -> list[Setting]:
    """The rows to run: one from the flags, or the matrix of what applies to ``device``.

    ``torch.set_float32_matmul_precision`` only affects CUDA (PyTorch's documentation) and
    cuDNN exists only on CUDA, so elsewhere the matrix varies dropout alone.
    """
    cuda = device.type == 'cuda'
    if not matrix:
        return [Setting(dropout, matmul_precision, cudnn_tf32 if cuda else None)]
    precisions = MATMUL_PRECISIONS if cuda else (matmul_precision,)
    tf32s: tuple[bool | None, ...] = (True, False) if cuda else (None,)
    return [Setting(d, p, t) for d, p, t in itertools.product((True, False), precisions, tf32s)]


@contextlib.contextmanager
def numeric_settings(setting: Setting) -> Iterator[None]:
    """Apply a row's matmul precision, cuDNN TF32 and RNG choice; restore them after."""
    from torch._inductor import config as inductor_config

    precision = torch.get_float32_matmul_precision()
    tf32 = torch.backends.cudnn.allow_tf32
    fallback_random = inductor_config.fallback_random
    torch.set_float32_matmul_precision(setting.matmul_precision)
    if setting.cudnn_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = setting.cudnn_tf32
    # Without dropout the only random draw left is the VAE latent sample: compiled code then
    # draws it with eager's generator, so eager and compiled see the same noise.
    inductor_config.fallback_random = not setting.dropout
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = tf32
        inductor_config.fallback_random = fallback_random


def disable_dropout(module: torch.nn.Module) -> int:
    """Set every dropout probability in ``module`` to 0; returns how many were changed."""
    changed = 0
    for sub in module.modules():
        if isinstance(sub, torch.nn.Dropout):
            sub.p, changed = 0.0, changed + 1
        elif isinstance(sub, torch.nn.MultiheadAttention):
            sub.dropout, changed = 0.0, changed + 1
    return changed


def add_graph_break(act_network: torch.nn.Module) -> Any:
    """Testing aid (``--inject-graph-break``): a forward hook on the ACT network with a
    finite check that branches in Python on a tensor's value, which dynamo cannot trace
    (data-dependent control flow): a genuine graph break. Returns the hook handle."""
    def finite_check(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        if not torch.isfinite(output[0]).all():
            raise FloatingPointError('the ACT network produced non-finite actions')

    return act_network.register_forward_hook(finite_check)


# -- compiling --------------------------------------------------------------------------------
def compile_callable(fn: Callable, config: CompileBenchConfig, *, freeze: bool) -> Callable:
    """``torch.compile`` with the run's mode, backend and fullgraph.

    Inference (``freeze``) with inductor and fullgraph goes through the runtime's own
    :func:`compile_inference_model`; otherwise the same call is made here with the flags.
    """
    if config.backend == 'inductor' and config.fullgraph and freeze:
        return compile_inference_model(fn, mode=config.compile_mode, freeze=True)
    kwargs: dict[str, Any] = {}
    if config.backend == 'inductor':
        kwargs = ({'options': {'freezing': True}} if freeze and config.compile_mode == 'default'
                  else {'mode': config.compile_mode})
    return torch.compile(fn, fullgraph=config.fullgraph, dynamic=False, backend=config.backend,
                         **kwargs)


def graph_breaks() -> int:
    """Graph breaks dynamo recorded since the last ``torch._dynamo.reset()``."""
    from torch._dynamo.utils import counters
    return int(sum(counters['graph_break'].values()))


def _compile_error(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    kind = 'graph break' if isinstance(exc, torch._dynamo.exc.Unsupported) else 'compile failed'
    return f'{kind} ({type(exc).__name__}: {first})'


def _timed(device: torch.device, fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """Seconds of ``fn(*args)`` (with a device sync on CUDA) and its result."""
    if device.type == 'cuda':
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(*args)
    if device.type == 'cuda':
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def _paired_speedup(eager: list[float], compiled: list[float]) -> float:
    """Median over iterations of eager/compiled, each pair measured side by side."""
    return float(np.median(np.asarray(eager) / np.asarray(compiled)))


# -- one row ----------------------------------------------------------------------------------
def _trainer_class() -> type:
    from act_ros.training.loop import Trainer

    class CompiledStepTrainer(Trainer):
        """The trainer with its loss step compiled by the benchmark's settings."""

        def __init__(self, *args: Any, compile_step: Callable[[Callable], Callable],
                     **kwargs: Any) -> None:
            self._compile_step = compile_step
            super().__init__(*args, **kwargs)

        def _make_loss_step(self) -> Callable:
            return self._compile_step(super()._make_loss_step())

    return CompiledStepTrainer


def _inference(config: CompileBenchConfig, network: torch.nn.Module, batch: dict[str, Any],
               features: list[str], state_key: str, device: torch.device) -> dict[str, float]:
    eager = ACTInferenceModel(copy.deepcopy(network)).to(device).eval()
    compiled_model = ACTInferenceModel(copy.deepcopy(network)).to(device).eval()
    if config.inject_graph_break:
        add_graph_break(compiled_model.model)
    compiled = compile_callable(compiled_model, config, freeze=True)
    samples = batch[state_key].shape[0]

    def inputs(i: int) -> list[torch.Tensor]:
        j = i % samples
        return [batch[state_key][j:j + 1]] + [batch[key][j:j + 1] for key in features]

    with torch.no_grad():
        compile_s, _ = _timed(device, compiled, *inputs(0))
        eager(*inputs(0))
        times: dict[str, list[float]] = {'eager': [], 'compiled': []}
        diff = 0.0
        for i in range(config.iters):  # interleaved A/B on the same inputs
            args = inputs(i)
            t_eager, a = _timed(device, eager, *args)
            t_compiled, b = _timed(device, compiled, *args)
            times['eager'].append(t_eager)
            times['compiled'].append(t_compiled)
            diff = max(diff, float((a.float() - b.float()).abs().max()))
    return {'max abs action diff': diff, 'infer eager ms': 1e3 * float(np.median(times['eager'])),
            'infer compiled ms': 1e3 * float(np.median(times['compiled'])),
            'infer speed-up': _paired_speedup(times['eager'], times['compiled']),
            'infer compile s': compile_s}


def _trainers(config: CompileBenchConfig, setting: Setting, inputs: Any,
              workdir: Path) -> tuple[Any, Any]:
    """Two trainers with identical weights, optimizer state and batch order; the second
    compiles its loss step."""
    from act_ros.training.loop import Trainer
    from act_ros.training.speed import synthetic_config

    fields = dict(model_preset=config.model_preset, batch_size=config.batch_size,
                  steps=config.iters + 1, seed=config.seed)
    eager = Trainer(synthetic_config(inputs, workdir, **fields), inputs)
    compiled = _trainer_class()(synthetic_config(inputs, workdir, **fields), inputs,
                                compile_step=lambda fn: compile_callable(fn, config, freeze=False))
    if config.inject_graph_break:
        add_graph_break(compiled.policy.model)
    if not setting.dropout:
        disable_dropout(eager.policy)
        disable_dropout(compiled.policy)
    return eager, compiled


def _training(config: CompileBenchConfig, eager: Any, compiled: Any,
              device: torch.device) -> dict[str, float]:
    steps = config.iters + 1  # the first compiled step compiles; it is not timed
    times: dict[str, list[float]] = {'eager': [], 'compiled': []}
    for step in range(steps):  # interleaved A/B, the same seed before each arm's step
        for name, trainer in (('eager', eager), ('compiled', compiled)):
            torch.manual_seed(config.seed + step)
            elapsed, _ = _timed(device, trainer.train_step)
            times[name].append(elapsed)
    curves = {}
    for name, trainer in (('eager', eager), ('compiled', compiled)):
        trainer.history.flush()
        curves[name] = {key: np.array([row[key] for row in trainer.history.train])
                        for key in ('loss', 'grad_norm')}
    loss_e, loss_c = curves['eager']['loss'], curves['compiled']['loss']
    norm_e, norm_c = curves['eager']['grad_norm'], curves['compiled']['grad_norm']
    loss_rel = np.abs(loss_e - loss_c) / np.maximum(np.abs(loss_e), 1e-12)
    norm_rel = np.abs(norm_e - norm_c) / np.maximum(np.abs(norm_e), 1e-12)
    return {'loss abs diff step 1': float(abs(loss_e[0] - loss_c[0])),
            'loss rel diff step 1': float(loss_rel[0]),
            'train eager ms': 1e3 * float(np.median(times['eager'][1:])),
            'train compiled ms': 1e3 * float(np.median(times['compiled'][1:])),
            'train speed-up': _paired_speedup(times['eager'][1:], times['compiled'][1:]),
            'loss max rel diff': float(loss_rel.max()),
            'grad-norm rel diff step 1': float(norm_rel[0]),
            'grad-norm max rel diff': float(norm_rel.max()),
            'train compile s': times['compiled'][0]}


def run_setting(config: CompileBenchConfig, setting: Setting, inputs: Any) -> RowResult:
    """Measure one row; a compile error (graph break under fullgraph) is returned, not raised."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    row = RowResult(setting)
    with numeric_settings(setting), tempfile.TemporaryDirectory() as tmp:
        eager, compiled = _trainers(config, setting, inputs, Path(tmp))
        # Inference on copies of the initial network, the first samples of the first batch.
        batch = eager.preprocessor(inputs.store.batch(eager.order.indices(0)))
        try:
            infer = _inference(config, eager.policy.model, batch, eager.features,
                               inputs.contract.state_feature, inputs.device)
            train = _training(config, eager, compiled, inputs.device)
        except torch._dynamo.exc.TorchDynamoException as exc:
            row.error = _compile_error(exc)
            return row
    row.values = {**infer, **train, 'graph breaks': float(graph_breaks())}
    return row


# -- report -----------------------------------------------------------------------------------
def _diff(value: float, *, mark: bool = True) -> str:
    text = f'{value:.1e}'
    return text + MARK if mark and not value <= TOLERANCE else text


def table(rows: list[RowResult]) -> str:
    """The markdown table: one line per row, FAIL with the reason for a failed compile."""
    lines = []
    for row in rows:
        if row.error:
            lines.append([row.setting.label(), f'FAIL: {row.error}'] + ['-'] * (len(COLUMNS) - 2))
            continue
        v = row.values
        lines.append([
            row.setting.label(), _diff(v['max abs action diff']),
            f"{_diff(v['loss abs diff step 1'], mark=False)} / {_diff(v['loss rel diff step 1'])}",
            f"{v['infer eager ms']:.2f}", f"{v['infer compiled ms']:.2f}",
            f"{v['infer speed-up']:.2f}x", f"{v['train eager ms']:.1f}",
            f"{v['train compiled ms']:.1f}", f"{v['train speed-up']:.2f}x",
            _diff(v['loss max rel diff']),
            f"{_diff(v['grad-norm rel diff step 1'], mark=False)} / "
            f"{_diff(v['grad-norm max rel diff'], mark=False)}",
            f"{int(v['graph breaks'])}", f"{v['infer compile s']:.0f} + {v['train compile s']:.0f}"])
    return markdown_table(COLUMNS, lines)


def notes(config: CompileBenchConfig, rows: list[RowResult], device: torch.device,
          parameters: int) -> str:
    """What the numbers mean, and which settings do not apply on this device."""
    out = [
        f'device {device}; model preset {config.model_preset} ({parameters / 1e6:.1f} M '
        f'parameters); cameras {config.image_size[0]}x{config.image_size[1]}; inference batch 1, '
        f'training batch {config.batch_size}; backend {config.backend}, mode '
        f"'{config.compile_mode}', fullgraph {'yes' if config.fullgraph else 'no'}"
        + (', graph break injected (--inject-graph-break)' if config.inject_graph_break else '')
        + '.',
        f'- {config.iters} iterations per arm after one untimed call (the compiled call '
        'compiles: its time is the compile column, which includes one step and depends on '
        "inductor's on-disk cache: a graph compiled before compiles much faster), eager and "
        'compiled '
        'interleaved on the same inputs; times are medians, a speed-up is the median of the '
        'per-iteration eager/compiled ratios.',
        f'- `{MARK.strip()}` marks a difference above {TOLERANCE:.0e}: absolute for actions '
        '(normalized units), relative for the loss (as the trainer computes it, gripper weight '
        '5: an untrained ACT\'s loss is tens, mostly the KL term, where 1e-5 absolute is float32 '
        'rounding). The grad-norm column (relative, unmarked) gives '
        'step 1 and the largest over all steps: after a few AdamW steps rounding differences in '
        'the weights grow, so it shows drift rather than a pass/fail.',
        '- Training: the trainer\'s own step (batch, normalization, loss, backward, clipping, '
        'AdamW, scheduler); the compiled arm compiles the loss step as `act-ros train --compile` '
        'does, from identical weights and optimizer state.']
    if any(r.setting.dropout for r in rows):
        out.append('- Dropout on: both arms are seeded identically before every step, but '
                   'compiled code may draw its random numbers (dropout masks, the VAE latent '
                   'sample) differently from eager, so the loss columns then include the dropout '
                   'noise, not only numerical error. `--disable-dropout` sets dropout to 0 and '
                   'makes compiled code draw the one remaining random number, the VAE sample, '
                   'with eager\'s generator (`torch._inductor.config.fallback_random`), so those '
                   'rows measure numerics alone.')
    if device.type != 'cuda':
        out.append(f'- On {device.type.upper()}: cuDNN TF32 does not apply (cuDNN is CUDA-only), '
                   'and `torch.set_float32_matmul_precision` is documented by PyTorch to affect '
                   'CUDA only, so `--matrix` varies dropout alone here; a precision given with '
                   '`--matmul-precision` is set but expected to change nothing.')
        if config.compile_mode == 'reduce-overhead':
            out.append("- Mode 'reduce-overhead' adds CUDA graphs, which need CUDA: here it "
                       "compiles like 'default' without frozen weights.")
    if config.compile_mode != 'default':
        out.append("- Frozen weights (inductor `freezing`) are used for inference in mode "
                   "'default' only, as in the runtime.")
    return '\n'.join(out)


def render(config: CompileBenchConfig, rows: list[RowResult], device: torch.device,
           parameters: int, *, header: bool = True) -> str:
    title = '# act_ros compile benchmark\n\n' + machine_description() + '\n\n' if header else ''
    failed = [r for r in rows if r.error]
    verdict = (f'\n\n**{len(failed)} of {len(rows)} combinations FAILED to compile.**'
               if failed else '')
    return (f'{title}## torch.compile vs eager (ACT inference and training step)\n\n'
            f'{notes(config, rows, device, parameters)}\n\n{table(rows)}{verdict}\n')


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, CompileBenchConfig]:
    p = argparse.ArgumentParser(prog='act-ros bench compile', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--device', default='auto', help='auto, cpu, cuda, cuda:N, mps')
    p.add_argument('--compile-mode', choices=BENCH_COMPILE_MODES, default='default')
    p.add_argument('--fullgraph', action='store_true',
                   help='compile whole graphs only: a graph break is a FAIL and exit status 1')
    p.add_argument('--backend', choices=BACKENDS, default='inductor',
                   help="'aot_eager' traces and differentiates but runs eager kernels (compiles in "
                        'seconds: separates graph capture from code generation)')
    p.add_argument('--disable-dropout', action='store_true',
                   help='dropout 0, so eager and compiled losses compare numerics alone')
    p.add_argument('--matmul-precision', choices=MATMUL_PRECISIONS, default='highest')
    p.add_argument('--disable-cudnn-tf32', action='store_true', help='CUDA only')
    p.add_argument('--matrix', action='store_true', help='run dropout x matmul precision x cuDNN '
                   'TF32, as far as they apply to the device')
    p.add_argument('--model-preset', choices=sorted(PRESETS), default='default')
    p.add_argument('--image-size', type=parse_image_size, default=(480, 640),
                   help='camera size HxW (default 480x640)')
    p.add_argument('--batch-size', type=int, default=8, help='training batch')
    p.add_argument('--iters', type=int, default=10, help='timed iterations per arm')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--torch-threads', type=int, default=None)
    p.add_argument('--inject-graph-break', action='store_true',
                   help='testing aid: a Python branch on a tensor value in the ACT forward, a real '
                        'graph break '
                        '(with --fullgraph the run must FAIL)')
    p.add_argument('--no-header', action='store_true', help='omit the machine description '
                   '(act-ros bench all writes it once)')
    p.add_argument('--output', type=Path, help='also write the report (markdown) here')
    args = p.parse_args(argv)
    try:
        config = CompileBenchConfig(device=args.device, compile_mode=args.compile_mode,
                                    fullgraph=args.fullgraph, backend=args.backend,
                                    model_preset=args.model_preset, image_size=args.image_size,
                                    batch_size=args.batch_size, iters=args.iters, seed=args.seed,
                                    inject_graph_break=args.inject_graph_break)
    except ValueError as exc:
        p.error(str(exc))
    return args, config


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    from act_ros.core.device import select_device
    from act_ros.training.speed import synthetic_inputs

    device = select_device(config.device)
    settings = settings_for(device, matrix=args.matrix, dropout=not args.disable_dropout,
                            matmul_precision=args.matmul_precision,
                            cudnn_tf32=not args.disable_cudnn_tf32)
    inputs = synthetic_inputs(image_size=config.image_size, batch_size=config.batch_size,
                              device=str(device), seed=config.seed)
    rows = []
    for setting in settings:
        print(f'[bench compile] {setting.label()}: compiling and measuring ...', file=sys.stderr,
              flush=True)
        rows.append(run_setting(config, setting, inputs))
        if rows[-1].error:
            print(f'[bench compile] FAIL: {rows[-1].error}', file=sys.stderr, flush=True)
    from lerobot.policies.act.modeling_act import ACTPolicy

    from act_ros.core.inference.checkpoint import make_act_config
    parameters = sum(p.numel() for p in ACTPolicy(make_act_config(
        inputs.contract, image_size=config.image_size, preset=config.model_preset)).parameters())
    report = render(config, rows, device, parameters, header=not args.no_header)
    print(report, flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.output, report)
    return 1 if any(r.error for r in rows) else 0


if __name__ == '__main__':
    sys.exit(main())
