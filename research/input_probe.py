"""What a policy's action chunk depends on, its cameras or its joints (a research probe).

Run from a checkout of the repository (research/ is not installed)::

    python -m research.input_probe --checkpoint CKPT --episodes 10

In demonstrations the expert acts on the true object poses, so once its arm moves, the arm's
configuration (the joint state the policy reads beside its images) already tells where the
box and the pad are. A policy cloned from such data can learn to continue the arm's motion
instead of looking, and does well on the expert's states while, on its own, it carries the
first chunk's mistake on (the "copycat" problem of behaviour cloning with proprioception).

The probe lets the scripted expert drive ``episodes`` seeds and, at every ``every``-th tick,
queries the policy's chunk from the true observation and from the same observation with
one input group taken from another seed at the same tick (seed ``k`` pairs with seed
``k + 1``, the last with the first): the cameras, the joints, the object poses where the
checkpoint reads them, and everything at once. Per frame it records the mean absolute
difference between the chunks (arm joints, radians; the gripper is left out, its unit
differs) and each chunk's mean absolute difference from the expert's own next actions.
A group whose swap changes the chunk little is one the policy does not act on. At the first
frame every seed's arm is in the home pose (within ``home_noise_rad`` of ``config/sim.yaml``),
so there the images are about all that tells the seeds apart.

Medians per kind of frame (the first frame, the box on the table, the box lifted), as in
:mod:`research.pose_probe`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.logs import setup_logging
from research.pose_probe import add_simulation_arguments, frame_kinds, write_result

logger = logging.getLogger(__name__)

PROG = 'python -m research.input_probe'

CAMERAS, JOINTS, POSES, ALL = 'cameras', 'joints', 'object poses', 'all inputs'


def _frame(obs: Any, table_z: float) -> dict:
    return {'images': {name: image.copy() for name, image in obs.images.items()},
            'state': np.array(obs.joint_positions, dtype=np.float64),
            'poses': np.array(obs.environment_state, dtype=np.float64),
            'lifted': bool(obs.box_pose[2] > table_z + 0.01)}


def probe_inputs(checkpoint: Path, *, episodes: int, seed: int, every: int = 30,
                 episode_steps: int | None = None, render_size: tuple[int, int] | None = None,
                 progress: bool = False) -> dict:
    """Record the expert's episodes, then query the policy on true and swapped inputs."""
    from tqdm import tqdm

    from act_ros.core.observation import Observation
    from act_ros.sim import PortPickAlignEnv, ScriptedExpert
    from act_ros.training.evaluation.rollout import SimPolicy, make_sim_config

    if episodes < 2:
        raise ValueError(f'episodes must be >= 2 (seeds swap inputs in pairs), got {episodes}')
    if every < 1:
        raise ValueError(f'every must be >= 1, got {every}')
    policy = SimPolicy(checkpoint, mode='chunk')
    try:
        predictor = policy.runtime.predictor
        if not predictor.cameras:
            raise ValueError(f'{checkpoint}: the policy takes no camera; nothing to probe')
        groups = [CAMERAS, JOINTS] + ([POSES] if predictor.env_state_key else []) + [ALL]
        arm = [i for i in range(policy.contract.num_joints)
               if i not in policy.contract.gripper_indices]
        env = PortPickAlignEnv(make_sim_config(Path(checkpoint), render_size,
                                               episode_steps=episode_steps), policy.contract)
        recorded: list[tuple[dict[int, dict], np.ndarray]] = []
        expert_aligned = 0
        bar = tqdm(total=2 * episodes, unit='episode', disable=not progress)
        for k in range(episodes):
            obs = env.reset(seed=seed + k)
            expert = ScriptedExpert(env)
            expert.reset(obs)
            table_z = float(obs.box_pose[2])
            frames, actions, tick = {}, [], 0
            while not env.done:
                action = np.asarray(expert.act(obs), dtype=np.float64)
                if tick % every == 0:
                    frames[tick] = _frame(obs, table_z)
                actions.append(action)
                obs = env.step(action)
                tick += 1
            recorded.append((frames, np.asarray(actions)))
            expert_aligned += bool(env.evaluate().success)
            bar.update(1)
        env.close()

        def chunk(own: dict, other: dict, swapped: str) -> np.ndarray:
            pick = {g: (other if swapped in (g, ALL) else own) for g in (CAMERAS, JOINTS, POSES)}
            return predictor.predict(Observation(
                images=pick[CAMERAS]['images'], state=pick[JOINTS]['state'],
                environment_state=pick[POSES]['poses'] if predictor.env_state_key else None))

        rows = []
        for k, (frames, actions) in enumerate(recorded):
            others = recorded[(k + 1) % episodes][0]
            for tick in sorted(set(frames) & set(others)):
                own, other = frames[tick], others[tick]
                true = chunk(own, other, '')[:, arm]
                n = min(len(true), len(actions) - tick)
                expert = actions[tick:tick + n][:, arm]
                row = {'seed': seed + k, 'tick': tick, 'lifted': own['lifted'],
                       'true_vs_expert': float(np.abs(true[:n] - expert).mean())}
                for group in groups:
                    swapped = chunk(own, other, group)[:, arm]
                    row[f'{group} swapped'] = float(np.abs(swapped - true).mean())
                    row[f'{group} swapped, vs expert'] = float(np.abs(swapped[:n] - expert).mean())
                rows.append(row)
            bar.update(1)
        bar.close()
    finally:
        policy.close()
    return {'probe': 'inputs', 'checkpoint': str(checkpoint), 'episodes': episodes,
            'seeds': [seed, seed + episodes - 1], 'every': every, 'groups': groups,
            'expert_align_rate': expert_aligned / episodes, 'summary': summarize(rows, groups), 'rows': rows}


def summarize(rows: list[dict], groups: list[str]) -> list[dict]:
    """Medians per kind of frame (radians, arm joints)."""
    keys = ['true_vs_expert'] + [f'{g} swapped{s}' for g in groups for s in ('', ', vs expert')]
    return [{'frames': name, 'n': len(group),
             **{key: (float(np.median([r[key] for r in group])) if group else None)
                for key in keys}}
            for name, group in frame_kinds(rows)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="What a policy's action chunk depends on: while the scripted expert "
                    'drives, the chunk from the true observation against the chunk with the '
                    "cameras, the joints (or the object poses) taken from another seed's "
                    'frame at the same tick.',
        formatter_class=HelpFormatter)
    parser.add_argument('--checkpoint', type=Path, required=True, help='policy checkpoint')
    parser.add_argument('--episodes', type=int, default=10, help='seeds the expert drives (>= 2)')
    parser.add_argument('--every', type=int, default=30, help='probe every Nth tick')
    add_simulation_arguments(parser, seed=3000000, episode_steps='shorter episodes (quick checks)')
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    args = build_parser().parse_args(argv)
    os.environ.setdefault('MUJOCO_GL', 'egl')
    setup_logging()
    start = time.perf_counter()
    try:
        out = probe_inputs(args.checkpoint, episodes=args.episodes, seed=args.seed,
                           every=args.every, episode_steps=args.episode_steps,
                           render_size=args.render_size, progress=not args.no_progress)
    except (FileNotFoundError, ValueError) as exc:
        print(f'{PROG}: {exc}', file=sys.stderr)
        return 2
    print('mean |difference| of the chunk, arm joints (rad), medians:')
    print(f"{'frames':17s} {'n':>4s}  {'true vs expert':>14s}  "
          + '  '.join(f'{g + " swapped":>22s}' for g in out['groups']))
    for row in out['summary']:
        cells = '  '.join(f"{_rad(row[g + ' swapped']):>22s}" for g in out['groups'])
        print(f"{row['frames']:17s} {row['n']:4d}  {_rad(row['true_vs_expert']):>14s}  {cells}")
    out['seconds'] = round(time.perf_counter() - start, 1)
    write_result(out, PROG, argv, args.output)
    return 0


def _rad(value: float | None) -> str:
    return '-' if value is None else f'{value:.4f}'


if __name__ == '__main__':
    sys.exit(main())
