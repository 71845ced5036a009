"""Seams: how smoothly one action chunk hands over to the next, on the commands sent.

A policy that plays action chunks changes its plan at every *handover*: the first tick
whose command comes from a chunk other than the previous tick's. Where the new chunk
disagrees with the old one, the command stream steps, and a position controller turns
that step into a velocity jump the arm shows as a jerk. This module measures it, per
joint and over the arm, against the motion *within* the chunks the policy computed.

With the commands ``q_t`` one control period ``dt`` apart:

- velocity step at tick ``t``: ``|q_t - 2 q_{t-1} + q_{t-2}| / dt`` (rad/s; the change of
  velocity from one period to the next), acceleration step ``|q_t - 3 q_{t-1} + 3 q_{t-2}
  - q_{t-3}| / dt^2`` (rad/s^2);
- the **jump at a handover** at tick ``h`` (``q_{h-1}`` from the old chunk, ``q_h`` from
  the new one): the largest step over the ticks whose differences straddle it (``h`` and
  ``h+1`` for the velocity, ``h`` to ``h+2`` for the acceleration): a position offset
  ``d`` at the seam shows as ``d/dt`` there however the chunks move. A handover spread
  over several ticks (a crossfade: ``transition`` ticks) is judged over all of them and
  the differences that reach past its last one;
- the **reference** (within a chunk): the same steps between the rows of every chunk the
  policy computed, as it computed them (so one reference for every way of playing the
  chunks: chunk execution, blending, temporal ensembling).

The headline figures are over the *arm*: the Euclidean norm over the measured joints
(the node and the evaluator leave the grippers out, whose commands are steps by
design), beside each joint's own. A handover counts ``over_within_p99`` when its velocity
jump exceeds the 99th percentile of the velocity steps within chunks: seams as smooth as
the motion within a chunk put about 1 in 100 handovers there.

Ticks without a command (stale inputs, no chunk yet) and :meth:`SeamMeter.break_stream`
(a new episode) break the stream: no step is taken across them. The reference is kept
as fixed log-spaced histograms (bounded memory, merged exactly across processes; its
quantiles good to a bin, 7.5 %), the handovers as samples. ``window_ticks`` keeps
only the recent past (``act_node``'s rolling window on ``/diagnostics``); ``None`` keeps
everything (evaluations).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Histogram edges of the reference: 1e-6 to 1e6 in the step's unit, 32 bins a decade
#: (neighbouring edges 7.5 % apart), below the first edge counted as zero.
_LOW_EXP, _HIGH_EXP, _PER_DECADE = -6, 6, 32
EDGES = np.logspace(_LOW_EXP, _HIGH_EXP, (_HIGH_EXP - _LOW_EXP) * _PER_DECADE + 1)
ORDERS = {'velocity': 2, 'acceleration': 3}  # finite-difference order of each step
#: Sub-windows a rolling reference is kept in (the oldest is dropped as a whole).
ROLLING_PARTS = 4


def _histogram(values: np.ndarray) -> np.ndarray:
    """Counts of ``values`` (>= 0) in the bins of :data:`EDGES`: bin 0 below the first edge
    (zero), the last above the last edge."""
    index = np.searchsorted(EDGES, values, side='right')
    return np.bincount(index, minlength=EDGES.size + 1)


def histogram_quantile(counts: np.ndarray, q: float) -> float:
    """The ``q`` quantile (0-1) of the values counted in ``counts`` (NaN without any),
    interpolated geometrically within its bin."""
    total = int(counts.sum())
    if total == 0:
        return float('nan')
    rank = q * (total - 1)
    cumulative = np.cumsum(counts)
    k = int(np.searchsorted(cumulative, rank, side='right'))
    if k == 0:
        return 0.0
    if k >= EDGES.size:
        return float(EDGES[-1])
    before = cumulative[k - 1]
    fraction = (rank - before + 0.5) / counts[k] if counts[k] else 0.5
    lo, hi = math.log(EDGES[k - 1]), math.log(EDGES[k])
    return float(math.exp(lo + min(max(fraction, 0.0), 1.0) * (hi - lo)))


def _steps(rows: np.ndarray, order: int, period_s: float) -> np.ndarray:
    """``|order-th difference| / dt^(order-1)`` of ``rows`` (T, J): (T - order, J)."""
    return np.abs(np.diff(rows, n=order, axis=0)) / period_s ** (order - 1)


@dataclass
class SeamSamples:
    """What a :class:`SeamMeter` measured, in a form that merges exactly across meters
    (processes of one evaluation): each handover's jumps and the reference histograms."""

    joint_names: tuple[str, ...]
    measured: tuple[int, ...]  # joints in the arm's norm
    period_s: float
    # kind -> (handovers, 1 + J): column 0 the arm's norm, then each joint.
    jumps: dict[str, np.ndarray] = field(default_factory=dict)
    # kind -> (1 + J, bins): the reference steps within chunks, norm then each joint.
    within: dict[str, np.ndarray] = field(default_factory=dict)
    chunks: int = 0  # chunks in the reference
    ticks: int = 0  # commands measured

    def __post_init__(self) -> None:
        width = 1 + len(self.joint_names)
        for kind in ORDERS:
            self.jumps.setdefault(kind, np.zeros((0, width)))
            self.within.setdefault(kind, np.zeros((width, EDGES.size + 1), dtype=np.int64))

    @property
    def handovers(self) -> int:
        return int(self.jumps['velocity'].shape[0])

    @classmethod
    def merge(cls, parts: Sequence[SeamSamples]) -> SeamSamples:
        """One set from several (same joints and period)."""
        if not parts:
            raise ValueError('no seam samples to merge')
        first = parts[0]
        for part in parts[1:]:
            if part.joint_names != first.joint_names or part.measured != first.measured:
                raise ValueError(f'seam samples of different joints: {first.joint_names} '
                                 f'{first.measured} vs {part.joint_names} {part.measured}')
        return cls(first.joint_names, first.measured, first.period_s,
                   jumps={k: np.concatenate([p.jumps[k] for p in parts]) for k in ORDERS},
                   within={k: sum(p.within[k] for p in parts) for k in ORDERS},
                   chunks=sum(p.chunks for p in parts), ticks=sum(p.ticks for p in parts))

    def to_dict(self) -> dict[str, Any]:
        """Plain lists (to pass between processes as JSON or pickle)."""
        return {'joint_names': list(self.joint_names), 'measured': list(self.measured),
                'period_s': self.period_s, 'chunks': self.chunks, 'ticks': self.ticks,
                'jumps': {k: v.tolist() for k, v in self.jumps.items()},
                'within': {k: v.tolist() for k, v in self.within.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeamSamples:
        width = 1 + len(data['joint_names'])
        return cls(tuple(data['joint_names']), tuple(data['measured']), float(data['period_s']),
                   jumps={k: np.asarray(v, dtype=np.float64).reshape(-1, width)
                          for k, v in data['jumps'].items()},
                   within={k: np.asarray(v, dtype=np.int64) for k, v in data['within'].items()},
                   chunks=int(data['chunks']), ticks=int(data['ticks']))

    def summary(self) -> dict[str, Any]:
        """The figures of every result file (``modes.<mode>.seams``) and of ``/diagnostics``:
        over the arm (norm over the measured joints) and per joint; ``None`` where nothing
        was measured (no handover, or no chunk)."""
        out: dict[str, Any] = {'handovers': self.handovers, 'ticks': self.ticks,
                               'chunks': self.chunks,
                               'arm_joints': [self.joint_names[i] for i in self.measured]}
        per_joint: dict[str, dict[str, Any]] = {name: {} for name in self.joint_names}
        for kind in ORDERS:
            jumps, within = self.jumps[kind], self.within[kind]
            for column in range(jumps.shape[1]):
                values = jumps[:, column]
                p99 = histogram_quantile(within[column], 0.99)
                figures = {
                    f'{kind}_jump_median': float(np.median(values)) if values.size else math.nan,
                    f'{kind}_jump_mean': float(values.mean()) if values.size else math.nan,
                    f'{kind}_jump_max': float(values.max()) if values.size else math.nan,
                    f'within_chunk_{kind}_step_median': histogram_quantile(within[column], 0.5),
                    f'within_chunk_{kind}_step_p99': p99,
                    f'over_within_p99_{kind}': int((values > p99).sum()) if math.isfinite(p99)
                    else 0,
                }
                if column == 0:
                    out.update(figures)
                else:
                    per_joint[self.joint_names[column - 1]].update(figures)
        out['over_within_p99'] = out.pop('over_within_p99_velocity')
        out['over_within_p99_fraction'] = (out['over_within_p99'] / self.handovers
                                           if self.handovers else math.nan)
        out['units'] = {'velocity': 'rad/s (gripper: normalized/s)',
                        'acceleration': 'rad/s^2 (gripper: normalized/s^2)'}
        out['per_joint'] = per_joint
        return _none_for_nan(out)


def _none_for_nan(value: Any) -> Any:
    """``value`` with every NaN replaced by ``None`` (JSON's null), nested."""
    if isinstance(value, dict):
        return {k: _none_for_nan(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


@dataclass
class _Part:
    """A stretch of a meter's window: reference histograms, chunks and ticks measured."""

    first_tick: int
    within: dict[str, np.ndarray]
    chunks: int = 0
    ticks: int = 0

    @classmethod
    def empty(cls, first_tick: int, width: int) -> _Part:
        return cls(first_tick, {kind: np.zeros((width, EDGES.size + 1), dtype=np.int64)
                                for kind in ORDERS})


class SeamMeter:
    """Measures the seams of one command stream, tick by tick (see the module docstring).

    ``joint_names``: every joint of a command; ``measured``: the indices in the arm's
    norm (default: all); ``period_s``: the control period; ``window_ticks``: keep the last
    that many ticks (``None``: everything).
    """

    def __init__(self, joint_names: Sequence[str], period_s: float, *,
                 measured: Sequence[int] | None = None,
                 window_ticks: int | None = None) -> None:
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f'period_s must be > 0, got {period_s}')
        if window_ticks is not None and window_ticks < ROLLING_PARTS:
            raise ValueError(f'window_ticks must be >= {ROLLING_PARTS} or None, got '
                             f'{window_ticks}')
        self.joint_names = tuple(joint_names)
        n = len(self.joint_names)
        self.measured = tuple(range(n)) if measured is None else tuple(int(i) for i in measured)
        if not self.measured or any(not 0 <= i < n for i in self.measured):
            raise ValueError(f'measured joints must be indices of the {n} joints, got '
                             f'{list(self.measured)}')
        self.period_s = float(period_s)
        self.window_ticks = window_ticks
        self._tick = 0  # ticks fed (the meter's own clock, across episodes)
        self._history: deque[tuple[np.ndarray, int]] = deque(maxlen=4)  # (q, source)
        self._pending: list[dict[str, Any]] = []
        # (tick, {kind: (1 + J,) jumps}) of the finished handovers.
        self._seams: deque[tuple[int, dict[str, np.ndarray]]] = deque()
        # The reference histograms and tick counts in rolling parts, newest last.
        self._parts: deque[_Part] = deque([_Part.empty(0, 1 + n)])

    # ------------------------------------------------------------------ feeding
    def break_stream(self) -> None:
        """No step across this point (new episode, a gap in the commands)."""
        self._history.clear()
        self._pending.clear()

    def add_chunk(self, actions: np.ndarray) -> None:
        """A chunk the policy computed (``(T, J)``, as computed): its rows join the reference."""
        rows = np.asarray(actions, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != len(self.joint_names):
            raise ValueError(f'chunk must have shape (T, {len(self.joint_names)}), got '
                             f'{rows.shape}')
        if not np.all(np.isfinite(rows)):
            return  # the safety chain refuses such rows; they are no motion to compare with
        part = self._parts[-1]
        for kind, order in ORDERS.items():
            if rows.shape[0] <= order:
                continue
            steps = _steps(rows, order, self.period_s)
            columns = np.concatenate([self._norm(steps)[:, None], steps], axis=1)
            for column in range(columns.shape[1]):
                part.within[kind][column] += _histogram(columns[:, column])
        part.chunks += 1

    def add_command(self, command: np.ndarray | None, source: int | None, *,
                    transition: bool = False) -> None:
        """This tick's command as sent (``None``: nothing sent, which breaks the stream)
        and the chunk it came from (``source``: any id that changes at a handover; for a
        blend, the newest chunk in it). ``transition``: this tick is still part of the
        last handover (a crossfade): the handover's jump is the largest step through its
        last such tick and the differences that reach past it."""
        self._tick += 1
        self._prune()
        if command is None or source is None:
            self.break_stream()
            return
        q = np.asarray(command, dtype=np.float64).reshape(-1)
        if q.size != len(self.joint_names) or not np.all(np.isfinite(q)):
            self.break_stream()
            return
        self._parts[-1].ticks += 1
        if self._history and self._history[-1][1] != source:
            self._pending.append({'tick': self._tick, 'age': 0, 'last': 0,
                                  'jumps': {k: None for k in ORDERS}})
        elif transition and self._pending:
            self._pending[-1]['last'] = self._pending[-1]['age']
        self._history.append((q, source))
        rows = np.stack([h[0] for h in self._history])
        steps = {kind: _steps(rows[-(order + 1):], order, self.period_s)[0]
                 for kind, order in ORDERS.items() if rows.shape[0] > order}
        finished = []
        for seam in self._pending:
            for kind, order in ORDERS.items():
                # This tick's difference straddles the seam or reaches into its transition.
                if seam['age'] < seam['last'] + order:
                    if kind not in steps:
                        seam['incomplete'] = True
                        continue
                    values = np.concatenate([[self._norm(steps[kind][None])[0]],
                                             steps[kind]])
                    old = seam['jumps'][kind]
                    seam['jumps'][kind] = values if old is None else np.maximum(old, values)
            seam['age'] += 1
            if seam['age'] >= seam['last'] + max(ORDERS.values()):
                finished.append(seam)
        for seam in finished:
            self._pending.remove(seam)
            if not seam.get('incomplete'):
                self._seams.append((seam['tick'], seam['jumps']))

    # ------------------------------------------------------------------ reading
    def samples(self) -> SeamSamples:
        """Everything in the window, as :class:`SeamSamples`."""
        width = 1 + len(self.joint_names)
        jumps = {kind: (np.stack([s[1][kind] for s in self._seams]) if self._seams
                        else np.zeros((0, width))) for kind in ORDERS}
        within = {kind: sum(part.within[kind] for part in self._parts) for kind in ORDERS}
        return SeamSamples(self.joint_names, self.measured, self.period_s, jumps=jumps,
                           within=within, chunks=sum(part.chunks for part in self._parts),
                           ticks=sum(part.ticks for part in self._parts))

    def summary(self) -> dict[str, Any]:
        """:meth:`SeamSamples.summary` of the window."""
        return self.samples().summary()

    # ------------------------------------------------------------------ internals
    def _norm(self, steps: np.ndarray) -> np.ndarray:
        return np.linalg.norm(steps[:, list(self.measured)], axis=1)

    def _prune(self) -> None:
        if self.window_ticks is None:
            return
        oldest = self._tick - self.window_ticks
        while self._seams and self._seams[0][0] <= oldest:
            self._seams.popleft()
        # The reference and the tick count roll by parts of a quarter window: they cover
        # the last three quarters of the window to all of it.
        if self._tick - self._parts[-1].first_tick >= self.window_ticks // ROLLING_PARTS:
            self._parts.append(_Part.empty(self._tick, 1 + len(self.joint_names)))
            while len(self._parts) > ROLLING_PARTS:
                self._parts.popleft()


def arm_seam_meter(joint_names: Sequence[str], gripper_indices: Sequence[int], period_s: float,
                   window_ticks: int | None = None) -> SeamMeter:
    """The seam meter of an arm's command stream: every joint measured, the arm's norm over
    the joints that are not grippers (whose commands are steps by design; all joints for
    an arm that is nothing but grippers)."""
    grippers = set(gripper_indices)
    arm = [i for i in range(len(joint_names)) if i not in grippers]
    return SeamMeter(joint_names, period_s, measured=arm or None, window_ticks=window_ticks)


def seam_line(summary: dict[str, Any]) -> str:
    """One line of a :meth:`SeamSamples.summary` for a log or a terminal."""
    if not summary['handovers']:
        return 'seams: no handover measured'
    return (f"seams: {summary['over_within_p99']} of {summary['handovers']} handovers over the "
            f"within-chunk p99 ({summary['within_chunk_velocity_step_p99']:.3f} rad/s); "
            f"velocity jump median {summary['velocity_jump_median']:.3f}, mean "
            f"{summary['velocity_jump_mean']:.3f}, max {summary['velocity_jump_max']:.3f} rad/s")
