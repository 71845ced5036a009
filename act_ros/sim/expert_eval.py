"""Score the scripted expert over seeded episodes: ``python -m act_ros.sim.expert_eval``.

Prints the align rate and mean errors (the ceiling a trained policy is judged against),
the release gate's verdict, and the simulation speed. Rendering is off unless asked for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from act_ros.sim.config import SimConfig
from act_ros.sim.env import PortPickAlignEnv
from act_ros.sim.expert import ScriptedExpert, run_episode
from act_ros.sim.metrics import summarize_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--episodes', type=int, default=100, help='number of episodes')
    parser.add_argument('--seed', type=int, default=0, help='seed of the first episode')
    parser.add_argument('--config', default=None, help='sim config YAML (default config/sim.yaml)')
    parser.add_argument('--render', action='store_true', help='render the cameras every step')
    parser.add_argument('--json', action='store_true', help='print the summary as JSON only')
    parser.add_argument('--verbose', action='store_true', help='one line per episode')
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f'--episodes must be >= 1, got {args.episodes}')

    config = SimConfig.from_yaml(args.config, render=args.render)
    results = []
    gate_trips = 0
    max_ik_error_m = 0.0
    with PortPickAlignEnv(config) as env:
        expert = ScriptedExpert(env)
        start = time.perf_counter()
        for seed in range(args.seed, args.seed + args.episodes):
            result = run_episode(env, expert, seed)
            gate_trips += int(expert.gate_tripped)
            max_ik_error_m = max(max_ik_error_m, expert.max_ik_error_m)
            results.append(result)
            if args.verbose:
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
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"episodes:            {summary['count']}")
        print(f"align_rate:          {summary['align_rate']:.3f}")
        print(f"mean_position_error: {summary['mean_position_error'] * 1000:.2f} mm")
        print(f"mean_yaw_error:      {summary['mean_yaw_error']:.2f} deg")
        print(f"gate tripped:        {gate_trips} episodes")
        print(f"max IK residual:     {max_ik_error_m * 1000:.3f} mm")
        print(f"failed seeds:        {summary['failed_seeds']}")
        print(f"speed:               {summary['steps_per_s_with_expert']:.0f} control steps/s "
              f"(physics + expert{', rendering' if args.render else ''})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
