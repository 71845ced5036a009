"""The console-script life of a node: init, build, spin until Ctrl-C or shutdown, then
clean up in order (shared by ``act_node``, ``sim_bridge``, ``record_node`` and
``expert_driver``)."""

from __future__ import annotations

from collections.abc import Callable
import sys
from typing import Any

import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy


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
    ``executor(node)`` builds the executor (default: multi-threaded, ``num_threads``).
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
            runner = executor(node) if executor is not None else MultiThreadedExecutor(
                num_threads=num_threads)
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
