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


def test_cpu_class_follows_the_flags_that_pick_the_kernels():
    assert check.cpu_class({'avx', 'avx2', 'fma'}, 'x86_64') == 'x86-avx2'
    assert check.cpu_class({'avx2', 'avx512f'}, 'x86_64') == 'x86-avx512'
    assert check.cpu_class({'avx2', 'avx512f', 'avx512_bf16'}, 'x86_64') == 'x86-avx512-bf16'
    assert check.cpu_class({'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'}, 'x86_64') == 'x86-amx'
    assert check.cpu_class({'sse4_2'}, 'x86_64') == 'x86'
    assert check.cpu_class(set(), 'aarch64') == 'arm64'


def _figure(name):
    return next(f for f in check.FIGURES if f.name == name)


def test_a_figure_fails_just_past_its_margin_in_its_direction():
    speedup = _figure('runtime.model_speedup_vs_lerobot')  # higher is better, -20 %
    assert speedup.limit(1.2) == pytest.approx(0.96)
    assert speedup.verdict(1.2, 0.97) == 'pass' and speedup.verdict(1.2, 5.0) == 'pass'
    assert speedup.verdict(1.2, 0.95) == 'FAIL'
    assert speedup.margin_text(1.2) == '>= 0.96 (baseline -20%)'
    missed = _figure('node.missed_periods_percent')  # lower is better, +70 points
    assert missed.verdict(1.0, 71.0) == 'pass' and missed.verdict(1.0, 71.1) == 'FAIL'
    # A stalled node (the committed 480x640 run: 1 command in 30 s) fails both node figures.
    assert missed.verdict(13.0, 99.9) == 'FAIL'
    assert _figure('node.commands_per_period').verdict(0.88, 1 / 900) == 'FAIL'
    leaked = _figure('faults.children_leaked')  # no allowance at all
    assert leaked.verdict(0.0, 0.0) == 'pass' and leaked.verdict(0.0, 1.0) == 'FAIL'
    assert speedup.verdict(None, 1.0) == 'no baseline'
    assert speedup.verdict(1.2, None) == 'FAIL (not measured)'
    assert _figure('runtime.lerobot_model_ms').verdict(50.0, 500.0) == 'info'


def test_every_checked_figure_states_its_margin_and_kind():
    names = [f.name for f in check.FIGURES]
    assert len(names) == len(set(names))
    for figure in check.FIGURES:
        assert figure.part in check.PARTS and figure.what
        if figure.better:
            assert figure.better in ('higher', 'lower')
            assert (figure.rel is None) != (figure.abs is None), figure.name


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
    if baseline is not None:
        base_file.write_text(json.dumps({'classes': {'x86-test': {'figures': baseline}}}))
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
    assert header.split() == ['figure', 'baseline', 'measured', 'margin', 'verdict', 'kind']
    row = next(line for line in out.splitlines() if 'node.inference_over_configure' in line)
    assert 'pass' in row and 'ratio (same run)' in row
    slow = {**GOOD, 'runtime.model_speedup_vs_lerobot': 0.8,
            'node.inference_over_configure_latency': 2.6}
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
    code, out, _ = _run_check(monkeypatch, tmp_path, capsys, GOOD, None, '--only', 'runtime',
                              '--write-baseline')
    assert code == 0
    written = json.loads((tmp_path / 'baselines.json').read_text())['classes']['x86-test']
    assert written['figures']['runtime.model_speedup_vs_lerobot'] == 1.2
    assert {'machine', 'cores', 'commit', 'date', 'command'} <= set(written)
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
    assert result_provenance('python -m act_ros.bench.record',
                             ['store', '--workdir', '/w', '--output', '/o.json', '--workdir=/v'],
                             output_path='/o.json', output_option='--output',
                             omit=('--workdir',))['command'] == 'python -m act_ros.bench.record store'


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
from act_ros.core.inference import ChunkPredictor
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
