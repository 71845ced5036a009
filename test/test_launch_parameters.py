"""Which parameter sources the launch files pass, and in which order
(act_ros.ros.launch_arguments): the user's params file wins over the launch file's
defaults, a launch argument wins over the file only when it is given.

`launch`/`launch_ros` are not installable here, so the launch files compute their nodes'
``parameters=`` lists with one pure function, tested here; the lists then go to a real
node the way launch_ros hands them over (each file, and each dict written to a file under
``/**``, as ``--params-file`` in order; the last one wins in rcl). What this does not
cover: ``ros2 launch`` itself (the substitution of the launch arguments' values, the
process it starts); test_launch_build.py checks that every launch file builds its nodes
with these functions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from act_ros.ros.launch_arguments import (
    ACT_NODE_ARGUMENTS,
    RECORD_NODE_ARGUMENTS,
    SIM_ACT_NODE_ARGUMENTS,
    SIM_BRIDGE_ARGUMENTS,
    file_parameters,
    parameter_sources,
    sim_mode,
    sim_parameters,
)

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / 'launch'
TABLES = {
    ('act.launch.py', 'act_node'): ACT_NODE_ARGUMENTS,
    ('record.launch.py', 'record_node'): RECORD_NODE_ARGUMENTS,
    ('sim.launch.py', 'sim_bridge'): SIM_BRIDGE_ARGUMENTS,
    ('sim.launch.py', 'act_node'): SIM_ACT_NODE_ARGUMENTS,
}


def declared_defaults(launch_file: str) -> dict[str, object]:
    """Launch argument -> its default_value (a string literal, or None for another
    expression), read from the file."""
    tree = ast.parse((LAUNCH / launch_file).read_text())
    out = {}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, 'id', '') == 'DeclareLaunchArgument':
            default = next((k.value for k in call.keywords if k.arg == 'default_value'), None)
            out[call.args[0].value] = (default.value if isinstance(default, ast.Constant)
                                       else None)
    return out


def node_specs(executable: str) -> dict[str, object]:
    import types

    from act_ros.core.contract import load_contract
    from act_ros.ros.node.parameters import parameter_specs
    from act_ros.ros.recording.record_node import record_parameters
    from act_ros.ros.sim_bridge.params import BRIDGE_PARAMETERS

    contract = load_contract()
    specs = {'act_node': parameter_specs(contract), 'record_node': record_parameters(contract),
             'sim_bridge': BRIDGE_PARAMETERS}[executable]
    use_sim_time = types.SimpleNamespace(name='use_sim_time', default=False, choices=())
    return {s.name: s for s in [*specs, use_sim_time]}


@pytest.mark.parametrize('where', list(TABLES), ids=lambda w: f'{w[0]}:{w[1]}')
def test_every_argument_is_declared_not_given_by_default_and_sets_a_declared_parameter(where):
    """Each launch argument that sets a parameter defaults to '' (not given: nothing
    passed) and sets a parameter the node declares, converted to its declared type."""
    launch_file, executable = where
    defaults = declared_defaults(launch_file)
    specs = node_specs(executable)
    for arg in TABLES[where]:
        assert defaults.get(arg.name, 'undeclared') == '', (launch_file, arg.name)
        spec = specs[arg.parameter]
        expected = type(spec.default) if spec.default is not None else str
        assert arg.type_ is expected, (arg.name, arg.type_, expected)


@pytest.mark.parametrize('where', list(TABLES), ids=lambda w: f'{w[0]}:{w[1]}')
def test_an_argument_not_given_passes_nothing(where):
    values = {arg.name: '' for arg in TABLES[where]}
    assert parameter_sources(['my_file.yaml'], values, TABLES[where]) == ['my_file.yaml']


def test_a_given_argument_comes_after_the_file_in_its_type():
    values = {'params_file': 'my_arm.yaml', 'autostart': 'false', 'device': 'cpu',
              'use_sim_time': 'True', 'top_image_topic': '/cam/top', 'model_path': ''}
    assert parameter_sources(['my_arm.yaml'], values, ACT_NODE_ARGUMENTS) == [
        'my_arm.yaml', {'device': 'cpu', 'autostart': False, 'use_sim_time': True,
                        'cameras.top.topic': '/cam/top'}]
    assert parameter_sources(['r.yaml'], {'max_episode_s': '20', 'output': '/d'},
                             RECORD_NODE_ARGUMENTS) == ['r.yaml', {'output': '/d',
                                                                   'max_episode_s': 20.0}]
    for args, bad, line in ((ACT_NODE_ARGUMENTS, {'autostart': 'maybe'},
                             "launch argument autostart:='maybe': expected true or false"),
                            (SIM_BRIDGE_ARGUMENTS, {'seed': '1.5'},
                             "launch argument seed:='1.5': expected an integer"),
                            (RECORD_NODE_ARGUMENTS, {'max_episode_s': 'long'},
                             "launch argument max_episode_s:='long': expected a number")):
        with pytest.raises(ValueError) as err:
            parameter_sources([], bad, args)
        assert str(err.value) == line


def _rcl_arguments(sources: list, tmp_path: Path) -> list[str]:
    """The ROS arguments launch_ros gives a node for ``parameters=sources``: a file as it
    is, a dict written to a file under ``/**``, each as ``--params-file``, in order."""
    args = ['--ros-args']
    for i, source in enumerate(sources):
        if isinstance(source, dict):
            path = tmp_path / f'launch_params_{i}.yaml'
            path.write_text(yaml.safe_dump({'/**': {'ros__parameters': source}}))
            source = str(path)
        args += ['--params-file', str(source)]
    return args


def _my_arm(tmp_path: Path, checkpoint: Path, **params) -> Path:
    path = tmp_path / 'my_arm.yaml'
    path.write_text(yaml.safe_dump({'/**/act_node': {'ros__parameters': {
        'model_path': str(checkpoint), 'backend': 'torch', 'execution': 'async', **params}}}))
    return path


def _act_launch_values(**given) -> dict[str, str]:
    """act.launch.py's launch arguments as ros2 launch has them: every declared default,
    with ``given`` on top."""
    defaults = declared_defaults('act.launch.py')
    return {k: (v if isinstance(v, str) else '') for k, v in defaults.items()} | given


@pytest.mark.ros
@pytest.mark.parametrize('given, expected', [({}, False), ({'autostart': 'true'}, True)])
def test_autostart_false_in_the_users_params_file_survives_act_launch(
        given, expected, tmp_path, tiny_checkpoint, ros_domain_id):
    """docs/deployment.md: under a lifecycle manager set ``autostart: false``. The launch
    argument left out, the file's false reaches the node; given, the argument wins."""
    rclpy = pytest.importorskip('rclpy')
    from act_ros.ros.node.act_node import ActNode

    my_arm = _my_arm(tmp_path, tiny_checkpoint, autostart=False, device='cpu')
    values = _act_launch_values(params_file=str(my_arm), **given)
    sources = parameter_sources([values['params_file']], values, ACT_NODE_ARGUMENTS)
    assert sources == ([str(my_arm)] if not given else [str(my_arm), {'autostart': True}])
    context = rclpy.context.Context()
    rclpy.init(context=context, domain_id=ros_domain_id, args=_rcl_arguments(sources, tmp_path))
    try:
        node = ActNode(context=context)
        assert node.autostart is expected
        assert node.get_parameter('device').value == 'cpu'  # the file's, not 'auto'
        assert node.lifecycle_state == 'unconfigured'
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


@pytest.mark.ros
def test_the_console_script_waits_for_its_lifecycle_manager(tmp_path, tiny_checkpoint,
                                                            ros_domain_id):
    """The act_node process launched with act.launch.py's sources for ``params_file:=
    my_arm.yaml`` alone stays unconfigured (no command, nothing loaded) until a lifecycle
    manager configures it: asked over its ~/get_state and ~/change_state services."""
    import os

    rclpy = pytest.importorskip('rclpy')
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState, GetState

    my_arm = _my_arm(tmp_path, tiny_checkpoint, autostart=False, torch_threads=1)
    values = _act_launch_values(params_file=str(my_arm))
    sources = parameter_sources([values['params_file']], values, ACT_NODE_ARGUMENTS)
    env = {**os.environ, 'ROS_DOMAIN_ID': str(ros_domain_id), 'PYTHONPATH': str(ROOT)}
    log = tmp_path / 'act_node.log'
    with log.open('w') as out:
        proc = subprocess.Popen([sys.executable, '-m', 'act_ros.ros.node.act_node',
                                 *_rcl_arguments(sources, tmp_path)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    context = rclpy.context.Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    node = rclpy.create_node('lifecycle_manager_stand_in', context=context)
    from rclpy.executors import SingleThreadedExecutor

    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        get_state = node.create_client(GetState, '/act_node/get_state')
        change = node.create_client(ChangeState, '/act_node/change_state')

        def call(client, request):
            assert client.wait_for_service(timeout_sec=60.0), log.read_text()[-3000:]
            future = client.call_async(request)
            executor.spin_until_future_complete(future, timeout_sec=60.0)
            return future.result()

        time.sleep(3.0)  # long enough for an autostart to have begun
        assert call(get_state, GetState.Request()).current_state.label == 'unconfigured'
        assert 'configured: model' not in log.read_text()
        request = ChangeState.Request()
        request.transition.id = Transition.TRANSITION_CONFIGURE
        assert call(change, request).success, log.read_text()[-3000:]
        assert call(get_state, GetState.Request()).current_state.label == 'inactive'
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown(context=context)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- sim.launch.py: defaults lose to the files, the pairing is set last ----------------------

def _sim_values(**given) -> dict[str, str]:
    defaults = declared_defaults('sim.launch.py')
    return {k: (v if isinstance(v, str) else '') for k, v in defaults.items()} | given


def _merged(sources: list) -> dict:
    """What a node ends up with from ``sources`` (later wins), files read."""
    out: dict = {}
    for source in sources:
        out.update(source if isinstance(source, dict) else
                   file_parameters(source, '/sim_bridge') | file_parameters(source, '/act_node'))
    return out


def test_sim_launch_defaults_to_lockstep_and_sim_time_with_no_file():
    bridge, act = sim_parameters(_sim_values(), act_files=[''], bridge_files=[''])
    assert _merged(bridge) == {'mode': 'lockstep', 'autostart': True,
                               'policy_reset_service': 'act_node/reset'}
    # The bridge publishes the gripper's effort: the gate's evidence of an empty close.
    assert _merged(act) == {'use_sim_time': True, 'trigger': 'observation', 'execution': 'sync',
                            'pad_source': 'topic', 'pad_pose_topic': 'pad_pose',
                            'autostart': True, 'release_gate.empty_effort': 1.0}


def test_sim_launch_files_win_over_its_defaults_and_given_arguments_over_the_files(tmp_path):
    bridge_file = tmp_path / 'bridge.yaml'
    bridge_file.write_text(yaml.safe_dump({'sim_bridge': {'ros__parameters': {
        'mode': 'realtime', 'seed': 7, 'image_height': 96, 'image_width': 128}}}))
    act_file = tmp_path / 'act.yaml'
    act_file.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        'use_sim_time': False, 'mode': 'ensemble', 'execution': 'async',
        'release_gate': {'empty_effort': 2.0}}}}))
    files = {'act_files': [str(act_file)], 'bridge_files': [str(bridge_file)]}
    bridge, act = sim_parameters(_sim_values(), **files)
    assert _merged(bridge)['mode'] == 'realtime' and _merged(bridge)['seed'] == 7
    merged = _merged(act)
    assert (merged['use_sim_time'], merged['mode'], merged['trigger'], merged['execution']) == (
        False, 'ensemble', 'timer', 'async')  # realtime: the file's execution stays
    assert merged['release_gate.empty_effort'] == 2.0
    bridge, act = sim_parameters(_sim_values(mode='lockstep', seed='3', use_sim_time='true',
                                             policy_mode='chunk'), **files)
    assert (_merged(bridge)['mode'], _merged(bridge)['seed']) == ('lockstep', 3)
    merged = _merged(act)
    assert (merged['use_sim_time'], merged['mode'], merged['trigger'], merged['execution']) == (
        True, 'chunk', 'observation', 'sync')  # lock-step needs both, whatever the file says


@pytest.mark.parametrize('key, namespace, applies', [
    ('sim_bridge', '', True), ('/sim_bridge', '', True), ('/**/sim_bridge', 'arm', True),
    ('/**', 'arm', True), ('/arm/sim_bridge', 'arm', True), ('/arm/sim_bridge', '', False),
    ('/*/sim_bridge', 'arm', True), ('act_node', '', False), ('/sim_*', '', True),
])
def test_a_params_file_section_applies_as_rcl_matches_node_names(key, namespace, applies,
                                                                tmp_path):
    path = tmp_path / 'p.yaml'
    path.write_text(yaml.safe_dump({key: {'ros__parameters': {'mode': 'realtime'}}}))
    assert sim_mode({}, [str(path)], namespace) == ('realtime' if applies else 'lockstep')


def test_the_packaged_files_equal_the_declared_defaults():
    """sim.launch.py's empty act_params_file and bridge_params_file mean the nodes' own
    defaults, which config/act.yaml and config/sim_bridge.yaml write out."""
    for path, executable in (('config/act.yaml', 'act_node'),
                             ('config/sim_bridge.yaml', 'sim_bridge')):
        specs = node_specs(executable)
        values = file_parameters(str(ROOT / path), f'/{executable}')
        assert values and all(values[k] == specs[k].default for k in values), path
