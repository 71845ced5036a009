"""``act-ros call``: call a ``std_srvs/srv/Trigger`` service, as ``ros2 service call``.

    act-ros call /record_node/start_episode
    act-ros call /act_node/reset --timeout 10

The recorder's ``start_episode``, ``save_episode``, ``discard_episode`` and the ``reset``
and ``seams`` services of ``act_node`` and ``sim_bridge`` are Triggers. Prints the
answer's ``success`` and ``message``.

exit status: 0 the service answered success, 1 it answered failure, 3 no such service
(or one of another type) appeared, or it did not answer, within --timeout.
"""

from __future__ import annotations

import argparse
import sys

from act_ros.core.arguments import HelpFormatter

TRIGGER = 'std_srvs/srv/Trigger'
NO_SERVICE = 3


def call_trigger(service: str, timeout_s: float) -> tuple[bool, str]:
    """Call the Trigger service ``service``: ``(success, message)``. ``TimeoutError`` when
    it does not appear or answer within ``timeout_s`` seconds, ``TypeError`` when it is not
    a Trigger."""
    import time

    from std_srvs.srv import Trigger

    from act_ros.ros.tools import absolute, graph_node, wait_in_graph

    name = absolute(service)
    deadline = time.monotonic() + timeout_s
    with graph_node('act_ros_call') as (node, executor):
        found = wait_in_graph(executor, node.get_service_names_and_types, name, 'service',
                              timeout_s)
        if TRIGGER not in found:
            raise TypeError(f'{name} is a {", ".join(found)}; act-ros call calls {TRIGGER} '
                            'services')
        client = node.create_client(Trigger, name)
        remaining = max(0.0, deadline - time.monotonic())
        if not client.wait_for_service(timeout_sec=remaining):
            raise TimeoutError(f'{name} did not become ready within {timeout_s:g} s')
        future = client.call_async(Trigger.Request())
        executor.spin_until_future_complete(future, timeout_sec=max(0.0, deadline -
                                                                    time.monotonic()))
        if not future.done():
            raise TimeoutError(f'{name} did not answer within {timeout_s:g} s')
        response = future.result()
        return bool(response.success), response.message


def main(argv: list[str] | None = None) -> int:
    doc, _, epilog = __doc__.partition('exit status:')
    p = argparse.ArgumentParser(prog='act-ros call', description=doc.strip(),
                                epilog='exit status:' + epilog.rstrip(),
                                formatter_class=HelpFormatter)
    p.add_argument('service', help="the service's name, e.g. /record_node/start_episode")
    # Not ros2's forever, but long enough for a recorder opening its encoders (seconds
    # on a loaded 2-core machine).
    p.add_argument('--timeout', type=float, default=30.0,
                   help='seconds to wait for the service to appear and answer')
    args = p.parse_args(argv)
    if args.timeout <= 0:
        p.error(f'--timeout must be > 0 seconds, got {args.timeout:g}')
    try:
        success, message = call_trigger(args.service, args.timeout)
    except (TimeoutError, TypeError) as exc:
        print(f'act-ros call: {exc}', file=sys.stderr)
        return NO_SERVICE
    print(f'success: {success}\nmessage: {message}')
    return 0 if success else 1


if __name__ == '__main__':
    sys.exit(main())
