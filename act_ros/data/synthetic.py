"""``act-ros generate-synthetic``: a small, structured random dataset for trainer smoke tests.

Joint trajectories are smooth sums of sinusoids inside the contract's limits; the action
at frame t is the trajectory a few frames ahead (as a position controller's target would
be). The images are drawn from the state: the top camera shows a disk whose position,
size and colour follow the first three joints and the gripper, the wrist camera a bar
whose angle follows ``wrist_roll`` on a background whose brightness follows
``wrist_flex``. A policy can therefore learn something real from the pixels.

With ``environment_state`` the dataset also holds the object poses
(``observation.environment_state``, :mod:`act_ros.core.object_state`): a box that lies
where the episode's trajectory closes the gripper and travels with the gripper while it
is closed, and a pad where it opens again, so the poses say something about the
actions too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.contract import Contract, load_contract, parse_image_size
from act_ros.core.object_state import ENVIRONMENT_STATE_FEATURE, ENVIRONMENT_STATE_NAMES, environment_state
from act_ros.data.episode import ROBOT_TYPE_SYNTHETIC, DatasetLayout, Episode

ACTION_LEAD_FRAMES = 5
_SINUSOIDS = 3


def _trajectory(rng: np.random.Generator, contract: Contract, times_s: np.ndarray) -> np.ndarray:
    """Smooth joint positions ``(len(times_s), n)`` inside the limits (gripper in [0, 1])."""
    lower, upper = contract.lower, contract.upper
    mid, half = (lower + upper) / 2.0, (upper - lower) / 2.0
    n = contract.num_joints
    freq_hz = rng.uniform(0.1, 0.6, size=(_SINUSOIDS, n))
    phase = rng.uniform(0.0, 2 * np.pi, size=(_SINUSOIDS, n))
    weight = rng.dirichlet(np.ones(_SINUSOIDS), size=n).T  # sums to 1 per joint
    offset = rng.uniform(-0.3, 0.3, size=n)
    wave = np.sum(weight[None] * np.sin(2 * np.pi * freq_hz[None] * times_s[:, None, None]
                                        + phase[None]), axis=1)
    q = mid + half * np.clip(offset + 0.6 * wave, -0.95, 0.95)
    for g, gripper in zip(contract.gripper_indices, contract.grippers):
        # Each gripper: open, close for a while, open again (smoothed steps), like a pick
        # and place.
        t_close, t_open = np.sort(rng.uniform(times_s[0], times_s[-1] + 1e-6, size=2))
        close = 1.0 / (1.0 + np.exp(-(times_s - t_close) * 12.0))
        reopen = 1.0 / (1.0 + np.exp(-(times_s - t_open) * 12.0))
        opening = np.clip(1.0 - close + reopen, 0.0, 1.0)
        q[:, g] = gripper.closed + opening * (gripper.open - gripper.closed)
    return q


def _first_opening(q: np.ndarray, contract: Contract) -> np.ndarray:
    """The first gripper's opening (0 closed, 1 open) in ``q`` (``(n,)`` or ``(T, n)``);
    half open for an arm without gripper."""
    if not contract.grippers:
        return np.full(np.shape(q)[:-1], 0.5)
    gripper = contract.grippers[0]
    return (np.asarray(q)[..., contract.gripper_indices[0]] - gripper.closed) / (
        gripper.open - gripper.closed)


def _unit(value: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.clip((value - lo) / (hi - lo), 0.0, 1.0)


def render_top(q: np.ndarray, contract: Contract, height: int, width: int) -> np.ndarray:
    """Top image for one state ``q``: a disk placed by the first two joints."""
    lo, hi = contract.lower, contract.upper
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    cx = (0.15 + 0.7 * _unit(q[0], lo[0], hi[0])) * width
    cy = (0.15 + 0.7 * _unit(q[1], lo[1], hi[1])) * height
    radius = (0.08 + 0.12 * _unit(q[2], lo[2], hi[2])) * min(height, width)
    inside = (xx - cx) ** 2 + (yy - cy) ** 2 <= radius ** 2
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[..., 0] = (40 + 60 * xx / max(width - 1, 1)).astype(np.uint8)
    image[..., 1] = 60
    image[..., 2] = (40 + 60 * yy / max(height - 1, 1)).astype(np.uint8)
    grip = float(np.clip(_first_opening(q, contract), 0.0, 1.0))
    image[inside] = (230, int(40 + 200 * grip), 40)
    return image


def render_wrist(q: np.ndarray, contract: Contract, height: int, width: int) -> np.ndarray:
    """Wrist image for one state ``q``: a bar rotated by ``wrist_roll`` (joint 4)."""
    lo, hi = contract.lower, contract.upper
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    yy -= height / 2.0
    xx -= width / 2.0
    angle = float(q[4]) if q.shape[0] > 4 else 0.0
    distance = np.abs(-np.sin(angle) * xx + np.cos(angle) * yy)
    bar = distance <= max(1.0, 0.06 * min(height, width))
    level = int(30 + 150 * _unit(q[3], lo[3], hi[3])) if q.shape[0] > 3 else 100
    image = np.full((height, width, 3), level, dtype=np.uint8)
    image[bar] = (250, 250, 60)
    return image


def _planar_position(q: np.ndarray, contract: Contract) -> np.ndarray:
    """A made-up gripper position on the table (m) from the first two joints."""
    lo, hi = contract.lower, contract.upper
    return np.array([0.15 + 0.2 * _unit(q[0], lo[0], hi[0]), -0.15 + 0.3 * _unit(q[1], lo[1], hi[1]),
                     0.015])


def synthetic_environment_state(q: np.ndarray, contract: Contract, seed: int) -> np.ndarray:
    """Object poses ``(T, 10)`` for the joint trajectory ``q`` (T, n): the box rests where the
    gripper first closes and moves with it while closed; the pad lies where it reopens."""
    rng = np.random.default_rng([seed, 10])  # not the trajectory's stream: it stays as it was
    closed = _first_opening(q, contract) < 0.5
    grasp = int(np.argmax(closed)) if closed.any() else 0
    release = grasp + int(np.argmax(~closed[grasp:])) if (~closed[grasp:]).any() else len(q) - 1
    box_yaw, pad_yaw = rng.uniform(-np.pi, np.pi, size=2)
    rest = _planar_position(q[grasp], contract)
    pad = _planar_position(q[release], contract) * np.array([1.0, 1.0, 0.0]) + [0.0, 0.0, 0.005]
    out = np.empty((len(q), len(ENVIRONMENT_STATE_NAMES)), dtype=np.float32)
    for t in range(len(q)):
        box = _planar_position(q[t], contract) if grasp <= t < release and closed[t] else rest
        if t >= release:
            box = pad + [0.0, 0.0, 0.015]
        jitter = rng.normal(0.0, 5e-4, size=3)  # a pose estimate is never exact
        out[t] = environment_state(box + jitter, box_yaw, pad, pad_yaw)
    return out


def synthetic_episode(layout: DatasetLayout, frames: int, seed: int) -> Episode:
    """One structured random episode of ``frames`` frames, fully determined by ``seed``
    (with the object poses when the layout has ``observation.environment_state``)."""
    if frames < 1:
        raise ValueError(f'frames must be >= 1, got {frames}')
    contract = layout.contract
    rng = np.random.default_rng(seed)
    times = np.arange(frames + ACTION_LEAD_FRAMES, dtype=np.float64) / layout.fps
    q = _trajectory(rng, contract, times)
    state, action = q[:frames], q[ACTION_LEAD_FRAMES:frames + ACTION_LEAD_FRAMES]
    h, w = layout.image_height, layout.image_width
    renderers = {'top': render_top, 'wrist': render_wrist}
    images = {}
    for index, name in enumerate(contract.camera_names):
        render = renderers.get(name, render_top if index == 0 else render_wrist)
        images[name] = np.stack([render(s, contract, h, w) for s in state])
    extras = {}
    if any(key == ENVIRONMENT_STATE_FEATURE for key, _ in layout.extra_features):
        extras[ENVIRONMENT_STATE_FEATURE] = synthetic_environment_state(state, contract, seed)
    return Episode(images=images, state=state.astype(np.float32),
                   action=action.astype(np.float32), seed=seed, extras=extras)


def write_synthetic_dataset(root: str | Path, *, episodes: int, frames: int,
                            image_size: tuple[int, int], video: bool = True, seed: int = 0,
                            contract: Contract | None = None, overwrite: bool = False,
                            environment_state: bool = False) -> Any:
    """Write ``episodes`` synthetic episodes (episode ``k`` from seed ``seed + k``) as a
    LeRobot v3 dataset at ``root``, all or nothing; returns the writer's result.

    ``environment_state``: also write the object poses, ``observation.environment_state``
    (shape (10,), names :data:`~act_ros.core.object_state.ENVIRONMENT_STATE_NAMES`), as
    simulator datasets hold them.
    """
    from act_ros.data.writer import AtomicDatasetWriter

    contract = contract or load_contract()
    height, width = image_size
    extra = ((ENVIRONMENT_STATE_FEATURE, ENVIRONMENT_STATE_NAMES),) if environment_state else ()
    layout = DatasetLayout(contract=contract, image_height=height, image_width=width,
                           use_video=video, robot_type=ROBOT_TYPE_SYNTHETIC, extra_features=extra)
    with AtomicDatasetWriter(layout, Path(root), overwrite=overwrite) as writer:
        for k in range(episodes):
            writer.add_episode(synthetic_episode(layout, frames, seed + k))
    return writer.result


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of ``act-ros generate-synthetic``."""
    parser = argparse.ArgumentParser(
        prog='act-ros generate-synthetic',
        description='Write a small structured random LeRobot v3 dataset with the features of '
                    'the I/O contract (cameras, observation.state, action), for smoke tests.',
        formatter_class=HelpFormatter)
    parser.add_argument('--output', required=True, type=Path,
                        help='dataset directory to create (must not exist or be empty)')
    parser.add_argument('--episodes', type=int, default=4, help='number of episodes (default 4)')
    parser.add_argument('--frames-per-episode', type=int, default=60,
                        help='frames per episode (default 60, i.e. 2 s at 30 fps)')
    parser.add_argument('--image-size', default='96x128', type=parse_image_size,
                        help='stored image size HEIGHTxWIDTH (default 96x128)')
    parser.add_argument('--seed', type=int, default=0,
                        help='random seed; episode k uses seed+k (default 0)')
    parser.add_argument('--video', action=argparse.BooleanOptionalAction, default=True,
                        help='store cameras as MP4 videos (default) or PNG images (--no-video)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing dataset at --output')
    parser.add_argument('--environment-state', action='store_true',
                        help='also write object poses (observation.environment_state), for '
                        'training with act-ros train --environment-state')
    parser.add_argument('--contract', type=Path, default=None,
                        help='contract YAML (default: the package config/contract.yaml)')
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``act-ros generate-synthetic``."""
    from act_ros.data.writer import check_output, quiet_library_output

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.frames_per_episode < 1:
        parser.error(f'--episodes and --frames-per-episode must be >= 1, got '
                     f'{args.episodes} and {args.frames_per_episode}')
    try:
        contract = load_contract(args.contract)
        height, width = args.image_size
        DatasetLayout(contract=contract, image_height=height, image_width=width,
                      use_video=args.video, robot_type=ROBOT_TYPE_SYNTHETIC)  # checks the size
        check_output(args.output, args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f'act-ros generate-synthetic: {exc}', file=sys.stderr)
        return 2
    quiet_library_output()
    result = write_synthetic_dataset(args.output, episodes=args.episodes,
                                     frames=args.frames_per_episode, image_size=(height, width),
                                     video=args.video, seed=args.seed, contract=contract,
                                     overwrite=args.overwrite,
                                     environment_state=args.environment_state)
    print(f'wrote {result.episodes} episodes, {result.frames} frames '
          f'({height}x{width}, {"video" if args.video else "images"}, {contract.fps} fps) '
          f'to {result.path} (repo_id {result.repo_id})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
