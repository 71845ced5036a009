"""``make demo``: the whole loop on one machine with the built-in simulation.

1. Collect scripted-expert demonstrations in MuJoCo into a LeRobot v3 dataset (reused
   when an earlier demo run left one).
2. Train ACT with the CPU demo preset (CUDA when present), within a step budget.
3. Start ``sim_bridge`` and ``act_node`` as two processes talking over ROS 2 (lock-step),
   run evaluation episodes through the topics, chunk execution and ensembling.
4. Record a short video of one episode (both cameras) and print the align rates next
   to the scripted expert's on the same seeds.

Everything lands under one output folder, named at the end. ``DEMO_FAST=1`` (or
``--fast``) is a few-minute variant for a quick look. Every stage runs as a child
process; Ctrl-C or SIGTERM stops it and the demo without leaving processes behind.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
import json
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import time


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of each stage. ``full`` fits about 25 minutes on a 2-core CPU."""

    episodes: int
    image_size: str
    train_steps: int
    batch_size: int
    val_interval: int
    closed_loop_episodes: int
    eval_episodes: int
    workers: int

    def __post_init__(self) -> None:
        for name in ('episodes', 'train_steps', 'batch_size', 'val_interval', 'eval_episodes',
                     'workers'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')


PLANS = {
    # Training is the long stage: ~1 step/s for the 'cpu' model at 96x128 on 2 cores.
    'full': DemoPlan(episodes=30, image_size='96x128', train_steps=700, batch_size=8,
                     val_interval=350, closed_loop_episodes=2, eval_episodes=5, workers=2),
    'fast': DemoPlan(episodes=4, image_size='96x128', train_steps=60, batch_size=4,
                     val_interval=60, closed_loop_episodes=1, eval_episodes=1, workers=2),
}
EVAL_SEED = 100_000  # evaluation seeds never overlap the collection seeds


class Stages:
    """Runs each stage as a child process and stops it cleanly on Ctrl-C / SIGTERM."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.child: subprocess.Popen | None = None
        self.timings: dict[str, float] = {}
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        raise KeyboardInterrupt

    def run(self, name: str, args: list[str]) -> None:
        print(f'\n=== {name} ===\n$ {" ".join(args)}', flush=True)
        start = time.monotonic()
        self.child = subprocess.Popen(args, start_new_session=True)
        try:
            code = self.child.wait()
        except KeyboardInterrupt:
            self.stop_child()
            raise
        finally:
            self.timings[name] = time.monotonic() - start
        self.child = None
        if code != 0:
            raise SystemExit(f'demo: stage "{name}" failed (exit {code}); see the output above')

    def stop_child(self) -> None:
        child, self.child = self.child, None
        if child is None or child.poll() is not None:
            return
        try:
            os.killpg(child.pid, signal.SIGINT)  # the stage cleans up its own children
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        except ProcessLookupError:
            pass


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='act_ros.demo', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--output-dir', type=Path, default=Path('outputs/demo'))
    parser.add_argument('--fast', action='store_true', default=os.environ.get('DEMO_FAST') == '1',
                        help='a few-minute variant (also DEMO_FAST=1)')
    parser.add_argument('--retrain', action='store_true', help='train again even if a '
                        'checkpoint from an earlier run exists')
    parser.add_argument('--device', default='auto', help='training device (auto: CUDA if present)')
    args = parser.parse_args(argv)
    plan = PLANS['fast' if args.fast else 'full']
    name = 'fast' if args.fast else 'full'
    out = args.output_dir.resolve() / name
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault('MUJOCO_GL', 'egl')
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    py = sys.executable
    stages = Stages(out)
    started = time.monotonic()
    print(f'act_ros demo ({name}): {asdict(plan)}\noutput folder: {out}', flush=True)
    try:
        dataset = out / 'dataset'
        if _dataset_ready(dataset):
            print(f'\n=== collect ===\nreusing the dataset of an earlier run: {dataset}')
        else:
            stages.run('collect', [py, '-m', 'act_ros.cli', 'collect', '--output', str(dataset),
                                   '--episodes', str(plan.episodes), '--image-size',
                                   plan.image_size, '--workers', str(plan.workers),
                                   '--seed', '0', '--overwrite'])
        train_dir = out / 'train'
        checkpoint = train_dir / 'best'
        if args.retrain and train_dir.exists():
            shutil.rmtree(train_dir)
        if (train_dir / 'training_metrics.json').is_file() and checkpoint.is_dir():
            print(f'\n=== train ===\nreusing the checkpoint of an earlier run: {checkpoint} '
                  '(--retrain to train again)')
        else:
            if train_dir.exists():
                shutil.rmtree(train_dir)  # an interrupted earlier run: start over
            stages.run('train', [
                py, '-m', 'act_ros.cli', 'train', '--preset', 'sim', '--dataset-root', str(dataset),
                '--output-dir', str(train_dir), '--steps', str(plan.train_steps),
                '--batch-size', str(plan.batch_size), '--val-interval', str(plan.val_interval),
                '--warmup-steps', str(max(1, plan.train_steps // 10)),
                '--checkpoint-interval', str(plan.train_steps), '--image-size', plan.image_size,
                '--closed-loop-val-episodes', str(plan.closed_loop_episodes),
                '--closed-loop-te-episodes', '0', '--early-stop-patience', '0',
                '--min-steps', '0', '--device', args.device])
        ros_json = out / 'ros_eval.json'
        stages.run('evaluate over ROS 2 (sim_bridge + act_node, two processes)', [
            py, '-m', 'act_ros.ros.ros_eval', '--checkpoint', str(checkpoint),
            '--episodes', str(plan.eval_episodes), '--mode', 'both', '--image-size',
            plan.image_size, '--seed', str(EVAL_SEED), '--output', str(ros_json),
            '--log-dir', str(out / 'ros_logs')])
        video = out / 'episode.mp4'
        stages.run('video', [py, '-m', 'act_ros.cli', 'evaluate', '--checkpoint', str(checkpoint),
                             '--episodes', '1', '--mode', 'chunk', '--seed', str(EVAL_SEED),
                             '--video', str(video), '--output', str(out / 'video_episode.json')])
        print('\n=== scripted expert on the same seeds ===', flush=True)
        expert = _expert_rate(plan.eval_episodes, EVAL_SEED)
    except KeyboardInterrupt:
        stages.stop_child()
        print('\ndemo interrupted: every stage it started has been stopped', file=sys.stderr)
        return 130

    ros = json.loads(ros_json.read_text())
    summary = {'plan': asdict(plan), 'output_dir': str(out), 'ros_eval': ros, 'expert': expert,
               'stage_seconds': stages.timings, 'wall_seconds': time.monotonic() - started}
    (out / 'summary.json').write_text(json.dumps(summary, indent=2))
    print(_summary_text(summary, ros, expert, out))
    return 0


def _summary_text(summary: dict, ros: dict, expert: dict, out: Path) -> str:
    lines = ['', '=' * 72, f'act_ros demo finished in {summary["wall_seconds"] / 60:.1f} min', '',
             f'{"policy / mode":<28}{"align rate":>12}{"pos err (mm)":>14}{"yaw err (deg)":>15}']
    for mode, metrics in _modes(ros).items():
        lines.append(_row(f'ACT over ROS 2, {mode}', metrics))
    lines.append(_row('scripted expert (ceiling)', expert))
    lines += ['', f'outputs in {out}:',
              '  train/best/              checkpoint (LeRobot pretrained_model)',
              '  train/training_metrics.json, train/*.png   metrics and plots',
              '  ros_eval.json            per-episode results over ROS 2',
              '  episode.mp4              one episode, top and wrist cameras',
              '  summary.json             this table']
    return '\n'.join(lines)


def _modes(ros: dict) -> dict:
    modes = ros.get('modes', ros)
    return {k: v for k, v in modes.items() if isinstance(v, dict) and 'align_rate' in v}


def _row(label: str, m: dict) -> str:
    return (f'{label:<28}{m["align_rate"]:>12.2f}{1000 * m["mean_position_error"]:>14.1f}'
            f'{m["mean_yaw_error"]:>15.1f}')


if __name__ == '__main__':
    sys.exit(main())
