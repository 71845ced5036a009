"""``make bench-check`` (act_ros.bench.check) and the figures it reads: the CPU class, the
margins and verdicts, the exit status against a baseline file; missed periods over the
node benchmark's whole window; the fault benchmark's recovery rule; the node
benchmark's defaults (the node's own)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from act_ros.bench import check
from act_ros.core.inference.precision import cpu_class


def test_cpu_class_follows_the_flags_that_pick_the_kernels():
    assert cpu_class({'avx', 'avx2', 'fma'}, 'x86_64') == 'x86-avx2'
    assert cpu_class({'avx2', 'avx512f'}, 'x86_64') == 'x86-avx512'
    assert cpu_class({'avx2', 'avx512f', 'avx512_bf16'}, 'x86_64') == 'x86-avx512-bf16'
    assert cpu_class({'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'}, 'x86_64') == 'x86-amx'
    assert cpu_class({'sse4_2'}, 'x86_64') == 'x86'
    assert cpu_class(set(), 'aarch64') == 'arm64'


def _figure(name):
    return next(f for f in check.FIGURES if f.name == name)


def test_margins_come_from_the_spread_of_the_baseline_runs():
    from act_ros.bench.margins import CAP, MIN_REL, SPREAD_K, derive, verdict

    speedup = _figure('runtime.model_speedup_vs_lerobot')  # higher is better
    margin = derive(speedup, [1.00, 1.02, 0.99, 1.01, 1.00])
    assert margin.checked and margin.spread == pytest.approx(0.02)
    assert margin.allowance == pytest.approx(SPREAD_K * 0.02)
    assert verdict(speedup, 1.0, 0.97, margin) == 'pass'
    assert verdict(speedup, 1.0, 0.95, margin) == 'FAIL'
    assert derive(speedup, [1.0, 1.0, 1.0]).allowance == pytest.approx(MIN_REL)
    # Runs that spread past what the cap allows: a 20 % regression could not be told from
    # noise, so the figure is held to its guard only, and says so.
    first = _figure('node.time_to_first_command_s')
    wide = derive(first, [10.0, 14.0, 9.0])
    assert not wide.checked and 'its guard only' in wide.why
    assert verdict(first, 10.0, 30.0, wide) == 'pass (guard only)'
    assert verdict(first, 10.0, 101.0, wide) == 'FAIL (guard)'
    # A share of a whole (missed periods, % of the window) moves in points of the whole.
    missed = _figure('node.missed_periods_percent')
    points = derive(missed, [1.0, 2.5, 1.5])
    assert points.checked and points.allowance == pytest.approx(3.0)  # 2 x 1.5 points
    assert verdict(missed, 1.5, 4.4, points) == 'pass'
    assert verdict(missed, 1.5, 4.6, points) == 'FAIL'
    # Zeros that must stay zero; a loss difference within float rounding.
    leaked = _figure('faults.children_leaked')
    exact = derive(leaked, [0.0, 0.0, 0.0])
    assert exact.checked and verdict(leaked, 0.0, 1.0, exact) == 'FAIL'
    loss = derive(_figure('training.step1_loss_abs_diff'), [0.0, 0.0, 0.0])
    assert loss.allowance == 1e-5
    # One baseline run (a baseline recorded before runs were kept): the speed-ups get the
    # cap, every other figure its guard.
    assert derive(speedup, [1.0]).allowance == pytest.approx(CAP)
    assert not derive(first, [10.0]).checked
    assert not derive(_figure('runtime.async_tick_p99_over_model'), [0.03]).checked
    assert verdict(_figure('runtime.lerobot_model_ms'), 50.0, 500.0, None) == 'info'
    assert verdict(speedup, 1.2, None, margin) == 'FAIL (not measured)'


def test_every_figure_checked_against_a_committed_baseline_fails_a_20_percent_regression():
    """For every CPU class in docs/benchmarks/baselines.json: each figure its margins
    check passes at its baseline and fails 20 % worse (a share of a whole: 20 points)."""
    from act_ros.bench.margins import verdict

    baselines = check.load_baselines(check.BASELINES)['classes']
    assert baselines
    checked = 0
    for klass, entry in baselines.items():
        margins = check.margins_of(entry)
        for figure in check.FIGURES:
            margin = margins.get(figure.name)
            base = entry['figures'].get(figure.name)
            if not figure.better or margin is None or not margin.checked:
                continue
            checked += 1
            assert verdict(figure, base, base, margin) == 'pass', (klass, figure.name)
            assert verdict(figure, base, figure.regressed(base), margin) == 'FAIL', \
                (klass, figure.name, base, margin)
            if margin.runs > 1:  # stored margins are those the runs give
                assert check.derive(figure, entry['runs'][figure.name]) == margin
    assert checked >= 3 * len(baselines)  # at least the speed-ups of every class


def test_every_checked_figure_states_its_guard_and_kind():
    names = [f.name for f in check.FIGURES]
    assert len(names) == len(set(names))
    for figure in check.FIGURES:
        assert figure.part in check.PARTS and figure.what
        if figure.better:
            assert figure.better in ('higher', 'lower')
            assert (figure.guard_rel is None) != (figure.guard_abs is None), figure.name


def _run_check(monkeypatch, tmp_path, capsys, figures, baseline, *args):
    """act-ros bench check with each part's figures given (the comparison is what is
    tested here; the parts are measured in the report's runs)."""
    calls = []

    def run_part(name, env):
        first = Path(env.get('PYTHONPATH', '').split(os.pathsep)[0] or '.') / 'sitecustomize.py'
        calls.append((name, first.read_text() if first.is_file() else ''))
        return {k: v for k, v in figures.items() if k.startswith(name + '.')}, None

    monkeypatch.setattr(check, 'run_part', run_part)
    monkeypatch.setattr(check, 'machine_line', lambda: 'test machine')
    base_file = tmp_path / 'baselines.json'
    if baseline is not None:  # three runs around each figure: 1 % spread
        runs = {k: [v, v * 1.01, v * 0.99] for k, v in baseline.items()}
        entry = {'figures': baseline, 'runs': runs}
        base_file.write_text(json.dumps({'classes': {'x86-test': entry}}))
    code = check.main(['--baselines', str(base_file), '--cpu-class', 'x86-test',
                       '--json', str(tmp_path / 'check.json'), *args])
    return code, capsys.readouterr().out, calls


GOOD = {'runtime.model_speedup_vs_lerobot': 1.2, 'runtime.async_tick_p99_over_model': 0.01,
        'runtime.lerobot_model_ms': 50.0, 'node.commands_per_period': 1.0,
        'node.missed_periods_percent': 0.5, 'node.inference_over_configure_latency': 1.2,
        'node.time_to_first_command_s': 5.0}


def test_check_passes_within_margins_and_fails_past_one(monkeypatch, tmp_path, capsys):
    baseline = GOOD
    code, out, calls = _run_check(monkeypatch, tmp_path, capsys, GOOD, baseline,
                                  '--only', 'runtime,node')
    assert code == 0, out
    assert [name for name, _ in calls] == ['runtime', 'node']
    header = next(line for line in out.splitlines() if line.startswith('figure'))
    assert header.split() == ['figure', 'baseline', 'spread', 'measured', 'margin', 'verdict',
                              'kind']
    row = next(line for line in out.splitlines() if 'node.inference_over_configure' in line)
    assert 'pass' in row and 'ratio (same run)' in row
    assert ' 1.0% ' in row and '<= 1.24 (+3.0%)' in row  # 2 x 1 % spread < 3 % floor
    # 20 % worse: 1.2 -> 0.96 (a 1.25x slower model call); 1.2 -> 1.44.
    slow = {**GOOD, 'runtime.model_speedup_vs_lerobot': 0.96,
            'node.inference_over_configure_latency': 1.44}
    code, out, calls = _run_check(monkeypatch, tmp_path, capsys, slow, baseline,
                                  '--only', 'runtime,node', '--inject-slowdown', '1.5')
    assert code == 1
    # Every part's processes start slowed, from outside (act_ros.bench.slowdown).
    assert all('install(1.5)' in site for _, site in calls) and 'SLOWED BUILD' in out
    failed = [line.split()[0] for line in out.splitlines() if ' FAIL ' in f' {line} ']
    assert failed == ['runtime.model_speedup_vs_lerobot', 'node.inference_over_configure_latency']
    saved = json.loads((tmp_path / 'check.json').read_text())
    assert saved['injected_slowdown'] == '1.5'
    assert {r['figure']: r['verdict'] for r in saved['rows']}[
        'runtime.model_speedup_vs_lerobot'] == 'FAIL'


def test_check_without_a_baseline_for_the_class_says_so(monkeypatch, tmp_path, capsys):
    code, out, _ = _run_check(monkeypatch, tmp_path, capsys, GOOD, None, '--only', 'runtime')
    assert code == 2 and 'no baseline for CPU class x86-test' in out
    with pytest.raises(SystemExit) as exit_:  # a baseline needs runs to measure a spread
        _run_check(monkeypatch, tmp_path, capsys, GOOD, None, '--only', 'runtime',
                   '--write-baseline', '--repeats', '1')
    assert exit_.value.code == 2 and '--repeats: expected at least 3' in capsys.readouterr().err
    measured = iter([1.2, 1.26, 1.14, 1.2, 1.2])

    def run_part(name, env):  # each run another speed-up: 1.2, 1.26, 1.14
        return {k: (next(measured) if k == 'runtime.model_speedup_vs_lerobot' else v)
                for k, v in GOOD.items() if k.startswith(name + '.')}, None

    monkeypatch.setattr(check, 'run_part', run_part)
    assert check.main(['--baselines', str(tmp_path / 'baselines.json'), '--cpu-class',
                       'x86-test', '--only', 'runtime', '--write-baseline', '--repeats',
                       '3']) == 0
    written = json.loads((tmp_path / 'baselines.json').read_text())['classes']['x86-test']
    assert written['runs']['runtime.model_speedup_vs_lerobot'] == [1.2, 1.26, 1.14]
    assert written['figures']['runtime.model_speedup_vs_lerobot'] == 1.2  # the median
    margin = written['margins']['runtime.model_speedup_vs_lerobot']
    assert margin['checked'] and margin['allowance'] == pytest.approx(0.12)  # 2 x 0.06
    assert {'machine', 'cores', 'commit', 'date', 'command', 'repeats'} <= set(written)
    assert '--repeats 3' in written['command']
    code, out, _ = _run_check(monkeypatch, tmp_path, capsys, GOOD, None, '--only', 'runtime')
    assert code == 0 and 'passed' in out  # the next run compares with what was written


def test_a_part_that_fails_fails_the_check(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(check, 'run_part', lambda name, env: ({}, f'{name}: exit 1\nboom'))
    monkeypatch.setattr(check, 'machine_line', lambda: 'test machine')
    base = tmp_path / 'b.json'
    base.write_text(json.dumps({'classes': {'x86-test': {'figures': GOOD}}}))
    code = check.main(['--baselines', str(base), '--cpu-class', 'x86-test', '--only', 'runtime',
                       '--json', str(tmp_path / 'c.json')])
    out = capsys.readouterr().out
    assert code == 1 and 'FAIL (not measured)' in out and 'runtime: exit 1' in out


# ---- act-ros bench node: missed periods over the whole window -------------------------------

def test_missed_periods_count_the_whole_window():
    from act_ros.bench.node import missed_in_window

    period = 1 / 30
    steady = np.arange(0, 30) * period + 0.01  # 30 commands over a 1 s window
    assert missed_in_window(steady, 0.0, 1.0, period)[0] == 0
    # A node that stalls: nothing, or one command, in a 20 s window (600 periods).
    assert missed_in_window(np.array([]), 0.0, 20.0, period)[0] == 600
    assert missed_in_window(np.array([10.0]), 0.0, 20.0, period)[0] == 599
    # Commands only in the first half, or only in the second: the other half is missed.
    half = np.arange(0, 300) * period
    assert missed_in_window(half, 0.0, 20.0, period)[0] == 300
    assert missed_in_window(half + 10.0, 0.0, 20.0, period)[0] == 300
    # A gap of three periods inside the window: two missed (as between commands before).
    gap = np.concatenate([np.arange(0, 10), np.arange(12, 30)]) * period
    assert missed_in_window(gap, 0.0, 30 * period, period)[0] == 2


def test_bench_node_summarizes_a_stalled_node_as_missed_periods():
    from act_ros.bench.node import summarize
    from act_ros.ros.harness import ReceivedCommand

    class OneCommand:  # one command in a 30 s window, as the committed 480x640 run had
        commands = [ReceivedCommand(12.0, np.zeros(6), (), 1e9 + 12.0)]

    result = summarize(OneCommand, 0.0, 30.0, 30.0, None)
    assert result['commands'] == 1 and result['periods_in_window'] == 900
    assert result['missed_periods'] == 899 and result['missed_periods_at_callback'] == 899

    class Nothing:
        commands = []

    assert summarize(Nothing, 0.0, 30.0, 30.0, None)['missed_periods'] == 900


def test_bench_node_runs_the_nodes_own_defaults():
    import yaml

    from act_ros.bench.node import node_parameters, parse_args
    from act_ros.core.paths import config_path

    node = yaml.safe_load(config_path('act.yaml').read_text())['/**/act_node']['ros__parameters']
    args = parse_args([])
    assert (args.execution, args.mode, args.backend, args.executor, args.torch_threads,
            args.precision, args.inference_nice) == (None,) * 7  # the node's parameters apply
    params = node_parameters(args)
    assert params['execution'] == node['execution'] == 'process'
    assert params['precision'] == node['precision'] == 'auto'
    assert params['backend'] == node['backend'] == 'auto'
    assert params == {k: node[k] for k in ('mode', 'execution', 'torch_threads', 'backend',
                                            'executor', 'precision', 'inference_nice')}
    assert node_parameters(parse_args(['--execution', 'async']))['execution'] == 'async'


def test_bench_node_compares_precisions_each_round_with_its_own_parameter(capsys):
    from act_ros.bench.node import _given_node_options, compared, parse_args, variants

    one = parse_args(['--precision', 'bf16'])
    assert compared(one) == ''
    assert variants(one) == [('on', {'visualization.enabled': 'true'})]
    assert _given_node_options(one) == ['-p', 'precision:=bf16']  # a plain node option
    both = parse_args(['--precision', 'fp32,bf16', '--visualization', 'off', '--repeats', '2'])
    assert compared(both) == 'precision'
    assert variants(both) == [
        ('fp32', {'visualization.enabled': 'false', 'precision': 'fp32'}),
        ('bf16', {'visualization.enabled': 'false', 'precision': 'bf16'})]
    assert _given_node_options(both) == []  # set per round, not on the shared command line
    for bad, message in ((['--precision', 'fp32,int4'], 'expected distinct values'),
                         (['--precision', 'fp32,fp32'], 'expected distinct values'),
                         (['--precision', 'fp32,bf16', '--visualization', 'compare'],
                          'one thing at a time'),
                         (['--precision', 'fp32,bf16', '--inference-nice', '0,10'],
                          'one thing at a time'),
                         (['--inference-nice', '0,20'], 'distinct integers 0-19'),
                         (['--inference-nice', '5,5'], 'distinct integers 0-19')):
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert message in capsys.readouterr().err


def test_bench_node_compares_inference_niceness_values():
    from act_ros.bench.node import _given_node_options, compared, parse_args, variants

    one = parse_args(['--inference-nice', '10'])
    assert compared(one) == '' and _given_node_options(one) == ['-p', 'inference_nice:=10']
    both = parse_args(['--inference-nice', '0,10', '--visualization', 'off'])
    assert compared(both) == 'inference_nice' and _given_node_options(both) == []
    assert variants(both) == [
        ('nice_0', {'visualization.enabled': 'false', 'inference_nice': '0'}),
        ('nice_10', {'visualization.enabled': 'false', 'inference_nice': '10'})]


def test_bench_node_compares_modes_and_reports_their_seams(capsys):
    from act_ros.bench.node import SEAM_FIGURES, compared, parse_args, summarize, variants

    both = parse_args(['--mode', 'chunk,blend', '--visualization', 'off'])
    assert compared(both) == 'mode'
    assert variants(both) == [('chunk', {'visualization.enabled': 'false', 'mode': 'chunk'}),
                              ('blend', {'visualization.enabled': 'false', 'mode': 'blend'})]
    for bad in (['--mode', 'chunk,fast'], ['--mode', 'blend,blend'],
                ['--mode', 'chunk,blend', '--precision', 'fp32,bf16']):
        with pytest.raises(SystemExit):
            parse_args(bad)
        capsys.readouterr()

    class Nothing:
        commands = []
    diag = (0, 'ok', {'seams.handovers': '12', 'seams.over_within_p99': '1',
                      'seams.velocity_jump_median': '0.05', 'seams.velocity_jump_max': 'n/a',
                      'seams.within_chunk_velocity_step_p99': '0.2'})
    result = summarize(Nothing, 0.0, 30.0, 30.0, diag)
    assert [result[f'seams_{key}'] for key in SEAM_FIGURES] == [12.0, 1.0, 0.05, None, 0.2]


def test_bench_node_prints_one_column_per_setting(capsys):
    from act_ros.bench.node import report_side_by_side

    report_side_by_side({'fp32': {'missed_periods': 40, 'precision': 'fp32'},
                         'bf16': {'missed_periods': 3, 'precision': 'bf16'}},
                        {'cpu_count': 2}, 'precision')
    lines = capsys.readouterr().out.splitlines()
    assert 'precision fp32 vs bf16' in lines[1]
    assert lines[3].split() == ['missed_periods', '40', '3']
    assert next(line for line in lines if 'bf16 - fp32' in line).split()[-1] == '-37'


def test_result_files_name_the_command_without_the_output_path():
    from act_ros.bench.report import result_provenance

    entry = result_provenance('act-ros bench node',
                              ['--precision', 'fp32,bf16', '--json', '/tmp/x/out.json'],
                              output_path='/tmp/x/out.json')
    assert entry['command'] == 'act-ros bench node --precision fp32,bf16'
    assert entry['commit'] and 'CPU class' in entry['machine']
    assert result_provenance('act-ros bench faults', ['--json=/a/b.json', '--rounds', '1'],
                             output_path='/a/b.json')['command'] == 'act-ros bench faults --rounds 1'
    assert result_provenance('act-ros bench record',
                             ['store', '--workdir', '/w', '--output', '/o.json', '--workdir=/v'],
                             output_path='/o.json', output_option='--output',
                             omit=('--workdir',))['command'] == 'act-ros bench record store'


# ---- act-ros bench faults: what recovered means ----------------------------------------------

def test_recovery_is_the_first_of_five_commands_at_the_rate():
    from act_ros.bench.faults import first_steady

    period = 1 / 30
    assert first_steady([], period) is None
    assert first_steady(np.arange(4) * period, period) is None  # too few
    steady = 1.0 + np.arange(8) * period
    assert first_steady(steady, period) == pytest.approx(1.0)
    # Two stray commands, a silence, then the stream again: recovered at its start.
    times = np.concatenate([[0.1, 0.2], 0.5 + np.arange(6) * period])
    assert first_steady(times, period) == pytest.approx(0.5)
    jitter = 0.5 + np.array([0, 1, 2, 3.4, 4.4, 5.4, 6.4, 7.4]) * period  # one 1.4-period gap
    assert first_steady(jitter, period) == pytest.approx(0.5)


def test_a_slowed_call_takes_the_factor_it_is_given():
    import time

    from act_ros.bench import slowdown

    def work():
        time.sleep(0.02)
        return 'result'

    start = time.perf_counter()
    assert slowdown.slowed(work, 3.0)() == 'result'  # the same result
    assert time.perf_counter() - start >= 3 * 0.02  # 20 ms of work, 40 ms more
    assert slowdown.slowdown_of(slowdown.slowed(work, 3.0)) == 3.0
    assert slowdown.slowdown_of(work) is None
    for bad in (0.5, float('nan'), float('inf')):
        with pytest.raises(ValueError, match='finite number >= 1'):
            slowdown.slowed(work, bad)


_PROBE = """
import sys
from act_ros.bench.slowdown import slowdown_of
print('torch imported at start-up:', 'torch' in sys.modules)
from act_ros.core.inference.predictor import ChunkPredictor
from act_ros.training.loop import Trainer
print('factors:', slowdown_of(ChunkPredictor.normalized_chunk),
      slowdown_of(Trainer.train_step))
"""


@pytest.mark.parametrize('factor', [None, 1.5])
def test_the_slowdown_reaches_a_fresh_interpreter_only_from_outside(factor, tmp_path):
    """The runtime and the trainer carry no hook: a plain interpreter runs them unslowed;
    one started with bench-check's environment finds the model call and the training step
    slowed by the factor, wrapped as their modules are imported (nothing imported early),
    and says so on stderr."""
    import subprocess
    import sys

    from act_ros.bench import slowdown

    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, 'PYTHONPATH': root}
    if factor is not None:
        env = slowdown.slowed_environment(env, factor, tmp_path / 'slowed')
    proc = subprocess.run([sys.executable, '-c', _PROBE], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'torch imported at start-up: False' in proc.stdout
    assert f'factors: {factor} {factor}' in proc.stdout, proc.stdout
    announced = 'a deliberately slowed build' in proc.stderr
    assert announced == (factor is not None), proc.stderr[-2000:]
