"""Joint speed limits in physical units (act_ros.core.control.speed_limits): from the URDF, from
max_joint_velocity, from the deprecated per-tick max_joint_step, refused above the URDF,
and the same speed at any control rate through the safety chain."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from act_ros.core.contract import load_contract
from act_ros.core.control.kinematics import default_urdf_path
from act_ros.core.control.safety import SafetyLimits, limit_command
from act_ros.core.control.speed_limits import (
    DEFAULT_ARM_SPEED,
    DEFAULT_GRIPPER_TRAVEL_S,
    resolve_speed_limits,
    urdf_velocity_limits,
)
from act_ros.core.paths import config_path

CONTRACT = load_contract()
GRIPPER = CONTRACT.gripper_indices[0]


def package_arm(**kwargs):
    kwargs.setdefault('period_s', 1.0 / 30)
    kwargs.setdefault('urdf_path', default_urdf_path())
    return resolve_speed_limits(CONTRACT.joint_names, CONTRACT.lower, CONTRACT.upper,
                                grippers=(GRIPPER,), **kwargs)


def write_urdf(path: Path) -> Path:
    """A two-joint arm and a prismatic gripper of 4 cm travel at 2 cm/s, a mimic finger,
    and a joint whose velocity limit is 0 (none given)."""
    path.write_text("""<?xml version="1.0"?>
<robot name="two">
  <link name="base"/><link name="a"/><link name="b"/><link name="f"/><link name="g"/>
  <joint name="j1" type="revolute"><parent link="base"/><child link="a"/>
    <limit lower="-1" upper="1" effort="1" velocity="2.0"/></joint>
  <joint name="j2" type="revolute"><parent link="a"/><child link="b"/>
    <limit lower="-1" upper="1" effort="1" velocity="0"/></joint>
  <joint name="grip" type="prismatic"><parent link="b"/><child link="f"/>
    <limit lower="0" upper="0.04" effort="1" velocity="0.02"/></joint>
  <joint name="grip_mirror" type="prismatic"><parent link="b"/><child link="g"/>
    <limit lower="0" upper="0.04" effort="1" velocity="9.0"/><mimic joint="grip"/></joint>
</robot>
""")
    return path


def test_the_package_urdf_gives_the_default_speeds():
    urdf = urdf_velocity_limits(default_urdf_path())
    limits = package_arm()
    assert limits.sources == ('urdf',) * CONTRACT.num_joints and not limits.deprecation
    for i, name in enumerate(CONTRACT.joint_names):
        if i != GRIPPER:
            assert limits.speed[i] == urdf[name].velocity  # rad/s as the URDF gives them
    # The gripper: the finger's m/s over its travel, in the contract's normalized range.
    finger = urdf[CONTRACT.gripper_joints[0]]
    assert limits.speed[GRIPPER] == pytest.approx(
        finger.velocity / (finger.upper - finger.lower) * (CONTRACT.upper[GRIPPER]
                                                           - CONTRACT.lower[GRIPPER]))
    line = limits.line(1.0 / 30)
    assert 'URDF' in line and str(default_urdf_path()) in line and 'per tick' in line


def test_a_gripper_speed_is_scaled_from_its_urdf_travel_and_missing_limits_default(tmp_path):
    urdf = write_urdf(tmp_path / 'two.urdf')
    assert set(urdf_velocity_limits(urdf)) == {'j1', 'grip'}  # no 0, no mimic
    # Contract: j1, j2, an unknown joint, the gripper normalized 0..1.
    names = ('j1', 'j2', 'elsewhere', 'grip')
    limits = resolve_speed_limits(names, [-1, -1, -1, 0], [1, 1, 1, 1], grippers=(3,),
                                  period_s=0.02, urdf_path=urdf)
    np.testing.assert_allclose(limits.speed, [2.0, DEFAULT_ARM_SPEED, DEFAULT_ARM_SPEED, 0.5])
    assert limits.sources == ('urdf', 'default', 'default', 'urdf')
    np.testing.assert_allclose(limits.per_tick(0.02), limits.speed * 0.02)


def test_without_a_urdf_arm_joints_and_grippers_take_the_conservative_defaults():
    aloha = load_contract(config_path('robots/aloha/contract.yaml'))
    grips = list(aloha.gripper_indices)  # both grippers
    assert len(grips) == 2
    # The package's URDF names none of these joints: nothing comes from it.
    for urdf in (None, default_urdf_path()):
        limits = resolve_speed_limits(aloha.joint_names, aloha.lower, aloha.upper,
                                      grippers=grips, period_s=0.02, urdf_path=urdf)
        assert set(limits.sources) == {'default'} and limits.urdf_path == ''
        arm = [i for i in range(aloha.num_joints) if i not in grips]
        np.testing.assert_allclose(limits.speed[arm], DEFAULT_ARM_SPEED)
        for grip in grips:
            assert limits.speed[grip] == pytest.approx(
                (aloha.upper[grip] - aloha.lower[grip]) / DEFAULT_GRIPPER_TRAVEL_S)


@pytest.mark.parametrize('kwargs, words', [
    # Above the URDF's 3 rad/s, per joint and for the scaled gripper.
    (dict(velocity=[3.0, 3.0, 3.0, 3.0, 4.5, 3.0]),
     "max_joint_velocity is above the robot model's <limit velocity>"),
    (dict(velocity=[3.0, 3.0, 3.0, 3.0, 3.0, 3.5]), 'gripper 3.5 > 3'),
    (dict(velocity=[3.0, 3.0, 3.0, 3.0, 4.5, 3.0]), 'wrist_roll 4.5 > 3'),
    # The old default 0.1 per tick is 10 rad/s at 100 Hz.
    (dict(step_per_tick=[0.1], period_s=0.01),
     'max_joint_step [0.1] per tick at 100 Hz is above'),
    (dict(step_per_tick=[0.05], velocity=[1.5]),
     'max_joint_step is deprecated and replaced by max_joint_velocity'),
    (dict(velocity=[1.0, 2.0]), 'max_joint_velocity: expected 1 or 6 positive values'),
    (dict(velocity=[float('nan')]), 'max_joint_velocity: expected 1 or 6 positive values'),
    (dict(step_per_tick=[-0.1]), 'max_joint_step: expected 1 or 6 positive values per tick'),
])
def test_refused_with_one_line(kwargs, words):
    with pytest.raises(ValueError) as info:
        package_arm(**kwargs)
    assert words in str(info.value) and '\n' not in str(info.value)


def test_the_per_tick_step_is_converted_with_a_warning_naming_its_replacement():
    limits = package_arm(step_per_tick=[0.05])
    np.testing.assert_allclose(limits.speed, 1.5)  # 0.05 rad per tick at 30 Hz
    assert limits.sources == ('max_joint_step',) * CONTRACT.num_joints
    assert 'max_joint_step is deprecated' in limits.deprecation
    assert 'max_joint_velocity: [1.5]' in limits.deprecation
    np.testing.assert_allclose(limits.per_tick(1.0 / 30), 0.05)


def test_a_missing_urdf_is_one_line():
    with pytest.raises(FileNotFoundError, match='URDF'):
        package_arm(urdf_path='/nonexistent/robot.urdf')


def travel(rate_hz: float, seconds: float, speeds) -> np.ndarray:
    """Where an arm that reaches each command within the tick (measured = the previous
    command) is after ``seconds`` at ``rate_hz``, every joint asked to go from its lower
    limit to its upper one, through the safety chain."""
    period = 1.0 / rate_hz
    limits = SafetyLimits(CONTRACT.lower, CONTRACT.upper, max_step=speeds.per_tick(period))
    position = CONTRACT.lower
    previous = None
    for _ in range(int(round(seconds * rate_hz))):
        result = limit_command(CONTRACT.upper, position, limits, grippers=(GRIPPER,),
                               previous_command=previous)
        previous = position = result.command
    return position - CONTRACT.lower


def test_the_same_joint_speed_at_30_and_100_hz():
    """0.3 s toward far targets: every joint moves speed x 0.3 s at both rates (the old
    default of 0.1 per tick moved 0.9 rad at 30 Hz and 3 rad at 100 Hz)."""
    for speeds in (package_arm(), package_arm(velocity=[1.2])):
        at_30, at_100 = travel(30.0, 0.3, speeds), travel(100.0, 0.3, speeds)
        np.testing.assert_allclose(at_30, speeds.speed * 0.3, rtol=1e-9)
        np.testing.assert_allclose(at_100, speeds.speed * 0.3, rtol=1e-9)
    old_30 = travel(30.0, 0.3, package_arm(step_per_tick=[0.1]))
    old_100 = travel(100.0, 0.3, resolve_speed_limits(
        CONTRACT.joint_names, CONTRACT.lower, CONTRACT.upper, grippers=(GRIPPER,),
        step_per_tick=[0.1], period_s=0.01))  # no URDF: 10 rad/s is not refused
    assert old_100[0] == pytest.approx(old_30[0] * 100 / 30)


def test_the_evaluator_uses_the_node_files_speeds(tmp_path):
    """The closed-loop evaluator takes the node's limits from the same file: the package's
    act.yaml leaves them to the URDF (0.1 per tick at 30 Hz), the ALOHA file's 5 rad/s are
    0.1 per tick at its 50 Hz, and a file over the URDF is refused naming the file."""
    from act_ros.training.evaluation.rollout import SafetySettings

    package = SafetySettings.from_node_config(CONTRACT)
    np.testing.assert_allclose(package.limits.max_step, 3.0 / 30)
    aloha = load_contract(config_path('robots/aloha/contract.yaml'))
    settings = SafetySettings.from_node_config(aloha, config_path('robots/aloha/act.yaml'))
    np.testing.assert_allclose(settings.limits.max_step, 5.0 / 50)
    path = tmp_path / 'fast.yaml'
    path.write_text(yaml.safe_dump({'/**/act_node': {'ros__parameters': {
        'control_rate_hz': 100.0, 'max_joint_step': [0.1]}}}))
    with pytest.raises(ValueError, match=f'{path}: max_joint_step'):
        SafetySettings.from_node_config(CONTRACT, path)
