"""Linters as tests: ruff over the package, tests, launch files and setup.py."""

from pathlib import Path
import shutil
import subprocess
import sys

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which('ruff') or str(Path(sys.executable).parent / 'ruff')
    proc = subprocess.run([ruff, 'check', '--output-format', 'concise', 'act_ros', 'test', 'launch',
                           'setup.py'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
