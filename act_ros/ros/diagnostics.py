"""Diagnostics of the policy node: counters, a rate meter and the DiagnosticArray message.

The node keeps a :class:`~act_ros.core.control.loop.ControlCounters` (updated by the control
tick and the input callbacks) and publishes :func:`diagnostic_array` on
``/diagnostics``, where ``diagnostic_aggregator`` and ``rqt_robot_monitor`` pick it up.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue


def missed_periods(gaps_s: Any, period_s: float) -> int:
    """Control periods without a command in gaps between commands: a gap longer than 1.5
    periods counts as its length in periods, less the one the next command fills."""
    gaps = np.atleast_1d(np.asarray(gaps_s, dtype=np.float64))
    late = gaps[gaps > 1.5 * period_s]
    return int(np.sum(np.maximum(np.round(late / period_s) - 1, 0)))


class RateMeter:
    """Events per second over a sliding window (times in seconds, any monotonic clock)."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = float(window_s)
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def tick(self, now_s: float) -> None:
        with self._lock:
            self._times.append(now_s)
            self._trim(now_s)

    def rate_hz(self, now_s: float) -> float:
        """Events per second from the oldest event in the window up to ``now_s``.

        A stream that stops decays towards 0 as ``now_s`` moves on.
        """
        with self._lock:
            self._trim(now_s)
            if len(self._times) < 2:
                return 0.0
            return (len(self._times) - 1) / max(now_s - self._times[0], 1e-9)

    def reset(self) -> None:
        with self._lock:
            self._times.clear()

    def _trim(self, now_s: float) -> None:
        while self._times and now_s - self._times[0] > self.window_s:
            self._times.popleft()


LEVEL_NAMES = {DiagnosticStatus.OK: 'OK', DiagnosticStatus.WARN: 'WARN',
               DiagnosticStatus.ERROR: 'ERROR', DiagnosticStatus.STALE: 'STALE'}


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f'{value:.3f}'
    return str(value)


def diagnostic_array(*, name: str, hardware_id: str, level: bytes, message: str,
                     values: dict[str, Any], stamp: Time) -> DiagnosticArray:
    """One ``DiagnosticArray`` with a single status carrying ``values`` as key/value pairs."""
    status = DiagnosticStatus(level=level, name=name, message=message,
                              hardware_id=hardware_id)
    status.values = [KeyValue(key=str(k), value=_format(v)) for k, v in values.items()]
    msg = DiagnosticArray(status=[status])
    msg.header.stamp = stamp
    return msg


def status_values(msg: DiagnosticArray) -> dict[str, str]:
    """The key/value pairs of the first status of a ``DiagnosticArray`` (for tools and tests)."""
    if not msg.status:
        return {}
    return {kv.key: kv.value for kv in msg.status[0].values}
