"""Scripted expert for port-pick-align: IK on privileged box and pad poses.

Phases (control ticks at 30 Hz, from :class:`ExpertConfig`):

1. ``approach``: joint-space move from the start pose to hover above the box, fingers
   across two opposite box faces (the 90-degree choice that keeps wrist_roll smallest).
2. ``descend``: straight down to the grasp height.
3. ``close``: close the gripper and wait for the grip.
4. ``lift`` and 5. ``carry``: up to the carry height, then over the pad; meanwhile the yaw
   turns progressively so that the box (as measured in the gripper) ends aligned with
   the pad modulo 90 degrees.
6. ``place``: descend over the pad until the box sits on it (longer than one action chunk).
7. ``release``: arm still, gripper open (longer than one action chunk).
8. ``retreat``: straight up; then hold.

Cartesian segments follow a minimum-jerk profile and each tick's joints come from damped
least squares warm-started at the previous tick, so targets move smoothly. The gripper
command passes through the node's :class:`~act_ros.core.release_gate.ReleaseGate`
(default settings), which it must never trip.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

from act_ros.core.release_gate import GateDecision, ReleaseGate, ReleaseGateConfig
from act_ros.sim.env import PortPickAlignEnv, SimObservation
from act_ros.sim.ik import ArmIK, down_rotation, gripper_yaw
from act_ros.sim.metrics import EpisodeResult, wrap_angle

GRIPPER_OPEN = 1.0
GRIPPER_CLOSED = 0.0


@dataclass(frozen=True)
class ExpertConfig:
    """Heights (tool centre point above the table) and phase durations in control ticks.

    Top-down poses stop being reachable above ~0.08 m at the far edge of the workspace
    (0.225 m from the base), which bounds the hover, carry and retreat heights.
    """

    grasp_height_m: float = 0.018
    hover_height_m: float = 0.063
    carry_height_m: float = 0.07
    place_clearance_m: float = 0.001
    retreat_height_m: float = 0.075
    approach_steps: int = 40
    descend_steps: int = 25
    close_steps: int = 12
    lift_steps: int = 20
    carry_steps: int = 45
    place_steps: int = 42
    release_steps: int = 36
    retreat_steps: int = 25
    min_chunk_phase_steps: int = 31   # place and release outlast one 30-step action chunk

    def __post_init__(self) -> None:
        if not 0.0 < self.grasp_height_m < self.hover_height_m:
            raise ValueError(f'need 0 < grasp_height_m < hover_height_m, got '
                             f'{self.grasp_height_m} and {self.hover_height_m}')
        if not self.carry_height_m > self.grasp_height_m:
            raise ValueError(f'carry_height_m {self.carry_height_m} must exceed grasp_height_m '
                             f'{self.grasp_height_m}')
        for name, steps in self.phase_steps():
            if steps < 1:
                raise ValueError(f'{name}_steps must be >= 1, got {steps}')
        for name in ('place', 'release'):
            steps = getattr(self, f'{name}_steps')
            if steps < self.min_chunk_phase_steps:
                raise ValueError(f'{name}_steps must be >= {self.min_chunk_phase_steps} (longer '
                                 f'than an action chunk), got {steps}')

    def phase_steps(self) -> list[tuple[str, int]]:
        names = ('approach', 'descend', 'close', 'lift', 'carry', 'place', 'release', 'retreat')
        return [(n, getattr(self, f'{n}_steps')) for n in names]

    @property
    def total_steps(self) -> int:
        return sum(s for _, s in self.phase_steps())


def min_jerk(s: float) -> float:
    """Minimum-jerk profile on [0, 1]: zero velocity and acceleration at both ends."""
    s = min(max(s, 0.0), 1.0)
    return s * s * s * (10.0 - 15.0 * s + 6.0 * s * s)


def _fold_quarter(roll: float) -> float:
    """An angle modulo 90 degrees (the box symmetry), folded into [-45, 45) degrees."""
    quarter = math.pi / 2
    return (roll + quarter / 2) % quarter - quarter / 2


class ScriptedExpert:
    """Expert policy: ``reset(obs)`` at the episode start, then ``act(obs)`` every tick."""

    def __init__(self, env: PortPickAlignEnv, config: ExpertConfig | None = None,
                 gate_config: ReleaseGateConfig | None = None) -> None:
        self.env = env
        self.config = config or ExpertConfig()
        if self.config.total_steps > env.config.episode_steps:
            raise ValueError(f'the expert needs {self.config.total_steps} steps, the episode has '
                             f'{env.config.episode_steps}')
        self.ik = ArmIK(env.model)
        self.gate = ReleaseGate(gate_config)
        self._arm_index = env.arm_index
        self._gripper_index = env.gripper_index
        self._box_half = env.config.box_size_m / 2
        self.gate_decisions: list[GateDecision] = []
        self._schedule: list[tuple[str, int, int]] = []
        start = 0
        for name, steps in self.config.phase_steps():
            self._schedule.append((name, start, start + steps))
            start += steps
        self._bounds = {name: (begin, end) for name, begin, end in self._schedule}
        self.tick = 0
        self.phase = 'approach'
        self.phase_progress = 0.0     # of the phase of the last act(), in (0, 1]
        self.max_ik_error_m = 0.0     # worst IK position residual this episode

    # ------------------------------------------------------------------ helpers
    def _arm(self, joints: np.ndarray) -> np.ndarray:
        return np.asarray(joints, dtype=np.float64)[self._arm_index]

    def _phase_at(self, tick: int) -> tuple[str, float]:
        for name, begin, end in self._schedule:
            if tick < end:
                return name, (tick - begin + 1) / (end - begin)
        return 'hold', 1.0

    def _yaw_for_roll(self, xy: np.ndarray, roll: float) -> float:
        """Gripper yaw at ``xy`` for a given wrist roll when pointing down."""
        return math.atan2(xy[1], xy[0]) + math.pi / 2 - roll

    def _closest_yaw(self, xy: np.ndarray, yaw: float) -> float:
        """Among ``yaw + k * 90 deg``, the gripper yaw needing the smallest wrist roll."""
        roll = math.atan2(xy[1], xy[0]) + math.pi / 2 - yaw
        return self._yaw_for_roll(xy, _fold_quarter(wrap_angle(roll)))

    # ------------------------------------------------------------------ episode
    def reset(self, obs: SimObservation) -> None:
        """Plan the grasp for a new episode from its first observation."""
        self.gate.reset()
        self.gate_decisions = []
        self.tick = 0
        self.phase = 'approach'
        self._q_start = self._arm(obs.joint_positions)
        self._q_cmd = self._q_start.copy()
        box = obs.box_pose
        self._grasp_yaw = self._closest_yaw(box[:2], box[3])
        rotation = down_rotation(self._grasp_yaw)
        hover = np.array([box[0], box[1], self.config.hover_height_m])
        self._q_hover, self.max_ik_error_m = self.ik.solve(hover, rotation, self._q_start)
        self._pose = (hover, self._grasp_yaw)          # last commanded Cartesian target
        self._segment_start = self._pose
        self._segment_end = self._pose
        self._entered: set[str] = set()

    def _enter(self, phase: str, obs: SimObservation) -> None:
        """Fix the start and end targets of a phase from the current observation."""
        cfg = self.config
        pos, yaw = self._pose
        self._segment_start = (pos.copy(), yaw)
        if phase == 'descend':
            box = obs.box_pose
            end = (np.array([box[0], box[1], cfg.grasp_height_m]), yaw)
        elif phase == 'lift':
            self._plan_place(obs, reference_yaw=None)
            end = (np.array([pos[0], pos[1], cfg.carry_height_m]), yaw)
        elif phase == 'carry':
            end = (np.array([*self._place_xy, cfg.carry_height_m]), yaw)
        elif phase == 'place':
            self._plan_place(obs, reference_yaw=yaw)
            end = (np.array([*self._place_xy, self._place_z]), self._place_yaw)
        elif phase == 'retreat':
            end = (np.array([pos[0], pos[1], max(pos[2], cfg.retreat_height_m)]), yaw)
        else:  # close, release, hold: stay
            end = (pos.copy(), yaw)
        self._segment_end = end

    def _plan_place(self, obs: SimObservation, reference_yaw: float | None) -> None:
        """Where the gripper must go so that the held box lands on the pad, aligned.

        Uses the box pose measured in the gripper frame, so a grasp slightly off centre or
        turned is compensated. Of the four equivalent yaws, the first plan (``reference_yaw``
        None) takes the one with the smallest wrist roll; a re-plan keeps the one nearest to
        ``reference_yaw``, so the target never flips by 90 degrees on the way.
        """
        ee_pos, ee_rot = self.ik.forward(self._arm(obs.joint_positions))
        box, pad = obs.box_pose, obs.pad_pose
        box_in_gripper = ee_rot.T @ (box[:3] - ee_pos)
        relative_yaw = _fold_quarter(wrap_angle(box[3] - gripper_yaw(ee_rot)))
        aligned_yaw = pad[3] - relative_yaw
        if reference_yaw is None:
            place_yaw = self._closest_yaw(pad[:2], aligned_yaw)
        else:
            place_yaw = reference_yaw + _fold_quarter(wrap_angle(aligned_yaw - reference_yaw))
        rotation = down_rotation(place_yaw)
        offset = rotation @ box_in_gripper
        self._place_xy = pad[:2] - offset[:2]
        self._place_yaw = place_yaw
        self._place_z = pad[2] + self._box_half + self.config.place_clearance_m - offset[2]
        # The yaw target of the lift and carry (progressive alignment).
        self._carry_yaw_start = self._grasp_yaw
        self._carry_yaw_end = place_yaw

    def act(self, obs: SimObservation) -> np.ndarray:
        """Joint targets (contract order, gripper normalized) for this tick."""
        phase, s = self._phase_at(self.tick)
        if phase not in self._entered:
            self._entered.add(phase)
            if phase != 'approach':
                self._enter(phase, obs)
        self.phase, self.phase_progress = phase, s
        if phase == 'approach':
            self._q_cmd = self._q_start + min_jerk(s) * (self._q_hover - self._q_start)
        else:
            (p0, yaw0), (p1, yaw1) = self._segment_start, self._segment_end
            position = p0 + min_jerk(s) * (p1 - p0)
            if phase in ('lift', 'carry'):
                # Yaw turns over lift and carry together.
                begin, end = self._bounds['lift'][0], self._bounds['carry'][1]
                u = min_jerk((self.tick - begin + 1) / (end - begin))
                yaw = self._carry_yaw_start + u * (self._carry_yaw_end - self._carry_yaw_start)
            else:
                yaw = yaw0 + min_jerk(s) * (yaw1 - yaw0)
            self._pose = (position, yaw)
            self._q_cmd, error = self.ik.solve(position, down_rotation(yaw), self._q_cmd)
            self.max_ik_error_m = max(self.max_ik_error_m, error)
        if phase in ('approach', 'descend', 'release', 'retreat', 'hold'):
            gripper = GRIPPER_OPEN
        else:
            gripper = GRIPPER_CLOSED
        decision = self.gate.apply(gripper, obs.ee_position, obs.pad_pose[:3])
        self.gate_decisions.append(decision)
        action = np.empty(self.env.contract.num_joints)
        action[self._arm_index] = self._q_cmd
        action[self._gripper_index] = decision.command
        self.tick += 1
        return action

    @property
    def gate_tripped(self) -> bool:
        """True if the gate suppressed or changed any of this episode's gripper commands."""
        return any(d.suppressed_release or d.changed for d in self.gate_decisions)


def run_episode(env: PortPickAlignEnv, expert: ScriptedExpert, seed: int) -> EpisodeResult:
    """Run one full expert episode; returns the env's :class:`EpisodeResult`."""
    obs = env.reset(seed=seed)
    expert.reset(obs)
    while not env.done:
        obs = env.step(expert.act(obs))
    return env.evaluate()
