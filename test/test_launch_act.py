"""launch/act.launch.py and config/act.yaml.

`launch` and `launch_ros` are not installable from the Python package index, so the launch
file is checked by parsing it: every launch argument it uses is declared with a
description, every executable is a console script of setup.py, every parameter file
exists. Which parameters it passes, and in which order, is computed by
act_ros.ros.launch_arguments and tested in test_launch_parameters.py. Where `launch_ros`
is importable the description is also built. The parameters file is loaded by a real node
to check it matches the declarations.
"""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'act.launch.py'
PARAMS_FILE = ROOT / 'config' / 'act.yaml'
REQUIRED_ARGUMENTS = {'params_file', 'model_path', 'device', 'namespace', 'use_sim_time',
                      'log_level'}
NODE_KEY = '/**/act_node'


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    def callee(node: ast.Call) -> str:
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ''
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and callee(n) == name]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _string(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@pytest.fixture(scope='module')
def launch_tree() -> ast.Module:
    return ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))


def console_scripts() -> dict[str, str]:
    """name -> 'module:function' from setup.py's entry_points."""
    tree = ast.parse((ROOT / 'setup.py').read_text())
    scripts = {}
    for call in _calls(tree, 'setup'):
        entry_points = _keyword(call, 'entry_points')
        if isinstance(entry_points, ast.Dict):
            for key, value in zip(entry_points.keys, entry_points.values):
                if _string(key) == 'console_scripts':
                    for item in ast.literal_eval(value):
                        name, _, target = item.partition('=')
                        scripts[name.strip()] = target.strip()
    return scripts


def test_one_generate_launch_description(launch_tree):
    names = [n.name for n in launch_tree.body if isinstance(n, ast.FunctionDef)]
    assert names.count('generate_launch_description') == 1


def used_arguments(tree: ast.AST) -> set[str]:
    """Launch arguments a launch file reads: ``LaunchConfiguration('x')``, ``values['x']``
    in its launch_setup, and those of the act_ros.ros.launch_arguments tables it imports
    (each sets the parameter of its name when given)."""
    from act_ros.ros import launch_arguments

    used = {_string(c.args[0]) for c in _calls(tree, 'LaunchConfiguration')}
    used |= {_string(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)
             and isinstance(n.value, ast.Name) and n.value.id == 'values'}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == 'act_ros.ros.launch_arguments':
            for alias in node.names:
                table = getattr(launch_arguments, alias.name)
                if alias.name.endswith('_ARGUMENTS'):
                    used |= {arg.name for arg in table}
                elif alias.name == 'sim_parameters':
                    used |= {arg.name for arg in (*launch_arguments.SIM_BRIDGE_ARGUMENTS,
                                                  *launch_arguments.SIM_ACT_NODE_ARGUMENTS)}
    for node in tree.body:  # module constants naming arguments, e.g. RVIZ_ARGUMENTS
        if isinstance(node, ast.Assign) and node.targets[0].id.endswith('_ARGUMENTS'):
            used |= set(ast.literal_eval(node.value))
    return used - {None}


def test_arguments_are_declared_with_descriptions_and_all_used(launch_tree):
    declared = {}
    for call in _calls(launch_tree, 'DeclareLaunchArgument'):
        name = _string(call.args[0]) if call.args else _string(_keyword(call, 'name'))
        assert name, f'line {call.lineno}: argument name must be a string literal'
        description = _keyword(call, 'description')
        text = ast.literal_eval(description) if description is not None else ''
        assert isinstance(text, str) and len(text) > 10, f"'{name}' has no description"
        declared[name] = call
    used = used_arguments(launch_tree)
    assert REQUIRED_ARGUMENTS <= set(declared), REQUIRED_ARGUMENTS - set(declared)
    assert used <= set(declared), f'used but not declared: {used - set(declared)}'
    assert set(declared) <= used, f'declared but never used: {set(declared) - used}'


def test_executables_are_console_scripts_of_this_package(launch_tree):
    nodes = _calls(launch_tree, 'LifecycleNode') + _calls(launch_tree, 'Node')
    assert nodes
    package = package_name()
    scripts = console_scripts()
    for call in nodes:
        assert _string(_keyword(call, 'package')) == package
        executable = _string(_keyword(call, 'executable'))
        assert executable in scripts, (
            f"executable '{executable}' is not a console script in setup.py "
            f'(have {sorted(scripts)})')
        module, _, function = scripts[executable].partition(':')
        assert callable(getattr(importlib.import_module(module), function))


def package_name() -> str:
    """The package name from package.xml."""
    import xml.etree.ElementTree as ET
    return ET.parse(ROOT / 'package.xml').getroot().findtext('name')


def test_parameter_files_exist_and_are_installed(launch_tree):
    files = []
    for call in _calls(launch_tree, 'PathJoinSubstitution'):
        parts = call.args[0].elts
        find = parts[0]
        assert isinstance(find, ast.Call) and _calls(find, 'FindPackageShare')
        assert _string(find.args[0]) == package_name()
        files.append(Path(*[_string(p) for p in parts[1:]]))
    assert Path('config/act.yaml') in files
    for path in files:
        assert (ROOT / path).is_file(), f'{path} named in the launch file does not exist'
    setup = (ROOT / 'setup.py').read_text()
    assert "_files('config/*.yaml')" in setup and "_files('launch/*.launch.py')" in setup


def test_topics_are_parameters_not_remappings(launch_tree):
    """A topic given as a launch argument sets the node's topic parameter (so it wins over
    a params file that renames the topic), never a remapping of the default name."""
    for call in _calls(launch_tree, 'LifecycleNode') + _calls(launch_tree, 'Node'):
        assert _keyword(call, 'remappings') is None


def test_params_file_mirrors_the_declared_parameters():
    from act_ros.core.contract import load_contract
    from act_ros.ros.node.parameters import parameter_specs

    data = yaml.safe_load(PARAMS_FILE.read_text())
    assert list(data) == [NODE_KEY]
    params = _flatten(data[NODE_KEY]['ros__parameters'])
    names = {s.name for s in parameter_specs(load_contract())}
    assert set(params) <= names, f'unknown parameters in act.yaml: {set(params) - names}'
    documented = set(params) | _commented_keys(PARAMS_FILE.read_text())
    missing = sorted(n for n in names if n not in documented and n != 'contract_path')
    assert not missing, f'parameters neither set nor documented in act.yaml: {missing}'


def _commented_keys(text: str) -> set[str]:
    """Parameter names written as ``# name: value`` lines (documented, left at default),
    under the mapping keys they are indented in (``release_gate.empty_effort``)."""
    import re

    keys, sections = set(), []  # sections: (indent, key) of the mappings enclosing a line
    for line in text.splitlines():
        commented = re.match(r'^(\s*)#\s*([a-z_][\w.]*):', line)
        plain = re.match(r'^(\s*)([A-Za-z_/*][\w./*]*):\s*(#.*)?$', line)
        match = commented or plain
        if not match:
            continue
        indent = len(match.group(1))
        sections = [(i, k) for i, k in sections if i < indent]
        if commented:
            path = [k for _, k in sections]
            inner = path[path.index('ros__parameters') + 1:] if 'ros__parameters' in path else []
            keys.add('.'.join([*inner, match.group(2)]))
        else:
            sections.append((indent, match.group(2)))
    return keys


def _flatten(tree: dict, prefix: str = '') -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f'{prefix}{key}.'))
        else:
            out[f'{prefix}{key}'] = value
    return out


@pytest.mark.ros
def test_params_file_loads_into_the_node(ros_domain_id):
    rclpy = pytest.importorskip('rclpy')
    from rclpy.lifecycle import TransitionCallbackReturn

    from act_ros.ros.node.act_node import ActNode
    from act_ros.ros.node.parameters import get_value

    context = rclpy.context.Context()
    rclpy.init(context=context, domain_id=ros_domain_id,
               args=['--ros-args', '--params-file', str(PARAMS_FILE)])
    try:
        node = ActNode(context=context, namespace='arm')  # the /** key matches namespaces
        # Speed limits left to the URDF: neither limit is set by the file.
        assert get_value(node, 'max_joint_velocity') is None
        assert get_value(node, 'max_joint_step') is None
        assert node.get_parameter('cameras.top.topic').value == 'camera/top/image_raw'
        assert node._parameter_errors == []
        # Everything in the file validates; only the checkpoint is missing.
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.last_configure_error.startswith('model_path is not set')
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def test_launch_description_builds_where_launch_ros_is_installed():
    pytest.importorskip('launch_ros', reason='launch/launch_ros are not on PyPI: they come with a '
                        'ROS 2 install; without one the file is parsed and checked above')
    from launch.actions import DeclareLaunchArgument

    spec = importlib.util.spec_from_file_location('act_launch', LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    names = {e.name for e in description.entities if isinstance(e, DeclareLaunchArgument)}
    assert REQUIRED_ARGUMENTS <= names


# ---- RViz: rviz:=true, launch/rviz.launch.py, rviz/act.rviz -------------------------------

RVIZ_LAUNCH = ROOT / 'launch' / 'rviz.launch.py'
RVIZ_CONFIG = ROOT / 'rviz' / 'act.rviz'


def _declared_arguments(tree: ast.AST) -> dict[str, ast.Call]:
    return {_string(c.args[0]): c for c in _calls(tree, 'DeclareLaunchArgument')}


def test_rviz_argument_includes_the_rviz_launch_file_only_when_asked(launch_tree):
    declared = _declared_arguments(launch_tree)
    assert _string(_keyword(declared['rviz'], 'default_value')) == 'false'
    include, = _calls(launch_tree, 'IncludeLaunchDescription')
    condition = _keyword(include, 'condition')
    assert _calls(condition, 'IfCondition') and \
        _string(_calls(condition, 'LaunchConfiguration')[0].args[0]) == 'rviz'
    path = _calls(include, 'PathJoinSubstitution')[0].args[0].elts
    assert [_string(p) for p in path[1:]] == ['launch', 'rviz.launch.py']
    # Every argument it passes is one the included file declares.
    passed = {_string(k) for k in _keyword(include, 'launch_arguments').func.value.keys} - {None}
    passed |= next(set(ast.literal_eval(n.value)) for n in launch_tree.body
                   if isinstance(n, ast.Assign) and n.targets[0].id == 'RVIZ_ARGUMENTS')
    rviz_tree = ast.parse(RVIZ_LAUNCH.read_text())
    assert set(passed) <= set(_declared_arguments(rviz_tree)), passed


def test_rviz_launch_file_runs_rviz_with_the_installed_config():
    tree = ast.parse(RVIZ_LAUNCH.read_text(), filename=str(RVIZ_LAUNCH))
    declared = _declared_arguments(tree)
    assert all(len(ast.literal_eval(_keyword(c, 'description'))) > 10 for c in declared.values())
    used = {_string(c.args[0]) for c in _calls(tree, 'LaunchConfiguration')}
    assert used == set(declared), (used, set(declared))
    nodes = {_string(_keyword(c, 'package')): c for c in _calls(tree, 'Node')}
    assert set(nodes) == {'rviz2', 'robot_state_publisher'}
    assert _string(_keyword(nodes['rviz2'], 'executable')) == 'rviz2'
    args = _keyword(nodes['rviz2'], 'arguments').elts
    assert _string(args[0]) == '-d' and _string(args[1].args[0]) == 'rviz_config'
    default = _calls(_keyword(declared['rviz_config'], 'default_value'), 'PathJoinSubstitution')
    parts = default[0].args[0].elts
    assert _string(parts[0].args[0]) == package_name()
    assert Path(*[_string(p) for p in parts[1:]]) == Path('rviz/act.rviz')
    assert RVIZ_CONFIG.is_file()
    assert "_files('rviz/*.rviz')" in (ROOT / 'setup.py').read_text()
    # The robot model it publishes is the package URDF, gripper normalized (see below).
    assert 'display_description()' in RVIZ_LAUNCH.read_text()


def test_rviz_config_shows_what_the_node_publishes():
    from act_ros.core.contract import load_contract
    from act_ros.ros.node.parameters import camera_topic_param, parameter_specs
    from act_ros.ros.node.visualization import (
        END_EFFECTOR,
        GATE_TEXT,
        MARKERS_TOPIC,
        PATH_TOPIC,
        PLANNED_GRIPPER,
        REGION,
    )

    config = yaml.safe_load(RVIZ_CONFIG.read_text())['Visualization Manager']
    defaults = {s.name: s.default for s in parameter_specs(load_contract())}
    assert config['Global Options']['Fixed Frame'] == defaults['visualization.frame_id']
    displays = {d['Class'].split('/')[-1]: [] for d in config['Displays']}
    for d in config['Displays']:
        displays[d['Class'].split('/')[-1]].append(d)
    model, = displays['RobotModel']
    assert model['Description Source'] == 'Topic'
    # robot_state_publisher latches robot_description; so does act_node its two topics.
    assert model['Description Topic']['Value'] == '/robot_description'
    assert model['Description Topic']['Durability Policy'] == 'Transient Local'
    path, = displays['Path']
    markers, = displays['MarkerArray']
    for display, topic in ((path, PATH_TOPIC), (markers, MARKERS_TOPIC)):
        assert display['Topic']['Value'] == topic.replace('~', '/act_node')
        assert display['Topic']['Durability Policy'] == 'Transient Local'
        assert display['Topic']['Reliability Policy'] == 'Reliable'
    assert set(markers['Namespaces']) == {REGION, END_EFFECTOR, PLANNED_GRIPPER, GATE_TEXT}
    cameras = {d['Topic']['Value'] for d in displays['Image']}
    assert cameras == {'/' + defaults[camera_topic_param(c)] for c in ('top', 'wrist')}
    assert all(d['Topic']['Reliability Policy'] == 'Best Effort' for d in displays['Image'])


def test_display_description_moves_the_fingers_by_the_normalized_gripper():
    """joint_states carries the gripper normalized (0..1); robot_state_publisher gets a
    joint of that name the two fingers follow, scaled by their travel, and the arm as is."""
    import xml.etree.ElementTree as ET

    import numpy as np
    import pinocchio

    from act_ros.core.control.kinematics import default_urdf_path
    from act_ros.ros.robot_description import display_description

    text = display_description()
    joints = {j.get('name'): j for j in ET.fromstring(text).findall('joint')}
    original = {j.get('name'): j for j in ET.parse(default_urdf_path()).getroot().findall('joint')}
    travel = float(original['gripper'].find('limit').get('upper'))
    assert travel == pytest.approx(0.025)
    gripper = joints['gripper']
    assert gripper.get('type') == 'prismatic' and gripper.find('mimic') is None
    assert (gripper.find('limit').get('lower'), gripper.find('limit').get('upper')) == ('0', '1')
    for finger in ('gripper_finger', 'gripper_mirror'):
        mimic = joints[finger].find('mimic')
        assert mimic.get('joint') == 'gripper'
        assert float(mimic.get('multiplier')) == pytest.approx(travel)
        assert float(mimic.get('offset')) == 0.0
    assert joints['gripper_finger'].find('child').get('link') == 'finger_left_link'
    # The arm is unchanged: the same end-effector placement for the same arm joints.
    arm = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll']
    models = [pinocchio.buildModelFromUrdf(str(default_urdf_path())),
              pinocchio.buildModelFromXML(text)]
    q_arm = np.array([0.3, -0.4, 0.5, -0.2, 0.1])
    placements = []
    for model in models:
        data, q = model.createData(), pinocchio.neutral(model)
        for name, value in zip(arm, q_arm):
            q[model.joints[model.getJointId(name)].idx_q] = value
        pinocchio.forwardKinematics(model, data, q)
        placements.append(pinocchio.updateFramePlacement(model, data,
                                                         model.getFrameId('ee_link')))
    np.testing.assert_allclose(placements[0].homogeneous, placements[1].homogeneous,
                               atol=1e-12)
