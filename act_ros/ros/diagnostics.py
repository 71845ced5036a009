"""Diagnostics of the policy node: counters, a rate meter and the DiagnosticArray message.

The node keeps a :class:`NodeCounters` (updated by the control tick and the input
callbacks) and publishes :func:`diagnostic_array` on ``/diagnostics``, where
``diagnostic_aggregator`` and ``rqt_robot_monitor`` pick it up.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
import threading
from typing import Any

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue


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


@dataclass
class NodeCounters:
    """What the node counts between diagnostics messages (totals since configure)."""

    commands_published: int = 0
    ticks_without_command: int = 0
    stale_ticks: int = 0
    commands_rejected: int = 0
    joint_limit_clamps: int = 0
    step_limit_clamps: int = 0
    chunks_checked: int = 0
    chunk_limit_violations: int = 0
    chunks_with_violations: int = 0
    nonfinite_chunk_steps: int = 0
    suppressed_releases: int = 0
    runtime_resets: int = 0
    inference_failures: int = 0
    last_safety_reason: str = ''
    last_stale_reason: str = ''

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
