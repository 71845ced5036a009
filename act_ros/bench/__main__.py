"""``act-ros bench <name>`` / ``python -m act_ros.bench <name>``: run one benchmark.

``all`` runs every benchmark in turn with its defaults and writes one markdown report
(``--output``, default ``outputs/bench/report.md``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
import subprocess
import sys

BENCHMARKS = {
    'runtime': 'act_ros.bench.runtime',
    'node': 'act_ros.bench.node',
}


def _run_all(argv: list[str]) -> int:
    output = Path('outputs/bench/report.md')
    if '--output' in argv:
        output = Path(argv[argv.index('--output') + 1])
    output.parent.mkdir(parents=True, exist_ok=True)
    parts, failed = [], []
    for name, module in BENCHMARKS.items():
        part = output.with_name(f'{name}.md')
        print(f'== bench {name} ==', flush=True)
        args = [sys.executable, '-m', module]
        args += ['--output', str(part)] if name == 'runtime' else []
        # Each benchmark in a fresh process: no compiled state or threads leak between them.
        proc = subprocess.run(args, check=False, stdout=subprocess.PIPE, text=True)
        print(proc.stdout, flush=True)
        if proc.returncode != 0:
            failed.append(name)
            parts.append(f'## {name}\n\nFAILED (exit {proc.returncode})\n')
        elif part.is_file():
            parts.append(part.read_text())
        else:
            parts.append(f'## {name}\n\n```\n{proc.stdout.strip()}\n```\n')
    output.write_text('\n\n'.join(parts))
    print(f'report: {output}')
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ('-h', '--help'):
        print(__doc__.strip() + '\n\nbenchmarks: ' + ', '.join([*BENCHMARKS, 'all']))
        return 0
    name, rest = argv[0], argv[1:]
    if name == 'all':
        return _run_all(rest)
    if name not in BENCHMARKS:
        print(f"unknown benchmark '{name}' (have {', '.join([*BENCHMARKS, 'all'])})",
              file=sys.stderr)
        return 2
    return int(importlib.import_module(BENCHMARKS[name]).main(rest) or 0)


if __name__ == '__main__':
    sys.exit(main())
