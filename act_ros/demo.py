"""``make demo``: the shipped policy doing the simulated task over ROS 2, next to the expert.

By default (a few minutes on a 2-core CPU):

1. Evaluate the policy shipped in ``models/`` over ROS 2: ``sim_bridge`` and ``act_node``
   as two processes in lock-step on loopback, chunk execution and temporal ensembling,
   on seeds never used for collection or checkpoint selection.
2. Run the scripted expert on the same seeds (the ceiling).
3. Record one successful episode (both cameras) to ``episode.mp4``: the first seed the
   policy aligned over ROS 2, replayed by the in-process evaluator, which runs the same
   runtime, safety chain and release gate.
4. Print the align rates and errors of both modes next to the expert's.

``--full-loop`` runs the whole pipeline instead: collect expert demonstrations, train with
the CPU recipe (``config/train_sim.yaml``), then the same evaluation of the new checkpoint
(about 2.5 hours on 2 cores; ``--fast`` is a few-minute smoke of it). ``--model DIR``
evaluates another checkpoint. Everything lands under one output folder, named at the
end. Every stage runs as a child process; Ctrl-C or SIGTERM stops it and the demo
without leaving processes behind.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
import json
import os
from pathlib import Path
import shutil
import signal
import sys
import time

from act_ros.core.atomic import write_json_atomic

# Evaluation seeds: disjoint from collection (0, 1, ...), from the trainer's checkpoint
# selection (1_000_000 + k) and from act-ros evaluate's default (2_000_000 + k).
EVAL_SEED = 100_000
SHIPPED_MODEL = 'sim_port_pick_align'


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of each stage. ``episodes``/``train_steps`` 0: no collection/training."""

    eval_episodes: int
    episodes: int = 0
    image_size: str = '96x128'
    train_steps: int = 0  # 0: the preset's own (the CPU recipe)
    workers: int = 2
    exploration_noise: float = 0.06  # rad, as the CPU recipe's dataset was collected

    def __post_init__(self) -> None:
        for name in ('eval_episodes', 'workers'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        for name in ('episodes', 'train_steps'):
            if getattr(self, name) < 0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')

    @property
    def trains(self) -> bool:
        return self.episodes > 0


PLANS = {
    # The shipped model over ROS 2, both modes: the README's demo.
    'shipped': DemoPlan(eval_episodes=10),
    # The CPU recipe end to end (config/train_sim.yaml): collection, training, evaluation.
    'full': DemoPlan(eval_episodes=10, episodes=200),
    # A quick look at the whole loop: a smoke-scale run that does not learn the task.
    'fast': DemoPlan(eval_episodes=1, episodes=4, train_steps=60),
}


class Stages:
    """Runs each stage as a child process (:class:`~act_ros.core.processes.ProcessSet`:
    own process group, dies with the demo) and stops it cleanly on Ctrl-C / SIGTERM or when
    it runs past its time limit."""

    def __init__(self, log_dir: Path) -> None:
        from act_ros.core.processes import ProcessSet

        self.procs = ProcessSet(log_dir, dict(os.environ))
        self.timings: dict[str, float] = {}
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        raise KeyboardInterrupt

    def run(self, name: str, args: list[str], timeout_s: float = 3600.0) -> None:
        """Run one child as a stage (see :meth:`run_parallel`)."""
        self.run_parallel(name, {name: args}, timeout_s)

    def run_parallel(self, name: str, commands: dict[str, list[str]],
                     timeout_s: float = 3600.0) -> None:
        """Run several children at once (one stage); every one must succeed."""
        print(f'\n=== {name} ===', flush=True)
        for label, args in commands.items():
            print(f'{"" if label == name else f"[{label}] "}$ {" ".join(args)}', flush=True)
        start = time.monotonic()
        children = {label: self.procs.start(label, args, log=False)
                    for label, args in commands.items()}
        codes = {}
        try:
            deadline = start + timeout_s
            for label, child in children.items():
                codes[label] = self.procs.wait(child, max(1.0, deadline - time.monotonic()))
        except TimeoutError as exc:
            self.stop_child()
            raise SystemExit(f'demo: stage "{name}" failed: {exc}') from None
        except KeyboardInterrupt:
            self.stop_child()
            raise
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.monotonic() - start
        failed = {label: code for label, code in codes.items() if code != 0}
        if failed:
            self.stop_child()
            raise SystemExit(f'demo: stage "{name}" failed ({failed}); see the output above')

    def stop_child(self) -> None:
        """Stop the running stage (SIGINT to its group first: it cleans up its children)."""
        self.procs.stop_all(grace_s=30.0)


def _domain_id(offset: int) -> int:
    """A ROS domain of this demo's own per parallel evaluation (the Makefile's, else
    derived from the pid), kept within the valid range."""
    base = int(os.environ.get('ROS_DOMAIN_ID', 10 + os.getpid() % 90))
    return 1 + (base + offset * 7) % 101


def shipped_model_path() -> Path:
    """``models/sim_port_pick_align`` of the source tree or the installed package."""
    from act_ros.core.paths import share_dir

    return share_dir() / 'models' / SHIPPED_MODEL


def _dataset_ready(path: Path) -> bool:
    return (path / 'meta' / 'info.json').is_file()


def _expert_rate(episodes: int, seed: int) -> dict:
    """The scripted expert on the evaluation seeds (no rendering): the ceiling."""
    from act_ros.sim import PortPickAlignEnv, ScriptedExpert, SimConfig, summarize_results
    from act_ros.sim.expert import run_episode

    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        expert = ScriptedExpert(env)
        results = [run_episode(env, expert, seed + k) for k in range(episodes)]
    return summarize_results(results)


def _train(stages: Stages, plan: DemoPlan, out: Path, args: argparse.Namespace) -> Path:
    """Collect and train (reusing an earlier run's dataset and checkpoint); the checkpoint."""
    py = sys.executable
    dataset = out / 'dataset'
    if _dataset_ready(dataset):
        print(f'\n=== collect ===\nreusing the dataset of an earlier run: {dataset}')
    else:
        stages.run('collect', [py, '-m', 'act_ros.cli', 'collect', '--output', str(dataset),
                               '--episodes', str(plan.episodes), '--image-size', plan.image_size,
                               '--workers', str(plan.workers), '--seed', '0',
                               '--exploration-noise', str(plan.exploration_noise),
                               '--overwrite'])
    train_dir = out / 'train'
    checkpoint = train_dir / 'best'
    if args.retrain and train_dir.exists():
        shutil.rmtree(train_dir)
    if (train_dir / 'training_metrics.json').is_file() and checkpoint.is_dir():
        print(f'\n=== train ===\nreusing the checkpoint of an earlier run: {checkpoint} '
              '(--retrain to train again)')
        return checkpoint
    command = [py, '-m', 'act_ros.cli', 'train', '--preset', 'sim', '--dataset-root',
               str(dataset), '--image-size', plan.image_size, '--device', args.device]
    if (train_dir / 'last' / 'training_state.pt').is_file():
        command.append('--resume')  # an interrupted earlier run continues where it stopped
    elif train_dir.exists():
        shutil.rmtree(train_dir)
    if plan.train_steps:
        # Smoke scale: a short schedule, one closed-loop check at the end.
        command += ['--steps', str(plan.train_steps), '--warmup-steps',
                    str(max(1, plan.train_steps // 10)), '--val-interval',
                    str(plan.train_steps), '--checkpoint-interval', str(plan.train_steps),
                    '--closed-loop-val-episodes', '1', '--early-stop-patience', '0',
                    '--min-steps', '0']
    stages.run('train', command + ['--output-dir', str(train_dir)], timeout_s=8 * 3600.0)
    return checkpoint


def _record_success(stages: Stages, checkpoint: Path, ros: dict, out: Path,
                    tries: int = 3) -> dict:
    """Video of one aligned episode: the first seeds aligned over ROS 2 (chunk mode first),
    replayed in process; returns what was recorded."""
    py = sys.executable
    aligned = [(mode, e['seed']) for mode, m in _modes(ros).items()
               for e in m.get('episodes', []) if e.get('success')]
    candidates = aligned[:tries] or [('chunk', EVAL_SEED)]
    video = out / 'episode.mp4'
    for mode, seed in candidates:
        result_file = out / 'video_episode.json'
        stages.run('video', [py, '-m', 'act_ros.cli', 'evaluate', '--checkpoint', str(checkpoint),
                             '--episodes', '1', '--mode', mode, '--seed', str(seed), '--video',
                             str(video), '--output', str(result_file), '--no-progress'])
        episode = json.loads(result_file.read_text())['modes'][mode]['episodes'][0]
        if episode['success'] or not aligned:
            return {'path': str(video), 'mode': mode, 'seed': seed,
                    'aligned': bool(episode['success'])}
    return {'path': str(video), 'mode': mode, 'seed': seed, 'aligned': False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='act_ros.demo', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--output-dir', type=Path, default=Path('outputs/demo'))
    parser.add_argument('--full-loop', action='store_true',
                        default=os.environ.get('DEMO_FULL_LOOP') == '1',
                        help='collect, train with the CPU recipe, then evaluate (~2.5 h on 2 '
                        'cores; also DEMO_FULL_LOOP=1)')
    parser.add_argument('--fast', action='store_true', default=os.environ.get('DEMO_FAST') == '1',
                        help='a few-minute smoke of the full loop (also DEMO_FAST=1)')
    parser.add_argument('--model', type=Path, default=None,
                        help=f'checkpoint to evaluate (default: models/{SHIPPED_MODEL})')
    parser.add_argument('--episodes', type=int, default=None,
                        help='evaluation episodes per mode (default: 10; 1 with --fast)')
    parser.add_argument('--retrain', action='store_true', help='train again even if a '
                        'checkpoint from an earlier full-loop run exists')
    parser.add_argument('--device', default='auto', help='training device (auto: CUDA if present)')
    args = parser.parse_args(argv)
    name = 'fast' if args.fast else 'full' if args.full_loop else 'shipped'
    plan = PLANS[name]
    if args.episodes is not None:
        if args.episodes < 1:
            parser.error(f'--episodes must be >= 1, got {args.episodes}')
        plan = DemoPlan(**{**asdict(plan), 'eval_episodes': args.episodes})
    if plan.trains and args.model is not None:
        parser.error('--model evaluates an existing checkpoint; it does not combine with '
                     '--full-loop or --fast')
    out = args.output_dir.resolve() / name
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault('MUJOCO_GL', 'egl')
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    stages = Stages(out / 'logs')
    started = time.monotonic()
    print(f'act_ros demo ({name}): {asdict(plan)}\noutput folder: {out}', flush=True)
    try:
        if plan.trains:
            checkpoint = _train(stages, plan, out, args)
        else:
            checkpoint = (args.model or shipped_model_path()).resolve()
            if not (checkpoint / 'model.safetensors').is_file():
                print(f'demo: no model at {checkpoint} (expected a LeRobot pretrained_model '
                      'directory with model.safetensors); run `make demo DEMO_ARGS=--full-loop` '
                      'to train one', file=sys.stderr)
                return 2
        # One sim_bridge + act_node pair per mode, in ROS domains of their own, at once.
        commands = {mode: [sys.executable, '-m', 'act_ros.ros.evaluation.ros_eval',
                           '--checkpoint', str(checkpoint), '--episodes', str(plan.eval_episodes),
                           '--mode', mode, '--seed', str(EVAL_SEED), '--torch-threads', '1',
                           '--domain-id', str(_domain_id(k)),
                           '--output', str(out / f'ros_eval_{mode}.json'),
                           '--log-dir', str(out / 'ros_logs' / mode)]
                    for k, mode in enumerate(('chunk', 'ensemble'))}
        stages.run_parallel('evaluate over ROS 2 (sim_bridge + act_node per mode)', commands)
        ros = {mode: json.loads((out / f'ros_eval_{mode}.json').read_text())[mode]
               for mode in commands}
        write_json_atomic(out / 'ros_eval.json', ros)
        video = _record_success(stages, checkpoint, ros, out)
        print('\n=== scripted expert on the same seeds ===', flush=True)
        start = time.monotonic()
        expert = _expert_rate(plan.eval_episodes, EVAL_SEED)
        stages.timings['expert'] = time.monotonic() - start
    except KeyboardInterrupt:
        stages.stop_child()
        print('\ndemo interrupted: every stage it started has been stopped', file=sys.stderr)
        return 130

    summary = {'plan': asdict(plan), 'checkpoint': str(checkpoint), 'output_dir': str(out),
               'seeds': [EVAL_SEED + k for k in range(plan.eval_episodes)], 'ros_eval': ros,
               'expert': expert, 'video': video, 'stage_seconds': stages.timings,
               'wall_seconds': time.monotonic() - started}
    write_json_atomic(out / 'summary.json', summary)
    print(_summary_text(summary, ros, expert, out))
    return 0


def _summary_text(summary: dict, ros: dict, expert: dict, out: Path) -> str:
    count = summary['plan']['eval_episodes']
    lines = ['', '=' * 78,
             f'act_ros demo finished in {summary["wall_seconds"] / 60:.1f} min: '
             f'{count} episode(s) per row, seeds {EVAL_SEED}..{EVAL_SEED + count - 1} '
             '(never used for training)',
             f'checkpoint: {summary["checkpoint"]}', '',
             f'{"policy / mode":<32}{"align rate":>12}{"pos err (mm)":>14}{"yaw err (deg)":>15}']
    for mode, metrics in _modes(ros).items():
        lines.append(_row(f'ACT over ROS 2, {mode}', metrics))
    lines.append(_row('scripted expert (ceiling)', expert))
    for mode, metrics in _modes(ros).items():
        failed = {k: v for k, v in metrics.get('failures', {}).items() if v}
        if failed:
            lines.append(f'  {mode} failures by stage: '
                         + ', '.join(f'{k} {v}' for k, v in failed.items()))
    video = summary['video']
    lines += ['', f"video: {video['path']} ({video['mode']} mode, seed {video['seed']}, "
              f"{'aligned' if video['aligned'] else 'NOT aligned: no aligned episode to show'})",
              '', f'outputs in {out}:',
              '  ros_eval.json            per-episode results over ROS 2',
              '  episode.mp4              one episode, top and wrist cameras',
              '  summary.json             this table and the stage times']
    if summary['plan']['episodes']:
        lines.insert(-3, '  train/best/              checkpoint (LeRobot pretrained_model), '
                         'train/training_metrics.json and plots')
    return '\n'.join(lines)


def _modes(ros: dict) -> dict:
    modes = ros.get('modes', ros)
    return {k: v for k, v in modes.items() if isinstance(v, dict) and 'align_rate' in v}


def _row(label: str, m: dict) -> str:
    aligned = round(m['align_rate'] * m['count'])
    rate = f'{m["align_rate"]:.2f} ({aligned}/{m["count"]})'
    return (f'{label:<32}{rate:>12}{1000 * m["mean_position_error"]:>14.1f}'
            f'{m["mean_yaw_error"]:>15.1f}')


if __name__ == '__main__':
    sys.exit(main())
