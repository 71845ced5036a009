"""package.xml declares exactly the dependencies the code imports, so ``rosdep install
--from-paths src`` resolves on a ROS machine and nothing stale is left in it.

The expected keys are derived from the imports of ``act_ros/`` and ``launch/`` (read with
``ast``), not from a list in this test:

- a ROS package is a module provided by a ``ros-*`` distribution (the ROS 2 wheels this
  environment installs), or one a launch file imports that no distribution here provides
  (``launch``, ``launch_ros``: they come with a ROS install); its key is its name
  (``rclpy.lifecycle`` ships inside ``rclpy``);
- a Python library is a module provided by a distribution of setup.py's
  ``install_requires``; its rosdep key is ``python3-<module>``, except where rosdep names
  it otherwise (``ROSDEP_NAMES``). LeRobot, PyTorch and the libraries that come with them
  have no rosdep key and come from pip (README, ``NOT_IN_ROSDEP``); optional extras
  (MuJoCo, ONNX, OpenVINO, ...) are not runtime dependencies of the ROS package.

Test dependencies are what the tests use: pytest, pytest-timeout (the ``timeout`` of
setup.cfg), and no ament linter that no test runs.
"""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import importlib.util
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Imported module -> rosdep key, where the key is not python3-<module>.
ROSDEP_NAMES = {'cv2': 'python3-opencv', 'pinocchio': 'pinocchio'}
# install_requires without a rosdep key: installed with pip beside the ROS package (README).
NOT_IN_ROSDEP = {'lerobot', 'torch', 'huggingface-hub', 'safetensors', 'setuptools'}


def _declared() -> dict[str, set[str]]:
    root = ET.parse(ROOT / 'package.xml').getroot()
    kinds: dict[str, set[str]] = {}
    for tag in ('depend', 'exec_depend', 'build_depend', 'test_depend', 'buildtool_depend'):
        kinds[tag] = {el.text.strip() for el in root.findall(tag)}
    return kinds


def _imports(folder: str) -> set[str]:
    names = set()
    for path in (ROOT / folder).rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split('.')[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split('.')[0])
    return names - set(sys.stdlib_module_names) - {'act_ros'}


def _normalize(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def _install_requires() -> set[str]:
    tree = ast.parse((ROOT / 'setup.py').read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == 'install_requires':
            return {_normalize(re.split(r'[<>=!\[;]', item)[0].strip())
                    for item in ast.literal_eval(node.value)}
    raise AssertionError('setup.py has no install_requires')


def _from_ros_install(module: str) -> bool:
    """The module lives under a ROS install (an AMENT_PREFIX_PATH entry, as on a ROS machine
    where rclpy and the messages have no distribution record)."""
    prefixes = [p for p in os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep) if p]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin = str(getattr(spec, 'origin', None) or next(iter(
        getattr(spec, 'submodule_search_locations', None) or []), ''))
    return bool(origin) and any(origin.startswith(prefix) for prefix in prefixes)


def expected_keys() -> tuple[set[str], set[str]]:
    """(ROS package keys, Python library rosdep keys) the imports call for."""
    providers = importlib.metadata.packages_distributions()
    requires = _install_requires()
    ros, python = set(), set()
    launch_imports = _imports('launch')
    for module in _imports('act_ros') | launch_imports:
        dists = {_normalize(d) for d in providers.get(module, [])}
        if module == 'pinocchio':
            # From pip ('pin', whose wheel ships the module without a record) or from ROS:
            # the same key either way.
            dists.add('pin')
        elif any(d.startswith('ros-') for d in dists) or _from_ros_install(module) or (
                not dists and module in launch_imports):
            ros.add(module)
        if module not in ros and dists & (requires - NOT_IN_ROSDEP):
            python.add(ROSDEP_NAMES.get(module, f'python3-{module}'))
    return ros, python


def test_runtime_dependencies_are_exactly_what_the_code_imports():
    runtime = _declared()['exec_depend'] | _declared()['depend']
    ros, python = expected_keys()
    assert ros >= {'rclpy', 'sensor_msgs', 'launch', 'launch_ros'}  # the derivation works
    missing = sorted((ros | python) - runtime)
    unused = sorted(runtime - ros - python)
    assert not missing, f'imported but not declared as exec_depend in package.xml: {missing}'
    assert not unused, f'declared in package.xml but imported nowhere: {unused}'


def test_pip_only_requirements_are_current():
    """NOT_IN_ROSDEP names requirements setup.py still has, and package.xml none of them."""
    assert NOT_IN_ROSDEP <= _install_requires(), NOT_IN_ROSDEP - _install_requires()
    declared = set().union(*_declared().values())
    assert not {f'python3-{n}' for n in NOT_IN_ROSDEP} & declared


def test_an_unused_or_missing_dependency_is_caught(monkeypatch):
    declared = _declared()

    def check_fails_naming(exec_depend, key):
        changed = {**declared, 'exec_depend': exec_depend}
        monkeypatch.setattr(sys.modules[__name__], '_declared', lambda: changed)
        with pytest.raises(AssertionError, match=key):
            test_runtime_dependencies_are_exactly_what_the_code_imports()

    check_fails_naming(declared['exec_depend'] | {'python3-scipy'}, 'python3-scipy')  # stale
    check_fails_naming(declared['exec_depend'] - {'nav_msgs'}, 'nav_msgs')  # missing


def test_test_dependencies_are_what_the_tests_use():
    declared = _declared()['test_depend']
    pytest_ini = configparser.ConfigParser()
    pytest_ini.read(ROOT / 'setup.cfg')
    sources = {path.name: path.read_text() for path in (ROOT / 'test').glob('*.py')
               if path.name != Path(__file__).name}
    uses_timeout = (pytest_ini.has_option('tool:pytest', 'timeout')
                    or any('pytest.mark.timeout' in text for text in sources.values()))
    assert 'python3-pytest' in declared
    assert ('python3-pytest-timeout' in declared) == uses_timeout, (
        'pytest-timeout: declared as test_depend in package.xml '
        f"{'python3-pytest-timeout' in declared}, used by the tests {uses_timeout}")
    for linter in ('ament_flake8', 'ament_pep257', 'ament_copyright', 'ament_xmllint'):
        used = any(linter in text for text in sources.values())
        assert (linter in declared) == used, (
            f'{linter}: declared as test_depend {linter in declared}, run by a test {used}')


def _ros_extras() -> dict[str, set[str]]:
    """setup.py's ROS 2 wheel lists per distribution: extra -> ROS package names."""
    tree = ast.parse((ROOT / 'setup.py').read_text())
    lists = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
             if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
             and node.targets[0].id.startswith('ROS_WHEELS')}
    prefixes = {'ROS_WHEELS': ('ros', 'ros-'), 'ROS_WHEELS_JAZZY': ('ros-jazzy', 'ros-jazzy-')}
    assert set(lists) == set(prefixes), f'setup.py ROS wheel lists: {sorted(lists)}'
    extras = {}
    for name, (extra, prefix) in prefixes.items():
        packages = {re.split(r'[<>=!\[;]', item)[0].strip() for item in lists[name]}
        assert all(p.startswith(prefix) for p in packages), (name, sorted(packages))
        extras[extra] = {p[len(prefix):].replace('-', '_') for p in packages}
    return extras


def test_every_ros_distribution_extra_brings_the_same_packages():
    """The `ros` (Kilted) and `ros-jazzy` extras name the same ROS packages, every one a
    dependency package.xml declares (or the RMW the environment selects)."""
    extras = _ros_extras()
    assert extras['ros'] == extras['ros-jazzy'], (
        f"only in ros: {sorted(extras['ros'] - extras['ros-jazzy'])}; "
        f"only in ros-jazzy: {sorted(extras['ros-jazzy'] - extras['ros'])}")
    declared = _declared()['exec_depend'] | _declared()['depend']
    assert extras['ros'] - declared == {'rmw_fastrtps_cpp'}, sorted(extras['ros'] - declared)
