"""The example arms of ``config/robots/`` driven by act_node over real topics: an ALOHA-style
bimanual arm (14 joints, two grippers) and an SO-101 (degrees, a gripper in 0-100).

Each runs with its own contract and node parameter file as shipped, and a randomly
initialised LeRobot ACT checkpoint built for that contract (its joints, cameras and
units). The checkpoint's action statistics pin every gripper's request to fully open while
the harness measures each gripper closed: the commands must ramp each gripper open by at
most one tick's step (the file's ``max_joint_velocity`` over the contract's fps) from its
own previous command (the safety chain's gripper rule), while every arm joint stays within
one step of its measured position.
"""

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')

from rclpy.parameter import Parameter  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.core.paths import config_path  # noqa: E402
from act_ros.ros.harness import POSTPROCESSOR_STATS, RobotHarness, spinning, wait_until  # noqa: E402
from act_ros.ros.node.act_node import ActNode  # noqa: E402

ARMS = ('aloha', 'so101')
COMMANDS = 12
# Bounds on waiting for what must come (a busy 2-core machine), not speed requirements.
WAIT_S = 180.0


def arm_files(arm: str):
    return config_path(f'robots/{arm}/contract.yaml'), config_path(f'robots/{arm}/act.yaml')


def node_params(arm: str) -> dict:
    data = yaml.safe_load(arm_files(arm)[1].read_text())
    return data['/**/act_node']['ros__parameters']


@pytest.fixture(scope='module', params=ARMS)
def arm(request, module_tmp):
    """(name, contract, checkpoint) with every gripper's request pinned to open."""
    from safetensors.torch import load_file, save_file

    from act_ros.core.inference.checkpoint import create_checkpoint, read_policy_config

    name = request.param
    contract = load_contract(arm_files(name)[0])
    path = create_checkpoint(module_tmp(name) / 'act', contract=contract, preset='tiny',
                             image_size=(48, 64))
    config = read_policy_config(path)
    assert config.output_features['action'].shape == (contract.num_joints,)
    assert sorted(config.image_features) == sorted(contract.image_features)
    stats = load_file(str(path / POSTPROCESSOR_STATS))
    for i, gripper in zip(contract.gripper_indices, contract.grippers):
        stats['action.mean'][i] = gripper.open
        stats['action.std'][i] = 1e-6  # whatever the model says: open
    save_file(stats, str(path / POSTPROCESSOR_STATS))
    return name, contract, str(path)


def measured_state(contract) -> np.ndarray:
    """Arm joints at distinct places inside their limits, every gripper closed."""
    lower, upper = contract.lower, contract.upper
    state = lower + (upper - lower) * np.linspace(0.3, 0.7, contract.num_joints)
    for i, gripper in zip(contract.gripper_indices, contract.grippers):
        state[i] = gripper.closed
    return state


def make_node(context, arm: str, checkpoint: str, **params) -> ActNode:
    """act_node with the arm's parameter file, as a user starts it (``--params-file``)."""
    values = {'model_path': checkpoint, 'autostart': False, 'torch_threads': 1,
              'backend': 'torch', 'execution': 'sync', 'n_action_steps': 1,
              'max_obs_age_s': 2.0, 'diagnostics_period_s': 0.2, **params}
    return ActNode(context=context,
                   cli_args=['--ros-args', '--params-file', str(arm_files(arm)[1])],
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def test_example_arm_commands_every_joint_and_each_gripper_by_its_rule(rclpy_context, arm):
    name, contract, checkpoint = arm
    # The file's speed limit per second, one tick's worth at the contract's rate.
    step = float(node_params(name)['max_joint_velocity'][0]) / contract.fps
    state = measured_state(contract)
    image = np.random.default_rng(3).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    node = make_node(rclpy_context, name, checkpoint)
    harness = RobotHarness(context=rclpy_context, cameras=contract.camera_names,
                           joints=dict(zip(contract.joint_names, state)), image=image)
    with spinning(rclpy_context, node, harness):
        assert node.start(), node.last_configure_error
        assert node.robot_model_warning == ''  # the files turn both features off
        assert node.contract.joint_names == contract.joint_names  # from the parameter file
        assert node.settings.control_rate_hz == contract.fps  # the default: the contract's
        assert wait_until(lambda: len(harness.commands_since(0.0)) >= COMMANDS, WAIT_S), \
            f'expected {COMMANDS} commands, got {len(harness.commands_since(0.0))}'
        assert wait_until(lambda: harness.latest_diagnostics() is not None, WAIT_S)
        diagnostics = harness.latest_diagnostics()[2]
    commands = harness.commands_since(0.0)
    grippers = list(contract.gripper_indices)
    arm_joints = [i for i in range(contract.num_joints) if i not in grippers]
    previous = None
    for cmd in commands:
        assert list(cmd.joint_names) == list(contract.joint_names)
        assert cmd.positions.shape == (contract.num_joints,)
        assert np.all(np.isfinite(cmd.positions))
        assert np.all(cmd.positions >= contract.lower) and np.all(cmd.positions <= contract.upper)
        assert np.all(np.abs(cmd.positions[arm_joints] - state[arm_joints]) <= step + 1e-9)
        # Each gripper steps from its previous command (from its measured position after a
        # tick without a command: a slow machine), toward open.
        for i, gripper in zip(grippers, contract.grippers):
            moved = abs(cmd.positions[i] - state[i])
            if previous is not None:
                moved = min(moved, abs(cmd.positions[i] - previous[i]))
            assert moved <= step + 1e-9, (contract.joint_names[i], cmd.positions[i])
            assert gripper.opening(cmd.positions[i]) > 0.0
        previous = cmd.positions
    # Each gripper went further than one step from where it is measured: its rule is
    # against its previous command (fingers blocked on an object still close fully).
    last = commands[-1].positions
    for i, gripper in zip(grippers, contract.grippers):
        assert abs(last[i] - gripper.closed) > step + 1e-9, (contract.joint_names[i], last[i])
    # Both files turn the release gate off (no pad in these tasks; no robot model).
    assert diagnostics['gate_state'] == 'off'


def test_features_without_a_robot_model_turn_off_and_configure_goes_on(rclpy_context, arm):
    """The gate and the planned path need forward kinematics; these contracts name no URDF:
    both turn off, with the reason on /diagnostics, and the node still commands."""
    name, contract, checkpoint = arm
    node = make_node(rclpy_context, name, checkpoint, **{'release_gate.enabled': True,
                                                        'visualization.enabled': True})
    state = measured_state(contract)
    harness = RobotHarness(context=rclpy_context, cameras=contract.camera_names,
                           joints=dict(zip(contract.joint_names, state)),
                           image=np.zeros((48, 64, 3), dtype=np.uint8))
    with spinning(rclpy_context, node, harness):
        assert node.start(), node.last_configure_error
        assert node.loop.gates == ()
        assert 'no robot model' in node.io.visualizer.fk_error
        # One warning for both, naming why.
        assert node.robot_model_warning.startswith(
            'release gate and planned path off: no robot model: the contract')
        assert wait_until(lambda: len(harness.commands_since(0.0)) >= 2, WAIT_S)
        assert wait_until(lambda: harness.latest_diagnostics() is not None, WAIT_S)
        diagnostics = harness.latest_diagnostics()[2]
    assert diagnostics['gate_state'] == 'off'
    assert 'no path: no robot model' in diagnostics['visualization']


def test_an_ee_frame_parameter_names_one_end_effector(rclpy_context, arm):
    """One gripper: the parameter names its end effector (configure goes on; no model here,
    so the gate is off). Two grippers: configure fails with one line saying why."""
    name, contract, checkpoint = arm
    node = make_node(rclpy_context, name, checkpoint, ee_frame='ee_link')
    try:
        if len(contract.grippers) == 1:
            assert node.start(), node.last_configure_error
        else:
            assert not node.start()
            assert ("ee_frame: 'ee_link' names one end effector; the contract has 2 grippers"
                    in node.last_configure_error)
    finally:
        node.destroy_node()
