"""Spinning nodes: the console-script life of a node (init, build, spin until Ctrl-C or
shutdown, then clean up in order; shared by ``act_node``, ``sim_bridge``, ``record_node``
and ``expert_driver``) and :class:`PoolExecutor`, the multi-threaded executor they use."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
import sys
import threading
from typing import Any

import rclpy
from rclpy import executors as _executors
from rclpy.exceptions import InvalidHandle
from rclpy.executors import (Executor, ExternalShutdownException, ShutdownException,
                             TimeoutException)
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

# Raised by wait_for_ready_callbacks when its wait condition holds (rclpy since Iron).
_NO_WORK = tuple(e for e in (ExternalShutdownException, ShutdownException, TimeoutException,
                             getattr(_executors, 'ConditionReachedException', None)) if e)
# How long the spinning thread waits for a pool thread to start a callback it handed over
# before it looks at the middleware again.
HANDOVER_WAIT_S = 0.01


class PoolExecutor(Executor):
    """Runs callbacks on a pool of ``num_threads`` threads, like rclpy's
    ``MultiThreadedExecutor``, without its spin.

    rclpy's multi-threaded executor (Jazzy, Kilted: ros2/rclpy#1452, fixed upstream by
    ros2/rclpy#1547) hands a callback that no pool thread has started yet to the pool again
    on every round of its wait loop, and those rounds stop blocking: the spinning thread
    then runs Python without pause and holds the GIL that everything else in the process
    needs. ``act-ros bench executor`` (act_node and a robot harness in one process) shows
    it: with rclpy's executor the tiny model's configure-time measurement took 7.3 s per
    chunk in the median of 5 tries and 64 s in the worst (13 ms with this one), up to
    648 977 hand-overs in one start (docs/benchmarks/executor.json). This executor hands
    each callback to the pool once; while one waits for a free thread, the spinning thread
    sleeps until a pool thread starts it (at most ``HANDOVER_WAIT_S`` per round) instead of
    queueing it again.
    Exceptions raised by callbacks come out of :meth:`spin_once` as with rclpy's.
    """

    def __init__(self, num_threads: int = 4, *, context: Any = None) -> None:
        if num_threads < 1:
            raise ValueError(f'num_threads must be >= 1, got {num_threads}')
        super().__init__(context=context)
        self.num_threads = num_threads
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix='ros-callback')
        self._handover = threading.Condition()
        self._waiting: set[Any] = set()  # handed to the pool, not started by a thread yet
        self._handed: list[Any] = []  # handed over, their exceptions not yet raised

    def _spin_once_impl(self, timeout_sec: Any = None,
                        wait_condition: Callable[[], bool] = lambda: False) -> None:
        try:
            handler, _entity, _node = self.wait_for_ready_callbacks(
                timeout_sec, None, wait_condition)
        except _NO_WORK:
            return
        with self._handover:
            if handler in self._waiting:  # yielded again while it waits for a thread
                self._handover.wait(HANDOVER_WAIT_S)
                return
            self._waiting.add(handler)
        try:
            self._pool.submit(self._run, handler)
        except RuntimeError:  # the pool was shut down from another thread during this round
            if self._is_shutdown:
                return
            raise
        self._handed.append(handler)
        for done in [h for h in self._handed if h.done()]:
            self._handed.remove(done)
            done.result()  # raises the callback's exception here, as rclpy's executors do

    def _run(self, handler: Any) -> None:
        with self._handover:
            self._waiting.discard(handler)
            self._handover.notify_all()
        handler()

    def spin_once(self, timeout_sec: float | None = None) -> None:
        self._spin_once_impl(timeout_sec)

    def _spin_once_until_future_complete(self, future: Any, timeout_sec: Any = None) -> None:
        self._spin_once_impl(timeout_sec, future.done)

    def spin_once_until_future_complete(self, future: Any, timeout_sec: Any = None) -> None:
        future.add_done_callback(lambda _future: self.wake())
        self._spin_once_until_future_complete(future, timeout_sec)

    def shutdown(self, timeout_sec: float | None = None, *,
                 wait_for_threads: bool = True) -> bool:
        """Stop executing callbacks, wait up to ``timeout_sec`` for those running, then
        stop the pool (joining its threads with ``wait_for_threads``)."""
        finished = super().shutdown(timeout_sec)
        self._pool.shutdown(wait=wait_for_threads)
        return finished


def run_node(make_node: Callable[[], Any], *, name: str, args: list[str] | None = None,
             num_threads: int = 2, executor: Callable[[Any], Executor] | None = None,
             start: Callable[[Any, Executor], int | None] | None = None,
             spin: Callable[[Executor, Any], int | None] | None = None,
             shutdown_timeout_s: float | None = 120.0,
             before_shutdown: Callable[[Any], None] | None = None,
             on_exit: Callable[[Any], None] | None = None,
             errors: tuple[type[BaseException], ...] = (),
             on_error: Callable[[BaseException], int] | None = None) -> int:
    """Run the node ``make_node()`` builds; return the process's exit status.

    ``args``: ROS arguments (``['--ros-args', ...]``), ``None`` for ``sys.argv``.
    ``executor(node)`` builds the executor (default: a :class:`PoolExecutor` of
    ``num_threads``).
    ``start(node, executor)`` runs once the node is in the executor; a code it returns ends
    the run with that status. ``spin(executor, node)`` spins (default: until shutdown) and
    may return the status. ``before_shutdown(node)`` runs once spinning stops, before the
    executor is shut down (``shutdown_timeout_s``: how long running callbacks may take to
    finish; ``None``: not shut down, the node's own ``destroy_node`` stops its work);
    ``on_exit(node)`` last, before the node is destroyed. An exception of ``errors`` raised
    while building or starting ends with ``on_error(exc)``'s status (default: one line on
    stderr, status 2).

    Ctrl-C shuts the context down from rclpy's signal handler; an executor that is just
    building its wait set then raises ``RCLError`` ("the given context is not valid")
    rather than ``ExternalShutdownException``. That is a shutdown too, not a crash.
    """
    rclpy.init(args=None if args is None else [name, *args])
    node = None
    code = 0
    try:
        runner = None
        try:
            node = make_node()
            runner = executor(node) if executor is not None else PoolExecutor(num_threads)
            runner.add_node(node)
            early = start(node, runner) if start is not None else None
        except errors as exc:
            early = on_error(exc) if on_error is not None else _one_line(name, exc)
        try:
            if early is not None:
                code = early
            elif spin is not None:
                code = spin(runner, node) or 0
            else:
                spin_executor(runner)
        finally:
            if node is not None and before_shutdown is not None:
                before_shutdown(node)
            if runner is not None and shutdown_timeout_s is not None:
                runner.shutdown(timeout_sec=shutdown_timeout_s)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except _rclpy.RCLError:
        if rclpy.ok():
            raise  # a real middleware error, not the shutdown race
    finally:
        if node is not None:
            if on_exit is not None:
                on_exit(node)
            node.destroy_node()
        rclpy.try_shutdown()
    return code


# How many times spin_executor carries a spin past rclpy's destruction race before it
# takes the error for a lasting one and raises it.
MAX_DESTRUCTION_RACES = 1000


def spin_executor(executor: Executor) -> None:
    """``executor.spin()`` (until shutdown), carried past one rclpy race.

    An entity destroyed from another thread just after the executor gathered it for its
    wait set (act_node's cleanup destroys its subscriptions, and with them their QoS event
    handlers) makes rclpy raise ``InvalidHandle`` ("cannot use Destroyable because
    destruction was requested", ros2/rclpy#1284) out of ``spin_once``: the spinning thread
    ended and the node stopped serving, its lifecycle services included. The next
    iteration no longer sees the destroyed entity, so the spin goes on.
    """
    races = 0
    while True:
        try:
            executor.spin()
            return
        except InvalidHandle:
            races += 1
            if races > MAX_DESTRUCTION_RACES:
                raise


def _one_line(name: str, exc: BaseException) -> int:
    print(f'{name}: {exc}', file=sys.stderr)
    return 2
