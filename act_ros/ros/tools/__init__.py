"""The ``ros2`` commands the docs use, for machines without the ROS 2 CLI.

The pip/virtualenv setup (``make setup``: rclpy and the message packages from the Python
package index) has no ``ros2``: ``act-ros call`` stands for ``ros2 service call`` on the
package's ``std_srvs/srv/Trigger`` services, ``act-ros topics`` for ``ros2 topic list -t``,
``act-ros hz`` for ``ros2 topic hz`` (``act-ros share-dir`` for ``ros2 pkg prefix`` lives in
:mod:`act_ros.core.paths`: it needs no ROS). Each opens a node of its own in a fresh
context (the environment's ``ROS_DOMAIN_ID``) and closes it before it returns.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def graph_node(name: str) -> Iterator[tuple[Any, Any]]:
    """A node named ``name`` in a context of its own and a single-threaded executor that
    spins it: ``(node, executor)``; both shut down on exit."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    context = rclpy.context.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node(name, context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        try:
            yield node, executor
        finally:
            executor.shutdown()
            node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)


def spin_until(executor: Any, predicate: Callable[[], Any], timeout_s: float) -> Any:
    """Spin ``executor`` until ``predicate()`` is true or ``timeout_s`` passed; its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        executor.spin_once(timeout_sec=min(0.1, max(0.0, deadline - time.monotonic())))


def wait_in_graph(executor: Any, lookup: Callable[[], list], name: str, what: str,
                  timeout_s: float) -> list[str]:
    """The types of ``name`` once ``lookup()`` (a node's ``get_topic_names_and_types`` or
    ``get_service_names_and_types``) lists it; ``TimeoutError`` naming ``what`` (topic,
    service) after ``timeout_s`` seconds without it."""
    found = spin_until(executor, lambda: dict(lookup()).get(name, []), timeout_s)
    if not found:
        raise TimeoutError(f'no {what} {name} appeared within {timeout_s:g} s (is its node '
                           'running, with the same ROS_DOMAIN_ID? `act-ros topics` lists '
                           'what this machine sees)')
    return found


def absolute(name: str) -> str:
    """A topic or service name as the graph lists it (relative names resolve in ``/``)."""
    return name if name.startswith('/') else '/' + name


def message_class(type_name: str) -> Any:
    """The Python class of an interface type as the graph names it (``pkg/msg/Name``)."""
    parts = type_name.split('/')
    if len(parts) != 3:
        raise ValueError(f"interface type {type_name!r}: expected 'package/msg/Name'")
    package, kind, name = parts
    try:
        module = importlib.import_module(f'{package}.{kind}')
    except ImportError as exc:
        raise ValueError(f"{type_name}: its Python package '{package}' is not installed "
                         f"(pip: ros-{package.replace('_', '-')})") from exc
    try:
        return getattr(module, name)
    except AttributeError:
        raise ValueError(f'{type_name}: {package}.{kind} has no {name}') from None
