"""The happy path of the commands, as a user runs them: quiet and clean.

Quiet: the stderr of a short evaluation, an ONNX export and a synthetic dataset holds
only the package's own log lines (``LEVEL act_ros...: message``): no INFO from other
libraries, no deprecation warning, no encoder or muxer chatter.

Clean: a checkpoint load, an evaluation and a plot leave the temporary folder and the
working directory as they were. Each command runs as a process of its own with a fresh
``TMPDIR`` and working directory. Importing ``torch._dynamo`` creates torch's per-user
cache folder ``torchinductor_<user>`` in the temporary folder, once per user and reused
by every later process: it is made (where torch would put it) before the "before"
listing, as it is on any machine where torch ever ran.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from extras import needs_onnx

ROOT = Path(__file__).resolve().parents[1]
OWN_LINE = re.compile(r'^(DEBUG|INFO|WARNING|ERROR|CRITICAL) act_ros(\.\w+)*: ')
TIMEOUT_S = 600


@pytest.fixture
def user(tmp_path):
    """A working directory and a temporary folder of their own; the environment of a
    process that runs there."""
    work, tmp = tmp_path / 'work', tmp_path / 'tmp'
    work.mkdir()
    tmp.mkdir()
    env = {**os.environ, 'TMPDIR': str(tmp),
           'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    env.pop('TORCHINDUCTOR_CACHE_DIR', None)  # set by torch in this process, not by a user
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, 'tempdir', str(tmp))
        Path(default_cache_dir()).mkdir()
    return work, tmp, env


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob('*'))


def run_python(code: str, args: list[str], user) -> subprocess.CompletedProcess:
    work, _, env = user
    proc = subprocess.run([sys.executable, '-c', code, *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f'{args}: exit {proc.returncode}\n{proc.stderr[-3000:]}'
    return proc


def act_ros(args: list[str], user) -> subprocess.CompletedProcess:
    return run_python('import sys; from act_ros.cli import main; sys.exit(main())', args, user)


def foreign_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not OWN_LINE.match(line)]


def test_evaluation_is_quiet_and_leaves_nothing(tiny_checkpoint, user):
    work, tmp, _ = user
    before = listing(tmp), listing(work)
    proc = act_ros(['evaluate', '--checkpoint', str(tiny_checkpoint), '--episodes', '1',
                    '--episode-steps', '10', '--mode', 'chunk', '--no-progress'], user)
    assert 'align_rate' in proc.stdout
    assert foreign_lines(proc.stderr) == [], proc.stderr
    assert (listing(tmp), listing(work)) == before


@needs_onnx
def test_export_is_quiet(tiny_checkpoint, tmp_path, user):
    checkpoint = tmp_path / 'checkpoint'
    shutil.copytree(tiny_checkpoint, checkpoint)
    proc = act_ros(['export', '--checkpoint', str(checkpoint)], user)
    assert foreign_lines(proc.stderr) == [], proc.stderr
    assert any(checkpoint.glob('export/*.onnx'))


def test_synthetic_dataset_is_quiet(tmp_path, user):
    """MP4 videos are written: FFmpeg's muxer says nothing about its second pass."""
    proc = act_ros(['generate-synthetic', '--output', str(tmp_path / 'data'), '--episodes', '2',
                    '--frames-per-episode', '10', '--image-size', '48x64'], user)
    assert foreign_lines(proc.stderr) == [], proc.stderr
    assert any((tmp_path / 'data').rglob('*.mp4'))


LOAD = '''
import os, sys
from act_ros.core.inference.checkpoint import load_checkpoint
tmp = os.environ['TMPDIR']
before = len(os.listdir(tmp))
for _ in range(3):
    load_checkpoint(sys.argv[1])
print(before, len(os.listdir(tmp)))
'''


def test_checkpoint_loads_leave_no_temporary_file(tiny_checkpoint, user):
    """LeRobot's PreTrainedConfig.from_pretrained leaves a tmpXXXX.json per call; the
    package's loader parses the same config without."""
    work, tmp, _ = user
    before = listing(tmp), listing(work)
    proc = run_python(LOAD, [str(tiny_checkpoint)], user)
    counts = proc.stdout.split()
    assert counts[0] == counts[1], f'temporary folder: {counts[0]} entries before 3 loads, ' \
        f'{counts[1]} after'
    assert (listing(tmp), listing(work)) == before


PLOT = '''
import sys
import numpy as np
from act_ros.ros.plan_plot import PlanRecord, draw
record = PlanRecord()
record.paths.append(np.array([[0.2, 0.0, 0.1], [0.25, 0.05, 0.05]]))
record.ee_track.extend([np.array((0.2, 0.0, 0.1)), np.array((0.22, 0.02, 0.08))])
record.region = (np.array((0.25, 0.0, 0.0)), 0.1, (0.2, 0.8, 0.2, 1.0))
print(draw(record, sys.argv[1]))
'''


def test_plot_writes_only_where_asked(tmp_path, user):
    work, tmp, _ = user
    before = listing(tmp), listing(work)
    picture = tmp_path / 'pictures' / 'plan.png'
    run_python(PLOT, [str(picture)], user)
    assert picture.stat().st_size > 1000
    assert (listing(tmp), listing(work)) == before
