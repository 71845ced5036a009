"""Score the scripted expert over seeded episodes: ``act-ros expert-eval``.

Prints the align rate and mean errors (the ceiling a trained policy is judged against),
the release gate's verdict, and the simulation speed. Rendering is off unless asked for.
With ``--perturb`` every episode is perturbed once (:mod:`act_ros.sim.perturb`: the box
pushed, the gripper forced open in transit, the arm knocked off its path, in turn) and
the table says how often the expert still aligned the box, per kind.

``--output FILE`` writes the summary as a result file (atomically, with its
``provenance``: command, commit, machine, library versions); with ``--run NAME`` as well,
the summary becomes ``runs[NAME]`` of FILE and the file's other runs are kept, so several
runs share one file (``docs/results/expert/expert_eval.json``, which ``act-ros report``
reads)::

    act-ros expert-eval --episodes 100 --seed 2000000 \\
        --output docs/results/expert/expert_eval.json --run plain
    act-ros expert-eval --perturb --episodes 100 --seed 3000000 \\
        --perturbation-seed 0 --output docs/results/expert/expert_eval.json --run perturbed

Such a file's top-level ``provenance`` names every run's command, commit and machine, and
keeps each run's own provenance under ``provenance.runs[NAME]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_json_atomic
from act_ros.sim.config import SimConfig
from act_ros.sim.env import PortPickAlignEnv
from act_ros.sim.expert import ScriptedExpert, run_episode
from act_ros.sim.metrics import summarize_results
from act_ros.sim.perturb import PERTURBATIONS, run_perturbed_episode, sample_perturbation


def evaluate_nominal(env: PortPickAlignEnv, expert: ScriptedExpert, seeds: range, *,
                     verbose: bool = False) -> dict:
    """Summary of unperturbed expert episodes (``summarize_results`` plus gate and IK)."""
    results = []
    gate_trips = 0
    max_ik_error_m = 0.0
    start = time.perf_counter()
    for seed in seeds:
        result = run_episode(env, expert, seed)
        gate_trips += int(expert.gate_tripped)
        max_ik_error_m = max(max_ik_error_m, expert.max_ik_error_m)
        results.append(result)
        if verbose:
            print(f'seed {seed}: success={result.success} '
                  f'pos_err={result.position_error_m * 1000:.1f} mm '
                  f'yaw_err={result.yaw_error_deg:.1f} deg released={result.released} '
                  f'on_pad={result.box_on_pad}', file=sys.stderr)
    elapsed = time.perf_counter() - start
    summary = summarize_results(results)
    summary['gate_tripped_episodes'] = gate_trips
    summary['max_ik_error_m'] = max_ik_error_m
    summary['failed_seeds'] = [r.seed for r in results if not r.success]
    summary['steps_per_s_with_expert'] = sum(r.steps for r in results) / elapsed
    return summary


def evaluate_perturbed(env: PortPickAlignEnv, expert: ScriptedExpert, seeds: range, *,
                       perturbation_seed: int = 0, verbose: bool = False) -> dict:
    """Summary of perturbed episodes (``summarize_results`` over all of them, the kinds in
    turn) and ``by_perturbation``: per kind, its episodes (``count``), how many aligned,
    how many saw the perturbation fire, and the failed seeds."""
    rng = np.random.default_rng(perturbation_seed)
    table: dict[str, dict] = {kind: {'count': 0, 'aligned': 0, 'fired': 0, 'failed_seeds': []}
                              for kind in PERTURBATIONS}
    results = []
    for i, seed in enumerate(seeds):
        kind = PERTURBATIONS[i % len(PERTURBATIONS)]
        outcome = run_perturbed_episode(env, expert, seed, sample_perturbation(kind, rng))
        results.append(outcome.result)
        row = table[kind]
        row['count'] += 1
        row['fired'] += int(outcome.fired_tick is not None)
        row['aligned'] += int(outcome.result.success)
        if not outcome.result.success:
            row['failed_seeds'].append(seed)
        if verbose:
            print(f'seed {seed}: {kind} at tick {outcome.fired_tick}: '
                  f'success={outcome.result.success} '
                  f'({outcome.result.failure_phase or "aligned"})', file=sys.stderr)
    summary = summarize_results(results)
    summary['failed_seeds'] = [seed for row in table.values() for seed in row['failed_seeds']]
    summary['by_perturbation'] = table
    summary['perturbation_seed'] = perturbation_seed
    return summary


COMMAND = 'act-ros expert-eval'


class OutputError(Exception):
    """``--output FILE --run NAME`` cannot merge into FILE as it is (nothing is written)."""


def evaluate_aloha(task: str, seeds: range, *, verbose: bool = False) -> dict:

    """Summary of the gym-aloha expert's episodes (:mod:`act_ros.sim.aloha.expert`): each
    planned in the end-effector task, then replayed in the joint-space task, which scores
    it (gym-aloha's reward 4), without rendering. ``success_rate`` is the replay's; the
    plan's own success in the end-effector task is beside it, and the highest reward stage
    each failed replay reached."""
    from act_ros.sim.aloha.env import AlohaEnv, summarize_aloha_results
    from act_ros.sim.aloha.expert import end_effector_rollout, replay
    from act_ros.sim.tasks import sim_task

    name, task = task, sim_task(task).aloha_task
    results, planned, failed = [], 0, []
    start = time.perf_counter()
    with AlohaEnv(task, cameras=(), terminate_on_success=False) as env:
        for seed in seeds:
            trajectory = end_effector_rollout(task, seed, env.episode_steps)
            planned += trajectory.ee_max_reward >= env.max_reward
            result = replay(env, trajectory)
            results.append(result)
            if not result.success:
                failed.append({'seed': seed, 'max_reward': result.max_reward,
                               'plan_max_reward': trajectory.ee_max_reward})
            if verbose:
                print(f'seed {seed}: success={result.success} reward {result.max_reward:g} '
                      f'(plan {trajectory.ee_max_reward:g})')
    seconds = time.perf_counter() - start
    return {'task': name, **summarize_aloha_results(results),
            'plan_success_rate': planned / len(results), 'failed': failed,
            'failed_seeds': [f['seed'] for f in failed], 'seconds': seconds,
            'steps_per_s_with_expert': sum(r.steps for r in results) / seconds}


def run_provenance(argv: Sequence[str], output: Path) -> dict:
    """The provenance of one run: ``result_provenance`` (the command without ``--output``
    and ``--run``) and the versions of the libraries the simulation depends on."""
    from act_ros.provenance import library_versions, result_provenance

    entry = result_provenance(COMMAND, argv, output_path=output, output_option='--output',
                              omit=('--run',))
    entry['versions'] = library_versions(('act_ros', 'numpy', 'mujoco'))
    return entry


def merged_provenance(runs: dict[str, dict]) -> dict:
    """A file's top-level provenance from its runs' own: every command, the commit and the
    machine (each run's, named, where they differ) and ``runs``: each run's entry."""
    def joined(key: str) -> str:
        values = [entry[key] for entry in runs.values()]
        if len(set(values)) == 1:
            return values[0]
        return '; '.join(f'{name}: {entry[key]}' for name, entry in runs.items())

    merged = {'command': '; '.join(entry['command'] for entry in runs.values()),
              'commit': joined('commit'), 'machine': joined('machine'), 'runs': runs}
    changed = {name: entry['local_changes'] for name, entry in runs.items()
               if 'local_changes' in entry}
    if changed:  # a run from a tree with local changes names them (act-ros report checks)
        merged['local_changes'] = '; '.join(f'{name}: {files}' for name, files in changed.items())
    return merged


@contextlib.contextmanager
def _locked_folder(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s folder: two runs merging into one file at the
    same time each keep the other's run (the lock leaves no file behind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def existing_runs(path: Path, run: str) -> tuple[dict[str, dict], dict[str, dict]]:
    """The runs of the result file ``path`` (none when it does not exist) and their own
    provenance, or :class:`OutputError` when ``runs[run]`` cannot be merged into it."""
    if not path.exists():
        return {}, {}
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise OutputError(f'{path}: not a JSON file ({exc}); give another --output or '
                          'remove it') from None
    if not isinstance(old, dict) or not isinstance(old.get('runs'), dict):
        raise OutputError(f'{path}: has no "runs" (a single run\'s file?); give another '
                          '--output or remove it')
    own = (old.get('provenance') or {}).get('runs') or {}
    lacking = [name for name in old['runs'] if name != run and name not in own]
    if lacking:
        raise OutputError(f'{path}: run(s) {", ".join(lacking)} carry no provenance of their '
                          'own (provenance.runs; put together by hand?): rerun them into a '
                          'new file, or remove it')
    return dict(old['runs']), dict(own)


def write_result(path: Path, record: dict, provenance: dict, run: str | None = None) -> dict:
    """Write ``record`` to ``path`` atomically: the whole file (``run`` None), else as
    ``runs[run]``, keeping the file's other runs. Returns what was written."""
    if run is None:
        data = {'provenance': provenance, **record}
        write_json_atomic(path, data)
        return data
    with _locked_folder(path):
        runs, own = existing_runs(path, run)
        runs[run] = record
        own[run] = provenance
        own = {name: own[name] for name in runs}  # in the runs' order, no stale entries
        data = {'provenance': merged_provenance(own), 'runs': runs}
        write_json_atomic(path, data)
        return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='act-ros expert-eval', formatter_class=HelpFormatter,
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--episodes', type=int, default=100, help='number of episodes')
    parser.add_argument('--seed', type=int, default=0, help='seed of the first episode')
    parser.add_argument('--config', default=None, help='sim config YAML (default config/sim.yaml)')
    parser.add_argument('--render', action='store_true', help='render the cameras every step')
    parser.add_argument('--perturb', action='store_true',
                        help='perturb every episode once (push, forced open, knocked arm)')
    parser.add_argument('--perturbation-seed', type=int, default=0,
                        help='seed of the perturbations drawn (with --perturb)')
    parser.add_argument('--json', action='store_true', help='print the summary as JSON only')
    parser.add_argument('--output', type=Path, default=None,
                        help='result file to write (atomically, with its provenance)')
    parser.add_argument('--run', default=None,
                        help='with --output: write the summary as runs[RUN] of the file, '
                             'keeping its other runs (e.g. plain, perturbed)')
    parser.add_argument('--verbose', action='store_true', help='one line per episode')
    parser.add_argument('--task', default='port_pick_align',
                        choices=('port_pick_align', 'aloha_transfer_cube'),
                        help="the package's task (default) or gym-aloha's transfer cube, "
                             'whose expert is planned in the end-effector task and replayed '
                             'in joint space')
    args = parser.parse_args(argv)
    if args.task != 'port_pick_align' and (args.perturb or args.render or args.config):
        parser.error(f'--perturb, --render and --config apply to port_pick_align, not '
                     f'{args.task}')
    if args.episodes < 1:
        parser.error(f'--episodes must be >= 1, got {args.episodes}')
    if args.run is not None and (args.output is None or not args.run.strip()):
        parser.error('--run needs --output and a non-empty name')

    provenance = None
    if args.output is not None:  # of the code as it is now, before the episodes run
        provenance = run_provenance(list(argv if argv is not None else sys.argv[1:]),
                                    args.output)
        try:
            if args.run is not None:  # refused now rather than after the episodes
                existing_runs(args.output, args.run)
        except OutputError as exc:
            print(f'expert_eval: {exc}', file=sys.stderr)
            return 2
    seeds = range(args.seed, args.seed + args.episodes)
    if args.task != 'port_pick_align':
        summary = evaluate_aloha(args.task, seeds, verbose=args.verbose)
        return _finish(args, provenance, summary)
    config = SimConfig.from_yaml(args.config, render=args.render)
    with PortPickAlignEnv(config) as env:
        expert = ScriptedExpert(env)
        if args.perturb:
            summary = evaluate_perturbed(env, expert, seeds,
                                         perturbation_seed=args.perturbation_seed,
                                         verbose=args.verbose)
        else:
            summary = evaluate_nominal(env, expert, seeds, verbose=args.verbose)
    return _finish(args, provenance, summary)


def _finish(args: argparse.Namespace, provenance: dict | None, summary: dict) -> int:
    """Write the result file (with ``--output``) and print the summary."""
    if provenance is not None:
        record = {'args': provenance['command'].removeprefix(COMMAND).strip(), **summary}
        try:
            write_result(args.output, record, provenance, args.run)
        except OutputError as exc:
            print(f'expert_eval: {exc}', file=sys.stderr)
            return 2
        where = f' (runs.{args.run})' if args.run is not None else ''
        print(f'wrote {args.output}{where}', file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    elif 'success_rate' in summary:
        print(f"task:                {summary['task']}")
        print(f"episodes:            {summary['count']}")
        print(f"success_rate:        {summary['success_rate']:.3f} (the joint-space replay; "
              f"the end-effector plan alone {summary['plan_success_rate']:.3f})")
        print(f"highest reward:      {summary['max_reward_counts']} (episodes per stage)")
        print(f"failed seeds:        {summary['failed_seeds']}")
        print(f"speed:               {summary['steps_per_s_with_expert']:.0f} control steps/s "
              '(plan, replay and physics)')
    elif args.perturb:
        print(f"{'perturbation':<14} {'cases':>5} {'aligned':>7}  failed seeds")
        for kind, row in summary['by_perturbation'].items():
            print(f"{kind:<14} {row['count']:>5} {row['aligned']:>7}  {row['failed_seeds']}")
        print(f"{'all':<14} {summary['count']:>5} "
              f"{round(summary['align_rate'] * summary['count']):>7}  "
              f"(align rate {summary['align_rate']:.2f})")
        print(f"mean_position_error: {summary['mean_position_error'] * 1000:.2f} mm")
        print(f"mean_yaw_error:      {summary['mean_yaw_error']:.2f} deg")
    else:
        print(f"episodes:            {summary['count']}")
        print(f"align_rate:          {summary['align_rate']:.3f}")
        print(f"mean_position_error: {summary['mean_position_error'] * 1000:.2f} mm")
        print(f"mean_yaw_error:      {summary['mean_yaw_error']:.2f} deg")
        print(f"gate tripped:        {summary['gate_tripped_episodes']} episodes")
        print(f"max IK residual:     {summary['max_ik_error_m'] * 1000:.3f} mm")
        print(f"failed seeds:        {summary['failed_seeds']}")
        print(f"speed:               {summary['steps_per_s_with_expert']:.0f} control steps/s "
              f"(physics + expert{', rendering' if args.render else ''})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
