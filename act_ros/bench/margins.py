"""How far a figure of ``act-ros bench check`` may move before it counts as a regression.

Every figure the check compares must fail a 20 % regression (:data:`REGRESSION`): a
figure that is better higher failing at 80 % of its baseline, one better lower at 120 %
(a share of a whole, such as missed periods in percent of a window, at 20 points of that
whole more). The margin comes from the baseline's own repeated runs (``act-ros bench check
--write-baseline --repeats N``, stored beside the baseline figures): ``SPREAD_K`` times
the largest deviation of a run from their median, at least ``MIN_REL`` of the baseline
(a few runs underestimate the spread) or the figure's absolute ``floor``. A margin wider
than :data:`CAP` could not tell a 20 % regression from the runs' own spread: such a figure
is not checked for regressions, only against its guard (a wide bound that catches a node
that stalls or does not start), and the check says so.

A baseline recorded from one run has no spread: its speed-ups (ratios of this package's
call to LeRobot's, measured side by side in one run, so that the machine's speed cancels)
get the cap as their margin, its other figures their guard; record it again with
``--repeats`` for margins from its spread.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

#: The regression every checked figure must fail: 20 % of its baseline (or of its whole).
REGRESSION = 0.20
#: The widest margin a checked figure may have: 15 %, so that a 20 % regression is 5 %
#: past it (noise on the slowed run must not carry it back).
CAP = 0.15
#: The margin: this many times the largest deviation of a baseline run from their median.
SPREAD_K = 2.0
#: ... and at least this share of the baseline.
MIN_REL = 0.03


@dataclass(frozen=True)
class Figure:
    """One figure of the check: ``better`` is 'higher' or 'lower' ('' for one only shown).

    ``whole``: for a share of a whole (missed periods in % of the window: 100), its
    regression and margins are in points of that whole, not in shares of the baseline.
    ``floor``: the least allowance, in its unit (a loss difference of float rounding).
    ``guard_rel`` / ``guard_abs``: the guard, a wide bound checked when no margin can be
    (a share of the baseline, or in the figure's unit): it catches a stall, not a
    regression. ``ratio``: measured side by side in one run (the machine's speed cancels).
    ``speed``: a speed-up of this package against LeRobot, what a slower build moves.
    """

    name: str
    part: str
    unit: str
    better: str
    what: str
    guard_rel: float | None = None
    guard_abs: float | None = None
    ratio: bool = False
    speed: bool = False
    whole: float | None = None
    floor: float = 0.0

    def scale(self, baseline: float) -> float:
        """What 100 % is for this figure's regressions and margins."""
        return self.whole if self.whole is not None else abs(baseline)

    def limit(self, baseline: float, allowance: float) -> float:
        return baseline - allowance if self.better == 'higher' else baseline + allowance

    def regressed(self, baseline: float) -> float:
        """The figure 20 % worse than ``baseline``."""
        return self.limit(baseline, REGRESSION * self.scale(baseline))

    def guard(self, baseline: float) -> float | None:
        """The guard's allowance, or None when the figure has none."""
        if self.guard_rel is not None:
            return abs(baseline) * self.guard_rel
        return self.guard_abs


@dataclass(frozen=True)
class Margin:
    """How far a figure may move from its baseline (``allowance``, in its unit).
    ``checked``: within :data:`CAP`, so a 20 % regression fails it; else the guard
    applies. ``spread``: the runs' largest deviation from their median (a share of the
    baseline, or points of the whole; None: one run)."""

    allowance: float
    checked: bool
    spread: float | None
    runs: int
    why: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def derive(figure: Figure, runs: list[float]) -> Margin:
    """The margin of ``figure`` from its baseline runs (see the module docstring)."""
    runs = [float(v) for v in runs if v is not None]
    if not figure.better or not runs:
        return Margin(0.0, False, None, len(runs), 'shown only' if not figure.better
                      else 'no baseline run')
    median = statistics.median(runs)
    deviation = max(abs(v - median) for v in runs)
    scale = figure.scale(median)
    if len(runs) == 1:
        if figure.speed:
            return Margin(CAP * scale, True, None, 1,
                          f'one baseline run, no spread: the cap ({CAP:.0%})')
        return Margin(figure.guard(median) or 0.0, False, None, 1,
                      'one baseline run, no spread: its guard only')
    if scale == 0.0:  # a baseline of exactly 0 (unsafe commands, leaked children)
        if deviation == 0.0:
            return Margin(figure.floor, True, 0.0, len(runs),
                          f'{len(runs)} runs all 0: exact' + (
                              f' (within {figure.floor:g})' if figure.floor else ''))
        return Margin(figure.guard(median) or 0.0, False, None, len(runs),
                      'runs around 0 with a spread: no share of the baseline to compare')
    spread = deviation / scale
    allowance = max(SPREAD_K * deviation, MIN_REL * scale, figure.floor)
    if allowance <= CAP * scale:
        return Margin(allowance, True, spread, len(runs),
                      f'{len(runs)} runs spread {spread:.1%}: margin '
                      f'{allowance / scale:.1%} of the {"whole" if figure.whole else "baseline"}')
    return Margin(figure.guard(median) or 0.0, False, spread, len(runs),
                  f'{len(runs)} runs spread {spread:.1%}: a margin of {SPREAD_K:g} x that '
                  f'exceeds {CAP:.0%}, so a 20 % regression could not be told from noise: '
                  'its guard only')


def from_json(data: dict[str, Any] | None) -> Margin | None:
    return None if data is None else Margin(**data)


def verdict(figure: Figure, baseline: float | None, measured: float | None,
            margin: Margin | None) -> str:
    """'pass' / 'FAIL' against the margin; 'pass (guard only)' / 'FAIL (guard)' where no
    margin can be; 'info' for a figure only shown; 'no baseline'."""
    if measured is None:
        return 'FAIL (not measured)' if figure.better else 'not measured'
    if not figure.better:
        return 'info'
    if baseline is None or margin is None:
        return 'no baseline'
    if margin.checked:
        limit = figure.limit(baseline, margin.allowance)
        ok = measured >= limit if figure.better == 'higher' else measured <= limit
        return 'pass' if ok else 'FAIL'
    guard = figure.guard(baseline)
    if guard is None:
        return 'not checked (no guard)'
    limit = figure.limit(baseline, guard)
    ok = measured >= limit if figure.better == 'higher' else measured <= limit
    return 'pass (guard only)' if ok else 'FAIL (guard)'


def margin_text(figure: Figure, baseline: float | None, margin: Margin | None) -> str:
    """The bound a measurement must keep, e.g. ``>= 0.96 (baseline -4.0 %, 3 runs)``."""
    if not figure.better:
        return 'shown only'
    if baseline is None or margin is None:
        return '-'
    sign = '>=' if figure.better == 'higher' else '<='
    if margin.checked:
        allowance = margin.allowance
        scale = figure.scale(baseline)
        share = (f'{allowance / scale:.1%}' + (' of the whole' if figure.whole else '')
                 if scale else f'{allowance:g}')
        return (f'{sign} {num(figure.limit(baseline, allowance))} '
                f'({"-" if figure.better == "higher" else "+"}{share})')
    guard = figure.guard(baseline)
    if guard is None:
        return 'none'
    return f'{sign} {num(figure.limit(baseline, guard))} (guard)'


def num(value: float | None) -> str:
    if value is None:
        return '-'
    if value == 0:
        return '0'
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f'{value:.1e}'
    return f'{value:.3g}' if abs(value) < 100 else f'{value:.0f}'
