"""Turning action chunks into one action per control tick.

Two schemes, both keyed by the *tick* of the observation a chunk was computed from, so a
chunk that arrives late (computed in the background) is still played in step with time:

- :class:`ChunkQueue` (chunk execution): play the newest chunk, one action per tick.
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


class ChunkQueue:
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

    def remaining(self, tick: int) -> int:
        """Actions left for ticks ``>= tick``."""
        if self._chunk is None:
            return 0
        return max(0, self._chunk.end_tick - max(tick, self._chunk.start_tick))

    def action(self, tick: int) -> np.ndarray | None:
        if self._chunk is None or not self._chunk.covers(tick):
            return None
        return self._chunk.actions[tick - self._chunk.start_tick]

    @property
    def latest_start(self) -> int | None:
        return None if self._chunk is None else self._chunk.start_tick

    @property
    def latest(self) -> TimedChunk | None:
        """The chunk being played (as stored: at most ``horizon`` actions)."""
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
        rows = [c.actions[tick - c.start_tick] for c in self._chunks if c.covers(tick)]
        if not rows:
            return None
        weights = np.exp(-self.coeff * np.arange(len(rows), dtype=np.float64))
        stacked = np.stack(rows).astype(np.float64)
        return (weights[:, None] * stacked).sum(axis=0) / weights.sum()

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
