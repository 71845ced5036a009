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
threads that wait for each other make every time erratic). Every figure the check
compares fails a 20 % regression: its margin comes from the spread of the baseline's
repeated runs (``--write-baseline --repeats N`` stores them, their median and the
margins beside each other) and is at most 15 %; a figure whose runs spread too wide for
that is compared only against its guard, a wide bound that catches a node that stalls or
does not start, and the check says which (:mod:`act_ros.bench.margins`).

``--inject-slowdown F`` runs the same benchmarks on a deliberately slowed build
(:mod:`act_ros.bench.slowdown`, put on every benchmark process from outside): every model
call and training step takes F times as long. At F = 1.25 (a 20 % lower speed-up) the
check must fail.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from act_ros.bench.margins import (
    CAP,
    REGRESSION,
    Figure,
    Margin,
    derive,
    from_json,
    margin_text,
    num,
    verdict,
)
from act_ros.bench.slowdown import check_factor, slowed_environment
from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.inference.precision import cpu_class

PARTS = ('runtime', 'training', 'node', 'faults')
BASELINE_REPEATS = 5  # runs of every part behind a baseline (--write-baseline --repeats)
PART_TIMEOUT_S = 420.0
BASELINES = Path(__file__).resolve().parents[2] / 'docs' / 'benchmarks' / 'baselines.json'
# The model every part runs: LeRobot ACT at the 'cpu' size (15.6 M parameters) on 96x128
# inputs, fast enough for 30 Hz on 2 cores, so the node's figures are about the node.
PRESET, MODEL_SIZE = 'cpu', (96, 128)
CAMERAS = (240, 320)  # published to the node; the runtime resizes them to MODEL_SIZE


FIGURES = (
    Figure('runtime.model_speedup_vs_lerobot', 'runtime', 'x', 'higher',
           "LeRobot predict_action_chunk time / act_ros model call time (median of "
           'per-call ratios, interleaved)', guard_rel=0.2, ratio=True, speed=True),
    Figure('runtime.async_tick_p99_over_model', 'runtime', 'x', 'lower',
           'p99 tick of the async chunk loop at 30 Hz / LeRobot model time (a tick that '
           'waits for the model is about 1)', guard_abs=0.15, ratio=True),
    Figure('runtime.lerobot_model_ms', 'runtime', 'ms', '',
           'LeRobot predict_action_chunk, median (this machine now)'),
    Figure('training.step_speedup_vs_lerobot', 'training', 'x', 'higher',
           "LeRobot update_policy time / the trainer's step time (median of per-step "
           'ratios, interleaved)', guard_rel=0.2, ratio=True, speed=True),
    Figure('training.frozen_backbone_speedup_vs_lerobot', 'training', 'x', 'higher',
           'the same with the backbone frozen and its output cached', guard_rel=0.25, ratio=True,
           speed=True),
    Figure('training.step1_loss_abs_diff', 'training', '', 'lower',
           'first-step loss, trainer vs LeRobot (same weights, batch, seed)', guard_abs=1e-5,
           floor=1e-5),
    Figure('training.lerobot_step_ms', 'training', 'ms', '',
           'LeRobot update_policy, median (this machine now)'),
    Figure('node.commands_per_period', 'node', '', 'higher',
           'commands received / control periods in the window (a stalled node: about 0)',
           guard_rel=0.75),
    Figure('node.missed_periods_percent', 'node', '%', 'lower',
           'missed control periods over the whole window, % of its periods (a stalled node: '
           'about 100)', guard_abs=70.0, whole=100.0),
    Figure('node.inference_over_configure_latency', 'node', 'x', 'lower',
           "the node's inference time per chunk under camera load (mean) / the model "
           'latency its child measured at configure (median)', guard_rel=1.0, ratio=True),
    Figure('node.time_to_first_command_s', 'node', 's', 'lower',
           "from the node's process start to its first command at the harness (absolute; "
           'imports and model load)', guard_rel=9.0),
    Figure('faults.recovered_fraction', 'faults', '', 'higher',
           'faults recovered / faults injected', guard_abs=0.0),
    Figure('faults.unsafe_commands', 'faults', '', 'lower',
           'non-finite commands + commands from stale inputs + releases outside the radius',
           guard_abs=0.0),
    Figure('faults.children_leaked', 'faults', '', 'lower',
           'inference children left by the node (replaced ones, and after its exit)',
           guard_abs=0.0),
    Figure('faults.silencing_recovery_median_s', 'faults', 's', 'lower',
           'inputs stale or malformed: fault end to 5 commands in a row at the rate, '
           'median (absolute: set by the rate and a new chunk)', guard_abs=0.5),
    Figure('faults.ride_through_recovery_median_s', 'faults', 's', 'lower',
           'faults the node rides through: fault end to 5 commands in a row at the rate, '
           'median (absolute: about a period)', guard_abs=0.3),
    Figure('faults.child_restart_max_s', 'faults', 's', 'lower',
           'killed or hung inference child: signal to commands at the rate again '
           '(absolute: a fresh interpreter importing torch)', guard_rel=1.0),
    Figure('faults.exit_after_signal_s', 'faults', 's', 'lower',
           'SIGTERM to the node until it and its child are gone (absolute)', guard_rel=2.5),
)


# -- the machine --------------------------------------------------------------------------
def machine_line() -> str:
    from act_ros.bench.report import machine_description
    return machine_description()


# -- the parts (each runs in a fresh process: python -m act_ros.bench.check --part NAME) ---
def part_runtime(work: Path, *, iters: int = 15, loop_s: float = 6.0) -> dict[str, float]:
    import numpy as np
    import torch
    from lerobot.policies.act.modeling_act import ACTPolicy

    from act_ros.bench.runtime import control_loop, lerobot_tensors, sample_observations
    from act_ros.core.contract import load_contract
    from act_ros.core.inference.checkpoint import create_checkpoint, load_checkpoint
    from act_ros.core.inference.predictor import ChunkPredictor
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    torch.set_num_threads(1)
    device = torch.device('cpu')
    contract = load_contract()
    path = create_checkpoint(work / 'ckpt', preset=PRESET, image_size=MODEL_SIZE, seed=0)
    ckpt = load_checkpoint(path, contract=contract, device='cpu')
    ours = ChunkPredictor(ckpt, contract, device)
    lerobot = ACTPolicy(ckpt.config).to(device).eval()
    lerobot.load_state_dict(ckpt.policy.state_dict())
    observations = sample_observations(contract, CAMERAS, max(iters, 30))
    batches = [ckpt.preprocessor(lerobot_tensors(o, contract, ckpt.image_shapes))
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
        durations, _ = control_loop(rt.act, observations, loop_s, contract.fps)
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
def margins_of(entry: dict[str, Any] | None) -> dict[str, Margin]:
    """Each figure's margin for a baseline entry: the stored ones, else derived from its
    runs (one run for an entry recorded before runs were kept)."""
    entry = entry or {}
    stored = entry.get('margins') or {}
    runs = entry.get('runs') or {}
    out = {}
    for figure in FIGURES:
        if figure.name in stored:
            out[figure.name] = from_json(stored[figure.name])
        elif figure.name in runs or figure.name in entry.get('figures', {}):
            out[figure.name] = derive(figure, runs.get(figure.name)
                                      or [entry['figures'][figure.name]])
    return out


def compare(measured: dict[str, float | None], entry: dict[str, Any] | None,
            parts: list[str]) -> list[dict[str, Any]]:
    """One row per figure of the parts run: baseline, its runs' spread, measured, margin,
    verdict."""
    rows = []
    baseline = (entry or {}).get('figures') or {}
    margins = margins_of(entry)
    for figure in FIGURES:
        if figure.part not in parts:
            continue
        base = baseline.get(figure.name)
        value = measured.get(figure.name)
        margin = margins.get(figure.name)
        if not figure.better:
            kind = 'shown only'
        elif margin is not None and not margin.checked:
            kind = 'guard only'
        else:
            kind = 'ratio (same run)' if figure.ratio else 'absolute'
        rows.append({'figure': figure.name, 'unit': figure.unit, 'baseline': base,
                     'spread': None if margin is None else margin.spread,
                     'runs': None if margin is None else margin.runs,
                     'measured': value, 'margin': margin_text(figure, base, margin),
                     'verdict': verdict(figure, base, value, margin), 'kind': kind,
                     'why': '' if margin is None else margin.why})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    headers = ('figure', 'baseline', 'spread', 'measured', 'margin', 'verdict', 'kind')
    table = [headers] + [(r['figure'] + (f" ({r['unit']})" if r['unit'] else ''),
                          num(r['baseline']),
                          '-' if r['spread'] is None else f"{r['spread']:.1%}",
                          num(r['measured']), r['margin'], r['verdict'],
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
                   help='record the figures as the baseline of this CPU class: the median of '
                   '--repeats runs, the runs and the margins their spread gives, side by side')
    p.add_argument('--repeats', type=int, default=None, metavar='N',
                   help='run every part N times and compare the medians (default 1; with '
                   f'--write-baseline at least 3, default {BASELINE_REPEATS}: the margins come '
                   'from their spread)')
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
    repeats = args.repeats if args.repeats is not None else (
        BASELINE_REPEATS if args.write_baseline else 1)
    if repeats < 1 or (args.write_baseline and repeats < 3):
        p.error(f'--repeats: expected at least {3 if args.write_baseline else 1} (a baseline '
                f'needs runs to measure its spread), got {repeats}')
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
    runs: dict[str, list[float]] = {}
    errors = []
    with tempfile.TemporaryDirectory(prefix='act_ros_slowed_') as slowed_dir:
        if slowed:  # every Python process of every part, children included
            env = slowed_environment(env, factor, Path(slowed_dir))
        for repeat in range(repeats):
            for name in parts:
                start = time.monotonic()
                label = f'{name} (run {repeat + 1} of {repeats})' if repeats > 1 else name
                print(f'bench-check: {label} ...', flush=True)
                figures, error = run_part(name, env)
                for key, value in figures.items():
                    if value is not None:
                        runs.setdefault(key, []).append(float(value))
                if error:
                    errors.append(error)
                    print(f'bench-check: {error}', flush=True)
                else:
                    print(f'bench-check: {label} done in {time.monotonic() - start:.0f} s',
                          flush=True)
    measured: dict[str, float | None] = {k: statistics.median(v) for k, v in runs.items()}
    if args.write_baseline:
        if errors or slowed:
            print('bench-check: baseline not written (a part failed, or the build was slowed)')
            return 1
        entry = baseline_entry(entry, runs, parts, repeats)
        baselines['classes'][klass] = entry
        baselines['provenance'] = baselines_provenance(baselines['classes'])
        write_text_atomic(args.baselines, json.dumps(baselines, indent=2) + '\n')
        print('\n' + render(compare(measured, entry, parts)) + '\n')
        print(f'bench-check: baseline for {klass} written to {args.baselines}: the median of '
              f'{repeats} runs, with the runs and the margins their spread gives')
        return 0
    rows = compare(measured, entry, parts)
    print('\n' + render(rows) + '\n')
    for row in rows:
        if row['kind'] == 'guard only' and row['why']:
            print(f"bench-check: {row['figure']}: {row['why']}")
    failed = [r['figure'] for r in rows if r['verdict'].startswith('FAIL')]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        from act_ros.provenance import result_provenance
        write_text_atomic(args.json, json.dumps({
            'provenance': result_provenance('act-ros bench check', sys.argv[1:] if argv is None
                                            else argv, output_path=args.json),
            'cpu_class': klass, 'machine': machine_line(),
            'injected_slowdown': f'{factor:g}' if slowed else None,
            'baseline_commit': (entry or {}).get('commit'),
            'rows': rows, 'measured': measured, 'runs': runs, 'errors': errors}, indent=2))
    if errors or failed:
        print(f"bench-check: FAILED: {', '.join(failed + [e.split(':')[0] for e in errors])}")
        return 1
    if not entry:
        return 2
    checked = sum(r['kind'] in ('ratio (same run)', 'absolute') for r in rows)
    print(f'bench-check: passed ({len(rows)} figures, {checked} checked against a 20 % '
          f'regression, CPU class {klass})')
    return 0


def baselines_provenance(classes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The baselines file's provenance: each CPU class's entry is a run of its own."""
    runs = {}
    for klass, entry in classes.items():
        run = {key: str(entry.get(key, '')) for key in ('command', 'commit', 'machine')}
        for key in ('local_changes', 'note'):
            if entry.get(key):
                run[key] = entry[key]
        runs[klass] = run
    return {'command': 'act-ros bench check --write-baseline, once per CPU class (runs)',
            'commit': 'per CPU class (runs)', 'machine': 'per CPU class (runs)', 'runs': runs}


def baseline_entry(previous: dict[str, Any] | None, runs: dict[str, list[float]],
                   parts: list[str], repeats: int) -> dict[str, Any]:
    """The baseline of a CPU class: each figure the median of its runs, the runs, and the
    margins their spread gives (:func:`act_ros.bench.margins.derive`); the figures of parts
    not run this time are kept from ``previous``."""
    from act_ros.bench.report import source_commit
    from act_ros.provenance import local_changes

    previous = previous or {}
    ran = {f.name for f in FIGURES if f.part in parts} | {
        k for k in runs if k.split('.', 1)[0] in parts}
    keep = {k: v for k, v in previous.get('figures', {}).items() if k not in ran}
    keep_runs = {k: v for k, v in (previous.get('runs') or {}).items() if k not in ran}
    keep_margins = {k: v for k, v in (previous.get('margins') or {}).items() if k not in ran}
    figures = {**keep, **{k: statistics.median(v) for k, v in runs.items()}}
    all_runs = {**keep_runs, **runs}
    margins = {**keep_margins, **{f.name: derive(f, all_runs[f.name]).to_json()
                                  for f in FIGURES if f.better and f.name in runs}}
    commit = source_commit()
    entry = {'machine': machine_line(), 'cores': os.cpu_count(), 'commit': commit,
             'date': datetime.date.today().isoformat(),
             'command': f"act-ros bench check --write-baseline --repeats {repeats} --only "
                        f"{','.join(parts)}",
             'repeats': {part: repeats for part in parts}}
    if 'local changes' in commit:
        entry['local_changes'] = ', '.join(local_changes())
    if keep:
        entry['repeats'] = {**previous.get('repeats', {}), **entry['repeats']}
        entry['kept_from'] = previous.get('commit')
    entry.update({'figures': figures, 'margins': margins, 'runs': all_runs,
                  'regression': REGRESSION, 'cap': CAP})
    return entry


if __name__ == '__main__':
    sys.exit(main())
