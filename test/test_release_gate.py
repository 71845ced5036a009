"""Release gate transitions (docs/architecture.md section 6) as a table."""

import numpy as np
import pytest

from act_ros.core.release_gate import GateState, ReleaseGate, ReleaseGateConfig, gripper_gates

PAD = np.array([0.25, 0.10, 0.0])
NEAR = PAD + np.array([0.03, -0.02, 0.06])   # 0.07 m away
FAR = PAD + np.array([0.20, 0.0, 0.1])       # 0.22 m away


def run(commands, positions, config=None):
    gate = ReleaseGate(config or ReleaseGateConfig())
    out = []
    for cmd, pos in zip(commands, positions):
        d = gate.apply(cmd, pos, PAD)
        out.append((d.command, d.state, d.suppressed_release))
    return gate, out


def test_free_passes_everything_until_held():
    gate, out = run([1.0, 0.95, 0.5, 1.0], [FAR] * 4)
    assert [o[0] for o in out] == [1.0, 0.95, 0.5, 1.0]
    assert gate.state is GateState.FREE  # one closed tick is not a grip (hold_ticks = 3)


def test_holding_suppresses_far_release_and_intermediate_values():
    cmds = [0.0, 0.0, 0.0, 1.0, 0.6, 0.95]
    gate, out = run(cmds, [FAR] * len(cmds))
    assert out[2][1] is GateState.HOLDING
    assert [o[0] for o in out[3:]] == [0.0, 0.0, 0.0]
    assert [o[2] for o in out[3:]] == [True, False, True]
    assert gate.suppressed_releases == 2 and gate.state is GateState.HOLDING


def test_release_near_pad_passes_and_stays_released():
    cmds = [0.1, 0.1, 0.1, 0.95, 0.2, 1.0]
    pos = [FAR, FAR, FAR, NEAR, FAR, FAR]
    gate, out = run(cmds, pos)
    assert out[3] == (0.95, GateState.RELEASED, False)
    assert [o[0] for o in out[4:]] == [0.2, 1.0]
    gate.reset()
    assert gate.state is GateState.FREE


@pytest.mark.parametrize('ee, passes', [
    (PAD + np.array([0.0, 0.0, 0.099]), True),
    (PAD + np.array([0.0, 0.0, 0.101]), False),
    (None, False),
    (np.array([np.nan, 0.0, 0.0]), False),
])
def test_radius_boundary_and_unknown_positions(ee, passes):
    gate = ReleaseGate()
    for _ in range(3):
        gate.apply(0.0, ee, PAD)
    d = gate.apply(1.0, ee, PAD)
    assert (d.command == 1.0) is passes and d.suppressed_release is (not passes)


def test_disabled_gate_passes_everything():
    gate, out = run([0.0] * 4 + [1.0], [FAR] * 5, ReleaseGateConfig(enabled=False))
    assert out[-1][0] == 1.0


@pytest.mark.parametrize('kwargs', [dict(release_radius_m=0), dict(release_threshold=1.5),
                                    dict(hold_ticks=0), dict(closed_command=0.95),
                                    dict(hold_threshold=0.95)])
def test_invalid_config(kwargs):
    with pytest.raises(ValueError):
        ReleaseGateConfig(**kwargs)


def test_an_empty_gripper_returns_the_gate_to_free():
    """Fingers measured closed on nothing while HOLDING: the object was lost (or never
    grasped); there is nothing to release, so the gate frees the gripper to grasp again."""
    gate = ReleaseGate(ReleaseGateConfig(hold_ticks=2, empty_opening=0.05, empty_ticks=3))
    far, pad = np.array([0.0, 0.0, 0.3]), np.array([0.3, 0.0, 0.0])
    for _ in range(2):
        gate.apply(0.0, far, pad, measured_gripper=0.6)
    assert gate.state is GateState.HOLDING
    # Holding an object (opening 0.6): an open request far away is suppressed.
    assert gate.apply(1.0, far, pad, measured_gripper=0.6).command == 0.0
    # The object slips out: the fingers close to 0.02; two ticks are not enough ...
    for _ in range(2):
        assert gate.apply(1.0, far, pad, measured_gripper=0.02).suppressed_release
    assert gate.state is GateState.HOLDING
    # ... the third is: FREE, and the open request passes.
    decision = gate.apply(1.0, far, pad, measured_gripper=0.02)
    assert gate.state is GateState.FREE and decision.command == 1.0
    assert gate.objects_lost == 1
    # An unknown measured opening never frees the gripper.
    gate = ReleaseGate(ReleaseGateConfig(hold_ticks=1, empty_ticks=1))
    gate.apply(0.0, far, pad)
    for _ in range(5):
        assert gate.apply(1.0, far, pad, measured_gripper=None).command == 0.0
    assert gate.state is GateState.HOLDING


@pytest.mark.parametrize('overrides, message', [
    ({'empty_opening': 0.95}, 'empty_opening'),
    ({'empty_opening': -0.1}, 'empty_opening'),
    ({'empty_ticks': 0}, 'empty_ticks'),
])
def test_empty_gripper_settings_are_validated(overrides, message):
    with pytest.raises(ValueError, match=message):
        ReleaseGateConfig(**overrides)


def test_one_gate_per_gripper_none_without_gripper_or_with_the_gate_off():
    from dataclasses import replace

    from act_ros.core.contract import load_contract
    from act_ros.core.control import release_gates

    aloha = load_contract('robots/aloha/contract.yaml')
    gates = gripper_gates(aloha, ReleaseGateConfig())
    assert [(g.index, g.name) for g in gates] == [(6, 'left_arm_gripper'), (13, 'right_arm_gripper')]
    assert gates[0].gate is not gates[1].gate  # each its own state
    assert gripper_gates(aloha, ReleaseGateConfig(enabled=False)) == ()
    assert gripper_gates(replace(aloha, grippers=()), ReleaseGateConfig()) == ()
    # Forward kinematics without a model of the arm: the gates are off, and why is told.
    told = []
    assert release_gates(aloha, ReleaseGateConfig(), off=told.append) == ((), [])
    assert len(told) == 1 and 'no robot model' in told[0]
    # The package arm: its gate with the end effector from the contract's URDF.
    gates, ees = release_gates(load_contract(), ReleaseGateConfig(), off=told.append)
    assert len(gates) == len(ees) == 1 and len(told) == 1
    with pytest.raises(ValueError, match='ee_pose_topic is one end effector'):
        release_gates(aloha, ReleaseGateConfig(), ee_source='topic')
