"""Near-pad release gate: the gripper may only open to release an object near the pad.

State machine per episode (docs/architecture.md section 6):

- ``FREE``: gripper commands pass unchanged (approach with an open gripper).
- ``HOLDING``: entered once the gripper has been commanded below ``hold_threshold`` for
  ``hold_ticks`` consecutive ticks. Every gripper command is then replaced by
  ``closed_command``, except an open request (``>= release_threshold``) while the end
  effector is within ``release_radius_m`` of the pad (XY and Z distance, Euclidean),
  which passes and moves the gate to ``RELEASED``. Intermediate values never loosen the
  grip in transit. If the fingers are *measured* empty for ``empty_ticks`` ticks while
  commanded closed, they have closed on nothing (the object slipped out or was never
  grasped): there is nothing to release, and the gate goes back to ``FREE`` so that the
  policy can open the gripper and grasp again. The opening alone cannot tell a thin
  object (a card, a cable) from nothing, so "empty" needs evidence
  (:meth:`ReleaseGateConfig.evidence`): the gripper's effort below ``empty_effort`` (its
  joint's effort units, where the joint states carry it), else, opted in, an opening
  below ``empty_opening`` (the thinnest object the user assumes). With neither, a closed
  gripper holds something: HOLDING ends only by a release near the pad.
- ``RELEASED``: commands pass unchanged until :meth:`ReleaseGate.reset`.

Commands and thresholds are *openings* (0 closed, 1 open). An arm has one gate per gripper
(:class:`GripperGate`), which converts its gripper's joint units to openings and back
(:class:`act_ros.core.contract.GripperSpec`), or none.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from act_ros.core.contract import Contract, GripperSpec


class GateState(enum.Enum):
    FREE = 'FREE'
    HOLDING = 'HOLDING'
    RELEASED = 'RELEASED'


@dataclass(frozen=True)
class ReleaseGateConfig:
    """Settings of the release gate (units in the names)."""

    release_radius_m: float = 0.10
    release_threshold: float = 0.90
    hold_threshold: float = 0.90
    hold_ticks: int = 3
    closed_command: float = 0.0
    # Evidence of an empty gripper (None: not used). ``empty_effort``: |effort| of the
    # gripper joint below which closed fingers hold nothing (the joint's effort units);
    # ``empty_opening``: the measured opening below which they do, when no effort is known
    # (the opening on the thinnest object the arm picks: an opt-in assumption). For how
    # many ticks in a row the evidence must say so.
    empty_effort: float | None = None
    empty_opening: float | None = None
    empty_ticks: int = 5
    enabled: bool = True

    def __post_init__(self) -> None:
        if not self.release_radius_m > 0.0:
            raise ValueError(f'release_radius_m must be > 0, got {self.release_radius_m}')
        if not 0.0 < self.release_threshold <= 1.0:
            raise ValueError(f'release_threshold must be in (0, 1], got {self.release_threshold}')
        if not 0.0 < self.hold_threshold <= self.release_threshold:
            raise ValueError('hold_threshold must be in (0, release_threshold], got '
                             f'{self.hold_threshold} (release_threshold {self.release_threshold})')
        if self.hold_ticks < 1:
            raise ValueError(f'hold_ticks must be >= 1, got {self.hold_ticks}')
        if not 0.0 <= self.closed_command < self.hold_threshold:
            raise ValueError(f'closed_command must be in [0, hold_threshold), got {self.closed_command}')
        if self.empty_effort is not None and not (math.isfinite(self.empty_effort)
                                                  and self.empty_effort > 0.0):
            raise ValueError(f'empty_effort must be > 0 (or not set), got {self.empty_effort}')
        if self.empty_opening is not None and not 0.0 < self.empty_opening < self.hold_threshold:
            raise ValueError('empty_opening must be in (0, hold_threshold) (or not set), got '
                             f'{self.empty_opening} (hold_threshold {self.hold_threshold})')
        if self.empty_ticks < 1:
            raise ValueError(f'empty_ticks must be >= 1, got {self.empty_ticks}')

    def evidence(self) -> str:
        """One line: what tells this gate that closed fingers hold nothing."""
        if not self.enabled:
            return 'release gate off'
        ticks = f'for {self.empty_ticks} ticks'
        opening = (f'its opening < {self.empty_opening:g} (empty_opening, the thinnest object '
                   'assumed)' if self.empty_opening is not None else '')
        if self.empty_effort is not None:
            return (f'release gate: a closed gripper is empty when its effort is below '
                    f'{self.empty_effort:g} (empty_effort, the joint\'s effort units) {ticks}; '
                    + (f'without an effort in the joint states, when {opening}'
                       if opening else 'without an effort in the joint states, never'))
        if opening:
            return f'release gate: a closed gripper is empty when {opening} {ticks}'
        return ('release gate: a closed gripper always counts as holding (no empty-gripper '
                'evidence: set release_gate.empty_effort where the joint states carry the '
                "gripper's effort, or release_gate.empty_opening); HOLDING ends only by a "
                'release near the pad')

    def is_empty(self, opening: float | None, effort: float | None) -> bool:
        """Whether a gripper commanded closed, measured at ``opening`` (normalized) and
        ``effort`` (its joint's units; ``None``: unknown), holds nothing: its effort where
        known and ``empty_effort`` is set, else its opening where ``empty_opening`` is set,
        else never (a thin object cannot be told from none by its opening)."""
        if self.empty_effort is not None and effort is not None and math.isfinite(effort):
            return abs(effort) < self.empty_effort
        if self.empty_opening is not None and opening is not None and math.isfinite(opening):
            return opening < self.empty_opening
        return False


@dataclass(frozen=True)
class GateDecision:
    """What the gate did to one gripper command."""

    command: float
    requested: float
    state: GateState
    suppressed_release: bool
    distance_m: float | None

    @property
    def changed(self) -> bool:
        return self.command != self.requested


class ReleaseGate:
    """Per-episode gate on the gripper command (see module docstring)."""

    def __init__(self, config: ReleaseGateConfig | None = None) -> None:
        self.config = config or ReleaseGateConfig()
        self.suppressed_releases = 0
        self.objects_lost = 0  # HOLDING -> FREE transitions on an empty gripper, ever
        self.reset()

    def reset(self) -> None:
        """Start a new episode: FREE, no closed-tick count. The counters are kept."""
        self.state = GateState.FREE
        self._closed_ticks = 0
        self._empty_ticks = 0

    def distance(self, ee_position: np.ndarray | None, pad_position: np.ndarray | None) -> float | None:
        if ee_position is None or pad_position is None:
            return None
        ee = np.asarray(ee_position, dtype=np.float64).reshape(-1)[:3]
        pad = np.asarray(pad_position, dtype=np.float64).reshape(-1)[:3]
        d = float(np.linalg.norm(ee - pad))
        return d if math.isfinite(d) else None

    def apply(self, gripper_command: float, ee_position: np.ndarray | None,
              pad_position: np.ndarray | None,
              measured_gripper: float | None = None,
              measured_effort: float | None = None) -> GateDecision:
        """Return the gripper command to send this tick, updating the state machine.

        An unknown end-effector or pad position (``None``) counts as "not near the pad".
        ``measured_gripper`` (normalized opening) and ``measured_effort`` (the gripper
        joint's effort) let the gate notice an empty gripper while HOLDING
        (:meth:`ReleaseGateConfig.is_empty`); unknown (``None``) never does.
        """
        cfg = self.config
        requested = float(gripper_command)
        dist = self.distance(ee_position, pad_position)
        if not cfg.enabled or self.state is GateState.RELEASED:
            return GateDecision(requested, requested, self.state, False, dist)
        if self.state is GateState.HOLDING:
            empty = cfg.is_empty(measured_gripper, measured_effort)
            self._empty_ticks = self._empty_ticks + 1 if empty else 0
            if self._empty_ticks >= cfg.empty_ticks:
                self.state = GateState.FREE
                self.objects_lost += 1
                self._closed_ticks = 0
                self._empty_ticks = 0

        if self.state is GateState.FREE:
            self._closed_ticks = self._closed_ticks + 1 if requested < cfg.hold_threshold else 0
            if self._closed_ticks >= cfg.hold_ticks:
                self.state = GateState.HOLDING
                self._empty_ticks = 0
            return GateDecision(requested, requested, self.state, False, dist)

        # HOLDING
        if requested >= cfg.release_threshold:
            if dist is not None and dist <= cfg.release_radius_m:
                self.state = GateState.RELEASED
                return GateDecision(requested, requested, self.state, False, dist)
            self.suppressed_releases += 1
            return GateDecision(cfg.closed_command, requested, self.state, True, dist)
        return GateDecision(cfg.closed_command, requested, self.state, False, dist)


@dataclass(frozen=True)
class GripperGate:
    """The release gate of one gripper: where the gripper sits in a command (``index``),
    its units (``gripper``: joint positions to openings and back) and its gate."""

    index: int
    gripper: GripperSpec
    gate: ReleaseGate

    @property
    def name(self) -> str:
        return self.gripper.joint


def gripper_gates(contract: Contract, config: ReleaseGateConfig) -> tuple[GripperGate, ...]:
    """One gate per gripper of ``contract``, each with its own state; none when
    ``config.enabled`` is false."""
    if not config.enabled:
        return ()
    return tuple(GripperGate(i, g, ReleaseGate(config))
                 for i, g in zip(contract.gripper_indices, contract.grippers))
