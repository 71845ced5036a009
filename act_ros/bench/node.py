"""``act-ros bench node``: act_node under a camera-rate load over Fast DDS on loopback.

A harness in this process publishes two 480x640 rgb8 cameras and joint states at 30 Hz;
``act_node`` runs as its own process (the console-script entry point), with a default-size
ACT checkpoint in async chunk mode unless told otherwise. After start-up the benchmark
measures for ``--duration`` seconds and prints:

- command rate (Hz) and missed periods (gaps between commands longer than 1.5 periods,
  counted in periods), as received here and as the node counts its own publishes
  (``node_missed_periods_in_window``: a late subscriber does not count there);
- observation-stamp-to-command latency, median and p99, as the node measures it
  (diagnostics: header stamp of the observation used by the tick -> publish);
- CPU use of the node (with its inference child process, if any), of the node's main
  process alone, and of the harness (percent of one core);
- time to the first command: from the start of the node's process to the first command at
  the harness (``time_to_first_command_s``), and the node's own account of it by phase
  (``startup.*``, from ``/diagnostics``: import, node init, child start, model import,
  checkpoint load, backend build with its export cache ``hit``/``miss``, warm-up, latency
  measurement, activation, first request, first chunk, first command; they add up to the
  node's ``startup.time_to_first_command_s``). ``--startup-only`` stops there.

Every ROS process runs with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST in one domain.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import random
import sys
import tempfile
import time

import numpy as np

from act_ros.core.atomic import write_text_atomic
from act_ros.core.processes import ProcessSet


def _proc_cpu_s(pid: int, *, descendants: bool = True) -> float | None:
    """User + system CPU seconds of a process and (by default) its live descendants, so an
    inference child process counts; ``None`` when the process is gone."""
    import psutil

    try:
        process = psutil.Process(pid)
        procs = [process] + (process.children(recursive=True) if descendants else [])
        total = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return total
    except psutil.Error:
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='act-ros bench node', description=__doc__.split('\n')[0])
    p.add_argument('--model-path', help='checkpoint to run (default: a new untrained one)')
    p.add_argument('--preset', default='default', help="model size of the created checkpoint "
                   "('default' = LeRobot ACT, 'cpu', 'tiny')")
    p.add_argument('--duration', type=float, default=30.0, help='measured seconds (>= 20)')
    p.add_argument('--rate', type=float, default=30.0, help='camera/joint rate = control rate')
    p.add_argument('--height', type=int, default=480, help='camera image height (published)')
    p.add_argument('--width', type=int, default=640, help='camera image width (published)')
    p.add_argument('--model-size', type=_size, default=None, metavar='HxW',
                   help='input size of the created checkpoint (default: the camera size); '
                   'the runtime resizes the cameras to it')
    p.add_argument('--chunk-size', type=int, default=None,
                   help="chunk size of the created checkpoint (default: the contract's)")
    p.add_argument('--n-action-steps', type=int, default=None,
                   help='actions played per chunk in chunk mode (default: the chunk size)')
    p.add_argument('--device', default='auto')
    p.add_argument('--mode', default='chunk', choices=('chunk', 'ensemble'))
    p.add_argument('--execution', default='async', choices=('async', 'process', 'sync'))
    p.add_argument('--torch-threads', type=int, default=0)
    p.add_argument('--backend', default='torch', choices=('torch', 'openvino', 'onnxruntime'))
    p.add_argument('--executor', default='auto',
                   choices=('auto', 'multi_threaded', 'single_threaded'),
                   help="act_node's executor (default: the node's own default, 'auto')")
    p.add_argument('--startup-timeout', type=float, default=300.0)
    p.add_argument('--startup-only', action='store_true',
                   help='measure the time to the first command (and its phases) only')
    p.add_argument('--json', help='also write the results to this JSON file')
    args = p.parse_args(argv)
    if args.model_path and (args.model_size or args.chunk_size):
        p.error('--model-size and --chunk-size describe the created checkpoint; '
                'they cannot be combined with --model-path')
    for name in ('chunk_size', 'n_action_steps'):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def _size(text: str) -> tuple[int, int]:
    from act_ros.core.contract import parse_image_size

    try:
        h, w = parse_image_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW (e.g. 240x320), got '{text}'") from None
    if h < 16 or w < 16:
        raise argparse.ArgumentTypeError(f'expected at least 16x16, got {h}x{w}')
    return h, w


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    os.environ.setdefault('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp')
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(10, 99)))
    # Full-size images between processes need the large shared-memory profile (both sides).
    from act_ros.ros.evaluation.dds import dds_environment
    os.environ.update(dds_environment(dict(os.environ)))

    import rclpy

    from act_ros.core.contract import load_contract
    from act_ros.core.paths import config_path
    from act_ros.ros.harness import RobotHarness, spinning, wait_until

    contract = load_contract()
    with tempfile.TemporaryDirectory(prefix='act_ros_bench_node_') as tmp:
        model_path = args.model_path
        if not model_path:
            from act_ros.core.checkpoint import create_checkpoint
            size = args.model_size or (args.height, args.width)
            overrides = {'chunk_size': args.chunk_size} if args.chunk_size else {}
            print(f'[bench node] creating an untrained {args.preset} ACT checkpoint '
                  f'({size[0]}x{size[1]} input, chunk {args.chunk_size or contract.chunk_size}; '
                  f'{args.height}x{args.width} cameras)', flush=True)
            model_path = str(create_checkpoint(Path(tmp) / 'model', preset=args.preset,
                                               image_size=size, **overrides))
        cmd = [sys.executable, '-m', 'act_ros.ros.node.act_node', '--ros-args',
               '--params-file', str(config_path('act.yaml')),
               '-p', f'model_path:={model_path}', '-p', f'device:={args.device}',
               '-p', f'mode:={args.mode}', '-p', f'execution:={args.execution}',
               '-p', f'control_rate_hz:={float(args.rate)}',
               '-p', f'torch_threads:={args.torch_threads}',
               '-p', f'executor:={args.executor}',
               '-p', f'backend:={args.backend}',
               '-p', 'diagnostics_period_s:=1.0']
        n_action_steps = args.n_action_steps or args.chunk_size
        if n_action_steps:
            cmd[-2:-2] = ['-p', f'n_action_steps:={n_action_steps}']
        print(f"[bench node] starting act_node (ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']})",
              flush=True)
        # The robot is up before the node starts, as on a real robot: the time to the
        # first command is the node's, not the harness's own start-up.
        context = rclpy.context.Context()
        rclpy.init(context=context)
        rng = np.random.default_rng(0)
        image = rng.integers(0, 256, size=(args.height, args.width, 3), dtype=np.uint8)
        harness = RobotHarness(context=context, cameras=contract.camera_names,
                               joints={n: 0.0 for n in contract.joint_names}, image=image,
                               rate_hz=args.rate, name='bench_robot')
        procs = ProcessSet(Path(tmp), dict(os.environ))
        try:
            with spinning(context, harness, num_threads=2):
                launched = time.monotonic()  # the node's process starts now
                node = procs.start('act_node', cmd)
                node_proc, log_path = node.popen, node.log_path
                wait_until(lambda: harness.commands or node_proc.poll() is not None,
                           args.startup_timeout, interval_s=0.2)
                if not harness.commands:
                    print(f'[bench node] no command within {args.startup_timeout:.0f} s '
                          f'(node exit code {node_proc.poll()}):\n'
                          f'{log_path.read_text()[-3000:]}', flush=True)
                    return 1
                results = {'time_to_first_command_s': harness.commands[0].received - launched}
                # The node reports its phases on /diagnostics once the first command is out.
                results.update(wait_until(lambda: startup_values(harness.latest_diagnostics()),
                                          10.0, interval_s=0.1) or {})
                if not args.startup_only:
                    results.update(measure_load(harness, node_proc.pid, args))
            results.update(camera_size=f'{args.height}x{args.width}',
                           model_input_size=('x'.join(map(str, args.model_size))
                                             if args.model_size else 'camera size'),
                           chunk_size=args.chunk_size or ('given' if args.model_path
                                                          else contract.chunk_size),
                           n_action_steps=n_action_steps or 'config/act.yaml',
                           mode=f'{args.mode}/{args.execution}', executor=args.executor,
                           backend=args.backend,
                           preset=args.preset if not args.model_path else 'given',
                           cpu_count=os.cpu_count())
        finally:
            procs.stop_all(grace_s=20.0)  # SIGINT, then escalation; its inference child too
            rclpy.try_shutdown(context=context)
    report(results)
    if args.json:
        write_text_atomic(args.json, json.dumps(results, indent=2))
    return 0


def measure_load(harness, node_pid: int, args: argparse.Namespace) -> dict:
    """Commands, latency and CPU over ``args.duration`` seconds, after 2 s of settling."""
    time.sleep(2.0)  # settle past start-up
    t0 = time.monotonic()
    before = harness.latest_diagnostics()
    node_cpu0, own_cpu0 = _proc_cpu_s(node_pid), time.process_time()
    main_cpu0 = _proc_cpu_s(node_pid, descendants=False)
    time.sleep(args.duration)
    t1 = time.monotonic()
    node_cpu1, own_cpu1 = _proc_cpu_s(node_pid), time.process_time()
    main_cpu1 = _proc_cpu_s(node_pid, descendants=False)
    results = summarize(harness, t0, t1, args.rate, harness.latest_diagnostics(since=t1 - 1.5),
                        before=before)
    wall = t1 - t0
    if node_cpu0 is not None and node_cpu1 is not None:
        results['node_cpu_percent'] = 100.0 * (node_cpu1 - node_cpu0) / wall
        results['node_main_process_cpu_percent'] = 100.0 * (main_cpu1 - main_cpu0) / wall
    results['harness_cpu_percent'] = 100.0 * (own_cpu1 - own_cpu0) / wall
    results['duration_s'] = wall
    return results


def startup_values(diag: tuple | None) -> dict[str, float | str]:
    """The node's ``startup.*`` diagnostics (numbers as floats) once its time to the first
    command is known; empty before that."""
    values = diag[2] if diag else {}
    out: dict[str, float | str] = {}
    for key, value in values.items():
        if not key.startswith('startup.'):
            continue
        try:
            out[key] = float(value)
        except ValueError:
            out[key] = value
    if not isinstance(out.get('startup.time_to_first_command_s'), float):
        return {}
    return out


def _missed(times: np.ndarray, period: float) -> tuple[int, np.ndarray]:
    """Periods without a command between the times ``times``, and the gaps."""
    from act_ros.ros.diagnostics import missed_periods

    gaps = np.diff(times) if times.size > 1 else np.zeros(0)
    return missed_periods(gaps, period), gaps


def summarize(harness, t0: float, t1: float, rate_hz: float, diag, before=None) -> dict:
    """Rates, gaps and latencies of the commands received in [t0, t1]; with ``before`` (the
    diagnostics at t0), the chunks that came late within the window; the node's real-time
    verdict from its configure-time measurement.

    Gaps are counted twice: at the middleware's reception time of each command (what a
    controller subscribed to the topic would see) and at this process's callback, which
    runs late whenever the harness itself (publishing two full-size cameras from Python)
    is busy."""
    window = [c for c in harness.commands if t0 <= c.received <= t1]
    times = np.array([c.received for c in window])
    period = 1.0 / rate_hz
    missed_callback, gaps = _missed(times, period)
    missed = missed_callback
    stamps = [c.middleware_received_s for c in window]
    if window and all(s is not None for s in stamps):
        missed, gaps = _missed(np.sort(np.array(stamps)), period)
    values = diag[2] if diag else {}

    def number(key, report=diag):
        try:
            return float(report[2][key]) if report else None
        except (KeyError, ValueError):
            return None

    def in_window(key):
        now, then = number(key), number(key, before)
        return now - then if now is not None and then is not None else None
    return {
        'realtime_feasible': values.get('realtime.feasible'),
        'realtime_verdict': values.get('realtime.feasibility'),
        'realtime_latency_median_ms': number('realtime.latency_median_ms'),
        'realtime_latency_worst_ms': number('realtime.latency_worst_ms'),
        'commands': int(times.size),
        'command_rate_hz': float(times.size / (t1 - t0)),
        'target_rate_hz': rate_hz,
        'missed_periods': missed,
        'missed_periods_at_callback': missed_callback,
        'max_gap_ms': float(gaps.max() * 1e3) if gaps.size else None,
        'latency_p50_ms': number('obs_to_command_p50_ms'),
        'latency_p99_ms': number('obs_to_command_p99_ms'),
        'inference_mean_ms': number('inference_mean_ms'),
        'chunks_computed': number('chunks_computed'),
        'chunks_late': number('chunks_late'),
        'chunks_late_in_window': in_window('chunks_late'),
        # The node's own count (its publish times): tells its lateness from the harness's.
        'node_missed_periods_in_window': in_window('missed_periods'),
        'stale_ticks': number('stale_ticks'),
        'device': values.get('device'),
    }


def report(results: dict) -> None:
    print('\nact_node benchmark')
    for key, value in results.items():
        text = f'{value:.2f}' if isinstance(value, float) else str(value)
        print(f'  {key:<38} {text}')


if __name__ == '__main__':
    sys.exit(main())
