"""How ``act_node`` puts a tick's command on the wire, by ``command_type`` and its options.

- ``JointTrajectory`` with ``command_trajectory: point`` (default): one point, the tick's
  command, reached in one control period (:func:`~act_ros.ros.conversions.to_joint_trajectory`);
- ``JointTrajectory`` with ``command_trajectory: chunk``: the rest of the plan as one
  multi-point trajectory, sent again every tick: the tick's command first, then the
  planned actions of the chunk (of the crossfade, or of the blend), each through the
  safety chain (:func:`act_ros.core.control.command_plan.limit_plan`), with velocities from the
  plan, ``time_from_start`` one period apart and ``header.stamp`` the tick's time, so a
  joint_trajectory_controller interpolates at its own rate. When a tick can send nothing
  after such a plan (stale inputs, a rejected command), an empty trajectory stops the
  controller where the arm is rather than let it play out the old plan;
- ``Float64MultiArray``: one command per tick, or with ``command_stream_rate_hz`` above
  the control rate, the tick's command and then samples toward the next planned (safe)
  action at that rate until the next tick (:func:`act_ros.core.control.command_plan.interpolate`);
  a tick that sends nothing ends the stream where it is.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from act_ros.core.control.command_plan import interpolate, plan_velocities
from act_ros.core.control.loop import ControlLoop
from act_ros.ros import conversions as conv
from act_ros.ros.node.parameters import NodeSettings

#: Planned points sent ahead with command_trajectory chunk, at most (a chunk's length).
MAX_PLAN_POINTS = 1000


class CommandSender:
    """Publishes each tick's command as configured (see the module docstring).

    ``publish(msg)`` puts a message on the command topic; ``now_s()`` is the node's clock.
    :meth:`send` runs in the control tick, :meth:`stream_tick` in the stream timer.
    """

    def __init__(self, settings: NodeSettings, publish: Any, now_s: Any) -> None:
        self.settings = settings
        self._publish = publish
        self._now_s = now_s
        self._lock = threading.Lock()
        self._plan_sent = False  # the last message was a multi-point plan still playing
        # Interpolated stream: the samples of the current period, when it began, next index.
        self._samples: np.ndarray | None = None
        self._started_s = 0.0
        self._next = 0
        self.messages = 0  # every command message published (the stream's included)

    @property
    def trajectory(self) -> bool:
        s = self.settings
        return s.command_type == 'JointTrajectory' and s.command_trajectory == 'chunk'

    @property
    def streaming(self) -> bool:
        s = self.settings
        return s.command_type == 'Float64MultiArray' and s.command_stream_rate_hz > 0

    def send(self, loop: ControlLoop, command: np.ndarray) -> None:
        """Publish this tick's ``command`` (and, as configured, the plan after it)."""
        s = self.settings
        if self.trajectory:
            points = loop.safe_plan(MAX_PLAN_POINTS)
            self._put(conv.to_joint_trajectory_plan(
                points, plan_velocities(points, s.period_s), s.joint_names, s.period_s,
                self._now_s()))
            self._plan_sent = points.shape[0] > 1
            return
        if s.command_type == 'JointTrajectory':
            self._put(conv.to_joint_trajectory(command, s.joint_names, s.period_s))
            return
        if self.streaming:
            samples = interpolate(loop.safe_plan(2), s.period_s, s.command_stream_rate_hz)
            with self._lock:
                self._samples, self._started_s, self._next = samples, self._now_s(), 1
        self._put(conv.to_float64_multiarray(command, len(s.joint_names)))

    def hold(self) -> None:
        """A tick that sends nothing: stop a plan the controller is playing, end the stream."""
        with self._lock:
            self._samples = None
        if self._plan_sent:
            self._put(conv.empty_joint_trajectory(self.settings.joint_names))
            self._plan_sent = False

    def stream_tick(self) -> None:
        """The stream timer: publish the sample due now, if any is left this period."""
        s = self.settings
        with self._lock:
            samples = self._samples
            if samples is None:
                return
            due = int((self._now_s() - self._started_s) * s.command_stream_rate_hz + 1e-6)
            if due < self._next:
                return
            if due >= samples.shape[0]:
                due = samples.shape[0] - 1  # the period's last sample; the next tick goes on
                if self._next > due:
                    return
            self._next = due + 1
            sample = samples[due]
        self._put(conv.to_float64_multiarray(sample, len(s.joint_names)))

    def _put(self, msg: Any) -> None:
        self._publish(msg)
        self.messages += 1
