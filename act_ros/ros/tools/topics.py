"""``act-ros topics``: the topics this machine sees, with their types, as ``ros2 topic list -t``.

    act-ros topics
    act-ros topics --wait 5       # a large or slow graph: discover for longer

Discovery takes a moment without the ROS 2 daemon: the list is read after --wait seconds.
"""

from __future__ import annotations

import argparse
import sys

from act_ros.core.arguments import HelpFormatter


def list_topics(wait_s: float) -> list[tuple[str, list[str]]]:
    """``(name, types)`` of every topic seen after ``wait_s`` seconds of discovery."""
    from act_ros.ros.tools import graph_node, spin_until

    with graph_node('act_ros_topics') as (node, executor):
        spin_until(executor, lambda: False, wait_s)
        return sorted(node.get_topic_names_and_types())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros topics', description=__doc__.strip(),
                                formatter_class=HelpFormatter)
    p.add_argument('--wait', type=float, default=2.0, help='seconds of discovery')
    args = p.parse_args(argv)
    if args.wait < 0:
        p.error(f'--wait must be >= 0 seconds, got {args.wait:g}')
    for name, types in list_topics(args.wait):
        print(f'{name} [{", ".join(types)}]')
    return 0


if __name__ == '__main__':
    sys.exit(main())
