"""Where a result came from: the machine, the library versions and the source revision.

Every result file the project's commands write (benchmarks with ``--json``, ``act-ros
evaluate --output``) carries a ``provenance`` object made by :func:`result_provenance`:
the command that made it, the commit and the machine (``act-ros report`` refuses a file
without one), and where the source differed from the commit, which files did
(``local_changes``).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Sequence


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
    import subprocess
    from importlib import metadata

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


def local_changes() -> list[str]:
    """The tracked files of the source checkout that differ from its commit (none for an
    installed package)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(['git', '--no-optional-locks', '-C', root, 'status', '--porcelain',
                              '--untracked-files=no'], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(line[3:].strip() for line in out.splitlines() if line.strip())


def result_provenance(command: str, argv: Sequence[str], *, output_path: object | None,
                      output_option: str = '--json', omit: Sequence[str] = ()) -> dict:
    """The ``provenance`` object of a result file a command writes: the command that made
    it (``argv`` without the output option and the ``omit`` options, which name paths of
    this machine), the source revision and the machine with its CPU class (what the
    kernels depend on)."""
    from act_ros.core.inference.precision import cpu_class

    words, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in (output_option, *omit):  # options naming paths of this machine
            skip = True
            continue
        if arg.startswith(tuple(f'{o}=' for o in (output_option, *omit))) or (
                output_path is not None and arg == str(output_path)):
            continue
        words.append(arg)
    out = {'command': ' '.join([command, *words]), 'commit': source_commit(),
           'machine': f'{machine_description()}; CPU class {cpu_class()}'}
    if 'local changes' in out['commit']:
        out['local_changes'] = ', '.join(local_changes()) or 'not listed (git status failed)'
    return out
