"""The grip in the simulator under the node's safety chain: full force, no tumbling.

The scripted expert's commands are passed through the same chain the node applies
(joint limits, max step, release gate) with the gripper rate-limited against its previous
command, as :class:`act_ros.core.control.loop.ControlLoop` does. While the box is carried the
fingers must squeeze it with the full closed command's force and the box must not turn
in them. The reference run limits the gripper against its measured (blocked) position,
the behaviour this replaced, and shows the weak grip it gave.
"""

import math

import numpy as np
import pytest

pytest.importorskip('mujoco')

from act_ros.core.control.release_gate import ReleaseGateConfig, gripper_gates  # noqa: E402
from act_ros.core.control.safety import SafetyLimits, limit_command  # noqa: E402
from act_ros.sim import PortPickAlignEnv, ScriptedExpert, SimConfig  # noqa: E402
from act_ros.sim.config import GRIPPER_EMPTY_EFFORT_N  # noqa: E402
from act_ros.sim.ik import gripper_yaw  # noqa: E402
from act_ros.sim.metrics import summarize_results, wrap_angle  # noqa: E402

pytestmark = pytest.mark.sim


@pytest.fixture(scope='module')
def env():
    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as environment:
        yield environment


def _carry_through_the_safety_chain(env, seed, *, against_previous_command):
    expert = ScriptedExpert(env)
    contract = env.contract
    limits = SafetyLimits(contract.lower, contract.upper, max_step=0.1)
    gate = gripper_gates(contract, ReleaseGateConfig(empty_effort=GRIPPER_EMPTY_EFFORT_N))
    obs = env.reset(seed=seed)
    expert.reset(obs)
    previous = None
    forces, relative_yaws, commands, efforts = [], [], [], []
    finger_actuators = [env.model.actuator(n).id for n in ('gripper', 'gripper_mirror')]
    while not env.done:
        action = expert.act(obs)
        result = limit_command(action, obs.joint_positions, limits,
                               grippers=contract.gripper_indices, gates=gate,
                               ee_positions=(obs.ee_position,), pad_position=obs.pad_pose[:3],
                               previous_command=previous if against_previous_command else None,
                               measured_effort=obs.joint_efforts)
        previous = result.command
        lifted = obs.box_pose[2] - env.config.box_size_m / 2 > 0.02
        if expert.phase in ('lift', 'carry') and lifted:
            forces.append(float(np.min(np.abs(env.data.actuator_force[finger_actuators]))))
            efforts.append(float(obs.joint_efforts[env.gripper_index]))
            _, rotation = expert.ik.forward(obs.joint_positions[env.arm_index])
            relative_yaws.append(wrap_angle(obs.box_pose[3] - gripper_yaw(rotation)))
            commands.append(float(result.command[env.gripper_index]))
        obs = env.step(result.command)
    if against_previous_command:
        # The gripper's effort (what sim_bridge publishes) says the fingers hold the box:
        # the gate, which takes it as evidence, never thought the gripper empty.
        assert efforts and max(abs(e) for e in efforts) > 2.0 * GRIPPER_EMPTY_EFFORT_N
        assert all(abs(e) > GRIPPER_EMPTY_EFFORT_N for e in efforts), efforts
        assert gate[0].gate.objects_lost == 0
    return env.evaluate(), np.array(forces), np.unwrap(np.array(relative_yaws) * 4) / 4, commands


def test_the_gripper_effort_tells_an_empty_close(env):
    """Closed on nothing the fingers push nothing: within two ticks the gripper's effort is
    below the gate's threshold (GRIPPER_EMPTY_EFFORT_N), where closed on the box it is
    about 2.9 N (above)."""
    obs = env.reset(seed=4)
    efforts = []
    for _ in range(8):
        target = obs.joint_positions.copy()
        target[env.gripper_index] = 0.0
        obs = env.step(target)
        efforts.append(float(obs.joint_efforts[env.gripper_index]))
    assert obs.joint_positions[env.gripper_index] < 0.01
    assert all(abs(e) < GRIPPER_EMPTY_EFFORT_N for e in efforts[1:]), efforts


@pytest.mark.parametrize('seed', [0, 7])
def test_a_carried_box_is_squeezed_with_full_force_and_does_not_turn(env, seed):
    result, forces, relative_yaw, commands = _carry_through_the_safety_chain(
        env, seed, against_previous_command=True)
    assert result.success, result
    assert len(forces) > 20
    assert commands and max(commands) == 0.0            # the full closed command
    # Position control: force = kp x error, here 200 N/m x 0.6 x 25 mm = 3 N per finger.
    assert np.median(forces) > 2.5 and forces.min() > 2.0
    assert math.degrees(np.ptp(relative_yaw)) < 2.0     # the box kept its place in the fingers
    assert result.max_lifted_tilt_deg < 5.0 and summarize_results([result])['tumbles'] == 0

    # The replaced behaviour: the gripper limited against its blocked, measured position
    # is commanded about measured - 0.1 and squeezes with a sixth of the force.
    _, weak, _, weak_commands = _carry_through_the_safety_chain(
        env, seed, against_previous_command=False)
    assert np.median(weak_commands) > 0.4
    assert np.median(weak) < 1.0
