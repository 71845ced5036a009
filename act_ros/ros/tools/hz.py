"""``act-ros hz``: the message rate of a topic, as ``ros2 topic hz``.

    act-ros hz /camera/top/image_raw
    act-ros hz /joint_states --seconds 10

Subscribes with the topic's own type (read from the graph), best effort (as
``qos_profile_sensor_data``, which hears reliable and best-effort publishers), without
deserializing the messages, for --seconds; then prints the average rate and the spread of
the intervals between arrivals (the middleware's receive times).

exit status: 0 a rate was measured, 1 fewer than two messages arrived, 3 the topic did not
appear within --timeout or its type is not installed here.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np

from act_ros.core.arguments import HelpFormatter

NO_TOPIC = 3


@dataclass(frozen=True)
class Rate:
    """What arrived on a topic: ``count`` messages, their intervals in seconds."""

    count: int
    intervals_s: np.ndarray

    @property
    def hz(self) -> float:
        return len(self.intervals_s) / float(self.intervals_s.sum()) \
            if len(self.intervals_s) and self.intervals_s.sum() > 0 else float('nan')

    def describe(self, topic: str, seconds: float) -> str:
        i = self.intervals_s
        return (f'{topic}: average rate {self.hz:.3f} Hz ({self.count} messages in '
                f'{seconds:g} s; interval min {i.min():.4f} s, max {i.max():.4f} s, '
                f'std dev {i.std():.4f} s)')


def measure_rate(topic: str, seconds: float, timeout_s: float) -> Rate:
    """Listen to ``topic`` for ``seconds`` once it appears (within ``timeout_s``).
    ``TimeoutError`` when it does not appear, ``ValueError`` when its type is unknown."""
    from rclpy.qos import qos_profile_sensor_data

    from act_ros.ros.tools import absolute, graph_node, message_class, spin_until, wait_in_graph

    name = absolute(topic)
    stamps: list[float] = []

    def arrived(_raw: bytes, info: object) -> None:
        stamp = info.get('received_timestamp', 0) if info else 0
        stamps.append(stamp * 1e-9 if stamp else time.monotonic())

    with graph_node('act_ros_hz') as (node, executor):
        found = wait_in_graph(executor, node.get_topic_names_and_types, name, 'topic',
                              timeout_s)
        node.create_subscription(message_class(found[0]), name, arrived,
                                 qos_profile_sensor_data, raw=True)
        spin_until(executor, lambda: False, seconds)
    intervals = np.diff(np.sort(np.asarray(stamps, dtype=np.float64)))
    return Rate(len(stamps), intervals)


def main(argv: list[str] | None = None) -> int:
    doc, _, epilog = __doc__.partition('exit status:')
    p = argparse.ArgumentParser(prog='act-ros hz', description=doc.strip(),
                                epilog='exit status:' + epilog.rstrip(),
                                formatter_class=HelpFormatter)
    p.add_argument('topic', help='the topic, e.g. /camera/top/image_raw')
    p.add_argument('--seconds', type=float, default=5.0, help='how long to measure')
    p.add_argument('--timeout', type=float, default=5.0,
                   help='seconds to wait for the topic to appear')
    args = p.parse_args(argv)
    for option in ('seconds', 'timeout'):
        if getattr(args, option) <= 0:
            p.error(f'--{option} must be > 0 seconds, got {getattr(args, option):g}')
    try:
        rate = measure_rate(args.topic, args.seconds, args.timeout)
    except (TimeoutError, ValueError) as exc:
        print(f'act-ros hz: {exc}', file=sys.stderr)
        return NO_TOPIC
    if rate.count < 2:
        print(f'act-ros hz: {rate.count} message(s) on {args.topic} in {args.seconds:g} s: '
              'no rate', file=sys.stderr)
        return 1
    print(rate.describe(args.topic, args.seconds))
    return 0


if __name__ == '__main__':
    sys.exit(main())
