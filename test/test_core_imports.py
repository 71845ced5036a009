"""The ROS-free layers never import ROS: importing every module of ``act_ros.core`` (and of
the simulation, data and training packages) loads no ROS package: not rclpy, no message or
service package, no ament or rosidl module."""

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

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
    names = [m.name for m in pkgutil.walk_packages(core.__path__, 'act_ros.core.')]
    assert 'act_ros.core.contract' in names and 'act_ros.core.control.safety' in names
    for name in names:
        importlib.import_module(name)


ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / 'docs' / 'architecture.md'
# The sentence of docs/architecture.md that states the layers, lowest first.
LAYER_SENTENCE = 'Each layer imports only from the layers before it in this\nlist:'
# The sentence that orders the rooms (subpackages) inside a layer, lowest first.
ROOM_SENTENCE = 'Rooms inside a layer keep the same rule, lowest\nfirst:'


def _module_imports(path):
    """act_ros modules imported by ``path``, every import: at module level, in a
    ``TYPE_CHECKING`` block, or inside a function."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith('act_ros'))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith('act_ros'):
            found.add(node.module)
            found.update(f'{node.module}.{a.name}' for a in node.names)
    return found


def _modules(root=ROOT / 'act_ros'):
    modules = {}
    for path in root.rglob('*.py'):
        rel = path.relative_to(root.parent).with_suffix('')
        name = '.'.join(rel.parts[:-1] if rel.name == '__init__' else rel.parts)
        modules[name] = path
    return modules


def import_graph(modules):
    """module -> the package's modules it imports (a name imported from a package that is
    a module of it counts as that module; a package's ``__init__`` importing its own
    submodules is not an edge)."""
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in _module_imports(path):
            while target and target not in modules:
                target = target.rpartition('.')[0]
            if target and target != name and not target.startswith(name + '.') \
                    and target != 'act_ros':
                deps.add(target)
        graph[name] = deps
    return graph


def cycles_of(graph):
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
    return cycles


def documented_layers():
    """{layer name: rank} from docs/architecture.md; the names after 'on top' share a rank."""
    text = ARCHITECTURE.read_text()
    assert LAYER_SENTENCE in text, f'{ARCHITECTURE.name} no longer states the layers'
    sentence = text.split(LAYER_SENTENCE, 1)[1].split('.', 1)[0]
    below, _, top = sentence.partition('on top')
    ranks = {name: rank for rank, name in enumerate(re.findall(r'`(\w+)`', below))}
    ranks.update({name: len(ranks) for name in re.findall(r'`(\w+)`', top)})
    return ranks


def documented_rooms():
    """{room: rank inside its layer} from docs/architecture.md, e.g. ``core.control``."""
    text = ARCHITECTURE.read_text()
    assert ROOM_SENTENCE in text, f'{ARCHITECTURE.name} no longer orders the rooms'
    sentence = text.split(ROOM_SENTENCE, 1)[1].split('(', 1)[0]
    rooms = re.findall(r'`([\w.]+)`', sentence)
    return {room: rooms.index(room) - rooms.index(room.split('.')[0]) for room in rooms}


def back_arrows(graph, ranks, rooms=None):
    """Imports from a lower layer to a higher one, or from a lower room of a layer to a
    higher room of it: (importer, imported)."""
    rooms = documented_rooms() if rooms is None else rooms

    def rank(module):
        parts = module.split('.')
        return ranks[parts[1]], rooms.get('.'.join(parts[1:3]), 0)
    return sorted((a, b) for a, deps in graph.items() for b in deps
                  if a != 'act_ros' and rank(b) > rank(a))


def test_no_import_cycles_between_modules():
    cycles = cycles_of(import_graph(_modules()))
    assert not cycles, 'import cycles: ' + '; '.join(' -> '.join(c) for c in cycles)


def test_imports_point_down_the_documented_layers():
    """Every import, in a function too, goes from a layer to one below it, in the order
    docs/architecture.md states; every module belongs to a stated layer."""
    ranks = documented_layers()
    assert list(ranks)[:3] == ['core', 'provenance', 'sim'] and 'report' in ranks
    modules = _modules()
    unplaced = sorted(m for m in modules if m != 'act_ros' and m.split('.')[1] not in ranks)
    assert not unplaced, f'modules in no layer of {ARCHITECTURE.name}: {unplaced}'
    arrows = back_arrows(import_graph(modules), ranks)
    assert not arrows, 'imports that run up the layers: ' + ', '.join(
        f'{a} -> {b}' for a, b in arrows)


def planted(tmp_path, module, statement, name):
    """A copy of the package whose ``module`` (a path under act_ros/) gains a function
    that runs ``statement`` (an import of ``name``) and returns ``name``; its root."""
    import shutil

    root = tmp_path / 'act_ros'
    if not root.exists():
        shutil.copytree(ROOT / 'act_ros', root, ignore=shutil.ignore_patterns('__pycache__'))
    path = root / module
    path.write_text(path.read_text() + f'\n\ndef _planted():\n    {statement}\n'
                    f'    return {name}\n')
    return root


def test_a_function_level_back_import_is_caught(tmp_path):
    """The check sees an import inside a function: planted in a copy of core, it fails."""
    root = planted(tmp_path, 'core/control/safety.py',
                   'from act_ros.training.evaluation.rollout import SimPolicy', 'SimPolicy')
    graph = import_graph(_modules(root))
    assert back_arrows(graph, documented_layers()) == [
        ('act_ros.core.control.safety', 'act_ros.training.evaluation.rollout')]
    assert cycles_of(graph)  # rollout imports the safety chain: a circle as well


def test_a_back_import_between_rooms_is_caught(tmp_path):
    """Rooms are ordered too: inference importing the control path runs up a room."""
    root = planted(tmp_path, 'core/inference/runtime.py',
                   'from act_ros.core.control.release_gate import ReleaseGate', 'ReleaseGate')
    assert back_arrows(import_graph(_modules(root)), documented_layers()) == [
        ('act_ros.core.inference.runtime', 'act_ros.core.control.release_gate')]


# A module name of the repository's research/ folder (the probes run from a checkout).
RESEARCH_MODULE = re.compile(r'^research(\.\w+)*$')


def research_imports(root=ROOT / 'act_ros'):
    """(module, line) of each place in ``root`` that reaches the repository's research/
    folder: an import at any level (module, ``TYPE_CHECKING`` block, function) or a module
    name in a string (``importlib.import_module``, a command table such as the CLI's)."""
    found = []
    for name, path in sorted(_modules(root).items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value]
            else:
                continue
            if any(RESEARCH_MODULE.match(n) for n in names):
                found.append((name, node.lineno))
    return found


def test_the_package_never_imports_research():
    """research/ may import act_ros, never the reverse: it is not installed."""
    found = research_imports()
    assert not found, 'act_ros modules that reach research/ (not installed): ' + ', '.join(
        f'{m} line {line}' for m, line in found)


def test_a_research_import_is_caught(tmp_path):
    """Planted in a copy of the package, an import in a function and a module name given to
    the CLI's command table are both found."""
    root = planted(tmp_path, 'training/pose_pretrain.py', 'from research.pose_probe import main',
                   'main')
    cli = root / 'cli.py'
    cli.write_text(cli.read_text().replace(
        'COMMANDS: dict[str, tuple[str, str]] = {\n',
        "COMMANDS: dict[str, tuple[str, str]] = {\n    'probe': ('research.input_probe', 'x'),\n"))
    assert [m for m, _ in research_imports(root)] == ['act_ros.cli',
                                                      'act_ros.training.pose_pretrain']


def test_research_is_not_installed(monkeypatch):
    """setup.py's packages: act_ros and its subpackages, neither research nor the tests."""
    import runpy

    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, 'setup', lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / 'setup.py'))
    tops = {name.split('.')[0] for name in captured['packages']}
    assert tops == {'act_ros'}, f'setup.py installs {sorted(tops)}'
    assert 'act_ros.training' in captured['packages']
