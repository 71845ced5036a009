"""What a vision policy's features tell of the box and pad poses (a research probe).

Run from a checkout of the repository (research/ is not installed)::

    python -m research.pose_probe rollouts --checkpoint RUN/last --episodes 20
    python -m research.pose_probe layouts --checkpoint models/sim_port_pick_align

A training run's held-out pose error (the auxiliary pose head, :mod:`act_ros.training.
auxiliary`) is measured on frames of the expert's demonstrations. A policy meets other
states, and the expert's arm configuration itself tells where the objects are (it acts on
the true poses): a head that reads the joints beside the images can look accurate on
demonstrations and know little on the policy's own states. Two probes:

- ``rollouts``: the run's own pose head (saved with ``--resume`` state in
  ``RUN/last/training_state.pt``) read at every chunk query while the policy drives the
  simulation, and at the chunk queries of the same seeds driven by the scripted expert
  (the policy runs beside it without acting). The first query of a seed sees the same
  frame under both drivers.
- ``layouts``: the first frame of N random layouts (no expert, no episode). The
  checkpoint's per-camera backbone maps (what ACT's image projection reads) are captured,
  a fresh pose head of the ``backbone`` kind is fit on 90 % of the layouts and scored on
  the rest, for both cameras, the top one and the wrist one. It tells whether the frozen
  features hold the poses at all, independently of any head trained with the policy.

Errors are medians: box and pad position in the table plane (cm) and yaw modulo 90
degrees (deg; a guess uniform on the 90-degree period has a median error of 22.5 deg).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.logs import setup_logging
from act_ros.training.pose_pretrain import (
    ERROR_KEYS,
    PoseErrors,
    format_pose_errors,
    object_poses,
)

logger = logging.getLogger(__name__)

PROG = 'python -m research.pose_probe'
CHANCE_YAW_DEG = 22.5  # median |error| of a yaw guessed uniformly over its 90-degree period
CAMERA_SETS = {'both cameras': None, 'top only': ('top',), 'wrist only': ('wrist',)}


def _head_statistics(state: dict, checkpoint: Path):
    """Position mean and std the run's head was trained with: saved with the head, or (runs
    before they were saved) recomputed from the run's training split."""
    import torch

    if state.get('aux_position_mean') is not None:
        return (torch.as_tensor(state['aux_position_mean']),
                torch.as_tensor(state['aux_position_std']))
    import pandas as pd

    from act_ros.data.episode import OBJECT_POSES_FEATURE
    from act_ros.training.auxiliary import _POSITIONS
    from act_ros.training.data import make_split

    config = state.get('config', {})
    root = Path(config.get('dataset_root', ''))
    if not (root / 'meta' / 'info.json').is_file():
        raise FileNotFoundError(
            f'{checkpoint}: the pose head was saved without its statistics and the dataset it '
            f"was trained on ({root or 'not recorded'}) is not here")
    files = sorted((root / 'data').rglob('*.parquet'))
    frames = pd.concat(pd.read_parquet(f, columns=[OBJECT_POSES_FEATURE, 'episode_index'])
                       for f in files)
    poses = torch.from_numpy(np.stack(frames[OBJECT_POSES_FEATURE].to_numpy()).astype(np.float32))
    split, _, _ = make_split(frames['episode_index'].to_numpy(), config.get('val_ratio', 0.1),
                             config.get('seed', 0), len(frames))
    positions = poses[torch.from_numpy(split.train)][:, _POSITIONS].double()
    return positions.mean(0).float(), positions.std(0).clamp_min(1e-4).float()


def probe_rollouts(checkpoint: Path, *, episodes: int, seed: int,
                   training_state: Path | None = None, episode_steps: int | None = None,
                   render_size: tuple[int, int] | None = None, progress: bool = False) -> dict:
    """The run's pose head on the chunk queries of policy- and expert-driven episodes."""
    import torch
    from tqdm import tqdm

    from act_ros.sim import PortPickAlignEnv, ScriptedExpert
    from act_ros.training.auxiliary import ObjectPoseAuxiliary
    from act_ros.training.evaluation.rollout import SimPolicy, make_sim_config

    state_path = Path(training_state or Path(checkpoint) / 'training_state.pt')
    if not state_path.is_file():
        raise FileNotFoundError(f'{state_path}: no training state (the pose head is saved only '
                                'there: give the run\'s last/ checkpoint or --training-state)')
    state = torch.load(state_path, map_location='cpu', weights_only=False)
    if state.get('aux_head') is None:
        raise ValueError(f'{state_path}: the run trained no pose head '
                         '(--aux-object-pose-weight 0); nothing to probe')
    source = state.get('aux_source') or 'backbone'
    mean, std = _head_statistics(state, Path(checkpoint))
    policy = SimPolicy(checkpoint, mode='chunk')
    try:
        model = policy.runtime.predictor.model.model
        shapes = [tuple(policy.runtime.predictor.checkpoint.policy.config.input_features[k].shape)
                  for k in policy.runtime.predictor.checkpoint.config.image_features]
        if not shapes:
            raise ValueError(f'{checkpoint}: the policy takes no camera; nothing to probe')
        aux = ObjectPoseAuxiliary(model, shapes, torch.zeros(2, 8), torch.device('cpu'),
                                  source=source)
        aux.head.load_state_dict(state['aux_head'])
        aux.head.eval()
        aux.mean, aux.std = mean, std
        env = PortPickAlignEnv(make_sim_config(Path(checkpoint), render_size,
                                               episode_steps=episode_steps), policy.contract)
        rows: list[dict] = []
        outcomes: dict[str, list[dict]] = {'expert': [], 'policy': []}
        bar = tqdm(total=2 * episodes, unit='episode', disable=not progress)
        for driver in ('expert', 'policy'):
            for k in range(episodes):
                obs = env.reset(seed=seed + k)
                policy.reset(obs)
                expert = ScriptedExpert(env)
                expert.reset(obs)
                table_z = float(obs.box_pose[2])
                tick = 0
                while not env.done:
                    label = np.asarray(expert.act(obs), dtype=np.float64)
                    with aux.capture():
                        command = policy.act(obs)
                    if aux.captured:  # the policy queried a chunk on this frame
                        poses = torch.from_numpy(object_poses(obs))[None]
                        errors = PoseErrors.of(aux.errors(poses)).values[0]
                        rows.append({'driver': driver, 'seed': seed + k, 'tick': tick,
                                     'lifted': bool(obs.box_pose[2] > table_z + 0.01),
                                     **dict(zip(ERROR_KEYS, map(float, errors)))})
                    aux.discard()
                    obs = env.step(label if driver == 'expert' else command)
                    tick += 1
                result = env.evaluate()
                outcomes[driver].append({'seed': seed + k, 'success': bool(result.success),
                                         'failure_phase': result.failure_phase})
                bar.update(1)
        bar.close()
        env.close()
    finally:
        policy.close()
    return {'probe': 'rollouts', 'checkpoint': str(checkpoint), 'head_source': source,
            'episodes': episodes, 'seeds': [seed, seed + episodes - 1],
            'align_rate': {d: float(np.mean([o['success'] for o in v])) for d, v in
                           outcomes.items()},
            'summary': summarize_rollouts(rows), 'outcomes': outcomes, 'rows': rows}


def frame_kinds(rows: list[dict]) -> tuple[tuple[str, list[dict]], ...]:
    """Rows (with ``tick`` and ``lifted``) by kind of frame: the first frame, the box on the
    table, the box lifted."""
    return (('first frame', [r for r in rows if r['tick'] == 0]),
            ('box on the table', [r for r in rows if r['tick'] > 0 and not r['lifted']]),
            ('box lifted', [r for r in rows if r['lifted']]))


def summarize_rollouts(rows: list[dict]) -> list[dict]:
    """Median errors per driver: the first frame, the box on the table, the box lifted."""
    out = []
    for driver in ('expert', 'policy'):
        for name, group in frame_kinds([r for r in rows if r['driver'] == driver]):
            errors = PoseErrors(np.array([[r[k] for k in ERROR_KEYS] for r in group]
                                         ).reshape(-1, len(ERROR_KEYS)))
            out.append({'driver': driver, 'frames': name, 'n': len(group), **errors.medians()})
    return out


def capture_layouts(checkpoint: Path, *, layouts: int, seed: int,
                    render_size: tuple[int, int] | None = None, progress: bool = False
                    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """First frames of ``layouts`` random layouts: (N, cameras, C, h, w) float16 backbone
    maps of ``checkpoint``, (N, 8) poses, and the camera names in map order."""
    import torch
    from tqdm import tqdm

    from act_ros.sim import PortPickAlignEnv
    from act_ros.training.evaluation.rollout import SimPolicy, make_sim_config

    policy = SimPolicy(checkpoint, mode='chunk')
    try:
        model = policy.runtime.predictor.model.model
        captured: list[torch.Tensor] = []
        handle = model.encoder_img_feat_input_proj.register_forward_pre_hook(
            lambda _m, inputs: captured.append(inputs[0].detach().clone()))
        cameras = [name for name, _, _ in policy.runtime.predictor.cameras]
        if not cameras:
            raise ValueError(f'{checkpoint}: the policy takes no camera; nothing to probe')
        env = PortPickAlignEnv(make_sim_config(Path(checkpoint), render_size), policy.contract)
        maps, poses = [], []
        for k in tqdm(range(layouts), unit='layout', disable=not progress):
            obs = env.reset(seed=seed + k)
            policy.reset(obs)
            captured.clear()
            policy.act(obs)
            if len(captured) != len(cameras):
                raise RuntimeError(f'captured {len(captured)} feature maps for '
                                   f'{len(cameras)} cameras')
            maps.append(torch.stack([c[0] for c in captured]).numpy().astype(np.float16))
            poses.append(object_poses(obs))
        handle.remove()
        env.close()
    finally:
        policy.close()
    return np.stack(maps), np.stack(poses), cameras


def fit_layout_heads(maps: np.ndarray, poses: np.ndarray, cameras: list[str], *,
                     epochs: int = 150, held_out: float = 0.1, seed: int = 0) -> list[dict]:
    """Fit a fresh backbone pose head per camera set on the first ``1 - held_out`` of the
    layouts and score it on the rest (median errors, train and held out)."""
    import torch

    from act_ros.training.auxiliary import ObjectPoseHead, physical_errors

    n_train = int(round((1.0 - held_out) * len(maps)))
    if n_train < 2 or n_train >= len(maps):
        raise ValueError(f'{len(maps)} layouts cannot be split {1 - held_out:.0%} / '
                         f'{held_out:.0%} into two non-empty parts')
    x = torch.from_numpy(maps.astype(np.float32))
    p = torch.from_numpy(poses)
    targets_of = _Targets(p[:n_train])
    results = []
    for name, subset in CAMERA_SETS.items():
        index = [i for i, c in enumerate(cameras) if subset is None or c in subset]
        if not index:
            continue
        torch.manual_seed(seed)
        head = ObjectPoseHead(x.shape[2], [tuple(x.shape[-2:])] * len(index))
        optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=1e-4)
        targets = targets_of(p[:n_train])
        for _ in range(epochs):
            order = torch.randperm(n_train)
            for start in range(0, n_train, 64):
                batch = order[start:start + 64]
                loss = (head([x[batch, i] for i in index]) - targets[batch]).abs().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            scored = {}
            for part, rows in (('train', slice(0, n_train)), ('held_out', slice(n_train, None))):
                prediction = head([x[rows, i] for i in index])
                errors = physical_errors(prediction, p[rows], targets_of.mean, targets_of.std)
                scored[part] = PoseErrors.of(errors).medians()
        results.append({'cameras': name, 'layouts_train': n_train,
                        'layouts_held_out': len(maps) - n_train, **scored})
    return results


class _Targets:
    """Standardization of the training layouts' positions, as the trainer's head does."""

    def __init__(self, poses):
        from act_ros.training.auxiliary import _POSITIONS

        positions = poses[:, _POSITIONS].double()
        self.mean = positions.mean(0).float()
        self.std = positions.std(0).clamp_min(1e-4).float()

    def __call__(self, poses):
        from act_ros.training.auxiliary import pose_targets

        return pose_targets(poses, self.mean, self.std)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description='What a vision policy\'s features tell of the box and pad poses: the '
                    'run\'s pose head on the policy\'s own states against the expert\'s '
                    '(rollouts), or a head fit on the frozen backbone maps of random '
                    'first frames (layouts).',
        formatter_class=HelpFormatter)
    parser.add_argument('probe', choices=('rollouts', 'layouts'))
    parser.add_argument('--checkpoint', type=Path, required=True,
                        help='policy checkpoint (rollouts: the run\'s last/, which holds the '
                             'pose head in training_state.pt)')
    parser.add_argument('--training-state', type=Path, default=None,
                        help='rollouts: the training_state.pt with the pose head (default: in '
                             '--checkpoint)')
    parser.add_argument('--episodes', type=int, default=20,
                        help='rollouts: seeds, each driven by the expert and by the policy')
    parser.add_argument('--layouts', type=int, default=3000,
                        help='layouts: random first frames (90 %% fit, 10 %% scored)')
    parser.add_argument('--epochs', type=int, default=150, help='layouts: epochs of the fit')
    add_simulation_arguments(parser, seed=2000000, episode_steps='rollouts: shorter episodes '
                             '(quick checks)')
    return parser


def add_simulation_arguments(parser: argparse.ArgumentParser, *, seed: int,
                             episode_steps: str) -> None:
    """The probes' common options: seeds, episode length, render size, output, progress."""
    from act_ros.core.contract import parse_image_size

    parser.add_argument('--seed', type=int, default=seed, help='first simulation seed')
    parser.add_argument('--episode-steps', type=int, default=None, help=episode_steps)
    parser.add_argument('--render-size', type=parse_image_size, default=None,
                        help='rendered camera size HEIGHTxWIDTH (default: the size the '
                             'checkpoint was trained at)')
    parser.add_argument('--output', type=Path, default=None, help='JSON result file')
    parser.add_argument('--no-progress', action='store_true')


def write_result(out: dict, command: str, argv: list[str] | None, output: Path | None) -> None:
    """Write a probe's result with its provenance to ``output`` (when given)."""
    from act_ros.core.atomic import write_text_atomic
    from act_ros.provenance import result_provenance

    if output is None:
        return
    out = {'provenance': result_provenance(command, argv if argv is not None else sys.argv[1:],
                                           output_path=output, output_option='--output'), **out}
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output, json.dumps(out, indent=1))
    print(f'wrote {output}')


def main(argv: list[str] | None = None) -> int:
    import os

    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ('episodes', 'layouts', 'epochs'):
        if getattr(args, name) < 1:
            parser.error(f'--{name} must be >= 1, got {getattr(args, name)}')
    os.environ.setdefault('MUJOCO_GL', 'egl')
    setup_logging()
    start = time.perf_counter()
    try:
        if args.probe == 'rollouts':
            out = probe_rollouts(args.checkpoint, episodes=args.episodes, seed=args.seed,
                                 training_state=args.training_state,
                                 episode_steps=args.episode_steps, render_size=args.render_size,
                                 progress=not args.no_progress)
            for row in out['summary']:
                print(f"{row['driver']:7s} {row['frames']:17s} n={row['n']:4d}  "
                      + format_pose_errors(row))
            print('align rate while probing: ' + ', '.join(
                f'{d} {r:.2f}' for d, r in out['align_rate'].items()))
        else:
            maps, poses, cameras = capture_layouts(args.checkpoint, layouts=args.layouts,
                                                   seed=args.seed, render_size=args.render_size,
                                                   progress=not args.no_progress)
            out = {'probe': 'layouts', 'checkpoint': str(args.checkpoint),
                   'layouts': args.layouts, 'seeds': [args.seed, args.seed + args.layouts - 1],
                   'map_shape': list(maps.shape[2:]), 'cameras': cameras,
                   'fits': fit_layout_heads(maps, poses, cameras, epochs=args.epochs)}
            for fit in out['fits']:
                print(f"{fit['cameras']:13s} held out: {format_pose_errors(fit['held_out'])}   "
                      f"train: {format_pose_errors(fit['train'])}")
    except (FileNotFoundError, ValueError) as exc:
        print(f'{PROG}: {exc}', file=sys.stderr)
        return 2
    out['seconds'] = round(time.perf_counter() - start, 1)
    out['chance_yaw_deg'] = CHANCE_YAW_DEG
    write_result(out, PROG, argv, args.output)
    return 0


if __name__ == '__main__':
    sys.exit(main())
