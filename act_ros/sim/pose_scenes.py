"""Random still scenes for pose-supervised vision training: no expert, no episode.

A scene is a random layout (:meth:`PortPickAlignEnv.reset` with a seed) with the arm put
where the task takes it, rendered from both cameras, labelled with the true box and pad
poses. Three kinds, drawn with the probabilities of :class:`SceneMix`:

- ``start``: the episode's first frame (arm at its start posture);
- ``reach``: the gripper pointing down at a random point near the box, near the pad or
  between them, at a random height and yaw (half the time near the box's yaw), fingers
  at a random opening;
- ``held``: the box between the fingers (closed on its width, its faces along them)
  somewhere between the box's place and the pad, the pad's yaw unchanged.

The arm joints come from the simulation's inverse kinematics (a top-down gripper), so the
arm looks as it does when the task is done, and a camera sees the objects as partly hidden
by it. Each scene depends only on its seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from act_ros.sim.env import PortPickAlignEnv, SimObservation
from act_ros.sim.ik import ArmIK, down_rotation

SCENE_KINDS = ('start', 'reach', 'held')
TRIES = 8  # draws of a reachable gripper pose before a scene falls back to the first frame


@dataclass(frozen=True)
class SceneMix:
    """Probabilities of the scene kinds (normalized) and the heights the gripper takes."""

    start: float = 0.15
    reach: float = 0.5
    held: float = 0.35
    low_m: float = 0.02    # lowest tool-centre-point height near the box
    high_m: float = 0.16   # highest
    spread_m: float = 0.03  # std of the point around its anchor in the table plane

    def probabilities(self) -> np.ndarray:
        p = np.array([self.start, self.reach, self.held], dtype=np.float64)
        if np.any(p < 0) or p.sum() <= 0:
            raise ValueError(f'scene mix: expected non-negative probabilities with a positive '
                             f'sum, got start={self.start}, reach={self.reach}, held={self.held}')
        return p / p.sum()


class PoseScenes:
    """``scene(seed)`` -> (observation with images, kind) for one environment."""

    def __init__(self, env: PortPickAlignEnv, mix: SceneMix | None = None) -> None:
        self.env = env
        self.mix = mix or SceneMix()
        self._p = self.mix.probabilities()
        self.ik = ArmIK(env.model)
        self._home = np.asarray(env.config.home_joint_positions, dtype=np.float64)[env.arm_index]
        self._box_half = env.config.box_size_m / 2
        self._box_opening = min(1.0, self._box_half / env.finger_open_m)

    def _joints(self, target: np.ndarray, yaw: float) -> np.ndarray | None:
        """Arm joints for the gripper pointing down at ``target`` with fingers along ``yaw``,
        solved from the start posture turned toward the target (the usual branch); None
        where the arm cannot reach that pose (more than 5 mm or 3 degrees off)."""
        q0 = self._home.copy()
        q0[0] = math.atan2(target[1], target[0])
        q0[-1] = math.remainder(q0[0] + math.pi / 2 - yaw, 2 * math.pi)
        q, error, rotation_error = self.ik.solve_checked(target, down_rotation(yaw), q0)
        return q if error <= 0.005 and rotation_error <= math.radians(3.0) else None

    def scene(self, seed: int) -> tuple[SimObservation, str]:
        """The scene of ``seed`` and its kind (a pose the arm cannot reach is drawn again,
        up to ``TRIES`` times, then the scene is the first frame)."""
        obs = self.env.reset(seed=seed)
        rng = np.random.default_rng([int(seed), 0x5CE7E])
        kind = SCENE_KINDS[int(rng.choice(len(SCENE_KINDS), p=self._p))]
        if kind == 'start':
            return obs, kind
        box, pad = np.asarray(obs.box_pose, float), np.asarray(obs.pad_pose, float)
        for _ in range(TRIES):
            placed = (self._reach(rng, box, pad) if kind == 'reach'
                      else self._held(rng, box, pad))
            if placed is not None:
                return placed, kind
        return self.env.reset(seed=seed), 'start'

    def _reach(self, rng: np.random.Generator, box: np.ndarray,
               pad: np.ndarray) -> SimObservation | None:
        mix = self.mix
        between = box[:2] + rng.uniform() * (pad[:2] - box[:2])
        anchor = (box[:2], pad[:2], between)[int(rng.choice(3, p=[0.5, 0.25, 0.25]))]
        yaw = (box[3] + rng.normal(0.0, math.radians(10.0)) if rng.uniform() < 0.5
               else rng.uniform(-math.pi, math.pi))
        target = np.array([*(anchor + rng.normal(0.0, mix.spread_m, 2)),
                           rng.uniform(mix.low_m, mix.high_m)])
        q = self._joints(target, yaw)
        if q is None:
            return None
        return self.env.pose_scene(q, rng.uniform(self._box_opening, 1.0))

    def _held(self, rng: np.random.Generator, box: np.ndarray,
              pad: np.ndarray) -> SimObservation | None:
        mix = self.mix
        between = box[:2] + rng.uniform() * (pad[:2] - box[:2])
        anchor = (pad[:2], between)[int(rng.integers(2))]
        target = np.array([*(anchor + rng.normal(0.0, mix.spread_m, 2)),
                           rng.uniform(self._box_half + 0.01, mix.high_m)])
        yaw = rng.uniform(-math.pi, math.pi)
        q = self._joints(target, yaw)
        if q is None:
            return None
        tcp = self.ik.forward(q)[0]
        box_yaw = yaw + rng.integers(4) * math.pi / 2 + rng.normal(0.0, math.radians(3.0))
        return self.env.pose_scene(q, self._box_opening, box_pose=[*tcp, box_yaw])
