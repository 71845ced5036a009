"""Status of ``act_node`` as ``diagnostic_msgs/DiagnosticArray`` on ``/diagnostics``.

Level: ERROR while inputs are stale or invalid (no commands are sent; ``input_problems``
names them, e.g. ``object_pose/box: stale (...)`` for a checkpoint that takes the object
poses); WARN when no command went out since the last report, a command was rejected, or a
chunk violated the limits; OK otherwise. The key/values carry the rates, latencies, queue
depth, gate state, the required inputs and their ages, every counter of
:class:`~act_ros.core.control.loop.ControlCounters`, the real-time verdict (``realtime.*``),
the start-up phases up to the first command (``startup.*``) and the checkpoint
(``checkpoint.source``, ``checkpoint.path``; for a Hub id also ``checkpoint.repo_id``,
``checkpoint.revision`` and ``checkpoint.commit``).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus

from act_ros.ros.diagnostics import RateMeter, diagnostic_array, missed_periods

#: The seam figures on /diagnostics (seams.<name>), over the arm's joints.
SEAM_KEYS = ('handovers', 'over_within_p99', 'velocity_jump_median', 'velocity_jump_mean',
             'velocity_jump_max', 'within_chunk_velocity_step_median',
             'within_chunk_velocity_step_p99', 'acceleration_jump_median',
             'acceleration_jump_max', 'within_chunk_acceleration_step_p99')


def seam_values(summary: dict[str, Any]) -> dict[str, Any]:
    """``seams.*`` key/values of a seam summary (:mod:`act_ros.core.control.seams`): the arm's
    figures (rad/s, rad/s^2; ``n/a`` before any handover) and each joint's largest
    velocity jump."""
    values = {f'seams.{key}': summary[key] for key in SEAM_KEYS}
    for joint, figures in summary['per_joint'].items():
        values[f'seams.velocity_jump_max.{joint}'] = figures['velocity_jump_max']
    return {key: 'n/a' if value is None else value for key, value in values.items()}


class NodeStatus:
    """Command rate and latency bookkeeping, and the periodic diagnostics message."""

    def __init__(self, node: Any) -> None:  # ActNode (not imported: no circle)
        self.node = node
        self.command_rate = RateMeter(window_s=2.0)
        self._lock = threading.Lock()
        self.last_latency_ms: float | None = None
        # Header stamp of the observation the last command answered (s; None before one).
        self.last_obs_stamp_s: float | None = None
        self._latency_sum_ms = 0.0
        self._latency_count = 0
        self._recent_latency_ms: deque[float] = deque(maxlen=1000)
        self._last_report: dict[str, int] = {}
        # Command timing at the node itself (a subscriber's own delays do not count):
        # periods without a command (gaps over 1.5 periods) and the longest gap.
        self._last_command_s: float | None = None
        self.missed_periods = 0
        self._gap_max_ms = 0.0

    def reset_rates(self) -> None:
        self.command_rate.reset()
        with self._lock:
            self.last_latency_ms = None
            self._latency_sum_ms, self._latency_count = 0.0, 0
            self._recent_latency_ms.clear()
            self._last_command_s = None
            self.missed_periods = 0
            self._gap_max_ms = 0.0

    def on_command(self, obs_stamp_s: float | None) -> None:
        """Record one published command; latency is from the observation's header stamp."""
        now = self.node.now_s()
        self.command_rate.tick(now)
        period = self.node.settings.period_s
        with self._lock:
            if self._last_command_s is not None:
                gap = now - self._last_command_s
                self._gap_max_ms = max(self._gap_max_ms, gap * 1e3)
                self.missed_periods += missed_periods(gap, period)
            self._last_command_s = now
            self.last_obs_stamp_s = obs_stamp_s
        if obs_stamp_s is not None and obs_stamp_s > 0.0:
            latency = (now - obs_stamp_s) * 1e3
            with self._lock:
                self.last_latency_ms = latency
                self._latency_sum_ms += latency
                self._latency_count += 1
                self._recent_latency_ms.append(latency)

    def report(self) -> tuple[bytes, str, dict[str, Any]]:
        """Level, one-line message and key/values describing the node now."""
        node = self.node
        settings, loop, inputs = node.settings, node.loop, node.inputs
        now = node.now_s()
        counters = node.counters.as_dict()
        snap = inputs.snapshot(now)
        stats = loop.runtime.stats
        rate = self.command_rate.rate_hz(now)
        with self._lock:
            mean_latency = (self._latency_sum_ms / self._latency_count
                            if self._latency_count else None)
            last_latency = self.last_latency_ms
            recent = np.array(self._recent_latency_ms)
            gap_max_ms, self._gap_max_ms = self._gap_max_ms, 0.0
            missed = self.missed_periods
        values: dict[str, Any] = {
            'active': node.is_active,
            'command_rate_hz': rate,
            'target_rate_hz': settings.control_rate_hz,
            'trigger': settings.trigger,
            'mode': f'{settings.runtime.mode}/{settings.runtime.execution}',
            'device': str(loop.runtime.device),
            'inference_last_ms': stats.last_inference_ms,
            'inference_mean_ms': stats.mean_inference_ms,
            'inference_restarts': loop.runtime.inference_restarts,
            'queue_depth': stats.queue_depth,
            'chunks_computed': stats.chunks_computed,
            'chunks_discarded': stats.chunks_discarded,
            'chunks_late': stats.chunks_late,  # model slower than a chunk: nothing to play
            'runtime_ticks': stats.ticks,
            'obs_to_command_last_ms': last_latency if last_latency is not None else 'n/a',
            'obs_to_command_mean_ms': mean_latency if mean_latency is not None else 'n/a',
            # Over the last (up to) 1000 commands.
            'obs_to_command_p50_ms': float(np.percentile(recent, 50)) if recent.size else 'n/a',
            'obs_to_command_p99_ms': float(np.percentile(recent, 99)) if recent.size else 'n/a',
            'missed_periods': missed,  # since activation: periods the node sent nothing in
            'command_gap_max_ms': gap_max_ms,  # since the previous report
            'gate_state': loop.gate_state,  # 'off' without a gate
            'gate_distance_m': loop.last_distance_m if loop.last_distance_m is not None else 'n/a',
            'input_problems': snap.describe_problems() or 'none',
            # ~/planned_path and ~/markers (act_ros.ros.node.visualization)
            'visualization': (node.io.visualizer.describe() if node.io is not None
                              and node.io.visualizer is not None else 'off'),
            'message_rejections': inputs.rejections,
            'last_rejection': inputs.last_rejection or 'none',
        }
        if node.verdict is not None:
            values.update({f'realtime.{k}': v for k, v in node.verdict.as_values().items()})
        # What the model runs in: the backend (auto: the one chosen and why) and the
        # precision (auto: the bf16 check against fp32).
        values['backend'] = loop.runtime.config.backend
        values['backend_why'] = loop.runtime.config.backend_why
        if loop.runtime.precision_check is not None:
            values.update(loop.runtime.precision_check.as_values())
        # The speed limit of each joint (per second, its source, the step per tick).
        values.update(node.settings.speed_limits.as_values(node.settings.period_s))
        # Background chunks by part: transfer, preprocess, model, postprocess, return.
        values.update(stats.split.as_values())
        # Time from process start to the first command, by phase (act_ros.core.startup).
        values.update(node.startup.as_values())
        # Every input a tick needs (readiness): joint states, the checkpoint's cameras and,
        # for a checkpoint that takes them, the object poses (object_pose/<object>).
        values['required_inputs'] = ', '.join(inputs.required)
        for name in inputs.required:
            age = snap.age_s(name)
            values[f'age_s.{name}'] = age if age is not None else 'n/a'
        if loop.runtime.environment_state_dim:
            for obj, topic in settings.object_pose_topics.items():
                values[f'object_pose_topic.{obj}'] = node.resolve_topic_name(topic)
        values.update(counters)
        # Chunk handovers against the motion within chunks (act_ros.core.control.seams), over the
        # last seams.window_s.
        if loop.seams is not None:
            values.update(seam_values(loop.seams.summary()))
        # Which checkpoint: as named, its directory and, for a Hub id, repo, revision, commit.
        values.update(loop.runtime.source.as_values())

        new = {k: counters[k] - self._last_report.get(k, 0) for k in
               ('commands_published', 'commands_rejected', 'chunks_with_violations')}
        self._last_report = {k: counters[k] for k in new}
        if not snap.ok:
            problems = snap.describe_problems(node.io.input_sources)
            return DiagnosticStatus.ERROR, f'inputs unusable, no commands: {problems}', values
        if counters['inference_failing']:
            return DiagnosticStatus.ERROR, ('inference failing, no commands: '
                                            f"{counters['last_inference_error']}"), values
        if new['commands_published'] == 0:
            return DiagnosticStatus.WARN, 'no commands since the last report', values
        if new['commands_rejected'] or new['chunks_with_violations']:
            return DiagnosticStatus.WARN, (f"commanding at {rate:.1f} Hz; "
                                           f"{new['commands_rejected']} commands rejected, "
                                           f"{new['chunks_with_violations']} chunks over limits"), \
                values
        return DiagnosticStatus.OK, f'commanding at {rate:.1f} Hz', values

    def publish(self) -> None:
        """Publish one diagnostics message (only while active, like every output)."""
        node = self.node
        with node.lock:
            if not node.is_active or node.io is None or node.loop is None:
                return
            level, message, values = self.report()
            msg = diagnostic_array(name=f'{node.get_name()}: policy',
                                   hardware_id=node.get_fully_qualified_name(),
                                   level=level, message=message, values=values,
                                   stamp=node.get_clock().now().to_msg())
            node.io.diagnostics_pub.publish(msg)
