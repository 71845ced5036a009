"""``act-ros plot-seams``: joint position and velocity around chunk handovers, one panel
per mode.

    act-ros plot-seams --checkpoint models/sim_port_pick_align_poses --seed 2000000 \\
        --trace docs/results/seams/trace.json --output seams.png
    act-ros plot-seams --from-trace docs/results/seams/trace.json --output seams.png

Runs one episode of the checkpoint per mode (chunk, ensemble, blend by default) in the
simulation through the node's control step (:class:`~act_ros.training.evaluation.rollout.SimPolicy`),
the same seed for each, and records every command sent with the chunk it came from
(the newest in a blend). ``--trace`` writes that record (with its provenance) so that the
figure can be drawn again from a committed file (``--from-trace``). The figure shows, for
one joint (``--joint``, default the arm joint that moves most), the commanded position
and velocity over ``--span-s`` seconds around the episode's middle, with a vertical line
at every handover: where a chunk hands over with a jump, the velocity trace steps there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.inference.chunking import DEFAULT_BLEND_WINDOW, blend_window_ticks

DEFAULT_MODES = ('chunk', 'ensemble', 'blend')


def record_episode(checkpoint: str | Path, mode: str, seed: int, *, blend_ticks: int,
                   episode_steps: int | None = None, device: str = 'cpu') -> dict[str, Any]:
    """One episode of ``mode``: the commands sent (``(T, J)`` as lists; a tick without a
    command repeats the held target), each tick's source chunk (``None`` where nothing was
    sent) and the episode's result."""
    import dataclasses

    from act_ros.sim import PortPickAlignEnv
    from act_ros.training.evaluation.rollout import SimPolicy, make_sim_config

    policy = SimPolicy(checkpoint, mode=mode, device=device,
                       blend_ticks=blend_ticks if mode == 'blend' else None)
    try:
        config = make_sim_config(checkpoint, episode_steps=episode_steps)
        if not policy.cameras:  # nothing looks at the images
            config = dataclasses.replace(config, render=False)
        env = PortPickAlignEnv(config, policy.contract)
    except BaseException:
        policy.close()
        raise
    commands, sources = [], []
    try:
        obs = env.reset(seed=seed)
        policy.reset(obs)
        while not env.done:
            command = policy.act(obs)
            sent = policy.loop.last_command is not None
            commands.append([round(float(v), 7) for v in command])
            sources.append(policy.runtime.last_source if sent else None)
            obs = env.step(command)
        result = env.evaluate().to_dict()
    finally:
        env.close()
        policy.close()
    return {'commands': commands, 'sources': sources, 'success': bool(result['success']),
            'seams': policy.seams.summary()}


def handover_ticks(sources: list[int | None]) -> list[int]:
    """Ticks whose command came from another chunk than the previous tick's."""
    return [t for t in range(1, len(sources))
            if sources[t] is not None and sources[t - 1] is not None
            and sources[t] != sources[t - 1]]


def plot(trace: dict[str, Any], output: Path, *, joint: str | None = None,
         span_s: float = 3.0) -> Path:
    """Draw ``trace`` (see :func:`record_episode`, one per mode) to ``output``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    names = trace['joint_names']
    period = float(trace['period_s'])
    modes = list(trace['modes'])
    if joint is None:  # the arm joint that moves most in the first mode
        first = np.asarray(trace['modes'][modes[0]]['commands'])
        arm = [i for i, name in enumerate(names) if name not in trace.get('grippers', ())]
        joint = names[max(arm, key=lambda i: np.ptp(first[:, i]))]
    if joint not in names:
        raise ValueError(f"--joint: '{joint}' is not one of {names}")
    j = names.index(joint)
    fig, axes = plt.subplots(2, len(modes), figsize=(4.2 * len(modes), 5.0), sharex=True,
                             squeeze=False)
    for column, mode in enumerate(modes):
        record = trace['modes'][mode]
        q = np.asarray(record['commands'])[:, j]
        t = np.arange(q.size) * period
        v = np.concatenate([[0.0], np.diff(q) / period])
        middle = q.size // 2
        half = int(round(span_s / period / 2))
        shown = slice(max(0, middle - half), min(q.size, middle + half))
        top, bottom = axes[0][column], axes[1][column]
        top.plot(t[shown], q[shown], '.-', color='tab:blue', markersize=3, linewidth=1)
        bottom.plot(t[shown], v[shown], '.-', color='tab:orange', markersize=3, linewidth=1)
        seams = [h for h in handover_ticks(record['sources']) if shown.start <= h < shown.stop]
        for h in seams:
            for ax in (top, bottom):
                ax.axvline(h * period - period / 2, color='0.6', linewidth=0.6, linestyle=':')
        s = record.get('seams') or {}
        top.set_title(f"{mode}: {s.get('over_within_p99', '?')} of {s.get('handovers', '?')} "
                      'handovers over p99', fontsize=10)
        bottom.set_xlabel('time in the episode (s)')
        if column == 0:
            top.set_ylabel(f'{joint} command (rad)')
            bottom.set_ylabel(f'{joint} velocity (rad/s)')
    fig.suptitle(f"{trace['checkpoint']}, seed {trace['seed']}: dotted lines are handovers",
                 fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog='act-ros plot-seams', description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument('--checkpoint', type=Path, help='LeRobot pretrained_model directory')
    p.add_argument('--from-trace', type=Path, default=None,
                   help='draw a trace written by --trace instead of running episodes')
    p.add_argument('--modes', default=','.join(DEFAULT_MODES),
                   help='comma list of chunk, ensemble, blend')
    p.add_argument('--seed', type=int, default=2_000_000, help='the episode of every mode')
    p.add_argument('--blend-window', default=DEFAULT_BLEND_WINDOW,
                   help="blend mode: ticks ('6') or seconds ('0.2s')")
    p.add_argument('--episode-steps', type=int, default=None,
                   help='ticks per episode (default: config/sim.yaml)')
    p.add_argument('--joint', default=None, help='joint to draw (default: the arm joint that '
                   'moves most)')
    p.add_argument('--span-s', type=float, default=3.0, help='seconds shown around the middle')
    p.add_argument('--trace', type=Path, default=None, help='also write the trace (JSON)')
    p.add_argument('--output', type=Path, required=True, help='figure to write (.png)')
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``act-ros plot-seams``."""
    from act_ros.core.contract import load_contract

    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.from_trace is None):
        parser.error('give --checkpoint (run episodes) or --from-trace (draw a trace)')
    if not args.span_s > 0:
        parser.error(f'--span-s must be > 0, got {args.span_s}')
    if args.from_trace is not None:
        try:
            trace = json.loads(args.from_trace.read_text())
            print(f'wrote {plot(trace, args.output, joint=args.joint, span_s=args.span_s)}')
        except (OSError, ValueError, KeyError) as exc:
            print(f'act-ros plot-seams: {exc}', file=sys.stderr)
            return 2
        return 0
    modes = [m for m in args.modes.split(',') if m]
    if not modes or any(m not in DEFAULT_MODES for m in modes):
        parser.error(f'--modes: expected a comma list of {DEFAULT_MODES}, got {args.modes!r}')
    contract = load_contract()
    try:
        blend_ticks = blend_window_ticks(args.blend_window, contract.fps)
        trace: dict[str, Any] = {
            'checkpoint': str(args.checkpoint), 'seed': args.seed,
            'period_s': 1.0 / contract.fps, 'joint_names': list(contract.joint_names),
            'grippers': list(contract.gripper_joints),
            'blend_window': args.blend_window, 'blend_ticks': blend_ticks, 'modes': {}}
        for mode in modes:
            trace['modes'][mode] = record_episode(args.checkpoint, mode, args.seed,
                                                  blend_ticks=blend_ticks,
                                                  episode_steps=args.episode_steps)
            print(f"{mode}: {'aligned' if trace['modes'][mode]['success'] else 'not aligned'}, "
                  f"{trace['modes'][mode]['seams']['handovers']} handovers")
        if args.trace is not None:
            from act_ros.provenance import result_provenance

            trace = {'provenance': result_provenance(
                'act-ros plot-seams', argv if argv is not None else sys.argv[1:],
                output_path=args.trace, output_option='--trace'), **trace}
            args.trace.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(args.trace, json.dumps(trace))
            print(f'wrote {args.trace}')
        print(f'wrote {plot(trace, args.output, joint=args.joint, span_s=args.span_s)}')
    except (OSError, ValueError) as exc:
        print(f'act-ros plot-seams: {exc}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
