"""Shared helpers for benchmark reports: statistics, markdown tables, machine description."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Sequence

import numpy as np


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """Median, p99 and max in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return {'median_ms': float('nan'), 'p99_ms': float('nan'), 'max_ms': float('nan')}
    return {'median_ms': float(np.median(ms)), 'p99_ms': float(np.percentile(ms, 99)),
            'max_ms': float(ms.max())}


def fmt(value: object, digits: int = 1) -> str:
    if isinstance(value, float):
        if np.isnan(value):
            return 'n/a'
        if value != 0 and (abs(value) < 10 ** -digits or abs(value) >= 1e6):
            return f'{value:.1e}'
        return f'{value:.{digits}f}'
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]], digits: int = 1) -> str:
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '|'.join('---' for _ in headers) + '|']
    for row in rows:
        lines.append('| ' + ' | '.join(fmt(v, digits) for v in row) + ' |')
    return '\n'.join(lines)


def machine_description() -> str:
    """One paragraph: CPU, cores, accelerator, library versions."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    cpu = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    parts = [f'CPU: {cpu}, {os.cpu_count()} cores', f'torch {torch.__version__}',
             f'torch threads {torch.get_num_threads()}']
    if torch.cuda.is_available():
        parts.append(f'GPU: {torch.cuda.get_device_name(0)}')
    try:
        import lerobot
        parts.append(f'lerobot {lerobot.__version__}')
    except (ImportError, AttributeError):
        pass
    parts.append(f'Python {platform.python_version()}')
    return '; '.join(parts)


BENCH_PACKAGES = ('act_ros', 'torch', 'lerobot', 'accelerate', 'numpy', 'onnxruntime', 'openvino',
                  'mujoco', 'ros-rclpy')


def library_versions(packages: Iterable[str] = BENCH_PACKAGES) -> str:
    """Installed versions of the packages the numbers depend on, and the source revision."""
    from importlib import metadata
    import subprocess

    found = []
    for name in packages:
        try:
            found.append(f'{name} {metadata.version(name)}')
        except metadata.PackageNotFoundError:
            continue
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:  # read-only: never takes the index lock
        return subprocess.run(['git', '--no-optional-locks', *args], cwd=root, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
    try:
        dirty = ' with local changes' if git('status', '--porcelain', '--untracked-files=no') \
            else ''
        found.append(f"source {git('rev-parse', '--short', 'HEAD')}{dirty}")
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout (an installed package)
    return ', '.join(found)


def source_commit() -> str:
    """The source revision (short hash, ``with local changes`` when the tree differs), or
    ``not a git checkout`` for an installed package."""
    found = [part for part in library_versions(('act_ros',)).split(', ')
             if part.startswith('source ')]
    return found[0].removeprefix('source ') if found else 'not a git checkout'


def result_provenance(command: str, argv: Sequence[str], *, json_path: str | None) -> dict:
    """The ``provenance`` object of a result file a benchmark writes: the command that made
    it (``argv`` without the output option, which names a path of this machine), the
    source revision and the machine with its CPU class (what the kernels depend on)."""
    from act_ros.bench.check import cpu_class

    words, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == '--json':
            skip = True
            continue
        if arg.startswith('--json=') or (json_path is not None and arg == str(json_path)):
            continue
        words.append(arg)
    return {'command': ' '.join([command, *words]), 'commit': source_commit(),
            'machine': f'{machine_description()}; CPU class {cpu_class()}'}
