"""Release gate transitions (docs/architecture.md section 6) as a table."""

import numpy as np
import pytest

from act_ros.core.control.release_gate import GateState, ReleaseGate, ReleaseGateConfig, gripper_gates

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


def hold_then(gate, opening, effort=None, ticks=10):
    """Grip (HOLDING), then ask to open far from the pad for ``ticks`` ticks with the
    fingers measured at ``opening`` and ``effort``; the commands sent."""
    far, pad = np.array([0.0, 0.0, 0.3]), np.array([0.3, 0.0, 0.0])
    for _ in range(gate.config.hold_ticks):
        gate.apply(0.0, far, pad, measured_gripper=opening, measured_effort=effort)
    assert gate.state is GateState.HOLDING
    return [gate.apply(1.0, far, pad, measured_gripper=opening, measured_effort=effort).command
            for _ in range(ticks)]


THIN = 0.02  # a 2 mm object in a gripper opening 100 mm


def test_a_thin_object_stays_gated_without_evidence_of_an_empty_gripper():
    """By default the opening alone never frees the gate: fingers on a 2 mm card measure
    as closed as fingers on nothing, so a closed gripper counts as holding."""
    gate = ReleaseGate()
    assert hold_then(gate, THIN, ticks=50) == [0.0] * 50
    assert gate.state is GateState.HOLDING and gate.objects_lost == 0
    assert hold_then(ReleaseGate(), 0.0, ticks=50) == [0.0] * 50  # even fully closed
    assert 'always counts as holding' in ReleaseGateConfig().evidence()


def test_the_effort_tells_a_thin_object_from_nothing():
    config = ReleaseGateConfig(empty_effort=1.0, empty_ticks=3)
    # On the 2 mm object the fingers push (2.9, in the joint's units, either sign): held.
    for effort in (2.9, -2.9):
        gate = ReleaseGate(config)
        assert hold_then(gate, THIN, effort) == [0.0] * 10
        assert gate.state is GateState.HOLDING
    # Closed on nothing: no effort; after empty_ticks ticks FREE, the open request passes.
    gate = ReleaseGate(config)
    assert hold_then(gate, 0.0, 0.01, ticks=4) == [0.0, 0.0, 1.0, 1.0]
    assert gate.state is GateState.FREE and gate.objects_lost == 1
    # The effort decides where it is known, whatever the opening (and the opening option).
    gate = ReleaseGate(ReleaseGateConfig(empty_effort=1.0, empty_opening=0.05))
    assert hold_then(gate, 0.0, 2.9) == [0.0] * 10
    # A message without an effort (None, NaN): the opening option, else never.
    gate = ReleaseGate(ReleaseGateConfig(empty_effort=1.0, empty_opening=0.05, empty_ticks=1))
    assert hold_then(gate, 0.0, float('nan'), ticks=1) == [1.0]
    gate = ReleaseGate(config)
    assert hold_then(gate, 0.0, None) == [0.0] * 10
    assert 'effort is below 1' in config.evidence()


def test_the_opt_in_thickness_frees_only_below_it():
    """empty_opening: the opening of the thinnest object the user picks (here 3 mm of
    100): a 2 mm object would be taken for nothing (the user's assumption), a 5 mm one is
    held, and a close on nothing frees the gate."""
    config = ReleaseGateConfig(empty_opening=0.03, empty_ticks=2)
    gate = ReleaseGate(config)
    assert hold_then(gate, 0.05) == [0.0] * 10
    gate = ReleaseGate(config)
    assert hold_then(gate, 0.0, ticks=3) == [0.0, 1.0, 1.0]
    assert gate.objects_lost == 1
    assert 'opening < 0.03' in config.evidence()


@pytest.mark.parametrize('overrides, message', [
    ({'empty_opening': 0.95}, 'empty_opening'),
    ({'empty_opening': -0.1}, 'empty_opening'),
    ({'empty_opening': 0.0}, 'empty_opening'),
    ({'empty_effort': 0.0}, 'empty_effort'),
    ({'empty_effort': float('nan')}, 'empty_effort'),
    ({'empty_ticks': 0}, 'empty_ticks'),
])
def test_empty_gripper_settings_are_validated(overrides, message):
    with pytest.raises(ValueError, match=message):
        ReleaseGateConfig(**overrides)


def test_one_gate_per_gripper_none_without_gripper_or_with_the_gate_off():
    from dataclasses import replace

    from act_ros.core.contract import load_contract
    from act_ros.core.control.loop import release_gates

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


def test_the_simulated_evaluation_takes_the_gripper_effort_as_evidence(tmp_path):
    """The in-process evaluator's gate (the node's file, config/act.yaml) takes the
    simulated gripper's effort as evidence of an empty close unless the file sets one."""
    import yaml

    from act_ros.core.contract import load_contract
    from act_ros.core.control.loop import SafetySettings
    from act_ros.sim.config import GRIPPER_EMPTY_EFFORT_N
    from act_ros.training.evaluation.rollout import sim_safety

    contract = load_contract()
    assert sim_safety(contract).gate.empty_effort == GRIPPER_EMPTY_EFFORT_N
    # The node's own reading of the file implies no effort evidence: a real arm's joint
    # states may carry none.
    assert SafetySettings.from_node_config(contract).gate.empty_effort is None
    path = tmp_path / 'act.yaml'
    path.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        'release_gate': {'empty_effort': 0.3, 'empty_opening': 0.02}}}}))
    gate = sim_safety(contract, path).gate
    assert (gate.empty_effort, gate.empty_opening) == (0.3, 0.02)
