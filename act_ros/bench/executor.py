"""``act-ros bench executor``: act_node beside a robot harness in one process, spun by
rclpy's ``MultiThreadedExecutor``, by the project's ``PoolExecutor`` and by a
``SingleThreadedExecutor``, side by side.

Each try builds a fresh ``ActNode`` (async execution, torch backend, chunk mode, 1 torch
thread, diagnostics every 0.2 s) and a ``RobotHarness`` publishing both cameras and the
joint states at 30 Hz, spins both on the executor under test in a background thread
(4 threads for the multi-threaded ones), then configures and activates the node from the
main thread, as a test or an embedding application does. During the configure the node
holds its lock while it measures the model, so its status and tick callbacks wait for
it: a multi-threaded executor then has callbacks queued for its pool. Measured per try:

- the model's time per chunk as the node measured it at configure (the real-time
  verdict's median and worst): the work of the main thread, slowed by an executor that
  keeps the interpreter lock;
- how long ``start()`` (configure + activate) took;
- callbacks handed to the pool during ``start()`` (the multi-threaded executors: rclpy's
  queues a waiting callback again on every round of its wait loop, ros2/rclpy#1452);
- the time from activation to the first ``--commands`` commands on the command topic.

The kinds take turns within each try, so a busy machine slows them alike. One table,
medians and worst over the tries; ``--json`` writes every try.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic

KINDS = ('rclpy_multi_threaded', 'pool', 'single_threaded')
LABELS = {'rclpy_multi_threaded': "rclpy MultiThreadedExecutor (4 threads)",
          'pool': 'PoolExecutor (4 threads)',
          'single_threaded': 'SingleThreadedExecutor'}
THREADS = 4
SETTLE_S = 1.0  # the harness publishes for this long before the node starts
COMMAND_TIMEOUT_S = 120.0


@dataclass
class Try:
    kind: str
    index: int
    model_median_ms: float
    model_worst_ms: float
    start_s: float
    handed_over: int | None  # None: a single-threaded executor has no pool
    commands_s: float | None  # None: not within COMMAND_TIMEOUT_S


def _make_executor(kind: str, context: Any) -> tuple[Any, dict[str, int] | None]:
    """The executor and, for the pool ones, a counter of the callbacks handed to the pool."""
    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

    from act_ros.ros.spin import PoolExecutor
    if kind == 'single_threaded':
        return SingleThreadedExecutor(context=context), None
    if kind == 'pool':
        executor = PoolExecutor(THREADS, context=context)
        pool = executor._pool
    else:
        executor = MultiThreadedExecutor(num_threads=THREADS, context=context)
        pool = executor._executor  # rclpy's thread pool (Jazzy, Kilted)
    counter = {'handed': 0}
    submit = pool.submit

    def counted(*args: Any, **kwargs: Any) -> Any:
        counter['handed'] += 1
        return submit(*args, **kwargs)

    pool.submit = counted
    return executor, counter


def run_try(kind: str, index: int, context: Any, checkpoint: str, commands: int) -> Try:
    from rclpy.parameter import Parameter

    from act_ros.core.contract import load_contract
    from act_ros.ros.harness import RobotHarness, wait_until
    from act_ros.ros.node.act_node import ActNode
    from act_ros.ros.spin import spin_executor

    contract = load_contract()
    values = {'model_path': checkpoint, 'autostart': False, 'torch_threads': 1,
              'backend': 'torch', 'execution': 'async', 'mode': 'chunk',
              'max_obs_age_s': 2.0, 'diagnostics_period_s': 0.2,
              'release_gate.enabled': False}
    node = ActNode(context=context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])
    size = _image_size(checkpoint)
    image = np.random.default_rng(index).integers(0, 256, size=(*size, 3), dtype=np.uint8)
    harness = RobotHarness(context=context, image=image,
                           joints={n: 0.1 for n in contract.joint_names}, rate_hz=30.0,
                           name=f'bench_robot_{index}')
    executor, counter = _make_executor(kind, context)
    executor.add_node(node)
    executor.add_node(harness)
    spinner = threading.Thread(target=spin_executor, args=(executor,), daemon=True)
    spinner.start()
    try:
        time.sleep(SETTLE_S)
        handed_before = counter['handed'] if counter else 0
        started = time.monotonic()
        if not node.start():
            raise RuntimeError(f'act_node did not start: {node.last_configure_error}')
        start_s = time.monotonic() - started
        handed = counter['handed'] - handed_before if counter else None
        active_at = time.monotonic()
        got = wait_until(lambda: len(harness.commands_since(0.0)) >= commands,
                         COMMAND_TIMEOUT_S, 0.005)
        commands_s = time.monotonic() - active_at if got else None
        latency = node.verdict.latency
        return Try(kind, index, 1e3 * latency.median_s, 1e3 * latency.worst_s, start_s,
                   handed, commands_s)
    finally:
        executor.shutdown(timeout_sec=10.0)
        spinner.join(timeout=10.0)
        node.destroy_node()
        harness.destroy_node()


def _image_size(checkpoint: str) -> tuple[int, int]:
    config = json.loads((Path(checkpoint) / 'config.json').read_text())
    for key, feature in config['input_features'].items():
        if key.startswith('observation.images.'):
            return tuple(feature['shape'][-2:])
    raise ValueError(f'{checkpoint}: no camera input; the benchmark feeds cameras')


def _stat(values: list[float | None], digits: int) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return 'never'
    missing = len(values) - len(known)
    text = f'{np.median(known):.{digits}f} / {max(known):.{digits}f}'
    return text + (f' ({missing} never)' if missing else '')


def table(tries: list[Try], commands: int) -> str:
    lines = ['| executor | tries | model per chunk at configure, ms (median / worst try) '
             '| start(), s | callbacks handed to the pool during start() '
             f'| activation to {commands} commands, s |', '|---|---|---|---|---|---|']
    for kind in KINDS:
        rows = [t for t in tries if t.kind == kind]
        if not rows:
            continue
        handed = [t.handed_over for t in rows]
        handed_text = ('-' if handed[0] is None else
                       f'{int(np.median(handed))} / {max(handed)}')
        lines.append(f'| {LABELS[kind]} | {len(rows)} '
                     f'| {_stat([t.model_median_ms for t in rows], 0)} '
                     f'| {_stat([t.start_s for t in rows], 2)} | {handed_text} '
                     f'| {_stat([t.commands_s for t in rows], 2)} |')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros bench executor', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--checkpoint', help='checkpoint with cameras (default: a new tiny one, '
                   '48x64)')
    p.add_argument('--tries', type=int, default=5, help='tries per executor')
    p.add_argument('--commands', type=int, default=30,
                   help='commands to wait for after activation')
    p.add_argument('--kinds', default=','.join(KINDS),
                   help=f'executors to compare, comma-separated, of {", ".join(KINDS)}')
    p.add_argument('--output', type=Path, help='also write the markdown table here')
    p.add_argument('--json', type=Path, help='also write every try as JSON')
    p.add_argument('--no-header', action='store_true')
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(',') if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds or args.tries < 1 or args.commands < 1:
        p.error(f'--kinds must name some of {", ".join(KINDS)} (got {args.kinds!r}); '
                f'--tries and --commands must be >= 1 (got {args.tries}, {args.commands})')
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    os.environ.setdefault('ROS_DOMAIN_ID', str(10 + os.getpid() % 90))
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import rclpy

    from act_ros.core.inference.checkpoint import create_checkpoint
    tries: list[Try] = []
    with tempfile.TemporaryDirectory(prefix='act_ros_bench_executor_') as tmp:
        checkpoint = args.checkpoint or str(create_checkpoint(
            Path(tmp) / 'tiny', preset='tiny', image_size=(48, 64), seed=0))
        context = rclpy.context.Context()
        rclpy.init(context=context)
        try:
            for index in range(args.tries):
                for kind in kinds:
                    result = run_try(kind, index, context, checkpoint, args.commands)
                    tries.append(result)
                    print(f'[bench executor] try {index + 1}/{args.tries} {kind}: model '
                          f'{result.model_median_ms:.0f} ms at configure, start '
                          f'{result.start_s:.2f} s, handed over {result.handed_over}, '
                          f'{args.commands} commands after {result.commands_s} s', flush=True)
        finally:
            rclpy.try_shutdown(context=context)
    title = '' if args.no_header else '# act_ros executor benchmark\n\n'
    what = args.checkpoint or 'a tiny ACT (48x64 cameras)'
    text = (f'{title}## act_node and a 30 Hz robot harness in one process, per executor\n\n'
            f'{what}; async execution, chunk mode, torch, 1 thread; {args.tries} tries per '
            'executor, the executors taking turns.\n\n' + table(tries, args.commands) + '\n')
    print(text, flush=True)
    if args.output:
        write_text_atomic(args.output, text)
    if args.json:
        from act_ros.bench.report import result_provenance
        write_text_atomic(args.json, json.dumps({
            'provenance': result_provenance('act-ros bench executor',
                                            argv if argv is not None else sys.argv[1:],
                                            output_path=args.json),
            'checkpoint': args.checkpoint or 'tiny ACT, 48x64 cameras (created)',
            'threads': THREADS, 'commands': args.commands,
            'tries': [asdict(t) for t in tries]}, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
