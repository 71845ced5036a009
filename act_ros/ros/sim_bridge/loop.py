"""The stepping loop of ``sim_bridge``: when the simulation advances and with which target.

ROS-free (the node hands it callbacks), so the timing rules are in one place:

- ``realtime``: one control step every ``1/fps`` s of wall clock, with the newest command
  received (or the last one, held). A step that runs late is counted as an overrun; the
  loop does not try to catch up.
- ``lockstep``: one control step per command received after an observation was
  published, then the next observation. When no command comes within
  ``lockstep_timeout_s`` the step runs anyway with the last target held and is counted
  (``lockstep_timeouts``): a policy that withholds a command cannot stall an episode, and
  an evaluation with timeouts is visibly not a clean lock-step run. After the final step
  of an episode no camera/joint observation is published (no command could follow it),
  so nothing computed from it can leak into the next episode.

Episodes start on :meth:`BridgeLoop.request_reset` (the node's ``~/reset``), or by
themselves with ``autostart`` (``episodes`` back to back; 0 = no end). Before each episode
``prepare_episode`` runs (the node resets the policy there); commands that arrive before
the episode's first observation is published are dropped.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from act_ros.sim.env import PortPickAlignEnv, SimObservation
from act_ros.sim.metrics import EpisodeResult

MODES = ('realtime', 'lockstep')


class EpisodeStartError(RuntimeError):
    """An episode could not start (for example the policy did not answer its reset)."""


@dataclass
class EpisodeCounters:
    """Command bookkeeping of the current episode."""

    received: int = 0
    applied: int = 0
    rejected: int = 0
    superseded: int = 0
    lockstep_timeouts: int = 0
    realtime_overruns: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class ResetTicket:
    """A pending episode start; :meth:`wait` returns once the first observation is out."""

    seed: int | None
    done: threading.Event = field(default_factory=threading.Event)
    success: bool = False
    message: str = ''
    episode: int = -1
    used_seed: int | None = None

    def finish(self, success: bool, message: str) -> None:
        self.success, self.message = success, message
        self.done.set()

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s)


class BridgeLoop:
    """Runs episodes of ``env`` in ``mode``; :meth:`run` is the body of the sim thread.

    ``publish(observation, sensors)`` puts an observation on the wire (``sensors`` is
    ``False`` for the terminal observation in lock-step: poses and clock only);
    ``publish_status()`` announces a change of :meth:`status`; ``prepare_episode()`` runs
    before an episode starts and may raise :class:`EpisodeStartError`.
    """

    def __init__(self, env: PortPickAlignEnv, *, mode: str, lockstep_timeout_s: float,
                 publish: Callable[[SimObservation, bool], None],
                 publish_status: Callable[[], None],
                 prepare_episode: Callable[[], None] | None = None,
                 first_seed: int = 0, autostart: bool = False, episodes: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got '{mode}'")
        if not lockstep_timeout_s > 0:
            raise ValueError(f'lockstep_timeout_s must be > 0, got {lockstep_timeout_s}')
        self.env = env
        self.mode = mode
        self.lockstep_timeout_s = float(lockstep_timeout_s)
        self.period_s = 1.0 / env.fps
        self.period_ns = round(1e9 / env.fps)
        self._publish = publish
        self._publish_status = publish_status
        self._prepare_episode = prepare_episode
        self.next_seed = int(first_seed)  # < 0: a fresh random seed per episode
        self.autostart = autostart
        self.episodes = int(episodes)
        self._cond = threading.Condition()
        self._pending: np.ndarray | None = None
        self._accepting = False
        self._resets: deque[ResetTicket] = deque()
        self._stopping = False
        self.held_target: np.ndarray | None = None
        self.counters = EpisodeCounters()
        self.episode = -1
        self.seed: int | None = None
        self.ticks = 0  # control periods since start: the simulated clock
        # The episode's step as of the last tick, set with it under the lock: the status
        # (read from the executor thread) never pairs a new step with the old clock.
        self._episode_step = 0
        self.result: EpisodeResult | None = None
        self.episodes_started = 0
        if autostart:
            self._resets.append(ResetTicket(None))

    # ------------------------------------------------------------ executor-thread side
    @property
    def sim_time_ns(self) -> int:
        return self.ticks * self.period_ns

    def offer(self, target: np.ndarray) -> None:
        """A new command (contract order). Dropped between episodes."""
        with self._cond:
            if not self._accepting:
                return
            self.counters.received += 1
            if self._pending is not None:
                self.counters.superseded += 1
            self._pending = np.asarray(target, dtype=np.float64).copy()
            self._cond.notify_all()

    def count_rejected(self) -> None:
        with self._cond:
            self.counters.rejected += 1

    def request_reset(self, seed: int | None = None) -> ResetTicket:
        """Start a new episode as soon as the loop can (aborting a running one).

        ``seed=None`` uses :attr:`next_seed`. Wait on the returned ticket for the outcome.
        """
        ticket = ResetTicket(seed)
        with self._cond:
            if self._stopping:
                ticket.finish(False, 'the bridge is shutting down')
            else:
                self._resets.append(ticket)
                self._cond.notify_all()
        return ticket

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Make :meth:`run` return; pending resets fail."""
        with self._cond:
            self._stopping = True
            while self._resets:
                self._resets.popleft().finish(False, 'the bridge is shutting down')
            self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        """Episode status (see :mod:`act_ros.ros.sim_bridge.messages` for the fields)."""
        with self._cond:
            env = self.env
            done = self.result is not None
            state = 'idle' if self.episode < 0 else 'done' if done else 'running'
            status = {
                'state': state, 'mode': self.mode, 'episode': self.episode, 'seed': self.seed,
                'step': self._episode_step if self.episode >= 0 else 0,
                'episode_steps': env.episode_steps, 'done': done,
                'sim_time_s': self.sim_time_ns * 1e-9, 'commands': self.counters.as_dict(),
            }
            if done:
                status['result'] = self.result.to_dict()
        return status

    # ------------------------------------------------------------------ sim-thread side
    def run(self) -> None:
        """Step episodes until :meth:`stop`."""
        next_tick = time.monotonic()
        while True:
            with self._cond:
                while not (self._stopping or self._resets or self._running()):
                    self._cond.wait()
                if self._stopping:
                    return
                ticket = self._resets.popleft() if self._resets else None
            if ticket is not None:
                self._start_episode(ticket)
                next_tick = time.monotonic() + self.period_s
                continue
            if self.mode == 'lockstep':
                target = self._wait_lockstep_command()
            else:
                target = self._wait_realtime_tick(next_tick)
                next_tick += self.period_s
                now = time.monotonic()
                if target is not None and now > next_tick:
                    with self._cond:
                        self.counters.realtime_overruns += 1
                    next_tick = now + self.period_s
            if target is not None:
                self._step(target)

    def _running(self) -> bool:
        return self.episode >= 0 and self.result is None

    def _interrupted(self) -> bool:
        return self._stopping or bool(self._resets)

    def _wait_lockstep_command(self) -> np.ndarray | None:
        deadline = time.monotonic() + self.lockstep_timeout_s
        with self._cond:
            while self._pending is None and not self._interrupted():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.counters.lockstep_timeouts += 1
                    return self.held_target
                self._cond.wait(remaining)
            if self._interrupted():
                return None
            return self._take_pending()

    def _wait_realtime_tick(self, tick_at: float) -> np.ndarray | None:
        with self._cond:
            while not self._interrupted():
                remaining = tick_at - time.monotonic()
                if remaining <= 0:
                    return self._take_pending() if self._pending is not None else self.held_target
                self._cond.wait(remaining)
            return None

    def _take_pending(self) -> np.ndarray:
        target, self._pending = self._pending, None
        self.counters.applied += 1
        self.held_target = target
        return target

    def _start_episode(self, ticket: ResetTicket) -> None:
        try:
            self._begin_episode(ticket)
        except EpisodeStartError as exc:
            ticket.finish(False, f'episode not started: {exc}')
        except BaseException as exc:
            ticket.finish(False, f'episode not started: {type(exc).__name__}: {exc}')
            raise

    def _begin_episode(self, ticket: ResetTicket) -> None:
        with self._cond:
            self._accepting = False
            self._pending = None
        if self._prepare_episode is not None:
            self._prepare_episode()
        seed = ticket.seed if ticket.seed is not None else self.next_seed
        obs = self.env.reset(seed if seed >= 0 else None)
        used = self.env.seed
        with self._cond:
            self.episode += 1
            self.episodes_started += 1
            self.seed = used
            self.next_seed = used + 1 if seed >= 0 else -1
            self.counters = EpisodeCounters()
            self.result = None
            self.held_target = obs.joint_positions.copy()
            self.ticks += 1  # the new episode starts one period after the last observation
            self._episode_step = self.env.step_index
            self._pending = None
            self._accepting = True
        ticket.episode, ticket.used_seed = self.episode, used
        self._publish(obs, True)
        self._publish_status()
        ticket.finish(True, f'episode {self.episode} started with seed {used}')

    def _step(self, target: np.ndarray) -> None:
        obs = self.env.step(target)
        with self._cond:
            self.ticks += 1
            self._episode_step = self.env.step_index
        done = self.env.done
        if done:
            result = self.env.evaluate()
            with self._cond:
                self.result = result
                self._accepting = False
                self._pending = None
        self._publish(obs, not (done and self.mode == 'lockstep'))
        self._publish_status()
        if done and self.autostart and (self.episodes <= 0 or self.episodes_started < self.episodes):
            with self._cond:
                self._resets.append(ResetTicket(None))
