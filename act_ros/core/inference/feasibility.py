"""Will this model hold this control rate? The verdict from a measured latency.

With chunks of ``C`` ticks and a model latency of ``L`` ticks (``L = ceil(latency / period)``):

- **chunk execution in the background** (``async``, ``process``): a chunk computed from
  the observation of tick ``t`` arrives at ``t + L`` and its actions run out at ``t + C``;
  the next one can be requested only once it has arrived (one request in flight), so it
  lands at ``t + 2L`` at the earliest. The queue never runs dry when ``2L <= C``; each
  chunk then plays at least ``L`` actions. With the runtime's request margin ``m`` ticks
  the comfortable condition is ``2(L + m) <= C``. A **blended handover** has the same
  condition (its crossfade of ``B`` ticks has the old chunk's rows to fade from when
  ``2(L + m) + B <= C``; later, it fades from the old chunk's last action).
- **temporal ensembling in the background**: a new chunk every ``L`` ticks, each blending
  into the ticks it covers; every tick stays covered when ``2L <= C``; the blend is then
  refreshed at ``1 / latency`` Hz (its *effective refresh rate*), which is reported
  rather than judged.
- **synchronous execution**: the tick itself waits for the model, so the rate holds only
  when one call fits in one period (``latency <= period``); otherwise every chunk
  (chunk mode) or every tick (ensembling) overruns.

When the configuration cannot hold its rate, :func:`verdict` says what would: the
chunk length that would fit, the model input size that would fit (an estimate: a
convolutional backbone's time grows about with the pixel count), and the rate that fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Input sizes worth suggesting (H, W), largest first: 4:3 like the contract's cameras.
CANDIDATE_SIZES = ((480, 640), (360, 480), (240, 320), (192, 256), (144, 192), (120, 160),
                   (96, 128))


@dataclass(frozen=True)
class Latency:
    """Model latency measured on this machine (seconds)."""

    median_s: float
    worst_s: float
    samples: int

    @classmethod
    def from_samples(cls, seconds: Sequence[float]) -> Latency:
        values = np.asarray([s for s in seconds if math.isfinite(s)], dtype=np.float64)
        if values.size == 0:
            raise ValueError('no latency measurement to judge the configuration by')
        return cls(median_s=float(np.median(values)), worst_s=float(values.max()),
                   samples=int(values.size))


@dataclass(frozen=True)
class Verdict:
    """Whether the configuration holds its rate, and what would when it does not."""

    feasible: bool
    mode: str
    execution: str
    rate_hz: float
    chunk_size: int
    n_action_steps: int
    latency: Latency
    latency_ticks: int
    reason: str
    margin_ticks: int = 0
    effective_refresh_hz: float | None = None
    alternatives: list[str] = field(default_factory=list)
    precision: str = ''  # what was measured: backend and precision, e.g. 'openvino bf16'

    def line(self) -> str:
        """One log line: the verdict, the numbers behind it and the alternatives."""
        head = 'feasible' if self.feasible else 'NOT feasible'
        text = (f'{head}: {self.mode}/{self.execution} at {self.rate_hz:g} Hz, chunk '
                f'{self.chunk_size}, n_action_steps {self.n_action_steps}; model '
                + (f'({self.precision}) ' if self.precision else '') +
                f'{self.latency.median_s * 1e3:.0f} ms median, {self.latency.worst_s * 1e3:.0f} '
                f'ms worst of {self.latency.samples} = {self.latency_ticks} tick(s): {self.reason}')
        if self.effective_refresh_hz is not None:
            text += f'; the blend refreshes at {self.effective_refresh_hz:.1f} Hz'
        if self.alternatives:
            text += '. Would fit: ' + '; '.join(self.alternatives)
        return text

    def as_values(self) -> dict[str, Any]:
        """Key/value pairs for /diagnostics and the runtime's stats."""
        values: dict[str, Any] = {
            'feasible': self.feasible, 'feasibility': self.reason,
            'latency_median_ms': self.latency.median_s * 1e3,
            'latency_worst_ms': self.latency.worst_s * 1e3,
            'latency_ticks': self.latency_ticks}
        if self.precision:
            values['measured_precision'] = self.precision
        if self.effective_refresh_hz is not None:
            values['ensemble_refresh_hz'] = self.effective_refresh_hz
        if self.alternatives:
            values['alternatives'] = '; '.join(self.alternatives)
        return values


def verdict(*, mode: str, execution: str, rate_hz: float, chunk_size: int,
            n_action_steps: int, latency: Latency, margin_ticks: int = 2,
            image_size: tuple[int, int] | None = None, backends: Sequence[str] = (),
            precision: str = '') -> Verdict:
    """Judge a configuration (see the module docstring).

    ``latency``: the model's time per chunk on this machine; the worst measured value is
    used (the runtime schedules by the slowest recent latency). ``image_size``: the
    model's input, for the input-size suggestion; ``backends``: other installed inference
    backends worth measuring; ``precision``: the backend and precision the latency was
    measured in (the verdict names it).
    """
    if rate_hz <= 0 or chunk_size < 1 or n_action_steps < 1:
        raise ValueError(f'need rate_hz > 0, chunk_size >= 1, n_action_steps >= 1; got '
                         f'{rate_hz}, {chunk_size}, {n_action_steps}')
    period = 1.0 / rate_hz
    worst = latency.worst_s
    ticks = max(1, math.ceil(worst / period - 1e-9))
    refresh = 1.0 / worst if mode == 'ensemble' and worst > 0 else None
    common = dict(mode=mode, execution=execution, rate_hz=rate_hz, chunk_size=chunk_size,
                  n_action_steps=n_action_steps, latency=latency, latency_ticks=ticks,
                  margin_ticks=margin_ticks, effective_refresh_hz=refresh, precision=precision)
    if execution == 'sync':
        feasible = worst <= period
        reason = (f'one model call ({worst * 1e3:.0f} ms) fits in the {period * 1e3:.0f} ms period'
                  if feasible else
                  f'the tick waits {worst * 1e3:.0f} ms for the model, longer than the '
                  f'{period * 1e3:.0f} ms period: the loop overruns once per '
                  f"{'tick' if mode == 'ensemble' else 'chunk'}")
        alternatives = [] if feasible else [
            "execution 'process' or 'async' (the next chunk is computed while the current one "
            'plays)'] + _size_and_rate(worst, image_size, period, rate_hz, need_ticks=1,
                                       chunk_size=chunk_size)
        return Verdict(feasible=feasible, reason=reason, alternatives=alternatives, **common)
    queued = mode in ('chunk', 'blend')  # one chunk played at a time (blend: crossfaded in)
    need = 2 * (ticks + (margin_ticks if queued else 0))
    feasible = need <= chunk_size
    if queued:
        reason = (f'2 x ({ticks} + {margin_ticks} margin) = {need} <= {chunk_size}: the next '
                  'chunk lands before the queue runs dry' if feasible else
                  f'2 x ({ticks} + {margin_ticks} margin) = {need} > {chunk_size}: chunks '
                  'come too late: the queue runs dry before each next chunk lands and nothing is '
                  'sent meanwhile (missed periods; a chunk with no action left for its ticks '
                  'counts as chunks_late)')
    else:
        reason = (f'2 x {ticks} = {need} <= {chunk_size}: every tick is covered by a chunk'
                  if feasible else
                  f'2 x {ticks} = {need} > {chunk_size}: some ticks are covered by no chunk')
    alternatives: list[str] = []
    if not feasible:
        alternatives.append(f'a checkpoint trained with chunk_size >= {need} (ACT default 100)')
        alternatives += _size_and_rate(worst, image_size, period, rate_hz,
                                       need_ticks=chunk_size // 2 - (margin_ticks if queued
                                                                     else 0),
                                       chunk_size=chunk_size)
        if backends:
            alternatives.append('measure the other installed backends (' + ', '.join(backends)
                                + ') with act-ros bench runtime')
    return Verdict(feasible=feasible, reason=reason, alternatives=alternatives, **common)


def _size_and_rate(worst: float, image_size: tuple[int, int] | None, period: float,
                   rate_hz: float, *, need_ticks: int, chunk_size: int) -> list[str]:
    """The largest candidate input size and the highest rate that would fit."""
    out = []
    budget_s = max(need_ticks, 0) * period
    if image_size is not None and budget_s > 0:
        pixels = image_size[0] * image_size[1]
        for h, w in CANDIDATE_SIZES:
            if h * w < pixels and worst * (h * w) / pixels <= budget_s:
                out.append(f'model input {h}x{w} (about {worst * (h * w) / pixels * 1e3:.0f} ms '
                           'if the time follows the pixel count; cameras stay as they are, the '
                           'runtime resizes)')
                break
    if need_ticks > 0:
        fitting_rate = need_ticks / worst
        if fitting_rate < rate_hz:
            out.append(f'control_rate_hz <= {math.floor(fitting_rate * 10) / 10:g} (the arm then '
                       'moves more slowly than in the demonstrations)')
    return out
