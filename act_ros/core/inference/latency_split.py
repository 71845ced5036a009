"""Where a chunk's time goes: the observation-to-chunk latency split into its parts.

For every chunk the runtime computes in the background (``async``, ``process``):

- ``transfer``: the observation crossing to the inference child (pickling, the socket,
  unpickling: from the parent's send to the child's receipt, on the shared monotonic
  clock); 0 in a thread of the same process;
- ``preprocess``: conversion to float tensors, resizing, normalization, batching;
- ``model``: the network alone (the backend's call);
- ``postprocess``: unnormalization and the conversion of the chunk;
- ``return``: the chunk crossing back (child's send to the parent's receipt); 0 in-process;
- ``other``: what is left of the total (thread hand-over, the socket wait's wake-up).

``total`` is the request's time in the runtime's worker, from the request to the chunk
back. :class:`SplitStats` keeps cumulative sums (counters: a benchmark differences two
readings over its window) and the medians of the recent chunks, and beside them the
model-only time per chunk measured at configure (:meth:`SplitStats.set_model_only`:
the model's part of the timed calls behind the real-time verdict, in the same predictor,
so the same backend, precision and threads), for ``/diagnostics`` (``latency_split.*``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

PARTS = ('transfer', 'preprocess', 'model', 'postprocess', 'return')
RECENT = 200  # chunks behind the medians


@dataclass(frozen=True)
class ChunkTiming:
    """Seconds of one chunk's parts (see the module docstring)."""

    total_s: float
    transfer_s: float = 0.0
    preprocess_s: float = 0.0
    model_s: float = 0.0
    postprocess_s: float = 0.0
    return_s: float = 0.0

    @property
    def other_s(self) -> float:
        return self.total_s - sum(getattr(self, f'{part}_s') for part in PARTS)

    @classmethod
    def in_process(cls, total_s: float, parts: Mapping[str, float]) -> ChunkTiming:
        """A chunk computed in this process: the predictor's ``last_timing`` parts."""
        return cls(total_s=total_s, **{f'{p}_s': float(parts.get(f'{p}_s', 0.0))
                                       for p in ('preprocess', 'model', 'postprocess')})

    @classmethod
    def from_child(cls, sent: float, back: float, child: Mapping[str, float]) -> ChunkTiming:
        """A chunk of the inference child: ``sent``/``back`` are the parent's monotonic
        moments of the request and the reply; ``child`` holds the child's ``received`` and
        ``replied`` moments (same clock) and its predictor's parts."""
        return cls(total_s=back - sent, transfer_s=child['received'] - sent,
                   return_s=back - child['replied'],
                   **{f'{p}_s': float(child.get(f'{p}_s', 0.0))
                      for p in ('preprocess', 'model', 'postprocess')})

    def as_ms(self) -> dict[str, float]:
        out = {f.name[:-2]: getattr(self, f.name) * 1e3 for f in fields(self)}
        out['other'] = self.other_s * 1e3
        return out


class SplitStats:
    """Thread-safe accumulation of :class:`ChunkTiming` (the worker adds, diagnostics read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.chunks = 0
        self._sums_ms = dict.fromkeys((*PARTS, 'other', 'total'), 0.0)
        self._recent: deque[dict[str, float]] = deque(maxlen=RECENT)
        self.model_only_s: list[float] = []

    def add(self, timing: ChunkTiming) -> None:
        ms = timing.as_ms()
        with self._lock:
            self.chunks += 1
            for key in self._sums_ms:
                self._sums_ms[key] += ms[key]
            self._recent.append(ms)

    def set_model_only(self, seconds: Sequence[float]) -> None:
        with self._lock:
            self.model_only_s = [float(s) for s in seconds]

    def medians_ms(self) -> dict[str, float]:
        """Median of each part (and total, other) over the recent chunks; empty before one."""
        with self._lock:
            recent = list(self._recent)
        if not recent:
            return {}
        return {key: float(np.median([r[key] for r in recent])) for key in recent[0]}

    def as_values(self) -> dict[str, Any]:
        """``latency_split.*`` key/values: ``chunks``, ``<part>_sum_ms`` (since start),
        ``<part>_p50_ms`` (recent chunks), ``model_only_ms`` (configure: median) and
        ``total_over_model_only`` (the median total over the model-only time)."""
        medians = self.medians_ms()
        with self._lock:
            values: dict[str, Any] = {'latency_split.chunks': self.chunks}
            for key, total in self._sums_ms.items():
                values[f'latency_split.{key}_sum_ms'] = total
            model_only = list(self.model_only_s)
        for key in self._sums_ms:
            values[f'latency_split.{key}_p50_ms'] = medians.get(key, 'n/a')
        model_only_ms = float(np.median(model_only)) * 1e3 if model_only else None
        values['latency_split.model_only_ms'] = model_only_ms if model_only_ms else 'n/a'
        values['latency_split.model_only_calls'] = len(model_only)
        # The node's time per chunk against the model alone (issue 23's goal: <= 1.15).
        total = medians.get('total')
        values['latency_split.total_over_model_only'] = (
            total / model_only_ms if total is not None and model_only_ms else 'n/a')
        return values


def _number(value: Any) -> float | None:
    """A diagnostics value (a string on the wire, a number in process) as a float."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def window_means(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, Any]:
    """The mean of each part per chunk over a window, from two readings of
    :meth:`SplitStats.as_values` (``/diagnostics`` key/values, strings or numbers):
    ``before`` at the window's start (``None``: from the node's start) and ``after`` at
    its end. Returns ``chunks`` and ``<part>_ms`` for every part, ``other`` and ``total``,
    ``model_only_ms`` and ``total_over_model_only``; only ``chunks`` (0) when no chunk
    came back in the window."""
    def counter(values, key):
        number = _number((values or {}).get(f'latency_split.{key}'))
        return 0.0 if number is None else number

    chunks = int(round(counter(after, 'chunks') - counter(before, 'chunks')))
    if chunks <= 0:
        return {'chunks': 0}
    out: dict[str, Any] = {'chunks': chunks}
    for key in (*PARTS, 'other', 'total'):
        out[f'{key}_ms'] = (counter(after, f'{key}_sum_ms')
                            - counter(before, f'{key}_sum_ms')) / chunks
    model_only = _number(after.get('latency_split.model_only_ms'))
    out['model_only_ms'] = model_only
    out['total_over_model_only'] = out['total_ms'] / model_only if model_only else None
    return out


def window_line(means: Mapping[str, Any]) -> str:
    """One line for a benchmark's output from :func:`window_means`."""
    if not means.get('chunks'):
        return 'latency split: no chunk came back in the window'
    parts = ', '.join(f"{key} {means[f'{key}_ms']:.0f} ms" for key in (*PARTS, 'other'))
    text = (f"latency split per chunk (mean of {means['chunks']}): {parts}; total "
            f"{means['total_ms']:.0f} ms")
    if means.get('model_only_ms'):
        text += (f"; the model alone {means['model_only_ms']:.0f} ms (at configure, same "
                 f"child): {means['total_over_model_only']:.2f}x")
    return text
