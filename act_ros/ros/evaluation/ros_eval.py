"""Evaluate a checkpoint over ROS 2: ``sim_bridge`` and ``act_node`` as separate processes.

    act-ros ros-eval --checkpoint DIR --episodes 10 --mode both \
        --image-size 96x128 --seed 1000

What it does, per policy mode (``chunk``, ``ensemble``):

1. starts ``sim_bridge`` (lock-step, episodes on ``~/reset``, calling ``/act_node/reset``
   before each one) and ``act_node`` (``trigger: observation``, ``execution: sync``: one
   synchronous policy tick per simulated observation; pad position from the bridge's
   ``pad_pose``; simulated time), both once, in one ROS domain on loopback; for the next
   mode the node is reconfigured through its lifecycle services (deactivate, cleanup,
   set ``mode``, configure, activate) instead of starting again. A checkpoint that takes
   the object poses (``observation.environment_state``) gets them through the node's
   subscriptions to the bridge's ``box_pose`` and ``pad_pose``;
2. for each episode: sets the bridge's ``seed`` parameter, calls ``/sim_bridge/reset``,
   waits for ``/sim_bridge/episode_status`` to report the episode done, keeps its result;
3. prints and returns ``align_rate``, ``mean_position_error`` (m) and ``mean_yaw_error``
   (deg) per mode, with the lock-step timeouts (0 in a clean run), the step rate and the
   seams of the commands the node sent (``<mode>.seams``, from its ``~/seams`` after the
   mode's last episode: ``seams.window_s`` 0 keeps every command since configure).

The same seeds are used for every mode. Everything started is stopped at the end, on an
error, on Ctrl-C and on SIGTERM (:mod:`act_ros.core.processes`). Child logs go to
``--log-dir`` (by default a temporary directory, named in the output, removed when the
evaluation succeeds and kept when it fails). With Fast DDS the
children get a profile that passes full-size images through shared memory
(:mod:`act_ros.ros.evaluation.dds`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.contract import parse_image_size
from act_ros.core.control.seams import seam_line
from act_ros.core.errors import CheckpointError
from act_ros.core.inference.chunking import DEFAULT_BLEND_WINDOW
from act_ros.core.inference.hub import resolve_checkpoint
from act_ros.core.inference.options import BACKEND_CHOICES
from act_ros.core.processes import ChildExitedError, ProcessSet, signals_deferred
from act_ros.ros.evaluation.client import EvalClient, EvalError
from act_ros.ros.evaluation.dds import dds_environment
from act_ros.sim.config import GRIPPER_EMPTY_EFFORT_N
from act_ros.sim.metrics import EpisodeResult

PREFIX = '[ros-eval]'
MODES = ('chunk', 'ensemble', 'blend')
DEFAULT_IMAGE_SIZE = (96, 128)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='act-ros ros-eval',
        description='Run lock-step evaluation episodes of a checkpoint with sim_bridge and '
                    'act_node as separate ROS 2 processes.',
        formatter_class=HelpFormatter)
    p.add_argument('--checkpoint', required=True, type=Path,
                   help='LeRobot pretrained_model directory, or Hub id '
                        'org/name[@revision][/subfolder] (docs/hub_ids.md)')
    p.add_argument('--episodes', type=int, default=10, help='episodes per mode (default 10)')
    p.add_argument('--mode', choices=(*MODES, 'both', 'all'), default='both',
                   help='policy execution mode(s) to evaluate (default both: chunk and '
                   'ensemble; all: the three)')
    p.add_argument('--blend-window', default=DEFAULT_BLEND_WINDOW,
                   help="mode blend: act_node's blend_window, ticks ('6') or seconds ('0.2s')")
    p.add_argument('--n-action-steps', type=int, default=None,
                   help="chunk and blend modes: act_node's n_action_steps, actions played from "
                   "each chunk before the next (default: the node's; ensemble mode ignores it)")
    p.add_argument('--image-size', default=None, metavar='HxW',
                   help='camera images rendered by the simulation (default: the size of the '
                        "checkpoint's training images, as act-ros evaluate; else its input "
                        'size, else 96x128)')
    p.add_argument('--seed', type=int, default=0, help='seed of the first episode; then +1')
    p.add_argument('--episode-steps', type=int, default=0,
                   help='control steps per episode (default: config/sim.yaml, 300)')
    p.add_argument('--device', default='auto', help='act_node inference device (default auto)')
    p.add_argument('--torch-threads', type=int, default=0,
                   help='act_node PyTorch CPU threads (0: PyTorch default)')
    p.add_argument('--backend', choices=BACKEND_CHOICES, default='torch',
                   help="act_node inference backend (default torch, as act-ros evaluate's, so "
                   "the two evaluations compare; auto: the node's own default)")
    p.add_argument('--command-type', choices=('JointTrajectory', 'Float64MultiArray'),
                   default='JointTrajectory', help='command message act_node sends')
    p.add_argument('--lockstep-timeout', type=float, default=5.0,
                   help='seconds the bridge waits for a command before holding the last '
                        'target (counted; default 5)')
    p.add_argument('--startup-timeout', type=float, default=180.0,
                   help='seconds to wait for the processes to come up (default 180)')
    p.add_argument('--domain-id', type=int, default=None,
                   help='ROS_DOMAIN_ID for every process (default: $ROS_DOMAIN_ID, else one '
                        'derived from the process id)')
    p.add_argument('--log-dir', type=Path, default=None, help='where child logs go')
    p.add_argument('--output', type=Path, default=None, help='also write the results as JSON')
    return p


def checkpoint_image_size(checkpoint: Path) -> tuple[int, int] | None:
    """(H, W) of the first camera feature of a checkpoint's ``config.json``, if readable."""
    try:
        config = json.loads((checkpoint / 'config.json').read_text())
    except (OSError, ValueError):
        return None
    for key, feature in sorted((config.get('input_features') or {}).items()):
        shape = feature.get('shape') if isinstance(feature, dict) else None
        if key.startswith('observation.images.') and shape and len(shape) == 3:
            return int(shape[1]), int(shape[2])
    return None


def render_size(checkpoint: Path) -> tuple[int, int]:
    """The size the bridge renders at: that of the checkpoint's training images (as
    ``act-ros evaluate`` does; a model trained on downscaled images sees the same
    downscaling), else its camera input size, else the default."""
    from act_ros.training.evaluation.rollout import checkpoint_render_size

    return (checkpoint_render_size(checkpoint) or checkpoint_image_size(checkpoint)
            or DEFAULT_IMAGE_SIZE)


def policy_input_topics(checkpoint: Path) -> list[str]:
    """The bridge topics ``act_node`` subscribes for this checkpoint (its ``config.json``):
    the joint states, the cameras it takes and, when it takes the object poses, ``box_pose``
    and ``pad_pose``; empty when the file cannot be read (the bridge's default then)."""
    try:
        config = json.loads((checkpoint / 'config.json').read_text())
    except (OSError, ValueError):
        return []
    features = config.get('input_features') or {}
    topics = ['joint_states']
    for key, feature in features.items():
        kind = feature.get('type') if isinstance(feature, dict) else None
        if kind == 'VISUAL' and key.startswith('observation.images.'):
            topics.append(f"camera/{key[len('observation.images.'):]}/image_raw")
        elif kind == 'ENV':
            topics += ['box_pose', 'pad_pose']
    return topics


def default_domain_id() -> int:
    env = os.environ.get('ROS_DOMAIN_ID', '')
    return int(env) if env.isdigit() else 1 + os.getpid() % 100


def bridge_command(args: argparse.Namespace, image_size: tuple[int, int], *,
                   policy_reset: bool = True, policy_inputs: list[str] | None = None,
                   task: str = 'port_pick_align') -> list[str]:
    """``sim_bridge`` of ``task`` in lock-step, episodes on ``~/reset`` (resetting
    ``/act_node`` first); ``policy_inputs``: the topics it waits for a subscriber on before
    an episode (default: the joints and every camera)."""
    params = {'task': task, 'mode': 'lockstep', 'autostart': 'false', 'seed': args.seed,
              'image_height': image_size[0], 'image_width': image_size[1],
              'episode_steps': args.episode_steps,
              'lockstep_timeout_s': float(args.lockstep_timeout)}
    if policy_inputs:
        params['policy_inputs'] = ','.join(policy_inputs)
    if policy_reset:
        params.update(policy_reset_service='/act_node/reset',
                      policy_reset_timeout_s=float(args.startup_timeout))
    return _ros_command('act_ros.ros.sim_bridge.bridge', params)


def node_command(args: argparse.Namespace, mode: str, model_path: str | None = None,
                 task: Any = None) -> list[str]:
    """``act_node`` for lock-step evaluation: one synchronous tick per observation.
    ``model_path``: what the node loads (default: ``--checkpoint`` made absolute); ``task``
    (:class:`~act_ros.sim.tasks.SimTask`): another task's robot parameter file and contract
    (the package's own by default)."""
    files: list[str] = []
    params: dict[str, Any] = {}
    if task is not None and task.is_aloha:
        files = [str(task.node_params_path())]
        params['contract_path'] = str(task.contract_path())
    else:  # the bridge publishes the gripper's effort: the gate's evidence of an empty close
        params['release_gate.empty_effort'] = GRIPPER_EMPTY_EFFORT_N
    if args.n_action_steps is not None:
        params['n_action_steps'] = args.n_action_steps
    params.update({'model_path': model_path or str(args.checkpoint.resolve()), 'mode': mode,
              'execution': 'sync',
              'trigger': 'observation', 'pad_source': 'topic', 'pad_pose_topic': 'pad_pose',
              # Used by a checkpoint that takes the object poses (one subscription for the
              # pad, shared with the release gate's); ignored by one that does not.
              'object_pose_topics.box': 'box_pose', 'object_pose_topics.pad': 'pad_pose',
              'device': args.device, 'torch_threads': args.torch_threads,
              'backend': args.backend,
              'command_type': args.command_type, 'use_sim_time': 'true', 'autostart': 'true',
              # Seams of every command since configure (one mode's run), read at its end.
              'seams.window_s': 0.0, 'blend_window': f"'{args.blend_window}'"})
    return _ros_command('act_ros.ros.node.act_node', params, files)


def _ros_command(module: str, params: dict[str, Any],
                 params_files: list[str] | tuple[str, ...] = ()) -> list[str]:
    command = [sys.executable, '-m', module, '--ros-args']
    for path in params_files:
        command += ['--params-file', path]
    for name, value in params.items():
        command += ['-p', f'{name}:={value}']
    return command


def _print(line: str) -> None:
    print(line, flush=True)


def run_evaluation(args: argparse.Namespace, log: Callable[[str], None] = _print,
                   argv: list[str] | None = None) -> dict[str, Any]:
    """Run the evaluation described by parsed ``args`` (``argv``: the command line they came
    from, for the output file's provenance; default ``sys.argv``); see the module docstring."""
    modes = {'both': ('chunk', 'ensemble'), 'all': MODES}.get(args.mode, (args.mode,))
    if args.episodes < 1:
        raise EvalError(f'--episodes must be >= 1, got {args.episodes}')
    if args.n_action_steps is not None and args.n_action_steps < 1:
        raise EvalError(f'--n-action-steps must be >= 1, got {args.n_action_steps}')
    try:  # a Hub id: its snapshot in the huggingface_hub cache (downloaded once)
        source = resolve_checkpoint(args.checkpoint)
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    checkpoint = source.path
    if not (checkpoint / 'config.json').is_file():
        raise EvalError(f'{args.checkpoint}: not a checkpoint directory (no config.json)')
    from act_ros.sim.tasks import checkpoint_task

    try:
        task = checkpoint_task(checkpoint)
        image_size = (parse_image_size(args.image_size) if args.image_size
                      else task.image_size if task.is_aloha else render_size(checkpoint))
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    domain = args.domain_id if args.domain_id is not None else default_domain_id()
    own_log_dir = args.log_dir is None  # a temporary one: removed unless something failed
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix='act_ros_ros_eval_'))
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST')
    env.setdefault('MUJOCO_GL', 'egl')
    env.setdefault('HF_HUB_OFFLINE', '1')
    env = dds_environment(env)  # full-size images through shared memory
    log(f'{PREFIX} checkpoint {source.describe()}')
    log(f'{PREFIX} ROS domain {domain} (loopback), images {image_size[0]}x{image_size[1]}, '
        f'{args.episodes} episode(s) per mode from seed {args.seed}, logs in {log_dir}')

    procs = ProcessSet(log_dir, env)
    client = EvalClient(domain, check=procs.check)
    results: dict[str, Any] = {}
    try:
        bridge = procs.start('sim_bridge', bridge_command(
            args, image_size, policy_inputs=policy_input_topics(checkpoint), task=task.name))
        log(f'{PREFIX} started sim_bridge (pid {bridge.pid}, task {task.name})')
        # A Hub id pinned to the commit resolved here: the node (offline) loads the same files.
        node = procs.start('act_node', node_command(args, modes[0], source.pinned, task))
        log(f'{PREFIX} started act_node (pid {node.pid}, mode {modes[0]}); waiting for it')
        client.wait_policy_active(args.startup_timeout)
        for mode in modes:
            if mode != modes[0]:
                log(f'{PREFIX} reconfiguring act_node for mode {mode}')
                client.switch_policy_mode(mode, args.startup_timeout)
            results[mode] = _run_mode(client, args, mode, log, task)
    except ChildExitedError as exc:
        raise EvalError(str(exc)) from None  # names the log file, which is kept
    finally:
        with signals_deferred():
            procs.stop_all()
            client.close()
    if own_log_dir:
        shutil.rmtree(log_dir, ignore_errors=True)
    for mode, metrics in results.items():
        log(format_metrics(mode, metrics))
    if args.output:
        from act_ros.provenance import result_provenance

        # The file carries where it came from beside the modes (which readers find as the
        # mappings with episodes); the returned results stay {mode: metrics}.
        provenance = result_provenance(
            'act-ros ros-eval',
            argv if argv is not None else sys.argv[1:], output_path=args.output,
            output_option='--output', omit=('--log-dir',))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.output, json.dumps({'provenance': provenance, **results},
                                                  indent=2))
        log(f'{PREFIX} results written to {args.output}')
    return results


def _run_mode(client: EvalClient, args: argparse.Namespace, mode: str,
              log: Callable[[str], None], task: Any = None) -> dict[str, Any]:
    from act_ros.sim.tasks import DEFAULT_TASK, sim_task
    from act_ros.training.evaluation.rollout import summarize_task_results

    task = task or sim_task(DEFAULT_TASK)
    if task.is_aloha:
        from act_ros.sim.aloha.env import AlohaEpisodeResult as Result
    else:
        Result = EpisodeResult
    results, episodes = [], []
    start = time.monotonic()
    steps = 0
    for i in range(args.episodes):
        seed = args.seed + i
        status = client.run_episode(seed, args.lockstep_timeout, args.startup_timeout)
        result = Result(**status['result'])
        results.append(result)
        episodes.append({**status['result'], 'commands': status['commands']})
        steps += result.steps
        timeouts = status['commands']['lockstep_timeouts']
        if task.is_aloha:
            outcome = (f"{'success' if result.success else 'no success'}, highest reward "
                       f'{result.max_reward:g} after {result.steps} steps')
        else:
            outcome = (f"{'aligned' if result.success else 'not aligned'}, position error "
                       f'{result.position_error_m * 1000:.1f} mm, yaw error '
                       f'{result.yaw_error_deg:.1f} deg')
        log(f'{PREFIX} {mode} episode {i + 1}/{args.episodes} seed {seed}: {outcome}'
            + (f', {timeouts} lock-step timeouts' if timeouts else ''))
    wall = time.monotonic() - start
    metrics: dict[str, Any] = {'task': task.name, **summarize_task_results(task, results)}
    metrics.update(
        lockstep_timeouts=sum(e['commands']['lockstep_timeouts'] for e in episodes),
        commands_rejected=sum(e['commands']['rejected'] for e in episodes),
        wall_s=wall, steps_per_s=steps / wall if wall > 0 else float('nan'),
        seeds=[args.seed + i for i in range(args.episodes)],
        seams=client.seams(args.startup_timeout), episodes=episodes)
    return metrics


def format_metrics(mode: str, m: dict[str, Any]) -> str:
    if 'align_rate' not in m:
        line = (f"{PREFIX} {mode:8s} success_rate {m['success_rate']:.2f} "
                f"({m['successes']}/{m['count']}), lock-step timeouts "
                f"{m['lockstep_timeouts']}, {m['steps_per_s']:.1f} steps/s")
    else:
        aligned = round(m['align_rate'] * m['count'])
        line = (f"{PREFIX} {mode:8s} align_rate {m['align_rate']:.2f} "
                f"({aligned}/{m['count']}), mean position error "
                f"{m['mean_position_error'] * 1000:.1f} mm, mean yaw error "
                f"{m['mean_yaw_error']:.1f} deg, lock-step timeouts {m['lockstep_timeouts']}, "
                f"{m['steps_per_s']:.1f} steps/s")
    if m.get('seams'):
        line += f"\n{PREFIX} {'':8s} {seam_line(m['seams'])}"
    return line


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that cleanup runs."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated(f'signal {signum}')


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run the evaluation and return ``{mode: metrics}``.

    Exits with status 1 and one line on an error, 130 on Ctrl-C/SIGTERM (after stopping
    every child process).
    """
    args = build_parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        return run_evaluation(args, argv=argv)
    except EvalError as exc:
        print(f'{PREFIX} error: {exc}', file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(f'{PREFIX} interrupted: every process it started is stopped', file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def cli(argv: list[str] | None = None) -> int:
    """Console-script entry point (``ros_eval``): :func:`main` with an exit status."""
    main(argv)
    return 0


if __name__ == '__main__':
    sys.exit(cli())
