"""Safety chain for joint commands, as pure functions.

Every command passes, in order: finite check -> joint limits -> max step per tick -> release
gate (:mod:`act_ros.core.control.release_gate`, one per gripper). The step per tick is a speed limit
times the control period (:mod:`act_ros.core.control.speed_limits`). The step limit protects the
arm: each arm joint moves at most ``max_step`` from its *measured* position. Each gripper
(an arm has zero, one or several) is rate-limited against its *previous command* instead:
fingers blocked by a grasped object stay open however hard they are commanded, so a limit
relative to where they are would cap the command at ``measured - max_step`` and, under
position control, the grip force with it (the force follows the command error). Against
the previous command, a closing gripper reaches the full closed command within
``1 / max_step`` ticks and holds it.
Each step reports what it changed, so the node can count and publish it. Whole chunks
are also checked against the limits when they arrive (:func:`check_chunk`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from act_ros.core.control.release_gate import GateDecision, GripperGate


@dataclass(frozen=True)
class SafetyLimits:
    """Per-joint position limits and the largest step allowed per control tick."""

    lower: np.ndarray
    upper: np.ndarray
    max_step: np.ndarray

    def __post_init__(self) -> None:
        lower = np.asarray(self.lower, dtype=np.float64).reshape(-1)
        upper = np.asarray(self.upper, dtype=np.float64).reshape(-1)
        step = np.broadcast_to(np.asarray(self.max_step, dtype=np.float64), lower.shape).copy()
        if lower.shape != upper.shape:
            raise ValueError(f'lower has {lower.size} joints, upper has {upper.size}')
        if not np.all(np.isfinite(lower)) or not np.all(np.isfinite(upper)):
            raise ValueError('joint limits must be finite')
        if np.any(lower >= upper):
            raise ValueError(f'every lower limit must be below its upper limit: {lower} vs {upper}')
        if np.any(~np.isfinite(step)) or np.any(step <= 0):
            raise ValueError(f'max_step must be positive and finite per joint, got {step}')
        object.__setattr__(self, 'lower', lower)
        object.__setattr__(self, 'upper', upper)
        object.__setattr__(self, 'max_step', step)

    @property
    def num_joints(self) -> int:
        return int(self.lower.size)


@dataclass(frozen=True)
class SafetyResult:
    """Outcome of the safety chain for one command.

    ``command`` is what may be sent (``None`` when the command was rejected);
    ``limited``/``step_limited`` are boolean masks of the joints that were clamped;
    ``gates``: what each gripper's release gate decided (in the order of the gates given,
    openings 0 closed to 1 open); ``reason`` names the first rejection or change, empty
    when nothing changed.
    """

    command: np.ndarray | None
    requested: np.ndarray
    limited: np.ndarray
    step_limited: np.ndarray
    gates: tuple[GateDecision, ...] = ()
    reason: str = ''

    @property
    def rejected(self) -> bool:
        return self.command is None

    @property
    def changed(self) -> bool:
        return (self.command is None or bool(self.limited.any() or self.step_limited.any())
                or any(decision.changed for decision in self.gates))


@dataclass(frozen=True)
class ChunkReport:
    """Limit check of a whole action chunk (``(T, J)``) when it arrives."""

    steps: int
    nonfinite_steps: int
    limit_violations: int
    violations_per_joint: np.ndarray = field(repr=False)
    max_excess: float

    @property
    def ok(self) -> bool:
        return self.nonfinite_steps == 0 and self.limit_violations == 0


def check_chunk(chunk: np.ndarray, limits: SafetyLimits) -> ChunkReport:
    """Count non-finite steps and limit violations over a whole chunk."""
    chunk = np.asarray(chunk, dtype=np.float64)
    if chunk.ndim != 2 or chunk.shape[1] != limits.num_joints:
        raise ValueError(f'chunk must have shape (T, {limits.num_joints}), got {chunk.shape}')
    finite = np.isfinite(chunk)
    below = np.where(finite, limits.lower - chunk, 0.0)
    above = np.where(finite, chunk - limits.upper, 0.0)
    excess = np.maximum(below, above)
    violating = excess > 0
    return ChunkReport(
        steps=int(chunk.shape[0]),
        nonfinite_steps=int((~finite.all(axis=1)).sum()),
        limit_violations=int(violating.sum()),
        violations_per_joint=violating.sum(axis=0),
        max_excess=float(excess.max(initial=0.0)),
    )


def limit_command(command: np.ndarray, measured: np.ndarray | None, limits: SafetyLimits,
                  *, grippers: Sequence[int] = (), gates: Sequence[GripperGate] = (),
                  ee_positions: Sequence[np.ndarray | None] = (),
                  pad_position: np.ndarray | None = None,
                  previous_command: np.ndarray | None = None,
                  measured_effort: np.ndarray | None = None) -> SafetyResult:
    """Run one command through the whole chain and return what may be sent.

    ``measured`` is the latest measured joint position (contract order); when it is
    ``None`` or not finite the step limit cannot be applied and the command is rejected.
    ``grippers``: the indices of the gripper joints. ``previous_command`` is the command
    sent on the previous tick (``None`` at the start of an episode or after a gap): each
    gripper's step is limited against it, every other joint's against ``measured``;
    without it the grippers too are limited against ``measured``. The gates (one per gated
    gripper, each with the position of its end effector in ``ee_positions``) are applied
    last, to their gripper entries, and only to commands that passed. ``measured_effort``
    (contract order, NaN where unknown; ``None``: no effort at all) is what the gates take
    as evidence of an empty gripper (:meth:`ReleaseGateConfig.is_empty`).
    """
    requested = np.asarray(command, dtype=np.float64).reshape(-1)
    n = limits.num_joints
    no = np.zeros(n, dtype=bool)
    if requested.size != n:
        return SafetyResult(None, requested, no, no,
                            reason=f'command has {requested.size} joints, expected {n}')
    if not np.all(np.isfinite(requested)):
        bad = [int(i) for i in np.flatnonzero(~np.isfinite(requested))]
        return SafetyResult(None, requested, no, no, reason=f'non-finite command at joints {bad}')
    if measured is None:
        return SafetyResult(None, requested, no, no, reason='no measured joint position')
    measured = np.asarray(measured, dtype=np.float64).reshape(-1)
    if measured.size != n or not np.all(np.isfinite(measured)):
        return SafetyResult(None, requested, no, no,
                            reason=f'measured joint position invalid (size {measured.size}, '
                                   f'finite {bool(np.all(np.isfinite(measured)))})')

    clamped = np.clip(requested, limits.lower, limits.upper)
    limited = clamped != requested
    if len(ee_positions) != len(gates):
        raise ValueError(f'{len(gates)} gates need as many end-effector positions, '
                         f'got {len(ee_positions)}')
    reference = measured.copy()
    if previous_command is not None:
        previous = np.asarray(previous_command, dtype=np.float64).reshape(-1)
        for i in grippers:
            if previous.size == n and np.isfinite(previous[i]):
                reference[i] = previous[i]
    lo = reference - limits.max_step
    hi = reference + limits.max_step
    stepped = np.clip(clamped, lo, hi)
    step_limited = stepped != clamped
    reasons = []
    if limited.any():
        reasons.append(f'joint limits at {[int(i) for i in np.flatnonzero(limited)]}')
    if step_limited.any():
        reasons.append(f'max step at {[int(i) for i in np.flatnonzero(step_limited)]}')

    decisions = []
    for gated, ee_position in zip(gates, ee_positions):
        # The gate judges the policy's intent (the limited request, before the step limit):
        # an open request that the step limit spreads over several ticks is still an open
        # request. A passed command keeps its step limit; the gate's closed command is a
        # grip and is sent as is (a held object must never loosen).
        i, gripper = gated.index, gated.gripper
        decision = gated.gate.apply(gripper.opening(clamped[i]), ee_position, pad_position,
                                    measured_gripper=gripper.opening(measured[i]),
                                    measured_effort=_entry(measured_effort, i, n))
        if decision.changed:
            stepped[i] = np.clip(gripper.position(decision.command), limits.lower[i],
                                 limits.upper[i])
            step_limited[i] = False
        if decision.suppressed_release:
            where = f' ({gated.name})' if len(gates) > 1 else ''
            reasons.append(f'release suppressed{where}: end effector away from the pad')
        decisions.append(decision)
    return SafetyResult(stepped, requested, limited, step_limited, tuple(decisions),
                        '; '.join(reasons))


def _entry(values: np.ndarray | None, i: int, n: int) -> float | None:
    """Entry ``i`` of a per-joint vector of ``n`` values; ``None`` where it has none."""
    if values is None:
        return None
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    return float(values[i]) if values.size == n and math.isfinite(values[i]) else None
