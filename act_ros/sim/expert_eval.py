"""Score the scripted expert over seeded episodes: ``python -m act_ros.sim.expert_eval``.

Prints the align rate and mean errors (the ceiling a trained policy is judged against),
the release gate's verdict, and the simulation speed. Rendering is off unless asked for.
With ``--perturb`` every episode is perturbed once (:mod:`act_ros.sim.perturb`: the box
pushed, the gripper forced open in transit, the arm knocked off its path, in turn) and
the table says how often the expert still aligned the box, per kind.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

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
    """Per kind of perturbation: cases, aligned, and the failed seeds (kinds in turn)."""
    rng = np.random.default_rng(perturbation_seed)
    table: dict[str, dict] = {kind: {'cases': 0, 'aligned': 0, 'fired': 0, 'failed_seeds': []}
                              for kind in PERTURBATIONS}
    for i, seed in enumerate(seeds):
        kind = PERTURBATIONS[i % len(PERTURBATIONS)]
        outcome = run_perturbed_episode(env, expert, seed, sample_perturbation(kind, rng))
        row = table[kind]
        row['cases'] += 1
        row['fired'] += int(outcome.fired_tick is not None)
        row['aligned'] += int(outcome.result.success)
        if not outcome.result.success:
            row['failed_seeds'].append(seed)
        if verbose:
            print(f'seed {seed}: {kind} at tick {outcome.fired_tick}: '
                  f'success={outcome.result.success} '
                  f'({outcome.result.failure_phase or "aligned"})', file=sys.stderr)
    total = sum(row['cases'] for row in table.values())
    aligned = sum(row['aligned'] for row in table.values())
    return {'perturbations': table, 'count': total, 'align_rate': aligned / total,
            'perturbation_seed': perturbation_seed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--episodes', type=int, default=100, help='number of episodes')
    parser.add_argument('--seed', type=int, default=0, help='seed of the first episode')
    parser.add_argument('--config', default=None, help='sim config YAML (default config/sim.yaml)')
    parser.add_argument('--render', action='store_true', help='render the cameras every step')
    parser.add_argument('--perturb', action='store_true',
                        help='perturb every episode once (push, forced open, knocked arm)')
    parser.add_argument('--perturbation-seed', type=int, default=0,
                        help='seed of the perturbations drawn (with --perturb)')
    parser.add_argument('--json', action='store_true', help='print the summary as JSON only')
    parser.add_argument('--verbose', action='store_true', help='one line per episode')
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f'--episodes must be >= 1, got {args.episodes}')

    config = SimConfig.from_yaml(args.config, render=args.render)
    seeds = range(args.seed, args.seed + args.episodes)
    with PortPickAlignEnv(config) as env:
        expert = ScriptedExpert(env)
        if args.perturb:
            summary = evaluate_perturbed(env, expert, seeds,
                                         perturbation_seed=args.perturbation_seed,
                                         verbose=args.verbose)
        else:
            summary = evaluate_nominal(env, expert, seeds, verbose=args.verbose)
    if args.json:
        print(json.dumps(summary))
    elif args.perturb:
        print(f"{'perturbation':<14} {'cases':>5} {'aligned':>7}  failed seeds")
        for kind, row in summary['perturbations'].items():
            print(f"{kind:<14} {row['cases']:>5} {row['aligned']:>7}  {row['failed_seeds']}")
        print(f"{'all':<14} {summary['count']:>5} "
              f"{round(summary['align_rate'] * summary['count']):>7}  "
              f"(align rate {summary['align_rate']:.2f})")
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
