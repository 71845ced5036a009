"""package.xml declares only dependency keys that exist, and every ROS package the code
imports, so ``rosdep install --from-paths src`` resolves on a ROS machine.

``rclpy.lifecycle`` ships inside ``rclpy`` (there is no ``rclpy_lifecycle`` package);
Python libraries are declared by their rosdep keys (``python3-*``); LeRobot, PyTorch and
MuJoCo are not in rosdep and come from pip (README). Test dependencies are what the tests
use: pytest, pytest-timeout (the ``timeout`` of setup.cfg), and no ament linter that no
test runs.
"""

from __future__ import annotations

import ast
import configparser
from pathlib import Path
import xml.etree.ElementTree as ET

ROOT = Path(__file__).resolve().parents[1]
# ROS 2 packages (Jazzy, Kilted) that this package may depend on.
ROS_PACKAGES = {
    'rclpy', 'lifecycle_msgs', 'sensor_msgs', 'std_msgs', 'std_srvs', 'trajectory_msgs',
    'geometry_msgs', 'diagnostic_msgs', 'rosgraph_msgs', 'rcl_interfaces', 'builtin_interfaces',
    'nav_msgs', 'visualization_msgs', 'launch', 'launch_ros', 'ament_index_python',
}
# rosdep keys (rosdistro's rosdep/python.yaml, base.yaml) for the Python libraries used.
ROSDEP_KEYS = {
    'python3-numpy', 'python3-yaml', 'python3-opencv', 'python3-matplotlib', 'python3-tqdm',
    'python3-pytest', 'python3-pytest-timeout', 'python3-psutil', 'pinocchio',
}
# Imported top-level module -> dependency key, for modules that rosdep provides.
MODULE_KEYS = {'numpy': 'python3-numpy', 'yaml': 'python3-yaml', 'cv2': 'python3-opencv',
               'matplotlib': 'python3-matplotlib', 'tqdm': 'python3-tqdm',
               'pinocchio': 'pinocchio', 'psutil': 'python3-psutil'}


def _declared() -> dict[str, set[str]]:
    root = ET.parse(ROOT / 'package.xml').getroot()
    kinds: dict[str, set[str]] = {}
    for tag in ('depend', 'exec_depend', 'build_depend', 'test_depend', 'buildtool_depend'):
        kinds[tag] = {el.text.strip() for el in root.findall(tag)}
    return kinds


def _imported_top_level() -> set[str]:
    names = set()
    for folder in ('act_ros', 'launch'):
        for path in (ROOT / folder).rglob('*.py'):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split('.')[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module.split('.')[0])
    return names


def test_every_declared_key_is_a_known_ros_package_or_rosdep_key():
    declared = set().union(*_declared().values())
    unknown = sorted(declared - ROS_PACKAGES - ROSDEP_KEYS)
    assert not unknown, f'package.xml declares keys that rosdep cannot resolve: {unknown}'


def test_every_imported_ros_or_rosdep_module_is_declared():
    runtime = _declared()['exec_depend'] | _declared()['depend']
    imported = _imported_top_level()
    wanted = {name for name in imported if name in ROS_PACKAGES}
    wanted |= {MODULE_KEYS[name] for name in imported if name in MODULE_KEYS}
    missing = sorted(wanted - runtime)
    assert not missing, f'imported but not declared as exec_depend in package.xml: {missing}'


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
