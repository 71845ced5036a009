"""Safety chain: finite check -> joint limits -> max step -> release gate."""

import numpy as np
import pytest

from act_ros.core.contract import GripperSpec, load_contract
from act_ros.core.control.release_gate import GateState, GripperGate, ReleaseGate, ReleaseGateConfig
from act_ros.core.control.safety import SafetyLimits, check_chunk, limit_command

LOWER = np.array([-1.0, -1.0, 0.0])
UPPER = np.array([1.0, 1.0, 1.0])
LIMITS = SafetyLimits(LOWER, UPPER, max_step=np.array([0.1, 0.1, 0.5]))
HERE = np.zeros(3)


def on_gripper(gate, index=2, closed=0.0, opened=1.0):
    """``gate`` on the gripper at ``index`` (closed and open positions in its units)."""
    return (GripperGate(index, GripperSpec(f'g{index}', closed, opened), gate),)


@pytest.mark.parametrize('command, measured, expected, limited, stepped', [
    ([0.05, -0.05, 0.2], [0, 0, 0], [0.05, -0.05, 0.2], [0, 0, 0], [0, 0, 0]),
    ([0.5, 0.0, 0.0], [0, 0, 0], [0.1, 0.0, 0.0], [0, 0, 0], [1, 0, 0]),
    ([2.0, 0.0, 0.0], [0.95, 0, 0], [1.0, 0.0, 0.0], [1, 0, 0], [0, 0, 0]),
    ([-3.0, 0.0, 1.5], [-0.5, 0, 0.9], [-0.6, 0.0, 1.0], [1, 0, 1], [1, 0, 0]),
])
def test_limits_then_step(command, measured, expected, limited, stepped):
    r = limit_command(np.array(command), np.array(measured, float), LIMITS)
    np.testing.assert_allclose(r.command, expected)
    assert r.limited.tolist() == [bool(x) for x in limited]
    assert r.step_limited.tolist() == [bool(x) for x in stepped]
    assert r.changed == bool(any(limited) or any(stepped))


@pytest.mark.parametrize('command, measured, reason', [
    ([np.nan, 0, 0], [0, 0, 0], 'non-finite command'),
    ([0, np.inf, 0], [0, 0, 0], 'non-finite command'),
    ([0, 0], [0, 0, 0], 'expected 3'),
    ([0, 0, 0], None, 'no measured'),
    ([0, 0, 0], [0, np.nan, 0], 'measured joint position invalid'),
])
def test_rejections_never_produce_a_command(command, measured, reason):
    r = limit_command(np.array(command, float), None if measured is None else np.array(measured, float),
                      LIMITS)
    assert r.rejected and r.command is None and reason in r.reason


def test_chunk_check_counts_violations():
    chunk = np.zeros((5, 3))
    chunk[1, 0] = 1.5
    chunk[2, 2] = -0.2
    chunk[3, 1] = np.nan
    rep = check_chunk(chunk, LIMITS)
    assert (rep.limit_violations, rep.nonfinite_steps, rep.steps) == (2, 1, 5)
    assert rep.violations_per_joint.tolist() == [1, 0, 1]
    assert rep.max_excess == pytest.approx(0.5) and not rep.ok
    assert check_chunk(np.zeros((4, 3)), LIMITS).ok
    with pytest.raises(ValueError, match='shape'):
        check_chunk(np.zeros((4, 2)), LIMITS)


def test_gate_applies_last_and_sees_intent_not_step_limited_value():
    gate = ReleaseGate(ReleaseGateConfig(hold_ticks=2))
    pad = np.array([0.3, 0.0, 0.0])
    far = np.array([0.0, 0.0, 0.2])
    measured = np.array([0.0, 0.0, 0.0])
    for _ in range(2):  # grip: gripper commanded closed
        r = limit_command(np.array([0.0, 0.0, 0.0]), measured, LIMITS, grippers=(2,),
                          gates=on_gripper(gate), ee_positions=(far,), pad_position=pad)
    assert gate.state is GateState.HOLDING
    r = limit_command(np.array([0.05, 0.0, 1.0]), measured, LIMITS, grippers=(2,),
                      gates=on_gripper(gate), ee_positions=(far,), pad_position=pad)
    assert r.command[2] == 0.0 and r.gates[0].suppressed_release
    assert 'release suppressed' in r.reason
    assert r.command[0] == pytest.approx(0.05)
    near = pad + np.array([0.0, 0.0, 0.05])
    r = limit_command(np.array([0.0, 0.0, 1.0]), measured, LIMITS, grippers=(2,),
                      gates=on_gripper(gate), ee_positions=(near,), pad_position=pad)
    # Released near the pad: the opening itself still respects the step limit (0.5/tick).
    assert gate.state is GateState.RELEASED and r.command[2] == pytest.approx(0.5)


def test_limits_validation_and_contract_limits():
    with pytest.raises(ValueError, match='below'):
        SafetyLimits(np.array([1.0]), np.array([0.0]), max_step=0.1)
    with pytest.raises(ValueError, match='max_step'):
        SafetyLimits(LOWER, UPPER, max_step=0.0)
    c = load_contract()
    lim = SafetyLimits(c.lower, c.upper, max_step=0.2)
    assert lim.num_joints == 6 and lim.max_step.shape == (6,)


def test_blocked_gripper_gets_the_full_closed_command_within_a_few_ticks():
    """Fingers stopped by a grasped object stay at 0.6 however hard they are commanded. The
    gripper is rate-limited against its previous command, so the command still reaches
    0 (full grip force under position control) and holds it; against the measured
    position it would stay at measured - max_step = 0.5 for good (a weak grip)."""
    limits = SafetyLimits(LOWER, UPPER, max_step=np.array([0.1, 0.1, 0.1]))
    measured = np.array([0.0, 0.0, 0.6])            # fingers blocked by the object
    previous = np.array([0.0, 0.0, 1.0])            # was open
    sent = []
    for _ in range(12):
        r = limit_command(np.array([0.0, 0.0, -0.3]), measured, limits, grippers=(2,),
                          previous_command=previous)
        previous = r.command
        sent.append(float(r.command[2]))
    np.testing.assert_allclose(sent[:10], [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0],
                               atol=1e-12)
    assert sent[10:] == [0.0, 0.0]
    # The reference without a previous command (an episode start): the measured position.
    r = limit_command(np.array([0.0, 0.0, 0.0]), measured, limits, grippers=(2,))
    assert r.command[2] == pytest.approx(0.5)
    # The arm joints stay limited against their measured positions.
    r = limit_command(np.array([0.5, 0.0, 0.0]), measured, limits, grippers=(2,),
                      previous_command=np.array([0.45, 0.0, 0.0]))
    assert r.command[0] == pytest.approx(0.1)


def test_each_gripper_is_rate_limited_against_its_own_previous_command():
    """Two arms, a gripper each (joints 1 and 3): both grippers step from their previous
    commands, the arm joints (0 and 2) from their measured positions."""
    limits = SafetyLimits(np.array([-1.0, 0.0, -1.0, 0.0]), np.array([1.0, 1.0, 1.0, 1.0]),
                          max_step=0.1)
    measured = np.array([0.0, 0.6, 0.0, 0.2])  # fingers blocked on objects
    previous = np.array([0.0, 1.0, 0.0, 0.0])
    sent = []
    for _ in range(4):
        r = limit_command(np.array([0.5, 0.0, -0.5, 1.0]), measured, limits, grippers=(1, 3),
                          previous_command=previous)
        previous = r.command
        sent.append(r.command.copy())
    sent = np.array(sent)
    np.testing.assert_allclose(sent[:, 1], [0.9, 0.8, 0.7, 0.6])  # from 1.0, not from 0.6
    np.testing.assert_allclose(sent[:, 3], [0.1, 0.2, 0.3, 0.4])  # from 0.0, not from 0.2
    np.testing.assert_allclose(sent[:, 0], 0.1)  # measured + max_step, every tick
    np.testing.assert_allclose(sent[:, 2], -0.1)
    # Only the joints named grippers are: without them, every joint is held to measured.
    r = limit_command(np.array([0.5, 0.0, -0.5, 1.0]), measured, limits, previous_command=previous)
    np.testing.assert_allclose(r.command, [0.1, 0.5, -0.1, 0.3])


def test_one_gate_per_gripper_each_in_its_units_and_near_its_own_end_effector():
    """Gripper 1 in 0-100 closing toward 100 (closed 100, open 0), gripper 3 normalized.
    Each gate holds its own object: a release passes only for the gripper whose end
    effector is near the pad, and the held one gets its own closed position (100)."""
    limits = SafetyLimits(np.array([-1.0, 0.0, -1.0, 0.0]), np.array([1.0, 100.0, 1.0, 1.0]),
                          max_step=np.array([0.1, 200.0, 0.1, 2.0]))
    config = ReleaseGateConfig(hold_ticks=2, empty_opening=0.05)  # evidence: the opening
    gates = (on_gripper(ReleaseGate(config), 1, closed=100.0, opened=0.0)[0],
             on_gripper(ReleaseGate(config), 3)[0])
    pad = np.array([0.3, 0.0, 0.0])
    near, far = pad + [0.0, 0.0, 0.05], np.array([0.0, 0.0, 0.3])
    measured = np.array([0.0, 70.0, 0.0, 0.3])  # both holding an object
    for _ in range(2):  # both commanded closed: 100 and 0 in their units
        r = limit_command(np.array([0.0, 100.0, 0.0, 0.0]), measured, limits, grippers=(1, 3),
                          gates=gates, ee_positions=(far, near), pad_position=pad)
    assert [g.gate.state for g in gates] == [GateState.HOLDING, GateState.HOLDING]
    # Both ask to open (0 and 1 in their units): the far one is held closed at 100.
    r = limit_command(np.array([0.0, 0.0, 0.0, 1.0]), measured, limits, grippers=(1, 3),
                      gates=gates, ee_positions=(far, near), pad_position=pad)
    assert r.command[1] == 100.0 and r.command[3] == 1.0
    assert [d.suppressed_release for d in r.gates] == [True, False]
    assert [g.gate.state for g in gates] == [GateState.HOLDING, GateState.RELEASED]
    assert 'release suppressed (g1)' in r.reason
    # The gate reads the measured opening in the gripper's units: 100 is closed on nothing.
    for _ in range(config.empty_ticks):
        limit_command(np.array([0.0, 100.0, 0.0, 1.0]), np.array([0.0, 100.0, 0.0, 1.0]),
                      limits, grippers=(1, 3), gates=gates, ee_positions=(far, near),
                      pad_position=pad)
    assert gates[0].gate.state is GateState.FREE and gates[0].gate.objects_lost == 1
    with pytest.raises(ValueError, match='end-effector positions'):
        limit_command(np.zeros(4), measured, limits, grippers=(1, 3), gates=gates,
                      ee_positions=(far,))
