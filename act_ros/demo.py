"""``make demo``: the shipped policies doing the simulated task over ROS 2, next to the expert.

By default (under 10 minutes on a 2-core CPU):

1. Evaluate the policies shipped in ``models/`` over ROS 2: the object-state policy
   (``sim_port_pick_align_poses``: cameras, joints and the object poses) in chunk and
   temporal-ensembling modes, and the vision policy (``sim_port_pick_align_192x256``:
   cameras and joints) in both modes too, and the policy for gym-aloha's transfer cube (the
   ACT paper's bimanual task, ``aloha_transfer_cube``: top camera and 14 joints) in chunk
   mode. Each evaluation is a ``sim_bridge`` and an ``act_node`` process
   in lock-step on loopback, in a ROS domain of its own, on seeds never used for
   collection, DAgger or checkpoint selection; two run at a time.
2. Run each task's scripted expert on the same seeds (the ceiling).
3. Record one successful episode (both cameras) to ``episode.mp4``: the first seed the
   first policy aligned over ROS 2, replayed by the in-process evaluator, which runs the
   same runtime, safety chain and release gate.
4. Print the align rates and errors of every policy and mode next to the expert's.

``--full-loop`` runs the whole pipeline instead: ``act-ros recipe object_state``
(expert demonstrations, behaviour cloning, DAgger, the object-state policy; 51 to 131
minutes on 2 cores, docs/expert_and_dagger.md), then the same evaluation of the new
checkpoint; ``--fast`` is a few-minute smoke of it (``config/recipe_smoke.yaml``).
``--model DIR`` (repeatable) evaluates other checkpoints. Everything lands under one
output folder, named at the end. Every stage runs as a child process; Ctrl-C or SIGTERM
stops it and the demo without leaving processes behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_json_atomic

# Evaluation seeds: disjoint from collection (0, 1, ...), from the trainer's checkpoint
# selection (1_000_000 + k) and from act-ros evaluate's default (2_000_000 + k).
EVAL_SEED = 100_000
# (folder in models/, what the policy sees, modes the demo shows by default), in the
# demo's order. The vision policy is the best one from cameras and joints alone (192x256;
# it aligns about a quarter of unseen seeds, docs/training_results.md section 4); the
# 96x128 one it started from stays in models/ as the vision recipe's starting backbone.
SHIPPED_MODELS = (('sim_port_pick_align_poses', 'cameras + object poses', ('chunk', 'ensemble')),
                  ('sim_port_pick_align_192x256', 'cameras only', ('chunk', 'ensemble')),
                  ('aloha_transfer_cube', 'ALOHA transfer cube: top camera', ('chunk',)))
SHIPPED_MODEL = SHIPPED_MODELS[1][0]
# Episodes of gym-aloha's transfer cube per mode over ROS 2 (a step renders a 480x640 frame
# of a meshed scene and sends it: 3-6 steps/s on 2 cores, so fewer episodes than the
# package's task to keep the demo near 10 minutes).
ALOHA_DEMO_EPISODES = 3


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of each stage. ``episodes``/``train_steps`` 0: no collection/training."""

    eval_episodes: int
    recipe: str = ''  # '' : evaluate shipped or given models; else act-ros recipe NAME
    modes: tuple[str, ...] = ('chunk', 'ensemble')  # per model unless a model says otherwise

    def __post_init__(self) -> None:
        if self.eval_episodes < 1:
            raise ValueError(f'eval_episodes must be >= 1, got {self.eval_episodes}')
        unknown = [m for m in self.modes if m not in ('chunk', 'ensemble')]
        if unknown or not self.modes:
            raise ValueError(f'modes must be chunk and/or ensemble, got {list(self.modes)}')

    @property
    def trains(self) -> bool:
        return bool(self.recipe)


PLANS = {
    # The shipped models over ROS 2: the README's demo.
    'shipped': DemoPlan(eval_episodes=10),
    # The object-state recipe end to end (config/recipe_object_state.yaml).
    'full': DemoPlan(eval_episodes=10, recipe='object_state'),
    # A quick look at the whole loop: a smoke-scale run that does not learn the task.
    'fast': DemoPlan(eval_episodes=1, recipe='smoke', modes=('chunk',)),
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
                     timeout_s: float = 3600.0, slots: int = 0) -> None:
        """Run several children as one stage, at most ``slots`` at a time (0: all at
        once), each next one started as soon as a slot frees, in the given order; every
        one must succeed. ``timeout_s`` bounds the whole stage."""
        print(f'\n=== {name} ===', flush=True)
        for label, args in commands.items():
            print(f'{"" if label == name else f"[{label}] "}$ {" ".join(args)}', flush=True)
        start = time.monotonic()
        deadline = start + timeout_s
        waiting = list(commands.items())
        slots = slots if slots > 0 else len(waiting)
        running: dict[str, object] = {}
        codes: dict[str, int] = {}
        try:
            while waiting or running:
                while waiting and len(running) < slots:
                    label, args = waiting.pop(0)
                    running[label] = self.procs.start(label, args, log=False)
                for label, child in list(running.items()):
                    code = child.popen.poll()
                    if code is not None:
                        codes[label] = code
                        del running[label]
                if any(code != 0 for code in codes.values()):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f'{", ".join(running)} did not finish within '
                                       f'{timeout_s:.0f} s')
                if running:
                    time.sleep(0.2)
        except TimeoutError as exc:
            self.stop_child()
            raise SystemExit(f'demo: stage "{name}" failed: {exc}; stopped') from None
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


def shipped_model_path(name: str = SHIPPED_MODEL) -> Path:
    """``models/<name>`` of the source tree or the installed package."""
    from act_ros.core.paths import share_dir

    return share_dir() / 'models' / name


def shipped_models() -> list[tuple[str, Path, tuple[str, ...]]]:
    """(label, path, default modes) of the shipped policies present, in the demo's order."""
    found = []
    for name, label, modes in SHIPPED_MODELS:
        path = shipped_model_path(name)
        if (path / 'model.safetensors').is_file():
            found.append((label, path, modes))
    return found


def _expert_rate(episodes: int, seed: int, task: str = 'port_pick_align') -> dict:
    """The task's scripted expert on the evaluation seeds (no rendering): the ceiling."""
    if task != 'port_pick_align':
        from act_ros.sim.expert_eval import evaluate_aloha

        return evaluate_aloha(task, range(seed, seed + episodes))
    from act_ros.sim import PortPickAlignEnv, ScriptedExpert, SimConfig, summarize_results
    from act_ros.sim.expert import run_episode

    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        expert = ScriptedExpert(env)
        results = [run_episode(env, expert, seed + k) for k in range(episodes)]
    return {**summarize_results(results), 'task': task}


def _episodes(plan: DemoPlan, path: Path) -> int:
    """Evaluation episodes of a model: the plan's, fewer for gym-aloha (see
    ``ALOHA_DEMO_EPISODES``) unless the plan asks for fewer still."""
    from act_ros.sim.tasks import checkpoint_task

    if checkpoint_task(path).is_aloha:
        return min(plan.eval_episodes, ALOHA_DEMO_EPISODES)
    return plan.eval_episodes


def _train(stages: Stages, plan: DemoPlan, out: Path, args: argparse.Namespace) -> Path:
    """Run (or continue) the recipe in ``out/recipe``; returns its final checkpoint."""
    run_dir = out / 'recipe'
    if args.retrain and run_dir.exists():
        shutil.rmtree(run_dir)
    stages.run(f'recipe {plan.recipe}', [sys.executable, '-m', 'act_ros.cli', 'recipe',
                                         plan.recipe, '--run-dir', str(run_dir)],
               timeout_s=8 * 3600.0)
    final = run_dir / 'final'
    return final / 'best' if (final / 'best' / 'model.safetensors').is_file() else final / 'last'


def _evaluate_over_ros(stages: Stages, plan: DemoPlan,
                       models: list[tuple[str, Path, tuple[str, ...]]],
                       out: Path) -> dict[str, dict]:
    """Every (model, mode) over ROS 2, two sim_bridge + act_node pairs at a time (the
    ensemble evaluations, the longest, first; the next one starts when a pair finishes);
    the results keyed ``'<label>, <mode>'`` in the order of ``models``."""
    jobs = [(label, path, mode) for label, path, modes in models for mode in modes]
    order = sorted(range(len(jobs)), key=lambda k: jobs[k][2] != 'ensemble')
    commands = {}
    for k in order:
        label, path, mode = jobs[k]
        tag = _tag(label, mode)
        commands[tag] = [sys.executable, '-m', 'act_ros.ros.evaluation.ros_eval',
                         '--checkpoint', str(path), '--episodes', str(_episodes(plan, path)),
                         '--mode', mode, '--seed', str(EVAL_SEED), '--torch-threads', '1',
                         '--domain-id', str(_domain_id(k)),
                         '--output', str(out / f'ros_eval_{tag}.json'),
                         '--log-dir', str(out / 'ros_logs' / tag)]
    stages.run_parallel('evaluate over ROS 2 (sim_bridge + act_node each, two at a time)',
                        commands, timeout_s=3 * 3600.0, slots=2)
    results: dict[str, dict] = {}
    for label, path, mode in jobs:
        tag = _tag(label, mode)
        result = json.loads((out / f'ros_eval_{tag}.json').read_text())[mode]
        results[f'{label}, {mode}'] = {**result, 'checkpoint': str(path), 'mode': mode}
    return results


def _experts(plan: DemoPlan, models: list[tuple[str, Path, tuple[str, ...]]]) -> dict:
    """Each evaluated task's expert on that task's demo seeds, keyed by task."""
    from act_ros.sim.tasks import checkpoint_task

    episodes = {checkpoint_task(path).name: _episodes(plan, path) for _, path, _ in models}
    return {task: _expert_rate(count, EVAL_SEED, task) for task, count in episodes.items()}


def _tag(label: str, mode: str) -> str:
    return ''.join(c if c.isalnum() else '_' for c in f'{label}_{mode}').strip('_')


def _record_success(stages: Stages, checkpoint: Path, ros: dict, out: Path,
                    tries: int = 3) -> dict:
    """Video of one aligned episode of ``checkpoint``: the first seeds it aligned over ROS 2
    (chunk mode first), replayed in process; returns what was recorded."""
    py = sys.executable
    aligned = [(m['mode'], e['seed']) for m in ros.values()
               if m.get('checkpoint') == str(checkpoint)
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
            return {'path': str(video), 'checkpoint': str(checkpoint), 'mode': mode,
                    'seed': seed, 'aligned': bool(episode['success'])}
    return {'path': str(video), 'checkpoint': str(checkpoint), 'mode': mode, 'seed': seed,
            'aligned': False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='act-ros demo', description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument('--output-dir', type=Path, default=Path('outputs/demo'))
    parser.add_argument('--full-loop', action='store_true',
                        default=os.environ.get('DEMO_FULL_LOOP') == '1',
                        help='run act-ros recipe object_state, then evaluate its policy (~1.5 h '
                        'on 2 cores; also DEMO_FULL_LOOP=1)')
    parser.add_argument('--fast', action='store_true', default=os.environ.get('DEMO_FAST') == '1',
                        help='a few-minute smoke of the full loop (also DEMO_FAST=1)')
    parser.add_argument('--model', type=Path, action='append', default=None,
                        help='checkpoint to evaluate (repeatable; default: the models shipped in '
                        'models/)')
    parser.add_argument('--episodes', type=int, default=None,
                        help='evaluation episodes per policy and mode (default: 10; 1 with --fast)')
    parser.add_argument('--modes', default=None,
                        help='comma-separated execution modes for every policy (default: '
                        'chunk,ensemble; the shipped vision policy chunk only)')
    parser.add_argument('--retrain', action='store_true', help='start the recipe again even if '
                        'an earlier full-loop run exists')
    args = parser.parse_args(argv)
    name = 'fast' if args.fast else 'full' if args.full_loop else 'shipped'
    plan = PLANS[name]
    try:
        if args.episodes is not None:
            plan = DemoPlan(**{**asdict(plan), 'eval_episodes': args.episodes})
        if args.modes is not None:
            plan = DemoPlan(**{**asdict(plan), 'modes': tuple(args.modes.split(','))})
    except ValueError as exc:
        parser.error(str(exc))
    if plan.trains and args.model is not None:
        parser.error('--model evaluates existing checkpoints; it does not combine with '
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
            models = [(f'recipe {plan.recipe}', _train(stages, plan, out, args).resolve(),
                       plan.modes)]
        elif args.model:
            models = [(path.name, path.resolve(), plan.modes) for path in args.model]
        else:  # each shipped policy in its own modes unless --modes says which
            models = [(label, path, plan.modes if args.modes else modes)
                      for label, path, modes in shipped_models()]
        missing = [str(p) for _, p, _ in models if not (p / 'model.safetensors').is_file()]
        if not models or missing:
            print(f'demo: no model at {missing or "models/"} (expected LeRobot pretrained_model '
                  'directories with model.safetensors); run `make demo DEMO_ARGS=--full-loop` '
                  'to train one', file=sys.stderr)
            return 2
        ros = _evaluate_over_ros(stages, plan, models, out)
        write_json_atomic(out / 'ros_eval.json', ros)
        video = _record_success(stages, models[0][1], ros, out)
        print('\n=== scripted experts on the same seeds ===', flush=True)
        start = time.monotonic()
        experts = _experts(plan, models)
        stages.timings['expert'] = time.monotonic() - start
    except KeyboardInterrupt:
        stages.stop_child()
        print('\ndemo interrupted: every stage it started has been stopped', file=sys.stderr)
        return 130

    from act_ros.provenance import result_provenance

    summary = {'provenance': result_provenance(
                   'make demo (act-ros demo)',
                   argv if argv is not None else sys.argv[1:], output_path=None,
                   output_option='--output-dir'),
               'plan': asdict(plan),
               'models': {label: str(path) for label, path, _ in models},
               'output_dir': str(out),
               'seeds': [EVAL_SEED + k for k in range(plan.eval_episodes)], 'ros_eval': ros,
               'experts': experts, 'video': video, 'stage_seconds': stages.timings,
               'wall_seconds': time.monotonic() - started}
    write_json_atomic(out / 'summary.json', summary)
    print(_summary_text(summary, ros, experts, out))
    return 0


def _summary_text(summary: dict, ros: dict, experts: dict, out: Path) -> str:
    count = summary['plan']['eval_episodes']
    lines = ['', '=' * 86,
             f'act_ros demo finished in {summary["wall_seconds"] / 60:.1f} min: '
             f'up to {count} episode(s) per row, seeds from {EVAL_SEED} '
             '(never used for training)', '']
    lines += [f'  {label}: {path}' for label, path in summary['models'].items()]
    lines += ['', f'{"policy (inputs), mode over ROS 2":<40}{"success rate":>14}'
              f'{"pos err (mm)":>14}{"yaw err (deg)":>15}']
    for label, metrics in ros.items():
        lines.append(_row(label, metrics))
    for task, expert in experts.items():
        lines.append(_row(f'scripted expert, {task} (ceiling)', expert))
    for label, metrics in ros.items():
        failed = {k: v for k, v in metrics.get('failures', {}).items() if v}
        if failed:
            lines.append(f'  {label} failures by stage: '
                         + ', '.join(f'{k} {v}' for k, v in failed.items()))
    video = summary['video']
    lines += ['', f"video: {video['path']} ({Path(video['checkpoint']).name}, {video['mode']} "
              f"mode, seed {video['seed']}, "
              f"{'aligned' if video['aligned'] else 'NOT aligned: no aligned episode to show'})",
              '', f'outputs in {out}:',
              '  ros_eval.json            per-episode results over ROS 2',
              '  episode.mp4              one episode, top and wrist cameras',
              '  summary.json             this table and the stage times']
    if summary['plan']['recipe']:
        lines.insert(-3, '  recipe/                  the recipe run: datasets, training runs '
                         '(final/best: the checkpoint), recipe.json')
    return '\n'.join(lines)


def _row(label: str, m: dict) -> str:
    rate = m.get('success_rate', m.get('align_rate'))
    rate_text = f'{rate:.2f} ({round(rate * m["count"])}/{m["count"]})'
    if 'mean_position_error' not in m:  # gym-aloha: success is the task's own reward
        return f'{label:<40}{rate_text:>14}{"-":>14}{"-":>15}'
    return (f'{label:<40}{rate_text:>14}{1000 * m["mean_position_error"]:>14.1f}'
            f'{m["mean_yaw_error"]:>15.1f}')


if __name__ == '__main__':
    sys.exit(main())
