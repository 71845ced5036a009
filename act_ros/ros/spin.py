"""The console-script life of a simple node: init, build, spin until Ctrl-C or shutdown,
then clean up in order (shared by ``record_node`` and ``expert_driver``)."""

from __future__ import annotations

from collections.abc import Callable
import sys
from typing import Any

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor


def run_node(make_node: Callable[[], Any], *, name: str, args: list[str] | None = None,
             num_threads: int = 2, before_shutdown: Callable[[Any], None] | None = None,
             on_exit: Callable[[Any], None] | None = None,
             errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run the node ``make_node()`` builds on a multi-threaded executor.

    ``args``: ROS arguments (``['--ros-args', ...]``), ``None`` for ``sys.argv``.
    ``before_shutdown(node)`` runs once spinning stops, before the executor is shut down
    (which lets running callbacks finish); ``on_exit(node)`` last, before the node is
    destroyed. An exception of ``errors`` raised while building ends with one line and
    exit status 2.
    """
    rclpy.init(args=None if args is None else [name, *args])
    node = None
    code = 0
    try:
        node = make_node()
        executor = MultiThreadedExecutor(num_threads=num_threads)
        executor.add_node(node)
        try:
            executor.spin()
        finally:
            if before_shutdown is not None:
                before_shutdown(node)
            executor.shutdown(timeout_sec=120.0)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except errors as exc:
        print(f'{name}: {exc}', file=sys.stderr)
        code = 2
    finally:
        if node is not None:
            if on_exit is not None:
                on_exit(node)
            node.destroy_node()
        rclpy.try_shutdown()
    return code
