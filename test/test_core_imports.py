"""The core never imports rclpy (STYLE.md): importing every core module leaves it out."""

import importlib
import pkgutil
import subprocess
import sys


def test_core_does_not_import_rclpy():
    code = (
        'import importlib, pkgutil, sys\n'
        'import act_ros.core as core\n'
        'for m in pkgutil.iter_modules(core.__path__):\n'
        '    importlib.import_module(f"act_ros.core.{m.name}")\n'
        'bad = sorted(k for k in sys.modules if k == "rclpy" or k.startswith("rclpy."))\n'
        'print(",".join(bad))\n'
        'sys.exit(1 if bad else 0)\n'
    )
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f'core imported rclpy modules: {proc.stdout} {proc.stderr[-2000:]}'


def test_every_core_module_imports():
    import act_ros.core as core
    names = [m.name for m in pkgutil.iter_modules(core.__path__)]
    assert 'contract' in names and 'safety' in names
    for name in names:
        importlib.import_module(f'act_ros.core.{name}')
