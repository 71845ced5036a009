"""Benchmarks ``compile`` and ``training`` and the combined ``all`` report.

The end-to-end runs use the tiny model at 32x32 with two iterations. The compile benchmark
runs with backend ``aot_eager`` (dynamo capture and AOTAutograd, eager kernels): it
exercises every part of the benchmark in seconds, where inductor's code generation takes
minutes on a 2-core CPU (inductor itself is covered by test_compile.py). Eager kernels
make the expected differences exactly zero, which checks that both arms really see the
same weights, batches and seeds.
"""

import json
import math
from pathlib import Path

import pytest
import torch

from act_ros.bench import __main__ as bench_main
from act_ros.bench import compile as compile_bench

TINY = ['--device', 'cpu', '--model-preset', 'tiny', '--image-size', '32x32', '--batch-size', '2',
        '--iters', '2', '--torch-threads', '1']


def _table(report: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the (single) markdown table in ``report``."""
    lines = [line for line in report.splitlines() if line.startswith('|')]
    split = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines]
    return split[0], split[2:]


def _number(cell: str) -> float:
    return float(cell.replace('!', '').rstrip('x').strip())


@pytest.mark.slow
def test_compile_benchmark_table(tmp_path):
    out = tmp_path / 'compile.md'
    torch._dynamo.reset()
    # One row (the matrix is checked without compiling below): dropout off, the path with
    # the most to get right (dropout disabled in both arms, eager RNG for the VAE sample).
    rc = compile_bench.main([*TINY, '--backend', 'aot_eager', '--fullgraph', '--disable-dropout',
                             '--output', str(out)])
    assert rc == 0
    report = out.read_text()
    header, rows = _table(report)
    assert header == list(compile_bench.COLUMNS)
    assert [row[0] for row in rows] == ['dropout off, matmul highest, cuDNN TF32 n/a']
    assert 'cuDNN TF32 does not apply' in report and report.startswith('# act_ros compile')
    for row in rows:
        assert 'FAIL' not in ' '.join(row)
        values = [_number(c) for cell in row[1:-1] for c in cell.split(' / ')]
        assert len(values) == len(row[1:-1]) + 2, row  # two cells hold a pair 'a / b'
        assert all(math.isfinite(v) for v in values), row
        compile_s = [float(x) for x in row[-1].split('+')]
        assert all(math.isfinite(s) and s >= 0 for s in compile_s)
        # Eager kernels on both sides: same weights, batches and seeds give equal numbers.
        assert '!' not in ' '.join(row)
        assert _number(row[1]) == 0.0 and max(_number(c) for c in row[2].split(' / ')) <= 1e-5
        assert _number(row[9]) <= 1e-5
        assert int(row[11]) == 0  # graph breaks


@pytest.mark.slow
def test_compile_benchmark_fails_on_a_graph_break(tmp_path, capsys):
    out = tmp_path / 'compile.md'
    torch._dynamo.reset()
    rc = compile_bench.main([*TINY, '--backend', 'aot_eager', '--fullgraph',
                             '--inject-graph-break', '--output', str(out)])
    assert rc == 1
    report = out.read_text()
    _, rows = _table(report)
    assert len(rows) == 1 and rows[0][1].startswith('FAIL: graph break (Unsupported')
    assert 'FAILED to compile' in report
    assert 'FAIL: graph break' in capsys.readouterr().err


def test_graph_breaks_are_counted_without_fullgraph_and_raise_with_it():
    """The same genuine break as --inject-graph-break, on a small network."""
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x), None

    net = Net()
    compile_bench.add_graph_break(net)
    for fullgraph in (False, True):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        config = compile_bench.CompileBenchConfig(backend='aot_eager', fullgraph=fullgraph)
        compiled = compile_bench.compile_callable(lambda x: net(x)[0] * 2, config, freeze=False)
        if fullgraph:
            with pytest.raises(torch._dynamo.exc.Unsupported):
                compiled(torch.randn(2, 4))
        else:
            x = torch.randn(2, 4)
            assert torch.allclose(compiled(x), net(x)[0] * 2)
            assert compile_bench.graph_breaks() >= 1


def test_settings_matrix_follows_the_device():
    cpu = compile_bench.settings_for(torch.device('cpu'), matrix=True, dropout=True,
                                     matmul_precision='highest', cudnn_tf32=True)
    assert [(s.dropout, s.matmul_precision, s.cudnn_tf32) for s in cpu] == [
        (True, 'highest', None), (False, 'highest', None)]
    cuda = compile_bench.settings_for(torch.device('cuda'), matrix=True, dropout=True,
                                      matmul_precision='highest', cudnn_tf32=True)
    assert len(cuda) == 2 * 3 * 2 and len(set(cuda)) == 12
    single = compile_bench.settings_for(torch.device('cuda'), matrix=False, dropout=False,
                                        matmul_precision='medium', cudnn_tf32=False)
    assert single == [compile_bench.Setting(False, 'medium', False)]
    with pytest.raises(ValueError, match='matmul precision'):
        compile_bench.Setting(matmul_precision='low')
    with pytest.raises(ValueError, match='inductor mode'):
        compile_bench.CompileBenchConfig(backend='aot_eager', compile_mode='max-autotune-no-cudagraphs')


def test_numeric_settings_are_restored():
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
              torch._inductor.config.fallback_random)
    with compile_bench.numeric_settings(compile_bench.Setting(False, 'medium', not before[1])):
        assert torch.get_float32_matmul_precision() == 'medium'
        assert torch._inductor.config.fallback_random is True
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
            torch._inductor.config.fallback_random) == before


@pytest.mark.slow
def test_training_benchmark_table(tmp_path):
    pytest.importorskip('accelerate', reason="LeRobot's update_policy needs accelerate ([bench])")
    from act_ros.bench import training

    out = tmp_path / 'training.md'
    rc = training.main([*TINY, '--warmup', '1', '--no-header', '--output', str(out),
                        '--json', str(tmp_path / 'training.json')])
    assert rc == 0
    report = out.read_text()
    assert report.startswith('## Training throughput') and 'CPU:' not in report
    header, rows = _table(report)
    assert header == list(training.COLUMNS)
    assert [row[0] for row in rows] == [training.LEROBOT, 'act_ros train_step (eager)',
                                        training.EARLY, training.FROZEN]
    for row in rows:
        assert all(math.isfinite(_number(cell)) and _number(cell) > 0 for cell in row[1:5])
    # Same weights, batch and seed, unit gripper weight: LeRobot's loss exactly, also for the
    # cached steps (the frozen stages have not moved at step 1).
    for row in rows[1:]:
        assert _number(row[5]) <= 1e-5 and '!' not in row[5], row
    assert 'ms per frame' in report
    # The JSON holds the same figures as the table, with where they came from, in the form
    # `act-ros report` renders.
    data = json.loads((tmp_path / 'training.json').read_text())
    assert [r['step'] for r in data['rows']] == [row[0] for row in rows]
    for r, row in zip(data['rows'], rows):
        assert r['ms_per_step'] == pytest.approx(_number(row[1]), abs=0.051)
    assert data['rows'][0]['speedup_vs_lerobot'] == 1.0
    assert str(tmp_path) not in data['provenance']['command']
    from act_ros import report as report_module
    (tmp_path / 'docs/results/training').mkdir(parents=True)
    part = report_module.definitions()['training_step']
    (tmp_path / 'training.json').rename(tmp_path / part['file'])
    table = report_module.records(report_module.Sources(tmp_path), part['file'], part['rows'],
                                  part['columns'])
    assert training.FROZEN in table


def test_all_passes_each_benchmark_its_options_and_states_the_machine_once(tmp_path):
    assert {'runtime', 'node', 'compile', 'training'} <= set(bench_main.BENCHMARKS)
    part = tmp_path / 'compile.md'
    compile_args = bench_main.benchmark_args('compile', part, device='cpu', size='cpu')
    for flag in ('--fullgraph', '--matrix', '--no-header', '--model-preset', '--image-size'):
        assert flag in compile_args
    assert compile_args[compile_args.index('--output') + 1] == str(part)
    training_args = bench_main.benchmark_args('training', tmp_path / 'training.md', device='cpu',
                                              size='cpu')
    assert '--no-header' in training_args and 'cpu' in training_args
    node_args = bench_main.benchmark_args('node', tmp_path / 'node.md', device='cpu', size='cpu')
    assert node_args[node_args.index('--json') + 1] == str(tmp_path / 'node.json')
    runtime_args = bench_main.benchmark_args('runtime', tmp_path / 'runtime.md', device='cpu',
                                             size='cpu')
    assert runtime_args[runtime_args.index('--output') + 1] == str(tmp_path / 'runtime.md')

    from act_ros.bench.report import machine_description
    machine = machine_description()
    header = bench_main.report_header()
    assert machine in header and 'torch ' in header and 'lerobot ' in header
    runtime_part = (f'# act_ros runtime benchmark\n\n{machine}; device cpu; cameras 96x128\n\n'
                    '## Model time per chunk\n\n| a |\n|---|\n| 1 |\n')
    section = bench_main.as_section('runtime', runtime_part, machine)
    assert machine not in section
    assert section.startswith('## act_ros runtime benchmark') and '### Model time' in section
    assert 'device cpu; cameras 96x128' in section
    assert bench_main.as_section('x', 'plain text', machine) == '## x\n\nplain text'
    node_json = Path(tmp_path / 'node.json')
    node_json.write_text('{"command_rate_hz": 29.9, "missed_periods": 0}')
    assert '| command_rate_hz | 29.90 |' in bench_main.node_section(node_json)
