"""``act-ros bench <name>`` / ``python -m act_ros.bench <name>``: run one benchmark.

``all`` runs every benchmark in turn, each in a fresh process with the settings it needs
(``compile`` and ``training`` CPU-sized on a CPU: the ``cpu`` model at 96x128; full size
elsewhere or with ``--size full``), and writes one markdown report (``--output``, default
``outputs/bench/report.md``): the machine description and versions once, then every
benchmark's tables. ``act-ros bench all --help`` lists its options. ``check`` runs the
fast benchmarks against the committed baseline of this CPU class and fails on a
regression (``make bench-check``; :mod:`act_ros.bench.check`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic

# One benchmark may run for a while (compile matrices, node load tests), never forever.
BENCHMARK_TIMEOUT_S = 3 * 3600.0
BENCHMARKS = {
    'runtime': 'act_ros.bench.runtime',
    'node': 'act_ros.bench.node',
    'compile': 'act_ros.bench.compile',
    'training': 'act_ros.bench.training',
    'faults': 'act_ros.bench.faults',
    'executor': 'act_ros.bench.executor',
}
# Run only when asked for (not by `all`): minutes of recording per run.
ON_DEMAND = {'record': 'act_ros.bench.record'}
# Compile and training benchmark sizes for `all`: 'cpu' finishes in minutes on 2 cores.
SIZES = {
    'cpu': ['--model-preset', 'cpu', '--image-size', '96x128', '--batch-size', '8'],
    'full': ['--model-preset', 'default', '--image-size', '480x640', '--batch-size', '8'],
}


def benchmark_args(name: str, part: Path, *, device: str, size: str) -> list[str]:
    """Command-line options ``all`` gives benchmark ``name`` (its report goes to ``part``)."""
    if name == 'runtime':
        return ['--device', device, '--output', str(part)]
    if name == 'node':
        # The configuration recommended for a CPU: model in its own process, one
        # single-threaded executor, the fastest installed CPU backend.
        from act_ros.core.inference.backends import installed_backends
        backend = 'openvino' if 'openvino' in installed_backends() else 'torch'
        cpu = device in ('auto', 'cpu') and not _has_accelerator()
        # Inference threads: all cores but one, which is left to the executor and the
        # harness (on 2 cores, 1 thread held 30 Hz where 2 missed periods).
        threads = str(max(1, (os.cpu_count() or 2) - 1))
        extra = (['--execution', 'process', '--executor', 'single_threaded', '--backend',
                  backend, '--torch-threads', threads] if cpu else ['--execution', 'process'])
        return ['--device', device, *extra, '--json', str(part.with_suffix('.json'))]
    if name == 'compile':
        return ['--device', device, *SIZES[size], '--iters', '5' if size == 'cpu' else '20',
                '--matrix', '--fullgraph', '--no-header', '--output', str(part)]
    if name == 'training':
        extra = ['--iters', '10', '--warmup', '2'] if size == 'cpu' else ['--iters', '20',
                                                                          '--compile']
        return ['--device', device, *SIZES[size], *extra, '--no-header', '--output', str(part)]
    if name == 'faults':
        return ['--no-header', '--json', str(part.with_suffix('.fault.json'))]
    if name == 'executor':
        return ['--no-header', '--output', str(part),
                '--json', str(part.with_suffix('.executor.json'))]
    raise ValueError(f"unknown benchmark '{name}'")


def _has_accelerator() -> bool:
    import torch
    return torch.cuda.is_available() or torch.backends.mps.is_available()


def as_section(name: str, text: str, machine: str) -> str:
    """One benchmark's markdown as a section of the combined report: the machine line the
    report header already gives is dropped and a top-level title becomes a second-level one."""
    text = text.replace(machine + '; ', '').replace(machine, '').strip()
    if text.startswith('# '):
        text = re.sub(r'^(#+) ', r'#\1 ', text, flags=re.MULTILINE)
    return text if text.startswith('#') else f'## {name}\n\n{text}'


def node_section(path: Path) -> str:
    """The node benchmark's JSON results as a markdown table."""
    from act_ros.bench.report import markdown_table
    results = json.loads(path.read_text())
    return '## act_node under camera-rate load\n\n' + markdown_table(
        ['measure', 'value'], [(k, v) for k, v in results.items()], digits=2)


def report_header() -> str:
    from act_ros.bench.report import library_versions, machine_description
    return (f'# act_ros benchmarks\n\nMachine: {machine_description()}\n\n'
            f'Versions: {library_versions()}\n')


def _run_all(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog='act-ros bench all', description='Run the benchmarks '
                                     'and write one markdown report.',
                                     formatter_class=HelpFormatter)
    parser.add_argument('--output', type=Path, default=Path('outputs/bench/report.md'),
                        help='the report; each part is written beside it (default: %(default)s)')
    parser.add_argument('--device', default='auto', help='auto, cpu, cuda, cuda:N, mps')
    parser.add_argument('--size', choices=('auto', 'cpu', 'full'), default='auto',
                        help="compile/training sizes (auto: 'cpu' on a CPU, else 'full')")
    parser.add_argument('--only', default=','.join(BENCHMARKS),
                        help='comma-separated subset of: ' + ', '.join(BENCHMARKS))
    parser.add_argument('--torch-threads', type=int, default=None,
                        help='CPU threads for PyTorch in every benchmark (OMP_NUM_THREADS); '
                             'default: PyTorch\'s (all cores: use it on a quiet machine only)')
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(',') if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f'unknown benchmarks {unknown} (have {", ".join(BENCHMARKS)})')
    from act_ros.bench.report import machine_description
    from act_ros.core.device import select_device
    size = args.size if args.size != 'auto' else (
        'cpu' if select_device(args.device).type == 'cpu' else 'full')
    env = dict(os.environ)
    if args.torch_threads:
        import torch
        torch.set_num_threads(args.torch_threads)  # the header describes what the children use
        env['OMP_NUM_THREADS'] = str(args.torch_threads)
    output = args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    parts, failed = [report_header().rstrip()], []
    for name in names:
        part = output.with_name(f'{name}.md')
        for stale in (part, part.with_suffix('.json')):
            stale.unlink(missing_ok=True)
        print(f'== bench {name} ==', flush=True)
        args_ = [sys.executable, '-m', BENCHMARKS[name],
                 *benchmark_args(name, part, device=args.device, size=size)]
        # Each benchmark in a fresh process: no compiled state or threads leak between them.
        try:
            proc = subprocess.run(args_, check=False, stdout=subprocess.PIPE, text=True, env=env,
                                  timeout=BENCHMARK_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors='replace') if isinstance(exc.stdout, bytes) else \
                (exc.stdout or '')
            proc = subprocess.CompletedProcess(args_, returncode=124, stdout=out + (
                f'\n[bench] {name} ran past {BENCHMARK_TIMEOUT_S:.0f} s and was stopped'))
        print(proc.stdout, flush=True)
        if part.with_suffix('.json').is_file():
            section = node_section(part.with_suffix('.json'))
        elif part.is_file():
            section = as_section(name, part.read_text(), machine)
        else:
            section = f'## {name}\n\n```\n{proc.stdout.strip()}\n```'
        if proc.returncode != 0:
            failed.append(name)
            section += f'\n\n**{name} FAILED (exit {proc.returncode})**'
        parts.append(section)
    write_text_atomic(output, '\n\n'.join(parts) + '\n')
    print(f'report: {output}' + (f" (failed: {', '.join(failed)})" if failed else ''))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ('-h', '--help'):
        print('usage: act-ros bench <benchmark> [options]   (act-ros bench <benchmark> --help: '
              'its options)\n\n' + __doc__.strip() + '\n\nbenchmarks: '
              + ', '.join([*BENCHMARKS, 'all', 'check']) + '; not in all: '
              + ', '.join(ON_DEMAND))
        return 0
    name, rest = argv[0], argv[1:]
    if name == 'all':
        return _run_all(rest)
    if name == 'check':  # the fast benchmarks against the committed baseline (make bench-check)
        from act_ros.bench.check import main as check
        return check(rest)
    modules = {**BENCHMARKS, **ON_DEMAND}
    if name not in modules:
        print(f"unknown benchmark '{name}' (have {', '.join([*modules, 'all', 'check'])})",
              file=sys.stderr)
        return 2
    return int(importlib.import_module(modules[name]).main(rest) or 0)


if __name__ == '__main__':
    sys.exit(main())
