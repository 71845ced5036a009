"""Release gate transitions (docs/architecture.md section 6) as a table."""

import numpy as np
import pytest

from act_ros.core.release_gate import GateState, ReleaseGate, ReleaseGateConfig

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
