"""Spinning nodes: the console-script life of a node (init, build, spin until Ctrl-C or
shutdown, then clean up in order; shared by ``act_node``, ``sim_bridge``, ``record_node``
and ``expert_driver``) and :class:`PoolExecutor`, the multi-threaded executor they use."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

import rclpy
from rclpy import executors as _executors
from rclpy.exceptions import InvalidHandle
from rclpy.executors import Executor, ExternalShutdownException, ShutdownException, TimeoutException
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
        # Handed to the pool, not started by a thread yet: handler -> its entity.
        self._waiting: dict[Any, Any] = {}
        self._handed: dict[Any, None] = {}  # handed over, their exceptions not yet raised
        self._inflight: set[Future] = set()  # the pool's work not finished yet
        self._closing = False

    def __del__(self) -> None:
        if hasattr(self, '_pool'):  # not when __init__ refused its arguments
            super().__del__()

    def _spin_once_impl(self, timeout_sec: Any = None,
                        wait_condition: Callable[[], bool] = lambda: False) -> None:
        try:
            handler, entity, _node = self.wait_for_ready_callbacks(
                timeout_sec, None, wait_condition)
        except _NO_WORK:
            return
        with self._handover:
            if self._closing:
                _release(handler, entity)
                return
            if handler in self._waiting:  # yielded again while it waits for a thread
                self._handover.wait(_handover_wait(timeout_sec))
                return
            self._waiting[handler] = entity
            try:
                work = self._pool.submit(self._run, handler)
            except RuntimeError:  # the pool was shut down from another thread
                del self._waiting[handler]
                _release(handler, entity)
                if self._closing:
                    return
                raise
            self._inflight.add(work)
        work.add_done_callback(self._finished)
        self._handed[handler] = None
        for done in [h for h in self._handed if h.done()]:
            del self._handed[done]
            done.result()  # raises the callback's exception here, as rclpy's executors do

    def _run(self, handler: Any) -> None:
        with self._handover:
            entity = self._waiting.pop(handler, None)
            self._handover.notify_all()
            if self._closing:  # shut down while it waited: its input stays untaken
                _release(handler, entity)
                return
        handler()

    def _finished(self, work: Future) -> None:
        with self._handover:
            self._inflight.discard(work)

    def spin_once(self, timeout_sec: float | None = None) -> None:
        self._spin_once_impl(timeout_sec)

    def _spin_once_until_future_complete(self, future: Any, timeout_sec: Any = None) -> None:
        self._spin_once_impl(timeout_sec, future.done)

    def spin_once_until_future_complete(self, future: Any, timeout_sec: Any = None) -> None:
        future.add_done_callback(lambda _future: self.wake())
        self._spin_once_until_future_complete(future, timeout_sec)

    def shutdown(self, timeout_sec: float | None = None, *,
                 wait_for_threads: bool = True) -> bool:
        """Stop executing callbacks and wait up to ``timeout_sec`` (``None`` or negative:
        without limit) for those running; return whether they all finished.

        Callbacks handed over but not started yet do not run: their messages, requests and
        timer ticks are not taken. The pool's threads are joined (``wait_for_threads``)
        only when every callback finished in time: a callback that never returns cannot
        hang the shutdown past ``timeout_sec``. (rclpy's own ``Executor.shutdown`` of this
        release sets its flag before it looks at it and never waits.)"""
        with self._handover:
            self._closing = True
            inflight = list(self._inflight)
        self._is_shutdown = True  # the base class's flag: spin() ends its loop
        self.wake()
        limit = None if timeout_sec is None or timeout_sec < 0 else timeout_sec
        _done, running = wait_futures(inflight, limit)
        super().shutdown(0)  # the base class's clean-up: nodes, guard conditions
        self._pool.shutdown(wait=wait_for_threads and not running, cancel_futures=True)
        with self._handover:  # cancelled before a thread took them
            left = list(self._waiting.items())
            self._waiting.clear()
        for handler, entity in left:
            _release(handler, entity)
        return not running


def _handover_wait(timeout_sec: Any) -> float:
    """How long a round waits for a pool thread to start a handed-over callback: at most
    ``HANDOVER_WAIT_S``, and no longer than a ``spin_once`` timeout in seconds."""
    if isinstance(timeout_sec, (int, float)) and timeout_sec >= 0:
        return min(HANDOVER_WAIT_S, float(timeout_sec))
    return HANDOVER_WAIT_S


def _release(handler: Any, entity: Any) -> None:
    """Give an entity whose callback will not run back to the wait set (rclpy marks it
    taken when it makes the handler) and cancel the handler's task."""
    if entity is not None:
        entity._executor_event = False
    handler.cancel()


def run_node(make_node: Callable[[], Any], *, name: str, args: list[str] | None = None,
             num_threads: int = 2, executor: Callable[[Any], Executor] | None = None,
             start: Callable[[Any, Executor], int | None] | None = None,
             spin: Callable[[Executor, Any], int | None] | None = None,
             shutdown_timeout_s: float | None = 120.0,
             before_shutdown: Callable[[Any], None] | None = None,
             on_exit: Callable[[Any], None] | None = None,
             errors: tuple[type[BaseException], ...] = (),
             on_error: Callable[[BaseException], int] | None = None,
             help_text: Callable[[], str] | None = None) -> int:
    """Run the node ``make_node()`` builds; return the process's exit status.

    ``args``: ROS arguments (``['--ros-args', ...]``), ``None`` for ``sys.argv``. With
    ``-h`` or ``--help`` among the arguments before ``--ros-args``, ``help_text()`` is
    printed and nothing starts (status 0).
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
    if help_text is not None and asks_for_help(sys.argv[1:] if args is None else args):
        print(help_text())
        return 0
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


def asks_for_help(args: list[str]) -> bool:
    """Whether the command line asks for ``--help`` (``-h``) before any ``--ros-args``."""
    for arg in args:
        if arg == '--ros-args':
            return False
        if arg in ('-h', '--help'):
            return True
    return False


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
