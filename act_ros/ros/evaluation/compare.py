"""Compare an in-process evaluation with an over-ROS one, episode by episode.

::

    act-ros evaluate --checkpoint CKPT --episodes 20 --seed 100000 --mode both --output inproc.json
    act-ros ros-eval --checkpoint CKPT --episodes 20 --seed 100000 \\
        --mode both --output ros.json
    act-ros compare-evals inproc.json ros.json --output comparison.json

The same checkpoint on the same seeds should end the same way both ways: the over-ROS run
steps the simulation in lock-step with the node's commands, and the node runs the same
runtime, safety chain and release gate as the in-process evaluator. The comparison names
every episode whose final position differs by more than ``--tolerance-mm`` and the
bridge's command counts (a lock-step timeout is a step run without a fresh command).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_json_atomic

# Key of the count of equal episodes in a mode's comparison, followed by the tolerance.
EQUAL_PREFIX = 'episodes_equal_within_'


def _modes_in_process(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if not isinstance(data.get('modes'), dict):
        raise ValueError('expected act-ros evaluate --output JSON (a "modes" mapping)')
    return data['modes']


def _modes_over_ros(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    modes = {k: v for k, v in data.items() if isinstance(v, dict) and 'episodes' in v}
    if not modes:
        raise ValueError('expected ros_eval --output JSON (one mapping per mode, with episodes)')
    return modes


def compare(in_process: dict[str, Any], over_ros: dict[str, Any],
            tolerance_mm: float = 0.1) -> dict[str, Any]:
    """Per mode present in both: the two summaries and the episodes side by side."""
    local, remote = _modes_in_process(in_process), _modes_over_ros(over_ros)
    common = [m for m in local if m in remote]
    if not common:
        raise ValueError(f'no mode in both files (in process: {sorted(local)}, over ROS 2: '
                         f'{sorted(remote)})')
    out: dict[str, Any] = {'checkpoint': in_process.get('checkpoint'), 'modes': {}}
    for mode in common:
        a = {e['seed']: e for e in local[mode].get('episodes', [])}
        b = {e['seed']: e for e in remote[mode]['episodes']}
        if set(a) != set(b):
            raise ValueError(f'{mode}: the files cover different seeds (in process '
                             f'{sorted(a)}, over ROS 2 {sorted(b)})')
        episodes, same = [], 0
        for seed in sorted(a):
            da, db = a[seed]['position_error_m'] * 1000, b[seed]['position_error_m'] * 1000
            equal = abs(da - db) <= tolerance_mm and a[seed]['success'] == b[seed]['success']
            same += equal
            episodes.append({'seed': seed, 'in_process_mm': round(da, 2),
                             'over_ros_mm': round(db, 2),
                             'in_process_aligned': a[seed]['success'],
                             'over_ros_aligned': b[seed]['success'],
                             'over_ros_commands': b[seed].get('commands')})
        summary_keys = ('align_rate', 'mean_position_error', 'mean_yaw_error', 'count',
                        'failures', 'tumbles')
        out['modes'][mode] = {
            'in_process': {k: local[mode][k] for k in summary_keys if k in local[mode]},
            'over_ros': {k: remote[mode][k] for k in (*summary_keys, 'lockstep_timeouts',
                                                      'commands_rejected') if k in remote[mode]},
            f'{EQUAL_PREFIX}{tolerance_mm:g}_mm': same,
            'largest_difference_mm': max(abs(e['in_process_mm'] - e['over_ros_mm'])
                                         for e in episodes),
            'episodes': episodes}
        out['seeds'] = sorted(a)
    return out


def equal_episodes(mode_result: dict[str, Any]) -> int:
    """How many episodes of one mode's comparison ended the same both ways (the key names
    the tolerance it was counted with)."""
    return next(v for k, v in mode_result.items() if k.startswith(EQUAL_PREFIX))


def format_comparison(result: dict[str, Any]) -> str:
    lines = [f'{"mode":<10}{"in process":>22}{"over ROS 2":>22}{"equal episodes":>18}'
             f'{"largest diff":>14}']
    for mode, m in result['modes'].items():
        cells = []
        for side in ('in_process', 'over_ros'):
            s = m[side]
            cells.append(f'{s["align_rate"]:.2f} ({round(s["align_rate"] * s["count"])}/'
                         f'{s["count"]}), {s["mean_position_error"] * 1000:.1f} mm')
        lines.append(f'{mode:<10}{cells[0]:>22}{cells[1]:>22}'
                     f'{equal_episodes(m):>11} of {len(m["episodes"]):<4}'
                     f'{m["largest_difference_mm"]:>11.2f} mm')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros compare-evals',
                                description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('in_process', type=Path, help='act-ros evaluate --output JSON')
    p.add_argument('over_ros', type=Path, help='ros_eval --output JSON')
    p.add_argument('--tolerance-mm', type=float, default=0.1,
                   help='final positions this close count as the same episode (default 0.1)')
    p.add_argument('--output', type=Path, default=None, help='write the comparison as JSON')
    args = p.parse_args(argv)
    try:
        in_process = json.loads(args.in_process.read_text())
        over_ros = json.loads(args.over_ros.read_text())
        result = compare(in_process, over_ros, args.tolerance_mm)
    except (OSError, ValueError, KeyError) as exc:
        print(f'compare: {exc}', file=sys.stderr)
        return 2
    from act_ros.provenance import result_provenance

    # The two runs' own commands, commits and machines come along: the comparison holds
    # only if both ran the same source on the same machine.
    result = {'provenance': result_provenance(
        'act-ros compare-evals', argv if argv is not None else sys.argv[1:],
        output_path=args.output, output_option='--output'), **result,
        'sources': {'in_process': in_process.get('provenance'),
                    'over_ros': over_ros.get('provenance')}}
    print(format_comparison(result))
    if args.output:
        write_json_atomic(args.output, result)
    return 0


if __name__ == '__main__':
    sys.exit(main())
