"""``colcon build`` of this package, as on a ROS 2 machine: the installed share/ (launch,
config, urdf, rviz, models, package.xml, ament index) and the lib/act_ros executables that
``ros2 run act_ros ...`` starts, with the interpreter that ran colcon (a virtualenv's, as
the README's ROS-machine recipe does) in their shebang."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import extras
import pytest
from test_launch_act import console_scripts

ROOT = Path(__file__).resolve().parents[1]
# The ROS executables (setup.py's console scripts but act-ros), as `ros2 run` finds them.
EXECUTABLES = tuple(name for name in console_scripts() if name != 'act-ros')

pytestmark = extras.needs(importlib.util.find_spec('colcon_core') is not None, 'colcon', 'dev')


@pytest.mark.slow
def test_colcon_build_installs_share_and_executables(tmp_path):
    src = tmp_path / 'ws' / 'src' / 'act_ros'
    files = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split('\n')
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    ws = tmp_path / 'ws'
    proc = subprocess.run([sys.executable, '-m', 'colcon', 'build', '--packages-select',
                           'act_ros', '--base-paths', 'src'], cwd=ws, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    prefix = ws / 'install' / 'act_ros'
    share = prefix / 'share' / 'act_ros'
    for rel in ('package.xml', 'launch/act.launch.py', 'launch/sim.launch.py',
                'launch/record.launch.py', 'config/act.yaml', 'config/contract.yaml',
                'config/record.yaml', 'config/train_sim.yaml', 'urdf/so101_class.urdf',
                'models/README.md', 'launch/rviz.launch.py', 'rviz/act.rviz'):
        assert (share / rel).is_file(), f'share/act_ros/{rel} not installed'
    assert (prefix / 'share' / 'ament_index' / 'resource_index' / 'packages' / 'act_ros').is_file()
    for name in EXECUTABLES:
        exe = prefix / 'lib' / 'act_ros' / name
        assert exe.is_file() and os.access(exe, os.X_OK), f'lib/act_ros/{name} missing'
        assert exe.read_text().splitlines()[0] == f'#!{sys.executable}', name
    # `ros2 run act_ros train --help`, as setup.bash would prepare it.
    site = next(prefix.glob('lib/python3*/site-packages'))
    env = dict(os.environ, PYTHONPATH=str(site), ACT_ROS_SHARE_DIR=str(share))
    run = subprocess.run([str(prefix / 'lib' / 'act_ros' / 'train'), '--help'],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'act-ros train' in run.stdout
