"""``act-ros bench node``: act_node under a camera-rate load over Fast DDS on loopback.

A harness in this process publishes two 480x640 rgb8 cameras and joint states at 30 Hz;
``act_node`` runs as its own process (the console-script entry point), with a default-size
ACT checkpoint and the node's own parameters (``config/act.yaml``: model in a child
process, blended handovers, its executor, backend and threads) unless an option says otherwise.
After start-up the benchmark measures for ``--duration`` seconds and prints:

- command rate (Hz) and missed periods over the whole window: every control period
  without a command, counted from the window's start to its end (a gap longer than 1.5
  periods counts as its length in periods, less the one the next command fills; the
  stretches before the first and after the last command of the window count too, so a
  node that stalls reports the periods it missed), as received here and as the node
  counts its own publishes (``node_missed_periods_in_window``: a late subscriber does not
  count there);
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

``--visualization`` sets the node's ``visualization.enabled`` (``on``, its default, or
``off``); the harness then subscribes to ``~/planned_path`` and ``~/markers`` as RViz
would, so the messages are really delivered, and reports their rates. ``compare`` measures
the same configuration with visualization off and on in one run (a fresh node each time,
the same checkpoint, harness and duration) and prints them side by side: the missed
periods of each and their difference. ``--repeats N`` measures each setting N times in
the balanced order off, on, on, off, off, on, ... (so the first round's cold caches and
any drift of the machine fall on both) and compares the medians.

``--mode`` sets the node's ``mode`` (chunk, ensemble, blend); a comma list
(``chunk,blend``) measures each side by side like ``--precision`` below. Every round
reports the seams of the commands the node sent (``seams_*``: handovers, how many were
over the within-chunk p99, velocity jumps; the node's own rolling figures).

``--precision`` sets the node's ``precision`` (default: the node's own, ``auto``); a comma
list (``fp32,bf16``) measures each in one run, side by side, the same way (a fresh node per
round, ``--repeats`` rounds each in a balanced order, medians compared). ``--json`` writes
the results with their provenance (the command, the source revision, the machine and its
CPU class), so a committed result file says where it came from.

A checkpoint that takes the object poses (``--model-path`` of an object-state policy) is
fed fixed box and pad poses on the node's object pose topics with every camera frame.

Every ROS process runs with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST in one domain.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.inference.checkpoint_info import SIM_CHUNK_SIZE
from act_ros.core.inference.options import BACKEND_CHOICES, PRECISIONS
from act_ros.core.inference.precision import AUTO
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
    p = argparse.ArgumentParser(prog='act-ros bench node', description=__doc__.split('\n')[0],
                                formatter_class=HelpFormatter)
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
                   help=f'chunk size of the created checkpoint (default {SIM_CHUNK_SIZE}, the '
                        "project's simulated arm's)")
    p.add_argument('--n-action-steps', type=int, default=None,
                   help='actions played per chunk in chunk mode (default: the chunk size)')
    p.add_argument('--device', default='auto')
    # None: the node's own value (config/act.yaml), not passed on its command line.
    p.add_argument('--mode', default=None,
                   help="act_node's mode (default: the node's, blend), or a comma list of "
                   f'them measured side by side in one run; from {NODE_MODES}')
    p.add_argument('--execution', default=None, choices=('async', 'process', 'sync'),
                   help="default: the node's (process: the model in a child process)")
    p.add_argument('--torch-threads', type=int, default=None,
                   help="default: the node's (0: PyTorch's default)")
    p.add_argument('--backend', default=None, choices=BACKEND_CHOICES,
                   help="default: the node's (auto: openvino on a CPU where installed)")
    p.add_argument('--executor', default=None,
                   choices=('auto', 'multi_threaded', 'single_threaded'),
                   help="act_node's executor (default: the node's own, auto)")
    p.add_argument('--startup-timeout', type=float, default=300.0)
    p.add_argument('--startup-only', action='store_true',
                   help='measure the time to the first command (and its phases) only')
    p.add_argument('--visualization', default='on', choices=('on', 'off', 'compare'),
                   help="act_node's visualization.enabled: on (the node's default), off, or "
                   'compare: off, then on, each measured for --duration, side by side')
    p.add_argument('--precision', default=None,
                   help="act_node's precision (default: the node's, auto), or a comma list "
                   f"of them measured side by side in one run; from {(AUTO, *PRECISIONS)}")
    p.add_argument('--inference-nice', default=None,
                   help="act_node's inference_nice (the inference process's niceness; default: "
                   "the node's, 0), or a comma list of values measured side by side in one run")
    p.add_argument('--model-only-calls', type=int, default=10,
                   help="model-only calls the node times at configure (its model_only_calls) "
                        'for split_model_only_ms, the model alone per chunk beside the split '
                        '(default 10; 0: the two calls behind the real-time verdict; not with '
                        '--startup-only, whose time to the first command they would lengthen)')
    p.add_argument('--repeats', type=int, default=1,
                   help='with a comparison (--visualization compare, several --precision or '
                   '--inference-nice values): '
                   'rounds per setting, in a balanced order (a b, b a, a b, ...); the medians '
                   'are compared (default 1)')
    p.add_argument('--json', help='also write the results to this JSON file')
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f'--repeats must be >= 1, got {args.repeats}')
    if not 0 <= args.model_only_calls <= 1000:
        p.error(f'--model-only-calls must be 0-1000, got {args.model_only_calls}')
    precisions = args.precision.split(',') if args.precision is not None else []
    unknown = [name for name in precisions if name not in (AUTO, *PRECISIONS)]
    if unknown or (args.precision is not None and len(set(precisions)) != len(precisions)):
        p.error(f'--precision: expected distinct values from {(AUTO, *PRECISIONS)}, '
                f"got '{args.precision}'")
    modes = args.mode.split(',') if args.mode is not None else []
    if any(mode not in NODE_MODES for mode in modes) or len(set(modes)) != len(modes):
        p.error(f"--mode: expected distinct values from {NODE_MODES}, got '{args.mode}'")
    nices = args.inference_nice.split(',') if args.inference_nice is not None else []
    if nices and (not all(n.isdigit() and int(n) <= 19 for n in nices)
                  or len(set(nices)) != len(nices)):
        p.error(f"--inference-nice: expected distinct integers 0-19, got '{args.inference_nice}'")
    if sum((len(precisions) > 1, len(nices) > 1, len(modes) > 1,
            args.visualization == 'compare')) > 1:
        p.error('compare one thing at a time: several --precision, --inference-nice or '
                '--mode values or --visualization compare, not two of them')
    if args.repeats > 1 and len(variants(args)) < 2:
        p.error('--repeats applies to a comparison only (--visualization compare, or '
                'several --precision, --inference-nice or --mode values)')
    if args.model_path and (args.model_size or args.chunk_size):
        p.error('--model-size and --chunk-size describe the created checkpoint; '
                'they cannot be combined with --model-path')
    for name in ('chunk_size', 'n_action_steps'):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


NODE_MODES = ('chunk', 'ensemble', 'blend')
# The node's seam figures the benchmark reports (seams.<name> on /diagnostics).
SEAM_FIGURES = ('handovers', 'over_within_p99', 'velocity_jump_median', 'velocity_jump_max',
                'within_chunk_velocity_step_p99')
NODE_OPTIONS = ('mode', 'execution', 'torch_threads', 'backend', 'executor', 'precision',
                'inference_nice')
# Node options a comma list of values compares side by side (one round per value).
COMPARED_OPTIONS = ('precision', 'inference_nice', 'mode')


def variants(args: argparse.Namespace) -> list[tuple[str, dict[str, str]]]:
    """The settings this run measures, as ``(label, node parameters)``: one, or the two of
    ``--visualization compare`` (off, on), or one per ``--precision`` (or
    ``--inference-nice``) value. Every setting carries ``visualization.enabled``; a single
    value is a plain node option."""
    visualization = {'visualization.enabled': 'true' if args.visualization == 'on' else 'false'}
    if args.visualization == 'compare':
        return [(label, {'visualization.enabled': enabled})
                for label, enabled in (('off', 'false'), ('on', 'true'))]
    kind = compared(args)
    if kind in COMPARED_OPTIONS:
        values = getattr(args, kind).split(',')
        label = (lambda v: f'nice_{v}') if kind == 'inference_nice' else (lambda v: v)
        return [(label(value), {**visualization, kind: value}) for value in values]
    return [(args.visualization, visualization)]


def compared(args: argparse.Namespace) -> str:
    """What the run compares: ``visualization``, ``precision``, ``inference_nice``,
    ``mode``, or ``''`` (one setting)."""
    if args.visualization == 'compare':
        return 'visualization'
    for name in COMPARED_OPTIONS:
        value = getattr(args, name, None)
        if value and ',' in str(value):
            return name
    return ''


def _node_defaults() -> dict[str, object]:
    """The node's parameters as ``config/act.yaml`` (the file the benchmark starts it with)
    sets them."""
    import yaml

    from act_ros.core.paths import config_path

    return yaml.safe_load(config_path('act.yaml').read_text())['/**/act_node'][
        'ros__parameters']


def node_parameters(args: argparse.Namespace) -> dict[str, object]:
    """The node's values of the options this benchmark can set: each option given, else the
    node's own default from ``config/act.yaml``."""
    defaults = _node_defaults()
    return {name: getattr(args, name) if getattr(args, name) is not None else defaults[name]
            for name in NODE_OPTIONS}


# Where the benchmark's robot puts the objects for a policy that takes their poses (robot
# base frame, metres; quaternion w, x, y, z): the box on the table beside the pad, which
# is at the node's default pad_position_m. Fixed: the benchmark measures time, not success.
BENCH_OBJECT_POSES = {'box': ((0.2, 0.08, 0.015), (1.0, 0.0, 0.0, 0.0)),
                      'pad': ((0.25, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0))}


def _given_checkpoint(model_path: str | Path) -> dict[str, Any]:
    """The chunk size and image input size (``HxW``) of a local checkpoint given with
    --model-path, for the result (empty where its config cannot be read)."""
    try:
        config = json.loads((Path(model_path) / 'config.json').read_text())
    except (OSError, ValueError):
        return {}
    shapes = {tuple(f['shape'][-2:]) for f in (config.get('input_features') or {}).values()
              if f.get('type') == 'VISUAL' and len(f.get('shape') or ()) == 3}
    out: dict[str, Any] = {'chunk_size': config.get('chunk_size')}
    if len(shapes) == 1:
        out['input_size'] = 'x'.join(map(str, shapes.pop()))
    return out


def object_pose_feeds(model_path: str | Path, contract) -> dict[str, tuple]:
    """``{topic: (position, quaternion)}`` the benchmark's robot publishes for the
    checkpoint at ``model_path``: the box and pad poses on the node's object pose topics
    (``config/act.yaml``) when it takes them, nothing otherwise."""
    from act_ros.core.inference.checkpoint_info import read_checkpoint_info

    if not read_checkpoint_info(model_path, contract).uses_environment_state:
        return {}
    topics = _node_defaults()['object_pose_topics']
    return {topics[name]: BENCH_OBJECT_POSES[name] for name in BENCH_OBJECT_POSES}


def _given_node_options(args: argparse.Namespace) -> list[str]:
    """``-p name:=value`` for each node option given on the command line (a list of
    precisions is the comparison's, set per round)."""
    out = []
    for name in NODE_OPTIONS:
        value = getattr(args, name)
        if value is not None and not (name in COMPARED_OPTIONS and ',' in str(value)):
            out += ['-p', f'{name}:={value}']
    return out


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
    from act_ros.ros.harness import RobotHarness, spinning

    contract = load_contract()
    with tempfile.TemporaryDirectory(prefix='act_ros_bench_node_') as tmp:
        model_path = args.model_path
        if not model_path:
            from act_ros.core.inference.checkpoint import create_checkpoint
            size = args.model_size or (args.height, args.width)
            chunk = args.chunk_size or SIM_CHUNK_SIZE
            overrides = {'chunk_size': chunk}
            print(f'[bench node] creating an untrained {args.preset} ACT checkpoint '
                  f'({size[0]}x{size[1]} input, chunk {chunk}; '
                  f'{args.height}x{args.width} cameras)', flush=True)
            model_path = str(create_checkpoint(Path(tmp) / 'model', preset=args.preset,
                                               image_size=size, **overrides))
        base_cmd = [sys.executable, '-m', 'act_ros.ros.node.act_node', '--ros-args',
                    '--params-file', str(config_path('act.yaml')),
                    '-p', f'model_path:={model_path}', '-p', f'device:={args.device}',
                    '-p', f'control_rate_hz:={float(args.rate)}',
                    '-p', 'diagnostics_period_s:=1.0']
        if not args.startup_only:  # a steadier model-only figure; startup-only: the defaults
            base_cmd += ['-p', f'model_only_calls:={args.model_only_calls}']
        # Only what was asked for: the node's own defaults else.
        base_cmd += _given_node_options(args)
        node = node_parameters(args)
        n_action_steps = args.n_action_steps or args.chunk_size
        if n_action_steps:
            base_cmd[-2:-2] = ['-p', f'n_action_steps:={n_action_steps}']
        settings = dict(variants(args))
        rounds = balanced_order(list(settings), args.repeats)
        kind = compared(args)
        # The robot is up before the node starts, as on a real robot: the time to the
        # first command is the node's, not the harness's own start-up.
        context = rclpy.context.Context()
        rclpy.init(context=context)
        rng = np.random.default_rng(0)
        image = rng.integers(0, 256, size=(args.height, args.width, 3), dtype=np.uint8)
        harness = RobotHarness(context=context, cameras=contract.camera_names,
                               joints={n: 0.0 for n in contract.joint_names}, image=image,
                               rate_hz=args.rate, name='bench_robot')
        harness.poses.update(object_pose_feeds(model_path, contract))
        plan = PlanCounter(harness)
        procs = ProcessSet(Path(tmp), dict(os.environ))
        by_round: dict[str, list[dict]] = {}
        try:
            with spinning(context, harness, num_threads=1):
                for label in rounds:
                    cmd = base_cmd + [word for name, value in settings[label].items()
                                      for word in ('-p', f'{name}:={value}')]
                    what = f'{kind or "visualization"} {label}'
                    print(f'[bench node] starting act_node, {what} '
                          f"(ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']})", flush=True)
                    number = len(by_round.get(label, [])) + 1
                    result = run_round(harness, plan, procs, cmd, args,
                                       f'act_node_{label}' + (f'_{number}' if number > 1 else ''))
                    if result is None:
                        return 1
                    by_round.setdefault(label, []).append(result)
            given = _given_checkpoint(model_path) if args.model_path else {}
            common = dict(camera_size=f'{args.height}x{args.width}',
                          model_input_size=given.get('input_size') or (
                              'x'.join(map(str, args.model_size)) if args.model_size
                              else 'camera size'),
                          chunk_size=args.chunk_size or given.get('chunk_size') or (
                              'given' if args.model_path else SIM_CHUNK_SIZE),
                          n_action_steps=n_action_steps or "the checkpoint's",
                          mode=(f"{node['mode']}/{node['execution']}" if kind != 'mode'
                                else f"compared/{node['execution']}"),
                          executor=node['executor'], backend=node['backend'],
                          torch_threads=node['torch_threads'],
                          precision_requested=(node['precision'] if kind != 'precision'
                                               else 'compared'),
                          inference_nice=(node['inference_nice'] if kind != 'inference_nice'
                                          else 'compared'),
                          preset=args.preset if not args.model_path else 'given',
                          model_only_calls=(args.model_only_calls if not args.startup_only
                                            else 'node default'),
                          cpu_count=os.cpu_count())
        finally:
            procs.stop_all(grace_s=20.0)  # SIGINT, then escalation; its inference child too
            rclpy.try_shutdown(context=context)
    if not kind:
        results = {**by_round[rounds[0]][0], 'visualization': args.visualization, **common}
        report(results)
    else:
        labels = list(settings)
        medians = {label: median_round(by_round[label]) for label in labels}
        results = {'compared': kind, 'settings': medians, **common}
        if kind == 'visualization':  # the names docs/benchmarks/node_visualization.json uses
            results.update(visualization_off=medians['off'], visualization_on=medians['on'])
        if args.repeats > 1:
            results['order'] = rounds
            results['rounds'] = {label: by_round[label] for label in labels}
            common = {**common, 'rounds per setting (medians shown)': args.repeats}
        if not args.startup_only:
            results['missed_periods_each_round'] = {
                label: [r['missed_periods'] for r in by_round[label]] for label in labels}
            if kind == 'visualization':
                results['missed_periods_on_minus_off'] = (medians['on']['missed_periods']
                                                          - medians['off']['missed_periods'])
        report_side_by_side(medians, common, kind)
    if args.json:
        from act_ros.bench.report import result_provenance
        provenance = result_provenance('act-ros bench node',
                                       argv if argv is not None else sys.argv[1:],
                                       output_path=args.json)
        write_text_atomic(args.json, json.dumps({'provenance': provenance, **results}, indent=2))
    return 0


def balanced_order(labels: list[str], repeats: int) -> list[str]:
    """The rounds of a comparison: the settings in order, then reversed, then in order, ...
    (``repeats`` of each), so that no setting always runs first or last."""
    return [label for k in range(repeats)
            for label in (labels if k % 2 == 0 else labels[::-1])]


def median_round(results: list[dict]) -> dict:
    """One round's keys with the median over ``results`` of every number (the first
    round's value for the rest)."""
    merged = dict(results[0])
    if len(results) == 1:
        return merged
    for key in list(merged):
        values = [r.get(key) for r in results]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = float(np.median(values))
    return merged


class PlanCounter:
    """Subscribes the harness to act_node's ``~/planned_path`` and ``~/markers`` as RViz
    does (reliable, transient local) and counts what arrives."""

    def __init__(self, harness) -> None:
        from nav_msgs.msg import Path as PathMsg
        from visualization_msgs.msg import MarkerArray

        from act_ros.ros.node.visualization import VISUALIZATION_QOS

        self.paths: list[float] = []
        self.markers: list[float] = []
        harness.create_subscription(PathMsg, '/act_node/planned_path',
                                    lambda _msg: self.paths.append(time.monotonic()),
                                    VISUALIZATION_QOS)
        harness.create_subscription(MarkerArray, '/act_node/markers',
                                    lambda _msg: self.markers.append(time.monotonic()),
                                    VISUALIZATION_QOS)

    def rates(self, t0: float, t1: float) -> dict[str, float]:
        count = {name: sum(t0 <= t <= t1 for t in list(times))
                 for name, times in (('path', self.paths), ('markers', self.markers))}
        return {f'visualization_{name}_rate_hz': n / (t1 - t0) for name, n in count.items()}


def run_round(harness, plan: PlanCounter, procs: ProcessSet, cmd: list[str],
              args: argparse.Namespace, name: str) -> dict | None:
    """Start act_node, time its first command, measure it under load, stop it; ``None``
    (after printing its log) when no command came."""
    from act_ros.ros.harness import wait_until

    first = len(harness.commands)
    launched = time.monotonic()  # the node's process starts now
    node = procs.start(name, cmd)
    node_proc, log_path = node.popen, node.log_path
    wait_until(lambda: len(harness.commands) > first or node_proc.poll() is not None
               or sends_nothing(harness.latest_diagnostics(since=launched)),
               args.startup_timeout, interval_s=0.2)
    if len(harness.commands) > first:
        results = {'time_to_first_command_s': harness.commands[first].received - launched}
        # The node reports its phases on /diagnostics once the first command is out.
        results.update(wait_until(
            lambda: startup_values(harness.latest_diagnostics(since=launched)), 10.0,
            interval_s=0.1) or {})
    elif node_proc.poll() is None and sends_nothing(harness.latest_diagnostics(since=launched)):
        print('[bench node] the node is active and sends nothing: its chunks come after their '
              'last action was due (the model is slower than a chunk lasts); measuring that',
              flush=True)
        results = {'time_to_first_command_s': None}
    else:
        print(f'[bench node] no command within {args.startup_timeout:.0f} s '
              f'(node exit code {node_proc.poll()}):\n'
              f'{log_path.read_text()[-3000:]}', flush=True)
        return None
    if not args.startup_only:
        results.update(measure_load(harness, node_proc.pid, args, since=launched, plan=plan))
    procs.stop(node, grace_s=20.0)
    return results


def measure_load(harness, node_pid: int, args: argparse.Namespace, *, since: float = 0.0,
                 plan: PlanCounter | None = None) -> dict:
    """Commands, latency and CPU over ``args.duration`` seconds, after 2 s of settling
    (diagnostics from ``since`` on: the node started then)."""
    time.sleep(2.0)  # settle past start-up
    t0 = time.monotonic()
    before = harness.latest_diagnostics(since=since)
    node_cpu0, own_cpu0 = _proc_cpu_s(node_pid), time.process_time()
    main_cpu0 = _proc_cpu_s(node_pid, descendants=False)
    time.sleep(args.duration)
    t1 = time.monotonic()
    node_cpu1, own_cpu1 = _proc_cpu_s(node_pid), time.process_time()
    main_cpu1 = _proc_cpu_s(node_pid, descendants=False)
    results = summarize(harness, t0, t1, args.rate,
                        harness.latest_diagnostics(since=max(since, t1 - 1.5)), before=before)
    if plan is not None:
        results.update(plan.rates(t0, t1))
    wall = t1 - t0
    if node_cpu0 is not None and node_cpu1 is not None:
        results['node_cpu_percent'] = 100.0 * (node_cpu1 - node_cpu0) / wall
        results['node_main_process_cpu_percent'] = 100.0 * (main_cpu1 - main_cpu0) / wall
    results['harness_cpu_percent'] = 100.0 * (own_cpu1 - own_cpu0) / wall
    results['duration_s'] = wall
    return results


def sends_nothing(diag: tuple | None) -> bool:
    """Whether the node's ``/diagnostics`` say it is active, has computed chunks and all of
    them came late (after their last action was due): it will send no command."""
    values = diag[2] if diag else {}
    try:
        computed, late = float(values['chunks_computed']), float(values['chunks_late'])
    except (KeyError, ValueError):
        return False
    return values.get('active') == 'True' and computed >= 2 and late == computed


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


def missed_in_window(times: np.ndarray, t0: float, t1: float, period: float
                     ) -> tuple[int, np.ndarray]:
    """Control periods of the window ``[t0, t1]`` without a command (commands at the sorted
    ``times``), and the gaps between the commands.

    The window holds ``(t1 - t0) / period`` control periods. Between two commands, a gap
    longer than 1.5 periods counts as its length in periods, less the one the next command
    fills (:func:`act_ros.ros.diagnostics.missed_periods`). The stretches at the edges
    count the same way, when longer than 1.5 periods: before the first command, every
    period from the window's start is missed; after the last one, every period up to the
    window's end. With no command at all, every period of the window is missed; with one,
    all but one.
    """
    from act_ros.ros.diagnostics import missed_periods

    times = np.sort(np.asarray(times, dtype=np.float64))
    gaps = np.diff(times) if times.size > 1 else np.zeros(0)
    if times.size == 0:
        return int(round((t1 - t0) / period)), gaps
    lead = times[0] - t0
    missed = missed_periods(np.append(gaps, t1 - times[-1]), period)
    missed += int(round(lead / period)) if lead > 1.5 * period else 0
    return missed, gaps


def summarize(harness, t0: float, t1: float, rate_hz: float, diag, before=None) -> dict:
    """Rates, gaps and latencies of the commands received in [t0, t1]; with ``before`` (the
    diagnostics at t0), the chunks that came late within the window; the node's real-time
    verdict from its configure-time measurement.

    Missed periods are counted over the whole window (:func:`missed_in_window`), twice: at
    the middleware's reception time of each command (what a controller subscribed to the
    topic would see) and at this process's callback, which runs late whenever the harness
    itself (publishing two full-size cameras from Python) is busy. The window's edges are
    put on the middleware's clock with the smallest callback delay of the window's
    commands."""
    window = [c for c in harness.commands if t0 <= c.received <= t1]
    times = np.array([c.received for c in window])
    period = 1.0 / rate_hz
    missed_callback, gaps = missed_in_window(times, t0, t1, period)
    missed = missed_callback
    stamps = [c.middleware_received_s for c in window]
    if window and all(s is not None for s in stamps):
        shift = min(c.received - c.middleware_received_s for c in window)
        missed, gaps = missed_in_window(np.array(stamps), t0 - shift, t1 - shift, period)
    values = diag[2] if diag else {}

    def number(key, report=diag):
        try:
            return float(report[2][key]) if report else None
        except (KeyError, ValueError):
            return None

    def in_window(key):
        now, then = number(key), number(key, before)
        return now - then if now is not None and then is not None else None
    return {**_split_in_window(before, values),
        'realtime_feasible': values.get('realtime.feasible'),
        'realtime_verdict': values.get('realtime.feasibility'),
        'realtime_latency_median_ms': number('realtime.latency_median_ms'),
        'realtime_latency_worst_ms': number('realtime.latency_worst_ms'),
        'commands': int(times.size),
        'command_rate_hz': float(times.size / (t1 - t0)),
        'target_rate_hz': rate_hz,
        'missed_periods': missed,
        'periods_in_window': int(round((t1 - t0) / period)),
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
        # Seams of the commands sent (the node's rolling window, seams.window_s).
        **{f'seams_{key}': number(f'seams.{key}') for key in SEAM_FIGURES},
        'device': values.get('device'),
        'precision': values.get('precision'),
        'backend_used': values.get('backend'),
        'realtime_measured_precision': values.get('realtime.measured_precision'),
    }


def _split_in_window(before, values: dict) -> dict:
    """The node's observation-to-chunk latency split over the window (mean per chunk of
    each part: transfer to the child, preprocess, model, postprocess, return) beside the
    model alone in the same child (``latency_split.*`` on ``/diagnostics``), as
    ``split_*`` entries; ``split_chunks`` 0 when no chunk came back in the window."""
    from act_ros.core.inference.latency_split import window_means

    means = window_means(before[2] if before else None, values)
    return {f'split_{key}': value for key, value in means.items()}


def _text(value) -> str:
    return f'{value:.2f}' if isinstance(value, float) else str(value)


def report(results: dict) -> None:
    print('\nact_node benchmark')
    for key, value in results.items():
        print(f'  {key:<38} {_text(value)}')


def report_side_by_side(columns: dict[str, dict], common: dict, kind: str) -> None:
    """A comparison: one row per measure, one column per setting (``kind`` names what
    differs: visualization, precision)."""
    labels = list(columns)
    print(f"\nact_node benchmark: {kind} {' vs '.join(labels)} (the same run)")
    print(f"  {'measure':<38} " + ' '.join(f'{label:>12}' for label in labels))
    for key in dict.fromkeys(k for column in columns.values() for k in column):
        print(f'  {key:<38} '
              + ' '.join(f"{_text(columns[label].get(key, '')):>12}" for label in labels))
    if len(labels) == 2 and all('missed_periods' in columns[label] for label in labels):
        first, second = labels
        difference = columns[second]['missed_periods'] - columns[first]['missed_periods']
        print(f"  {f'missed_periods {second} - {first}':<38} {_text(difference):>25}")
    for key, value in common.items():
        print(f'  {key:<38} {_text(value)}')


if __name__ == '__main__':
    sys.exit(main())
