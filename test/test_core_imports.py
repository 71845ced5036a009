"""The ROS-free layers never import ROS: importing every module of ``act_ros.core`` (and of
the simulation, data and training packages) loads no ROS package: not rclpy, no message or
service package, no ament or rosidl module."""

import importlib
import pkgutil
import subprocess
import sys

import pytest


ROS_FREE = ('core', 'sim', 'data', 'training')


@pytest.mark.parametrize('package', ROS_FREE)
def test_ros_free_packages_import_no_ros(package):
    code = (
        'import importlib, pkgutil, sys\n'
        f'import act_ros.{package} as pkg\n'
        'for m in pkgutil.iter_modules(pkg.__path__):\n'
        f'    importlib.import_module(f"act_ros.{package}.{{m.name}}")\n'
        'def is_ros(name):\n'
        '    top = name.split(".")[0]\n'
        '    return (top in ("rclpy", "rosidl_runtime_py", "builtin_interfaces", "rcl_interfaces",\n'
        '                    "rosgraph_msgs", "unique_identifier_msgs", "rpyutils")\n'
        '            or top.endswith(("_msgs", "_srvs")) or top.startswith(("ament_", "rosidl_")))\n'
        'bad = sorted(k for k in sys.modules if is_ros(k))\n'
        'print(",".join(bad))\n'
        'sys.exit(1 if bad else 0)\n'
    )
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (f'act_ros.{package} imported ROS modules: {proc.stdout} '
                                  f'{proc.stderr[-2000:]}')


def test_every_core_module_imports():
    import act_ros.core as core
    names = [m.name for m in pkgutil.iter_modules(core.__path__)]
    assert 'contract' in names and 'safety' in names
    for name in names:
        importlib.import_module(f'act_ros.core.{name}')
