"""Turning action chunks into one action per control tick.

Three schemes, all keyed by the *tick* of the observation a chunk was computed from, so a
chunk that arrives late (computed in the background) is still played in step with time:

- :class:`ChunkQueue` (chunk execution): play the newest chunk, one action per tick.
- :class:`BlendQueue` (blended handover): play the newest chunk, and when the next one
  arrives keep what was committed (every tick before its arrival) and crossfade the rest
  of the old plan into the new chunk over ``blend_ticks`` ticks, from the arrival tick
  on: the new chunk's rows for the ticks that passed while it was computed are dropped,
  so it starts where the arm is when it arrives, not where it was when it was asked for.
- :class:`TickEnsembler` (temporal ensembling, ACT paper Algorithm 2): every stored chunk
  that covers the current tick contributes its action for that tick, weighted
  ``w_i = exp(-k * i)`` with ``i = 0`` for the oldest chunk, normalized by ``sum(w_i)``.
  With ``k > 0`` older predictions weigh more (the original ACT's choice, k = 0.01);
  ``k = 0`` averages uniformly; ``k < 0`` favours new chunks. With one chunk per tick this
  is exactly LeRobot's ``ACTTemporalEnsembler``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np


def _rows(action, tick: int, horizon: int) -> np.ndarray | None:
    """The actions ``action(t)`` for ticks ``tick, tick + 1, ...``, at most ``horizon``,
    up to the first tick without one; ``None`` when there is none for ``tick``."""
    rows = []
    for t in range(tick, tick + horizon):
        row = action(t)
        if row is None:
            break
        rows.append(np.asarray(row, dtype=np.float64))
    return np.stack(rows) if rows else None


#: The crossfade of blend mode as users give it: a number of ticks, or seconds with an
#: ``s`` (converted at the control rate), e.g. ``6`` or ``0.2s``.
DEFAULT_BLEND_WINDOW = '0.2s'


def blend_window_ticks(text: str | int, rate_hz: float) -> int:
    """Ticks of a crossfade given as ``'6'`` (ticks) or ``'0.2s'`` (seconds at ``rate_hz``,
    rounded to the nearest tick); ``ValueError`` with one line on anything else."""
    value = str(text).strip()
    try:
        if value.endswith('s'):
            seconds = float(value[:-1])
            if not (np.isfinite(seconds) and seconds >= 0):
                raise ValueError
            return int(round(seconds * rate_hz))
        ticks = int(value)
        if ticks < 0:
            raise ValueError
        return ticks
    except ValueError:
        raise ValueError(f"blend window: expected ticks (e.g. '6') or seconds (e.g. '0.2s'), "
                         f"at least 0, got '{text}'") from None


def smoothstep_weights(n: int) -> np.ndarray:
    """Weights of the new chunk over an ``n``-tick crossfade: ``s((k + 1) / (n + 1))`` for
    ``k = 0 .. n - 1`` with ``s(x) = 3x^2 - 2x^3``, rising from near 0 to near 1 with a flat
    start and end, so the blend adds no velocity step where the fade begins or ends (a
    linear ramp would, of ``(new - old) / (n + 1)`` per tick)."""
    x = (np.arange(n, dtype=np.float64) + 1.0) / (n + 1.0)
    return x * x * (3.0 - 2.0 * x)


@dataclass(frozen=True)
class TimedChunk:
    """A chunk of actions whose first row is meant for control tick ``start_tick``."""

    start_tick: int
    actions: np.ndarray  # (T, J)
    # Header stamp (seconds) of the observation the chunk was computed from, where known:
    # row i is meant for stamp_s + i control periods (what a viewer of the plan needs).
    stamp_s: float | None = None

    @property
    def end_tick(self) -> int:
        """First tick after the chunk."""
        return self.start_tick + int(self.actions.shape[0])

    def covers(self, tick: int) -> bool:
        return self.start_tick <= tick < self.end_tick


class _OneChunk:
    """What :class:`ChunkQueue` and :class:`BlendQueue` share: one chunk (``_chunk``, the
    newest) behind the actions, each subclass's :meth:`action` for a tick."""

    _chunk: TimedChunk | None

    def action(self, tick: int) -> np.ndarray | None:
        raise NotImplementedError

    def remaining(self, tick: int) -> int:
        """Actions left for ticks ``>= tick``."""
        if self._chunk is None:
            return 0
        return max(0, self._chunk.end_tick - max(tick, self._chunk.start_tick))

    def source(self, tick: int) -> int | None:
        """Start tick of the chunk that plays ``tick`` (for a blend, the newest chunk in
        its action; ``None``: none does)."""
        return self._chunk.start_tick if self.action(tick) is not None else None

    def preview(self, tick: int, horizon: int) -> np.ndarray | None:
        """The actions planned for ``tick`` on (at most ``horizon``), changing nothing."""
        return _rows(self.action, tick, horizon)

    @property
    def latest_start(self) -> int | None:
        return None if self._chunk is None else self._chunk.start_tick


class ChunkQueue(_OneChunk):
    """Chunk execution: actions of the current chunk, aligned to ticks.

    ``horizon`` limits how many actions of each chunk may be played (``n_action_steps``).
    A newer chunk replaces the older one from the current tick on; actions for ticks that
    are already past are dropped.
    """

    def __init__(self, horizon: int) -> None:
        if horizon < 1:
            raise ValueError(f'horizon must be >= 1, got {horizon}')
        self.horizon = horizon
        self._chunk: TimedChunk | None = None

    def reset(self) -> None:
        self._chunk = None

    def add(self, chunk: TimedChunk) -> None:
        trimmed = replace(chunk, actions=chunk.actions[: self.horizon])
        if self._chunk is None or trimmed.start_tick >= self._chunk.start_tick:
            self._chunk = trimmed

    def action(self, tick: int) -> np.ndarray | None:
        if self._chunk is None or not self._chunk.covers(tick):
            return None
        return self._chunk.actions[tick - self._chunk.start_tick]

    @property
    def latest(self) -> TimedChunk | None:
        """The chunk being played (as stored: at most ``horizon`` actions)."""
        return self._chunk


class BlendQueue(_OneChunk):
    """Blended handover: the newest chunk, crossfaded in from the old plan when it arrives.

    :meth:`add` takes the tick the chunk arrives at (``now_tick``). Every action before it
    stays as it was (committed); for ticks ``now_tick + k``, ``k < blend_ticks``, the action
    is ``(1 - w_k) old_k + w_k new_k`` with :func:`smoothstep_weights` ``w``, where ``old``
    is what would have been played without the new chunk (an ongoing fade included; past
    its end, its last action, as a position controller holds it) and ``new`` the new
    chunk's row for that tick. ``blend_ticks = 0`` switches at once, as
    :class:`ChunkQueue` does. A chunk that starts before the one playing, or whose last
    tick has passed, is ignored.
    """

    def __init__(self, blend_ticks: int) -> None:
        if blend_ticks < 0:
            raise ValueError(f'blend_ticks must be >= 0, got {blend_ticks}')
        self.blend_ticks = int(blend_ticks)
        self._weights = smoothstep_weights(self.blend_ticks)
        self._chunk: TimedChunk | None = None
        self._fade_start = 0
        self._old: np.ndarray | None = None  # (blend_ticks, J) from _fade_start on

    def reset(self) -> None:
        self._chunk = None
        self._old = None

    def add(self, chunk: TimedChunk, now_tick: int) -> None:
        """Store ``chunk`` arriving at ``now_tick``; the fade starts there."""
        if chunk.end_tick <= now_tick:
            return
        if self._chunk is not None and chunk.start_tick < self._chunk.start_tick:
            return
        old = None
        if self._chunk is not None and self.blend_ticks:
            old = np.stack([self._planned(now_tick + k) for k in range(self.blend_ticks)])
        self._chunk, self._old, self._fade_start = chunk, old, now_tick

    def _planned(self, tick: int) -> np.ndarray:
        """What plays at ``tick`` without a newer chunk (its last action once it runs out)."""
        row = self.action(tick)
        return np.asarray(row if row is not None else self._chunk.actions[-1],
                          dtype=np.float64)

    def action(self, tick: int) -> np.ndarray | None:
        chunk = self._chunk
        if chunk is None or not chunk.covers(tick):
            return None
        new = chunk.actions[tick - chunk.start_tick]
        k = tick - self._fade_start
        if self._old is None or not 0 <= k < self.blend_ticks:
            return new
        w = self._weights[k]
        return (1.0 - w) * self._old[k] + w * np.asarray(new, dtype=np.float64)

    def fading(self, tick: int) -> bool:
        """Whether ``tick`` is inside a crossfade."""
        return self._old is not None and 0 <= tick - self._fade_start < self.blend_ticks

    @property
    def latest(self) -> TimedChunk | None:
        """The newest chunk (the one faded in)."""
        return self._chunk


class TickEnsembler:
    """Temporal ensembling over chunks aligned to ticks (see module docstring)."""

    def __init__(self, coeff: float, max_chunks: int) -> None:
        if not np.isfinite(coeff):
            raise ValueError(f'ensemble coefficient must be finite, got {coeff}')
        if max_chunks < 1:
            raise ValueError(f'max_chunks must be >= 1, got {max_chunks}')
        self.coeff = float(coeff)
        self.max_chunks = max_chunks
        self._chunks: deque[TimedChunk] = deque()

    def reset(self) -> None:
        self._chunks.clear()

    def add(self, chunk: TimedChunk) -> None:
        """Store a chunk; chunks are kept ordered by start tick (oldest first)."""
        chunks = list(self._chunks) + [chunk]
        chunks.sort(key=lambda c: c.start_tick)
        self._chunks = deque(chunks[-self.max_chunks:])

    def _prune(self, tick: int) -> None:
        while self._chunks and self._chunks[0].end_tick <= tick:
            self._chunks.popleft()

    def remaining(self, tick: int) -> int:
        """Ticks from ``tick`` on that at least one chunk covers."""
        self._prune(tick)
        if not self._chunks:
            return 0
        return max(0, max(c.end_tick for c in self._chunks) - tick)

    def action(self, tick: int) -> np.ndarray | None:
        """The blended action for ``tick``; ``None`` if no chunk covers it."""
        self._prune(tick)
        return self._blend(tick)

    def _blend(self, tick: int) -> np.ndarray | None:
        rows = [c.actions[tick - c.start_tick] for c in self._chunks if c.covers(tick)]
        if not rows:
            return None
        weights = np.exp(-self.coeff * np.arange(len(rows), dtype=np.float64))
        stacked = np.stack(rows).astype(np.float64)
        return (weights[:, None] * stacked).sum(axis=0) / weights.sum()

    def source(self, tick: int) -> int | None:
        """Start tick of the newest chunk in the blend for ``tick`` (``None``: none)."""
        starts = [c.start_tick for c in self._chunks if c.covers(tick)]
        return max(starts) if starts else None

    def preview(self, tick: int, horizon: int) -> np.ndarray | None:
        """The blended actions for ``tick`` on (at most ``horizon``) with the chunks stored
        now, changing nothing (no chunk is dropped)."""
        return _rows(self._blend, tick, horizon)

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    @property
    def latest_start(self) -> int | None:
        return self._chunks[-1].start_tick if self._chunks else None

    @property
    def latest(self) -> TimedChunk | None:
        """The newest chunk in the blend."""
        return self._chunks[-1] if self._chunks else None
