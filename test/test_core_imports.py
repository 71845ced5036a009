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


def _module_imports(path, package_root):
    """act_ros modules imported at module level by ``path`` (TYPE_CHECKING blocks too;
    imports inside functions are lazy by design and not counted)."""
    import ast

    tree = ast.parse(path.read_text())
    found = set()
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If):
            nodes.extend(node.body + node.orelse)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith('act_ros'))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith('act_ros'):
            found.add(node.module)
            found.update(f'{node.module}.{a.name}' for a in node.names)
    return found


def test_no_import_cycles_between_modules():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / 'act_ros'
    modules = {}
    for path in root.rglob('*.py'):
        rel = path.relative_to(root.parent).with_suffix('')
        name = '.'.join(rel.parts[:-1] if rel.name == '__init__' else rel.parts)
        modules[name] = path
    graph = {name: {m for m in _module_imports(path, root) if m in modules and m != name}
             for name, path in modules.items()}
    # A package's __init__ importing its own submodules is not a cycle worth flagging.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not d.startswith(name + '.')}
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, 'import cycles: ' + '; '.join(' -> '.join(c) for c in cycles)
