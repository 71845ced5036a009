"""Start-up timing: when did each step of getting to the first command happen?

Every moment is a reading of ``time.monotonic()``, which on Linux (CLOCK_MONOTONIC) and
macOS is one clock for all processes of the machine, so the inference child's moments
and its parent's share one axis. The origin is the start of the process
(:func:`process_start_monotonic`), so the import of Python and its packages counts too.

:class:`StartupTimeline` keeps named moments and turns them into *phases*: the time
between each moment and the previous one in :data:`EVENTS` order, so the phases of one
start-up add up to the time of its last moment. A step that ran concurrently with the
ones on this path (the node's own set-up while the child loads the model) is reported on
its own (:meth:`StartupTimeline.add_overlapped`), not as a phase.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

# Moments from process start to the first command, in the order they happen; the phase
# named beside each moment is the time from the previous moment to it.
EVENTS: tuple[tuple[str, str], ...] = (
    ('imported', 'import'),  # interpreter start + imports of the node module
    ('node_created', 'node_init'),  # rclpy.init, node, parameters
    ('configure_started', 'wait_configure'),  # autostart: ~0; else the lifecycle manager
    ('child_running', 'child_start'),  # checkpoint info read, child spawned, interpreter up
    ('model_imported', 'model_import'),  # torch, LeRobot, the backend (in the child, if any)
    ('checkpoint_loaded', 'checkpoint_load'),  # config, weights, processors
    ('backend_built', 'backend_build'),  # ONNX export (cache hit or miss) + compilation
    ('warmed_up', 'warmup'),  # the warm-up call(s)
    ('ready', 'ready'),  # the parent hears that the model is ready
    ('latency_measured', 'latency_measure'),  # timed calls behind the feasibility verdict
    ('configured', 'configure_end'),  # what is left of configure
    ('activated', 'activate'),
    ('first_request', 'first_request'),  # first tick with usable inputs asks for a chunk
    ('first_chunk', 'first_chunk'),  # the model computed it
    ('first_command', 'first_command'),  # the next tick published its first action
)
PHASE_OF = dict(EVENTS)
# Moments that only the inference child knows (sent to the parent when it is ready).
CHILD_EVENTS = ('child_running', 'model_imported', 'checkpoint_loaded', 'backend_built',
                'warmed_up')

_BOOT_CLOCK = getattr(time, 'CLOCK_BOOTTIME', None)


def process_start_monotonic(pid: int | None = None) -> float | None:
    """When process ``pid`` (default: this one) started, on the ``time.monotonic()`` axis.

    Read from ``/proc/<pid>/stat`` (start time in clock ticks since boot, 10 ms
    resolution); ``None`` where there is no procfs (then callers use a later moment).
    """
    try:
        with open(f"/proc/{pid or 'self'}/stat") as f:
            fields = f.read().rsplit(')', 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat; fields[0] is field 3 (state)
        hz = os.sysconf('SC_CLK_TCK')
    except (OSError, ValueError, IndexError):
        return None
    # The start time counts from boot (CLOCK_BOOTTIME since Linux 5.3; the same as
    # CLOCK_MONOTONIC before, barring suspend): age = boot clock now - start.
    boot_now = time.clock_gettime(_BOOT_CLOCK) if _BOOT_CLOCK is not None else time.monotonic()
    mono_now = time.monotonic()
    return mono_now - (boot_now - ticks / hz)


# Fallback origin where there is no procfs: as early as this package is imported.
_MODULE_LOADED = time.monotonic()


class StartupTimeline:
    """Named moments of one start-up, and their phases from the origin (process start)."""

    def __init__(self, origin: float | None = None) -> None:
        self.origin = origin if origin is not None else (process_start_monotonic()
                                                         or _MODULE_LOADED)
        self.events: dict[str, float] = {}
        self.notes: dict[str, Any] = {}  # e.g. backend_cache, inputs_complete_at_s
        self.overlapped: dict[str, float] = {}  # seconds of steps off the critical path

    def mark(self, name: str, at: float | None = None) -> None:
        """Record moment ``name`` (now, or monotonic time ``at``); the first record stays."""
        if name not in PHASE_OF:
            raise ValueError(f"unknown start-up moment '{name}', expected one of "
                             f'{list(PHASE_OF)}')
        self.events.setdefault(name, time.monotonic() if at is None else float(at))

    def merge(self, events: Mapping[str, float]) -> None:
        """Record the moments another process measured (unknown names are ignored)."""
        for name, at in events.items():
            if name in PHASE_OF and at is not None:
                self.mark(name, at)

    def add_overlapped(self, name: str, seconds: float) -> None:
        self.overlapped[name] = float(seconds)

    def forget_from(self, name: str) -> None:
        """Drop ``name`` and every later moment (a configure that is tried again)."""
        names = [event for event, _ in EVENTS]
        for event in names[names.index(name):]:
            self.events.pop(event, None)
        self.notes.clear()
        self.overlapped.clear()

    def at(self, name: str) -> float | None:
        """Seconds from the origin to moment ``name``; ``None`` if it has not happened."""
        moment = self.events.get(name)
        return None if moment is None else moment - self.origin

    @property
    def complete(self) -> bool:
        return 'first_command' in self.events

    def phases(self) -> dict[str, float]:
        """Phase name -> seconds, in order, for the moments recorded; they add up to the
        time of the last one. A moment earlier than the previous (clock granularity)
        counts as a zero-length phase."""
        out: dict[str, float] = {}
        previous = self.origin
        for event, phase in EVENTS:
            moment = self.events.get(event)
            if moment is None:
                continue
            out[phase] = max(moment - previous, 0.0)
            previous = max(moment, previous)
        return out

    def total_s(self) -> float | None:
        """Seconds from process start to the first command (``None`` before it)."""
        return self.at('first_command')

    def as_values(self, prefix: str = 'startup.') -> dict[str, Any]:
        """Key/values for ``/diagnostics`` and benchmark reports."""
        values: dict[str, Any] = {}
        total = self.total_s()
        values[f'{prefix}time_to_first_command_s'] = total if total is not None else 'n/a'
        values.update({f'{prefix}{phase}_s': seconds for phase, seconds in self.phases().items()})
        # Copies (atomic under the GIL): input callbacks may add a note meanwhile.
        values.update({f'{prefix}{name}_s (overlapped)': s
                       for name, s in dict(self.overlapped).items()})
        values.update({f'{prefix}{key}': value for key, value in dict(self.notes).items()})
        return values

    def line(self) -> str:
        """One log line: the total and every phase, in order."""
        total = self.total_s()
        head = (f'first command {total:.2f} s after process start' if total is not None
                else 'start-up (no command yet)')
        parts = [f'{phase.replace("_", " ")} {seconds:.2f}'
                 for phase, seconds in self.phases().items()]
        extra = [f'{key} {value}' for key, value in dict(self.notes).items()]
        extra += [f'{name.replace("_", " ")} {s:.2f} s alongside'
                  for name, s in dict(self.overlapped).items()]
        return head + ': ' + ', '.join(parts) + (' s' if parts else '') + (
            f" ({'; '.join(extra)})" if extra else '')
