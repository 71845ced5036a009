"""launch/sim.launch.py and config/sim_bridge.yaml.

`launch`/`launch_ros` are not installable from the Python package index, so the launch
file is checked by parsing it: every launch argument is declared with a description and
used, every executable is a console script of setup.py, every parameter it sets is one
the node declares (the parameter lists come from act_ros.ros.launch_arguments.
sim_parameters, whose order is tested in test_launch_parameters.py). The parameter file
is loaded by a real bridge node. Where `launch_ros` is importable the description is also
built.
"""

import ast
import importlib.util
from pathlib import Path

import pytest
import yaml

pytest.importorskip('rclpy')

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.ros.node.parameters import parameter_specs  # noqa: E402
from act_ros.ros.sim_bridge.params import BRIDGE_PARAMETERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'sim.launch.py'
BRIDGE_YAML = ROOT / 'config' / 'sim_bridge.yaml'
REQUIRED_ARGUMENTS = {'model_path', 'mode', 'policy_mode', 'seed', 'episodes', 'image_height',
                      'image_width', 'use_sim_time', 'device', 'namespace'}


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ''


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _callee(n) == name]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _string(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@pytest.fixture(scope='module')
def tree() -> ast.Module:
    return ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))


def node_calls(tree) -> dict[str, ast.Call]:
    """executable -> the Node/LifecycleNode call."""
    calls = _calls(tree, 'Node') + _calls(tree, 'LifecycleNode')
    return {_string(_keyword(c, 'executable')): c for c in calls}


def console_scripts() -> set[str]:
    setup = ast.parse((ROOT / 'setup.py').read_text())
    scripts = set()
    for call in _calls(setup, 'setup'):
        entry_points = _keyword(call, 'entry_points')
        for key, value in zip(entry_points.keys, entry_points.values):
            if _string(key) == 'console_scripts':
                scripts |= {item.partition('=')[0].strip() for item in ast.literal_eval(value)}
    return scripts


def test_arguments_are_declared_with_descriptions_and_all_used(tree):
    from test_launch_act import used_arguments

    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == \
        ['generate_launch_description', 'launch_setup']
    declared = {}
    for call in _calls(tree, 'DeclareLaunchArgument'):
        name = _string(call.args[0])
        assert name, f'line {call.lineno}: argument name must be a string literal'
        text = _string(_keyword(call, 'description')) or ''
        assert len(text) > 10, f"'{name}' has no description"
        declared[name] = call
    used = used_arguments(tree)
    assert REQUIRED_ARGUMENTS <= set(declared), REQUIRED_ARGUMENTS - set(declared)
    assert used == set(declared), (used ^ set(declared))


def test_both_executables_exist_and_get_only_parameters_they_declare(tree):
    from act_ros.ros.launch_arguments import sim_parameters

    nodes = node_calls(tree)
    assert set(nodes) == {'sim_bridge', 'act_node'}
    assert set(nodes) <= console_scripts()
    bridge_names = {spec.name for spec in BRIDGE_PARAMETERS}
    node_names = {spec.name for spec in parameter_specs(load_contract())} | {'use_sim_time'}
    given = {'mode': 'realtime', 'seed': '3', 'episodes': '2', 'image_height': '96',
             'image_width': '128', 'episode_steps': '60', 'lockstep_timeout_s': '1.5',
             'model_path': 'm', 'device': 'cpu', 'policy_mode': 'ensemble',
             'use_sim_time': 'true'}
    bridge, act = sim_parameters(given, act_files=[], bridge_files=[])
    bridge_set = set().union(*(d for d in bridge if isinstance(d, dict)))
    act_set = set().union(*(d for d in act if isinstance(d, dict)))
    assert bridge_set <= bridge_names and act_set <= node_names
    # Lock-step friendly pairing: the bridge resets the policy, the node reads the pad pose.
    assert {'policy_reset_service', 'mode', 'seed'} <= bridge_set
    assert {'trigger', 'pad_source', 'mode'} <= act_set


def test_no_parameter_file_by_default(tree):
    """Empty act_params_file and bridge_params_file: the nodes' own defaults (what
    config/act.yaml and config/sim_bridge.yaml write out, test_launch_parameters.py), so
    that the launch file's lock-step default is not overridden by the bridge's realtime."""
    declared = {_string(c.args[0]): _keyword(c, 'default_value')
                for c in _calls(tree, 'DeclareLaunchArgument')}
    assert _string(declared['act_params_file']) == _string(declared['bridge_params_file']) == ''
    assert not _calls(tree, 'PathJoinSubstitution')


def test_bridge_yaml_matches_the_declarations_and_loads_in_a_real_node(rclpy_context):
    from rclpy.parameter import Parameter

    from act_ros.ros.sim_bridge.bridge import SimBridge

    data = yaml.safe_load(BRIDGE_YAML.read_text())
    params = data['/**/sim_bridge']['ros__parameters']
    specs = {spec.name: spec for spec in BRIDGE_PARAMETERS}
    assert set(params) == set(specs)
    for name, value in params.items():
        assert value == specs[name].default, f'{name}: yaml {value!r} != default'
    bridge = SimBridge(context=rclpy_context, parameter_overrides=[
        Parameter(k, value=v) for k, v in params.items()])
    try:
        assert bridge.settings.mode == 'realtime' and bridge.env.config.episode_steps == 300
    finally:
        bridge.destroy_node()


@pytest.mark.skipif(importlib.util.find_spec('launch_ros') is None,
                    reason='launch/launch_ros are not on PyPI: they come with a ROS 2 install; '
                    'without one the launch file is parsed and checked by the tests above')
def test_launch_description_builds():
    spec = importlib.util.spec_from_file_location('sim_launch', LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    assert len(description.entities) > len(REQUIRED_ARGUMENTS)


def test_policy_inputs_name_topics_of_the_bridge(rclpy_context):
    """Lock-step waits for a subscriber on the topics the policy reads: by default the
    joints and both cameras; for a policy on the object poses without cameras, those."""
    from rclpy.parameter import Parameter

    from act_ros.ros.sim_bridge.bridge import SimBridge

    def bridge(value, name):
        return SimBridge(node_name=name, context=rclpy_context, parameter_overrides=[
            Parameter('policy_inputs', value=value), Parameter('image_height', value=32),
            Parameter('image_width', value=32)])

    with pytest.raises(ValueError, match=r"policy_inputs: \['camera/side/image_raw'\] are not "
                       'topics of the bridge'):
        bridge('joint_states,camera/side/image_raw', 'bad_bridge')
    for value, expected in (('', ['joint_states', 'camera/top/image_raw',
                                  'camera/wrist/image_raw']),
                            (' joint_states, box_pose,pad_pose', ['joint_states', 'box_pose',
                                                                  'pad_pose'])):
        node = bridge(value, 'sim_bridge')
        try:
            assert [p.topic_name for p in node.policy_input_pubs] == [f'/{t}' for t in expected]
            assert node.peers()['observation_subscribers'] == 0
        finally:
            node.destroy_node()
