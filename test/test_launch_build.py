"""Every launch file's description is built, with recording stand-ins for `launch` and
`launch_ros` (not installable from the Python package index), and what it would start is
checked against the nodes' own parameter declarations.

`generate_launch_description()` runs for real: its Python executes, and every
`DeclareLaunchArgument`, `LaunchConfiguration`, `Node`, `LifecycleNode`, `ParameterValue`
and included launch file is recorded with its arguments; an `OpaqueFunction`'s function
runs on the launch arguments' values (their defaults, or every argument given an example
value) and what it returns is recorded too. Then, for each node of this
package: every parameter the launch file sets is one the node declares (`act_node`:
`act_ros.ros.node.parameters.parameter_specs`, `sim_bridge`: `BRIDGE_PARAMETERS`,
`record_node`: `record_parameters`), with a value of the declared type (a literal, a
`ParameterValue(value_type=...)` whose launch argument's default converts to it, or a string
substitution for a string parameter); every launch argument used is declared, with a
default among its choices; an included launch file receives only arguments it declares.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_DIR = ROOT / 'launch'
STUBBED = ('launch', 'launch.actions', 'launch.conditions', 'launch.launch_description_sources',
           'launch.substitutions', 'launch_ros', 'launch_ros.actions',
           'launch_ros.parameter_descriptions', 'launch_ros.substitutions')


class Recorded:
    """A stand-in for any launch class: remembers how it was made."""

    kind = 'Recorded'

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __repr__(self):
        return f'{self.kind}{self.args}'


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith('__'):
            raise AttributeError(name)
        cls = type(name, (Recorded,), {'kind': name})
        setattr(self, name, cls)
        return cls


def build(path: Path, monkeypatch, *, given: bool = False) -> Recorded:
    """The recorded description; each OpaqueFunction's result is recorded as its
    ``expanded`` keyword, run on the declared defaults or (``given``) with every launch
    argument that sets a parameter given an example value of the parameter's type."""
    for name in STUBBED:
        monkeypatch.setitem(sys.modules, name, _StubModule(name))
    spec = importlib.util.spec_from_file_location(f'launch_under_test_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    assert description.kind == 'LaunchDescription'
    values = {name: (d.kwargs.get('default_value') if isinstance(d.kwargs.get('default_value'),
                                                                   str) else str(d))
              for name, d in declared(description).items()}
    if given:
        values.update({k: v for k, v in example_values().items() if k in values})
    context = types.SimpleNamespace(launch_configurations=values)
    for opaque in [e for e in walk(description) if e.kind == 'OpaqueFunction']:
        opaque.kwargs['expanded'] = opaque.kwargs['function'](context)
    return description


def example_values() -> dict[str, str]:
    """An example value for each launch argument that sets a parameter: the parameter's
    declared default (written as a launch argument), or one of its type where that is
    empty."""
    from act_ros.ros import launch_arguments as la

    specs = node_specs()
    tables = {'act_node': (*la.ACT_NODE_ARGUMENTS, *la.SIM_ACT_NODE_ARGUMENTS),
              'record_node': la.RECORD_NODE_ARGUMENTS, 'sim_bridge': la.SIM_BRIDGE_ARGUMENTS}
    out = {}
    for executable, table in tables.items():
        for arg in table:
            spec = specs[executable].get(arg.parameter)  # a broken table's: a string
            default = spec.default if spec is not None else ''
            if isinstance(default, bool):
                out[arg.name] = 'true'
            elif isinstance(default, (int, float)):
                out[arg.name] = str(default or 2)
            else:
                out[arg.name] = default or f'/example/{arg.name}'
    return out


def walk(value):
    """Every Recorded object inside ``value`` (lists, tuples, dicts, dict items views)."""
    if isinstance(value, Recorded):
        yield value
        for inner in (*value.args, *value.kwargs.values()):
            yield from walk(inner)
    elif isinstance(value, dict):
        for inner in value.values():
            yield from walk(inner)
    elif isinstance(value, (list, tuple)) or type(value).__name__ == 'dict_items':
        for inner in value:
            yield from walk(inner)


def declared(description: Recorded) -> dict[str, Recorded]:
    return {d.args[0]: d for d in walk(description) if d.kind == 'DeclareLaunchArgument'}


def node_specs() -> dict[str, dict]:
    from act_ros.core.contract import load_contract
    from act_ros.ros.node.parameters import parameter_specs
    from act_ros.ros.recording.record_node import record_parameters
    from act_ros.ros.sim_bridge.params import BRIDGE_PARAMETERS

    contract = load_contract()
    use_sim_time = types.SimpleNamespace(name='use_sim_time', default=False, choices=())
    return {'act_node': {s.name: s for s in [*parameter_specs(contract), use_sim_time]},
            'sim_bridge': {s.name: s for s in [*BRIDGE_PARAMETERS, use_sim_time]},
            'record_node': {s.name: s for s in [*record_parameters(contract), use_sim_time]}}


CONVERT = {bool: lambda s: {'true': True, 'false': False}[s.lower()], int: int, float: float,
           str: str}


def _type_of(spec) -> type | None:
    return None if spec.default is None else type(spec.default)


LAUNCH_FILES = sorted(p.name for p in LAUNCH_DIR.glob('*.launch.py'))


@pytest.fixture(params=[(name, given) for name in LAUNCH_FILES for given in (False, True)],
                ids=lambda p: f"{p[0]}{'-given' if p[1] else ''}")
def built(request, monkeypatch):
    name, given = request.param
    return name, build(LAUNCH_DIR / name, monkeypatch, given=given)


def test_every_launch_file_is_checked():
    assert {'act.launch.py', 'sim.launch.py', 'record.launch.py', 'rviz.launch.py'} <= \
        set(LAUNCH_FILES)


def test_arguments_used_are_declared_with_defaults_among_their_choices(built):
    name, description = built
    args = declared(description)
    used = {c.args[0] for c in walk(description) if c.kind == 'LaunchConfiguration'}
    assert used <= set(args), f'{name}: used but not declared: {used - set(args)}'
    for arg, call in args.items():
        assert len(call.kwargs.get('description', '')) > 10, f'{name}: {arg} undescribed'
        choices, default = call.kwargs.get('choices'), call.kwargs.get('default_value')
        if choices and isinstance(default, str):
            assert default in choices, f'{name}: {arg} default {default!r} not in {choices}'


def test_nodes_set_only_parameters_they_declare_with_their_types(built):
    check_nodes(*built)


def check_nodes(name: str, description: Recorded) -> None:
    specs = node_specs()
    args = declared(description)
    nodes = [n for n in walk(description) if n.kind in ('Node', 'LifecycleNode')]
    assert nodes, f'{name} starts no node'
    for node in nodes:
        if node.kwargs.get('package') != 'act_ros':
            continue
        executable = node.kwargs['executable']
        assert executable in specs, f'{name}: no parameter declarations known for {executable}'
        known = specs[executable]
        for item in node.kwargs.get('parameters', []):
            if not isinstance(item, dict):
                continue  # a parameter file (checked against the declarations elsewhere)
            for key, value in item.items():
                assert key in known, f'{name}: {executable} declares no parameter {key!r}'
                expected = _type_of(known[key])
                if isinstance(value, Recorded) and value.kind == 'ParameterValue':
                    value_type = value.kwargs.get('value_type', str)
                    if expected is not None:
                        assert value_type is expected, \
                            f'{name}: {key} is {expected.__name__}, launch gives {value_type}'
                    source = value.args[0]
                    if isinstance(source, Recorded) and source.kind == 'LaunchConfiguration':
                        default = args[source.args[0]].kwargs.get('default_value')
                        if isinstance(default, str):
                            CONVERT[value_type](default)  # the default must convert
                elif isinstance(value, Recorded):  # a substitution: a string at launch
                    assert value.kind in ('LaunchConfiguration', 'PythonExpression'), value
                    assert expected in (str, None), \
                        f'{name}: {key} is {expected.__name__} but gets a string substitution'
                    choices = getattr(known[key], 'choices', ())
                    if value.kind == 'LaunchConfiguration' and choices:
                        arg = args[value.args[0]]
                        for option in arg.kwargs.get('choices') or \
                                [arg.kwargs.get('default_value')]:
                            if isinstance(option, str):
                                assert option in choices, (name, key, option, choices)
                else:
                    assert expected is None or isinstance(value, expected), \
                        f'{name}: {key}={value!r}, declared {expected.__name__}'


def test_included_launch_files_get_only_arguments_they_declare(built, monkeypatch):
    name, description = built
    for include in (n for n in walk(description) if n.kind == 'IncludeLaunchDescription'):
        source = include.args[0]
        path_parts = [p for p in source.args[0].args[0] if isinstance(p, str)]
        included = LAUNCH_DIR / path_parts[-1]
        assert included.is_file(), f'{name} includes a missing {included.name}'
        given = {k for k, _ in include.kwargs.get('launch_arguments', [])}
        inner = declared(build(included, monkeypatch))
        assert given <= set(inner), f'{name} passes {given - set(inner)} to {included.name}'


@pytest.mark.parametrize('file,table,entry,problem', [
    ('act.launch.py', 'ACT_NODE_ARGUMENTS', ('device', 'devise', str),
     "declares no parameter 'devise'"),
    ('sim.launch.py', 'SIM_BRIDGE_ARGUMENTS', ('seed', 'seed', float), 'seed=2.0, declared int'),
    ('record.launch.py', 'RECORD_NODE_ARGUMENTS', ('max_episode_s', 'max_episode_s', str),
     "max_episode_s='2', declared float"),
])
def test_the_checks_catch_a_broken_argument_table(file, table, entry, problem, monkeypatch):
    """A launch argument that sets a parameter the node lacks, or gives it a value of the
    wrong type, fails the check above."""
    from act_ros.ros import launch_arguments as la

    name = entry[0]
    broken = tuple(la.LaunchArgument(*entry) if arg.name == name else arg
                   for arg in getattr(la, table))
    monkeypatch.setattr(la, table, broken)
    with pytest.raises(AssertionError, match=problem):
        check_nodes(file, build(LAUNCH_DIR / file, monkeypatch, given=True))


def test_the_checks_catch_a_broken_launch_file(tmp_path, monkeypatch):
    """A parameter of the wrong type written into the launch file fails the check too."""
    file = 'act.launch.py'
    old = "parameters=parameter_sources([values['params_file']], values, ACT_NODE_ARGUMENTS),"
    new = ("parameters=[*parameter_sources([values['params_file']], values, "
           "ACT_NODE_ARGUMENTS), {'autostart': 'yes'}],")
    text = (LAUNCH_DIR / file).read_text()
    assert old in text
    bad = tmp_path / file
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(AssertionError, match='autostart'):
        check_nodes(file, build(bad, monkeypatch))
