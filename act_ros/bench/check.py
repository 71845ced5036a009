"""``act-ros bench check`` / ``make bench-check``: the fast benchmarks against a baseline.

Runs four short benchmarks, each in a fresh process on the CPU (about 4 minutes in all
on an idle 2-core CPU), and compares every figure with the baseline committed for this machine's
CPU class (``docs/benchmarks/baselines.json``; the class from the CPU's flags:
``x86-amx``, ``x86-avx512-bf16``, ``x86-avx512``, ``x86-avx2``, ``arm64``, ...). Exit
status 0 when every figure is within its margin, 1 when one is not (or a benchmark
failed), 2 when no baseline exists for this class (``--write-baseline`` records one).

Where possible a figure is a ratio of two things measured side by side in the same run,
so that the machine's speed (and the load other programs put on it) cancels:

- ``runtime``: this runtime's model call against LeRobot's own ``predict_action_chunk``
  on the same checkpoint and inputs, interleaved call by call (speed-up, higher is
  better); a control loop at 30 Hz in async chunk mode, its p99 tick against the model
  time (the tick must never wait for the model);
- ``training``: the trainer's step against LeRobot's ``update_policy``, eager and with
  the backbone frozen and cached, interleaved step by step; the first step's loss
  difference (the same work is done);
- ``node``: ``act_node`` with its own defaults under camera-rate load (``act-ros bench
  node``): commands per control period, missed periods over the window, its inference
  time per chunk under that load against the model latency it measured at configure (the
  same child process, before the load);
- ``faults``: ``act-ros bench faults --quick``: every fault recovered, no unsafe command,
  no leaked child, recovery times.

The runtime and training parts run PyTorch on one thread (on a busy machine, several
threads that wait for each other make every time erratic). Seconds that no ratio can
cancel (start-up, recovery) are compared as they are, with wide margins; the table says
which figures those are. ``--inject-slowdown F`` runs the same benchmarks on a
deliberately slowed build (:mod:`act_ros.bench.slowdown`, put on every benchmark process
from outside): every model call and training step takes F times as long. The check must
then fail.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import datetime
import json
import os
from pathlib import Path
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

from act_ros.core.atomic import write_text_atomic
from act_ros.bench.slowdown import check_factor, slowed_environment
from act_ros.core.arguments import HelpFormatter

PARTS = ('runtime', 'training', 'node', 'faults')
PART_TIMEOUT_S = 420.0
BASELINES = Path(__file__).resolve().parents[2] / 'docs' / 'benchmarks' / 'baselines.json'
# The model every part runs: LeRobot ACT at the 'cpu' size (15.6 M parameters) on 96x128
# inputs, fast enough for 30 Hz on 2 cores, so the node's figures are about the node.
PRESET, MODEL_SIZE = 'cpu', (96, 128)
CAMERAS = (240, 320)  # published to the node; the runtime resizes them to MODEL_SIZE


@dataclass(frozen=True)
class Figure:
    """One compared figure: ``better`` is 'higher' or 'lower' ('' for a figure only shown);
    the margin is relative (``rel``, a fraction of the baseline) or absolute (``abs``)."""

    name: str
    part: str
    unit: str
    better: str
    what: str
    rel: float | None = None
    abs: float | None = None
    ratio: bool = False  # measured side by side in one run: machine speed cancels

    def limit(self, baseline: float) -> float | None:
        if not self.better:
            return None
        allowance = baseline * self.rel if self.rel is not None else self.abs
        return baseline - allowance if self.better == 'higher' else baseline + allowance

    def margin_text(self, baseline: float | None) -> str:
        if not self.better:
            return 'shown only'
        sign = '>=' if self.better == 'higher' else '<='
        allowance = (f'{"-" if self.better == "higher" else "+"}{self.rel:.0%}'
                     if self.rel is not None else
                     f'{"-" if self.better == "higher" else "+"}{_num(self.abs)}')
        if baseline is None:
            return f'{sign} baseline {allowance}'
        return f'{sign} {_num(self.limit(baseline))} (baseline {allowance})'

    def verdict(self, baseline: float | None, measured: float | None) -> str:
        if measured is None:
            return 'FAIL (not measured)' if self.better else 'not measured'
        if not self.better:
            return 'info'
        if baseline is None:
            return 'no baseline'
        limit = self.limit(baseline)
        ok = measured >= limit if self.better == 'higher' else measured <= limit
        return 'pass' if ok else 'FAIL'


FIGURES = (
    Figure('runtime.model_speedup_vs_lerobot', 'runtime', 'x', 'higher',
           "LeRobot predict_action_chunk time / act_ros model call time (median of "
           'per-call ratios, interleaved)', rel=0.2, ratio=True),
    Figure('runtime.async_tick_p99_over_model', 'runtime', 'x', 'lower',
           'p99 tick of the async chunk loop at 30 Hz / LeRobot model time (a tick that '
           'waits for the model is about 1)', abs=0.15, ratio=True),
    Figure('runtime.lerobot_model_ms', 'runtime', 'ms', '',
           'LeRobot predict_action_chunk, median (this machine now)'),
    Figure('training.step_speedup_vs_lerobot', 'training', 'x', 'higher',
           "LeRobot update_policy time / the trainer's step time (median of per-step "
           'ratios, interleaved)', rel=0.2, ratio=True),
    Figure('training.frozen_backbone_speedup_vs_lerobot', 'training', 'x', 'higher',
           'the same with the backbone frozen and its output cached', rel=0.25, ratio=True),
    Figure('training.step1_loss_abs_diff', 'training', '', 'lower',
           'first-step loss, trainer vs LeRobot (same weights, batch, seed)', abs=1e-5),
    Figure('training.lerobot_step_ms', 'training', 'ms', '',
           'LeRobot update_policy, median (this machine now)'),
    Figure('node.commands_per_period', 'node', '', 'higher',
           'commands received / control periods in the window (a stalled node: about 0; '
           'real time on a shared CPU: wide margin)', rel=0.75),
    Figure('node.missed_periods_percent', 'node', '%', 'lower',
           'missed control periods over the whole window, % of its periods (a stalled node: '
           'about 100)', abs=70.0),
    Figure('node.inference_over_configure_latency', 'node', 'x', 'lower',
           "the node's inference time per chunk under camera load (mean) / the model "
           'latency its child measured at configure (median)', rel=1.0, ratio=True),
    Figure('node.time_to_first_command_s', 'node', 's', 'lower',
           "from the node's process start to its first command at the harness (absolute; "
           'imports and model load on a shared CPU: wide margin)', rel=9.0),
    Figure('faults.recovered_fraction', 'faults', '', 'higher',
           'faults recovered / faults injected', abs=0.0),
    Figure('faults.unsafe_commands', 'faults', '', 'lower',
           'non-finite commands + commands from stale inputs + releases outside the radius',
           abs=0.0),
    Figure('faults.children_leaked', 'faults', '', 'lower',
           'inference children left by the node (replaced ones, and after its exit)',
           abs=0.0),
    Figure('faults.silencing_recovery_median_s', 'faults', 's', 'lower',
           'inputs stale or malformed: fault end to 5 commands in a row at the rate, '
           'median (absolute: set by the rate and a new chunk)', abs=0.5),
    Figure('faults.ride_through_recovery_median_s', 'faults', 's', 'lower',
           'faults the node rides through: fault end to 5 commands in a row at the rate, '
           'median (absolute: about a period)', abs=0.3),
    Figure('faults.child_restart_max_s', 'faults', 's', 'lower',
           'killed or hung inference child: signal to commands at the rate again '
           '(absolute: a fresh interpreter importing torch)', rel=1.0),
    Figure('faults.exit_after_signal_s', 'faults', 's', 'lower',
           'SIGTERM to the node until it and its child are gone (absolute)', rel=2.5),
)


def _num(value: float | None) -> str:
    if value is None:
        return '-'
    if value == 0:
        return '0'
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f'{value:.1e}'
    return f'{value:.3g}' if abs(value) < 100 else f'{value:.0f}'


# -- the machine --------------------------------------------------------------------------
def cpu_class(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The CPU class whose baseline applies: what the kernels PyTorch, OpenVINO and ONNX
    Runtime pick depend on (x86: AMX, AVX-512 with bf16, AVX-512, AVX2)."""
    if flags is None:
        from act_ros.core.precision import cpu_flags
        flags = set(cpu_flags())
    machine = (machine or platform.machine()).lower()
    if machine in ('aarch64', 'arm64'):
        return 'arm64'
    if machine not in ('x86_64', 'amd64'):
        return machine
    for name, needs in (('x86-amx', ('amx_bf16',)), ('x86-avx512-bf16', ('avx512_bf16',)),
                        ('x86-avx512', ('avx512f',)), ('x86-avx2', ('avx2',))):
        if all(flag in flags for flag in needs):
            return name
    return 'x86'


def machine_line() -> str:
    from act_ros.bench.report import machine_description
    return machine_description()


# -- the parts (each runs in a fresh process: python -m act_ros.bench.check --part NAME) ---
def part_runtime(work: Path, *, iters: int = 15, loop_s: float = 6.0) -> dict[str, float]:
    import numpy as np
    import torch
    from lerobot.policies.act.modeling_act import ACTPolicy

    from act_ros.bench.runtime import _control_loop, _lerobot_tensors, _observations
    from act_ros.core.checkpoint import create_checkpoint, load_checkpoint
    from act_ros.core.contract import load_contract
    from act_ros.core.inference import ChunkPredictor
    from act_ros.core.runtime import PolicyRuntime, RuntimeConfig

    torch.set_num_threads(1)
    device = torch.device('cpu')
    contract = load_contract()
    path = create_checkpoint(work / 'ckpt', preset=PRESET, image_size=MODEL_SIZE, seed=0)
    ckpt = load_checkpoint(path, contract=contract, device='cpu')
    ours = ChunkPredictor(ckpt, contract, device)
    lerobot = ACTPolicy(ckpt.config).to(device).eval()
    lerobot.load_state_dict(ckpt.policy.state_dict())
    observations = _observations(contract, CAMERAS, max(iters, 30))
    batches = [ckpt.preprocessor(_lerobot_tensors(o, contract, ckpt.image_shapes))
               for o in observations[:iters + 2]]
    times: dict[str, list[float]] = {'lerobot': [], 'ours': []}
    with torch.no_grad():
        for i, batch in enumerate(batches):  # interleaved; the first two warm up
            for name, call in (('lerobot', lerobot.predict_action_chunk),
                               ('ours', ours.normalized_chunk)):
                start = time.perf_counter()
                call(batch)
                if i >= 2:
                    times[name].append(time.perf_counter() - start)
    lerobot_s = np.asarray(times['lerobot'])
    ours_s = np.asarray(times['ours'])
    rt = PolicyRuntime(RuntimeConfig(model_path=path, device='cpu', mode='chunk',
                                     execution='async', contract=contract))
    try:
        rt.reset()
        durations, _ = _control_loop(rt.act, observations, loop_s, contract.fps)
    finally:
        rt.close()
    lerobot_ms = float(np.median(lerobot_s)) * 1e3
    p99_ms = float(np.percentile(np.asarray(durations), 99)) * 1e3
    return {'runtime.model_speedup_vs_lerobot': float(np.median(lerobot_s / ours_s)),
            'runtime.async_tick_p99_over_model': p99_ms / lerobot_ms,
            'runtime.lerobot_model_ms': lerobot_ms,
            'runtime.act_ros_model_ms': float(np.median(ours_s)) * 1e3,
            'runtime.async_tick_p99_ms': p99_ms}


def part_training(work: Path) -> dict[str, float]:
    import torch

    from act_ros.bench.training import FROZEN, LEROBOT, measure

    torch.set_num_threads(1)
    rows = {r['name']: r for r in measure(model_preset=PRESET, image_size=MODEL_SIZE,
                                          batch_size=4, iters=6, warmup=2,
                                          compile_step=False, device='cpu',
                                          early_freeze_arm=False)}
    eager = rows['act_ros train_step (eager)']
    return {'training.step_speedup_vs_lerobot': eager['speedup'],
            'training.frozen_backbone_speedup_vs_lerobot': rows[FROZEN]['speedup'],
            'training.step1_loss_abs_diff': eager['loss_diff'],
            'training.lerobot_step_ms': rows[LEROBOT]['median_s'] * 1e3,
            'training.act_ros_step_ms': eager['median_s'] * 1e3}


def part_node(work: Path, *, duration_s: float = 20.0) -> dict[str, float]:
    out = work / 'node.json'
    cmd = [sys.executable, '-m', 'act_ros.bench.node', '--preset', PRESET,
           '--model-size', 'x'.join(map(str, MODEL_SIZE)), '--height', str(CAMERAS[0]),
           '--width', str(CAMERAS[1]), '--duration', str(duration_s), '--device', 'cpu',
           '--startup-timeout', '180', '--json', str(out)]
    _run(cmd, 'node')
    r = json.loads(out.read_text())
    periods = r['periods_in_window']
    return {'node.commands_per_period': r['commands'] / periods,
            'node.missed_periods_percent': 100.0 * r['missed_periods'] / periods,
            'node.inference_over_configure_latency': (
                r['inference_mean_ms'] / r['realtime_latency_median_ms']
                if r.get('inference_mean_ms') and r.get('realtime_latency_median_ms') else None),
            'node.inference_mean_ms': r.get('inference_mean_ms'),
            'node.configure_latency_median_ms': r.get('realtime_latency_median_ms'),
            'node.time_to_first_command_s': r['time_to_first_command_s']}


def part_faults(work: Path) -> dict[str, float]:
    out = work / 'faults.json'
    _run([sys.executable, '-m', 'act_ros.bench.faults', '--quick', '--no-header', '--json',
          str(out)], 'faults', ok_codes=(0, 1))
    r = json.loads(out.read_text())
    results = r['results']
    groups = r['recovery_by_group']
    child = [x['recovery_s'] for x in results if x['group'] == 'inference child restarted']

    def median(group: str) -> float | None:
        return groups[group]['median_s'] if group in groups else None
    return {
        'faults.recovered_fraction': sum(x['recovered'] for x in results) / len(results),
        'faults.unsafe_commands': float(r['nonfinite_commands'] + sum(
            x['stale_commands'] + x['releases_outside'] for x in results)),
        'faults.children_leaked': float(r['children_leaked'] + r['children_left']),
        'faults.silencing_recovery_median_s': median('inputs that silence the node'),
        'faults.ride_through_recovery_median_s': median('faults the node rides through'),
        'faults.child_restart_max_s': (max(child) if child and None not in child else None),
        'faults.exit_after_signal_s': r['exit_s']}


def _run(cmd: list[str], name: str, ok_codes: tuple[int, ...] = (0,)) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=PART_TIMEOUT_S, check=False)
    if proc.returncode not in ok_codes:
        raise RuntimeError(f'{name} benchmark exited {proc.returncode}:\n'
                           + '\n'.join(proc.stdout.splitlines()[-30:]))


PART_FUNCTIONS = {'runtime': part_runtime, 'training': part_training, 'node': part_node,
                  'faults': part_faults}


def run_part(name: str, env: dict[str, str]) -> tuple[dict[str, float | None], str | None]:
    """One part in a fresh process; its figures, or an error message."""
    with tempfile.TemporaryDirectory(prefix=f'act_ros_check_{name}_') as tmp:
        out = Path(tmp) / 'figures.json'
        cmd = [sys.executable, '-m', 'act_ros.bench.check', '--part', name,
               '--part-output', str(out)]
        try:
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  timeout=PART_TIMEOUT_S + 60, check=False)
        except subprocess.TimeoutExpired:
            return {}, f'{name}: ran past {PART_TIMEOUT_S + 60:.0f} s'
        if proc.returncode != 0 or not out.is_file():
            tail = '\n'.join(proc.stdout.splitlines()[-15:])
            return {}, f'{name}: exit {proc.returncode}\n{tail}'
        return json.loads(out.read_text()), None


# -- comparing ----------------------------------------------------------------------------
def compare(measured: dict[str, float | None], baseline: dict[str, float] | None,
            parts: list[str]) -> list[dict[str, Any]]:
    """One row per figure of the parts run: baseline, measured, margin, verdict."""
    rows = []
    for figure in FIGURES:
        if figure.part not in parts:
            continue
        base = (baseline or {}).get(figure.name)
        value = measured.get(figure.name)
        rows.append({'figure': figure.name, 'unit': figure.unit, 'baseline': base,
                     'measured': value, 'margin': figure.margin_text(base),
                     'verdict': figure.verdict(base, value),
                     'kind': 'ratio (same run)' if figure.ratio else
                     ('shown only' if not figure.better else 'absolute')})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    headers = ('figure', 'baseline', 'measured', 'margin', 'verdict', 'kind')
    table = [headers] + [(r['figure'] + (f" ({r['unit']})" if r['unit'] else ''),
                          _num(r['baseline']), _num(r['measured']), r['margin'], r['verdict'],
                          r['kind']) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(headers))]
    lines = ['  '.join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in table]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


def load_baselines(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {'classes': {}}




def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros bench check', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--only', default=','.join(PARTS),
                   help=f"comma-separated subset of {', '.join(PARTS)} (default: all)")
    p.add_argument('--baselines', type=Path, default=BASELINES,
                   help='baseline file (default: docs/benchmarks/baselines.json)')
    p.add_argument('--cpu-class', help='compare with this class instead of the detected one')
    p.add_argument('--inject-slowdown', type=float, default=None, metavar='F',
                   help='a deliberately slowed build: every model call and training step '
                   'takes F times as long (act_ros.bench.slowdown)')
    p.add_argument('--write-baseline', action='store_true',
                   help="record this run's figures as the baseline of this CPU class")
    p.add_argument('--json', type=Path, default=Path('outputs/bench/check.json'),
                   help='also write the rows here (default: %(default)s)')
    p.add_argument('--part', choices=PARTS, help=argparse.SUPPRESS)
    p.add_argument('--part-output', type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part:  # inside the fresh process of one part
        with tempfile.TemporaryDirectory(prefix='act_ros_check_') as tmp:
            figures = PART_FUNCTIONS[args.part](Path(tmp))
        write_text_atomic(args.part_output, json.dumps(figures, indent=2))
        return 0
    parts = [name.strip() for name in args.only.split(',') if name.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f'unknown parts {unknown} (have {", ".join(PARTS)})')
    env = dict(os.environ)
    env.setdefault('HF_HUB_OFFLINE', '1')
    env.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    try:
        factor = 1.0 if args.inject_slowdown is None else check_factor(args.inject_slowdown)
    except ValueError as exc:
        p.error(f'--inject-slowdown: {exc}')
    slowed = factor > 1.0
    klass = args.cpu_class or cpu_class()
    baselines = load_baselines(args.baselines)
    entry = baselines['classes'].get(klass)
    print(f'bench-check: CPU class {klass} ({machine_line()})', flush=True)
    if slowed:
        print(f'bench-check: SLOWED BUILD, --inject-slowdown {factor:g}: every model call and '
              'training step takes that many times as long', flush=True)
    if entry:
        print(f"bench-check: baseline {args.baselines.name} [{klass}]: {entry.get('machine')}, "
              f"commit {entry.get('commit')}, {entry.get('date')}", flush=True)
    elif not args.write_baseline:
        print(f'bench-check: no baseline for CPU class {klass} in {args.baselines} (classes: '
              f"{', '.join(baselines['classes']) or 'none'}); the figures are shown without "
              'a verdict. Record one on a quiet machine with: act-ros bench check '
              '--write-baseline', flush=True)
    measured: dict[str, float | None] = {}
    errors = []
    with tempfile.TemporaryDirectory(prefix='act_ros_slowed_') as slowed_dir:
        if slowed:  # every Python process of every part, children included
            env = slowed_environment(env, factor, Path(slowed_dir))
        for name in parts:
            start = time.monotonic()
            print(f'bench-check: {name} ...', flush=True)
            figures, error = run_part(name, env)
            measured.update(figures)
            if error:
                errors.append(error)
                print(f'bench-check: {error}', flush=True)
            else:
                print(f'bench-check: {name} done in {time.monotonic() - start:.0f} s',
                      flush=True)
    rows = compare(measured, (entry or {}).get('figures'), parts)
    print('\n' + render(rows) + '\n')
    failed = [r['figure'] for r in rows if r['verdict'].startswith('FAIL')]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps({
            'cpu_class': klass, 'machine': machine_line(),
            'injected_slowdown': f'{factor:g}' if slowed else None,
            'rows': rows, 'measured': measured, 'errors': errors}, indent=2))
    if args.write_baseline:
        if errors or slowed:
            print('bench-check: baseline not written (a part failed, or the build was slowed)')
            return 1
        from act_ros.bench.report import source_commit
        entry = {'machine': machine_line(), 'cores': os.cpu_count(), 'commit': source_commit(),
                 'date': datetime.date.today().isoformat(),
                 'command': f"act-ros bench check --write-baseline --only {','.join(parts)}",
                 'figures': {**(entry or {}).get('figures', {}),
                             **{k: v for k, v in measured.items() if v is not None}}}
        baselines['classes'][klass] = entry
        write_text_atomic(args.baselines, json.dumps(baselines, indent=2) + '\n')
        print(f'bench-check: baseline for {klass} written to {args.baselines}')
        return 0
    if errors or failed:
        print(f"bench-check: FAILED: {', '.join(failed + [e.split(':')[0] for e in errors])}")
        return 1
    if not entry:
        return 2
    print(f'bench-check: passed ({len(rows)} figures, CPU class {klass})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
