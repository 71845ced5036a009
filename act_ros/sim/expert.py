"""Scripted expert for port-pick-align: state feedback on the measured arm and object poses.

Every tick the expert decides what to do from what it measures, not from a clock: the
tool centre point (forward kinematics of the measured joints), the gripper opening, the
box pose relative to the fingers, the box and pad poses. It therefore acts correctly
from any state it can recover from (a box pushed away, a box dropped in transit, an arm
knocked off its path), and it can label the states a learned policy visits (DAgger).

What it does, as a function of the state:

- **Not holding the box** (approach, descend, close): the fingers go to a grasp pose over
  the box's centre, across two opposite faces (of the four equivalent yaws, the one with
  the smallest wrist roll). The allowed height is a funnel around the box: the further
  the fingers are from the grasp pose (position and yaw), the higher they must stay, so
  the arm rises before it travels and descends only once aligned. At the grasp pose the
  gripper closes.
- **Holding it** (lift, carry, place): the target is the gripper pose that puts the box,
  as it sits in the fingers now, on the pad's centre, aligned with the pad modulo 90
  degrees. The same funnel keeps the box at carry height until it is over its target;
  the descent onto the pad is slow (longer than one action chunk). Yaw turns during
  lift and carry.
- **Box on the pad**: the arm holds still while the gripper opens (the release), then
  rises slowly, then holds.

Targets move toward their goal at a bounded speed (proportional near the goal, so the
arm arrives without overshoot); each tick's joints come from damped least squares
started at the measured joints. The gripper command passes through the node's
:class:`~act_ros.core.control.release_gate.ReleaseGate` (default settings), which the expert
never trips on its own.

The expert keeps two pieces of memory, both tie-breakers: which of two equally good
yaws it chose last (so that a choice near a tie does not flip back and forth), and the
gate's state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from act_ros.core.control.release_gate import GateDecision, ReleaseGate, ReleaseGateConfig
from act_ros.sim.config import GRIPPER_EMPTY_EFFORT_N
from act_ros.sim.env import PortPickAlignEnv, SimObservation
from act_ros.sim.ik import ArmIK, down_rotation, gripper_yaw
from act_ros.sim.metrics import EpisodeResult, wrap_angle

GRIPPER_OPEN = 1.0
GRIPPER_CLOSED = 0.0
QUARTER = math.pi / 2
# Phases the expert reports (ScriptedExpert.phase), in task order.
PHASES = ('approach', 'descend', 'close', 'lift', 'carry', 'place', 'release', 'retreat')


@dataclass(frozen=True)
class ExpertConfig:
    """Geometry, speeds and tolerances of the expert (lengths in metres, per control tick
    where the name says ``_per_tick``).

    Top-down poses stop being reachable above ~0.08 m at the far edge of the workspace
    (0.225 m from the base), which bounds the hover, carry and retreat heights.
    """

    grasp_above_centre_m: float = 0.003   # tool centre point above the box centre at the grasp
    hover_above_grasp_m: float = 0.045    # funnel top: hover height above the grasp height
    carry_height_m: float = 0.07          # tool centre point over the table while carrying
    retreat_height_m: float = 0.075
    place_clearance_m: float = 0.001      # box bottom above the pad top at the end of the descent
    funnel_slope: float = 4.0             # metres of height per metre of position error
    funnel_yaw_m_per_deg: float = 0.0015  # metres of height per degree of yaw error
    funnel_margin_m: float = 0.003        # position error allowed at the bottom of the funnel
    funnel_yaw_margin_deg: float = 2.0
    max_speed_per_tick_m: float = 0.005   # horizontal (15 cm/s at 30 Hz)
    descend_speed_per_tick_m: float = 0.003
    place_speed_per_tick_m: float = 0.0012  # the descent onto the pad lasts > 30 ticks
    retreat_speed_per_tick_m: float = 0.002
    min_speed_per_tick_m: float = 0.0004
    gain_per_tick: float = 0.15           # proportional approach near a goal
    max_yaw_rate_per_tick_deg: float = 3.0
    travel_clearance_m: float = 0.005     # below the funnel by more than this: rise before travel
    travel_freeze_m: float = 0.02         # ... by this much: no horizontal motion at all
    close_position_tol_m: float = 0.004   # grasp pose reached: close the gripper
    close_height_tol_m: float = 0.003
    close_yaw_tol_deg: float = 5.0
    hold_distance_m: float = 0.02         # box centre within this of the tool centre point ...
    hold_opening_margin: float = 0.06     # ... and the gripper within this of the box's width
    land_height_m: float = 0.0015         # held box's lowest corner this close to the pad: let go
    rest_height_m: float = 0.003          # a box's bottom this close to the pad top rests on it
    land_position_tol_m: float = 0.004
    open_opening: float = 0.92            # measured opening counted as open
    empty_opening: float = 0.1            # below this the fingers hold nothing
    release_distance_m: float = 0.03      # fingers this close to a placed box: still releasing
    placed_position_tol_m: float = 0.012  # a released box this close to the pad centre ...
    placed_yaw_tol_deg: float = 8.0       # ... and this well aligned stays where it is
    tie_margin_deg: float = 10.0          # keep the previous yaw choice unless this much worse
    over_target_m: float = 0.01           # held box within this of its target: placing
    noise_fade_m: float = 0.03            # exploration noise fades over this distance to a goal
    ik_tolerance_m: float = 0.001         # a Cartesian step solved worse than this ...
    ik_rotation_tolerance_rad: float = 0.05
    recovery_joint_step_rad: float = 0.05  # ... moves the arm in joint space, this fast

    def __post_init__(self) -> None:
        for name in ('hover_above_grasp_m', 'carry_height_m', 'retreat_height_m',
                     'funnel_slope', 'max_speed_per_tick_m', 'descend_speed_per_tick_m',
                     'place_speed_per_tick_m', 'retreat_speed_per_tick_m',
                     'min_speed_per_tick_m', 'gain_per_tick', 'max_yaw_rate_per_tick_deg',
                     'close_position_tol_m', 'close_height_tol_m', 'hold_distance_m',
                     'land_height_m', 'rest_height_m', 'placed_position_tol_m'):
            if not getattr(self, name) > 0.0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if not 0.0 < self.gain_per_tick <= 1.0:
            raise ValueError(f'gain_per_tick must be in (0, 1], got {self.gain_per_tick}')
        if not self.min_speed_per_tick_m <= min(self.place_speed_per_tick_m,
                                                 self.descend_speed_per_tick_m):
            raise ValueError('min_speed_per_tick_m must not exceed the descent speeds')
        if not self.travel_clearance_m < self.travel_freeze_m:
            raise ValueError('travel_clearance_m must be below travel_freeze_m')


@dataclass(frozen=True)
class Motion:
    """What one branch of the expert wants this tick: the next tool-centre-point target
    and gripper yaw, the goal they head for, and the gripper command."""

    target: np.ndarray
    yaw: float
    goal: np.ndarray
    goal_yaw: float
    gripper: float


def _fold_quarter(angle: float) -> float:
    """An angle modulo 90 degrees (the box symmetry), folded into [-45, 45) degrees."""
    return (angle + QUARTER / 2) % QUARTER - QUARTER / 2


def _speed(distance: float, max_speed: float, cfg: ExpertConfig) -> float:
    """Speed toward a goal ``distance`` away: proportional near it, bounded far from it."""
    return min(max_speed, max(cfg.min_speed_per_tick_m, cfg.gain_per_tick * distance))


def _toward(value: np.ndarray, goal: np.ndarray, speed: float) -> np.ndarray:
    """``value`` moved toward ``goal`` by at most ``speed`` (Euclidean)."""
    delta = goal - value
    distance = float(np.linalg.norm(delta))
    if distance <= speed:
        return goal.copy()
    return value + delta * (speed / distance)


class ScriptedExpert:
    """Expert policy: ``reset(obs)`` at the episode start, then ``act(obs)`` every tick."""

    def __init__(self, env: PortPickAlignEnv, config: ExpertConfig | None = None,
                 gate_config: ReleaseGateConfig | None = None) -> None:
        self.env = env
        self.config = config or ExpertConfig()
        self.ik = ArmIK(env.model)
        # The simulated gripper's effort tells an empty close (GRIPPER_EMPTY_EFFORT_N).
        self.gate = ReleaseGate(gate_config or ReleaseGateConfig(
            empty_effort=GRIPPER_EMPTY_EFFORT_N))
        self._arm_index = env.arm_index
        self._gripper_index = env.gripper_index
        self._box_half = env.config.box_size_m / 2
        # Normalized opening of fingers closed on the box (the box's width).
        self._box_opening = min(1.0, self._box_half / env.finger_open_m)
        self.gate_decisions: list[GateDecision] = []
        self.tick = 0
        self.phase = 'approach'
        self.noise_gain = 1.0          # how much exploration noise suits this tick, in [0, 1]
        self.recovering = False        # this tick moved in joint space (off the usual branch)
        self.max_ik_error_m = 0.0      # worst IK position residual this episode
        self._grasp_yaw: float | None = None
        self._place_yaw: float | None = None

    # ------------------------------------------------------------------ episode
    def reset(self, obs: SimObservation) -> None:
        """Start a new episode (clears the gate and the tie-breaking memory)."""
        self.gate.reset()
        self.gate_decisions = []
        self.tick = 0
        self.phase = 'approach'
        self.noise_gain = 1.0
        self.max_ik_error_m = 0.0
        self._grasp_yaw = None
        self._place_yaw = None

    # ------------------------------------------------------------------ geometry
    def _roll_for_yaw(self, xy: np.ndarray, yaw: float) -> float:
        """Wrist roll (relative to the arm's plane) that points the fingers along ``yaw``
        at ``xy`` when the gripper points down."""
        return wrap_angle(math.atan2(xy[1], xy[0]) + QUARTER - yaw)

    def _choose_yaw(self, xy: np.ndarray, yaw: float, previous: float | None) -> float:
        """Of ``yaw + k * 90 deg``, the gripper yaw with the smallest wrist roll at ``xy``;
        the previous choice is kept unless it needs ``tie_margin_deg`` more roll."""
        roll = self._roll_for_yaw(xy, yaw)
        best = yaw + (roll - _fold_quarter(roll))  # roll folded into [-45, 45) degrees
        if previous is not None:
            candidate = best + QUARTER * round(wrap_angle(previous - best) / QUARTER)
            extra = abs(self._roll_for_yaw(xy, candidate)) - abs(self._roll_for_yaw(xy, best))
            if extra <= math.radians(self.config.tie_margin_deg):
                return candidate
        return best

    def _funnel_height(self, bottom_z: float, position_error: float, yaw_error_deg: float,
                       top_z: float) -> float:
        """Lowest allowed height for the current alignment error (see module docstring)."""
        cfg = self.config
        rise = (cfg.funnel_slope * max(0.0, position_error - cfg.funnel_margin_m)
                + cfg.funnel_yaw_m_per_deg * max(0.0, yaw_error_deg - cfg.funnel_yaw_margin_deg))
        return min(top_z, bottom_z + rise) if top_z > bottom_z else bottom_z

    def _step_target(self, ee: np.ndarray, goal_xy: np.ndarray, goal_z: float,
                     floor_z: float, max_down: float) -> np.ndarray:
        """Next tool-centre-point target toward ``goal``; horizontal travel waits while the
        point is well below ``floor_z`` (the funnel)."""
        cfg = self.config
        deficit = floor_z - ee[2]
        travel = 1.0 - (deficit - cfg.travel_clearance_m) / (cfg.travel_freeze_m
                                                              - cfg.travel_clearance_m)
        travel = min(1.0, max(0.0, travel))
        xy_error = float(np.linalg.norm(goal_xy - ee[:2]))
        xy = _toward(ee[:2], goal_xy, travel * _speed(xy_error, cfg.max_speed_per_tick_m, cfg))
        z_goal = max(goal_z, floor_z)
        dz = z_goal - ee[2]
        up_speed = _speed(abs(dz), cfg.max_speed_per_tick_m, cfg)
        down_speed = _speed(abs(dz), max_down, cfg)
        z = ee[2] + (min(dz, up_speed) if dz > 0 else max(dz, -down_speed))
        return np.array([xy[0], xy[1], z])

    def _yaw_step(self, current: float, goal: float) -> float:
        cfg = self.config
        error = wrap_angle(goal - current)
        rate = min(math.radians(cfg.max_yaw_rate_per_tick_deg),
                   max(math.radians(0.05), cfg.gain_per_tick * abs(error)))
        return current + math.copysign(min(abs(error), rate), error)

    def _usual_posture(self, target: np.ndarray, yaw: float) -> np.ndarray:
        """Arm joints of the start posture turned toward ``target`` with the wrist roll
        for ``yaw``: an IK start on the usual branch (elbow up, wrist down)."""
        q = np.asarray(self.env.config.home_joint_positions, dtype=np.float64)[self._arm_index]
        q = q.copy()
        q[0] = math.atan2(target[1], target[0])
        q[-1] = self._roll_for_yaw(target[:2], yaw)
        return q

    # ------------------------------------------------------------------ decisions
    def _holding(self, box_in_gripper: np.ndarray, opening: float) -> bool:
        cfg = self.config
        return (float(np.linalg.norm(box_in_gripper)) <= cfg.hold_distance_m
                and abs(opening - self._box_opening) <= cfg.hold_opening_margin)

    def _gripping(self, box_in_gripper: np.ndarray, opening: float) -> bool:
        """The box is between fingers that are neither open nor closed on nothing."""
        cfg = self.config
        return (float(np.linalg.norm(box_in_gripper)) <= cfg.hold_distance_m
                and cfg.empty_opening < opening < cfg.open_opening)

    def _grasp_errors(self, box: np.ndarray, ee: np.ndarray,
                      yaw_now: float) -> tuple[float, float, float]:
        """Position (m), height (m) and yaw (deg, modulo 90) errors from the grasp pose."""
        grasp_z = box[2] + self.config.grasp_above_centre_m
        position_error = float(np.linalg.norm(box[:2] - ee[:2]))
        yaw_error = abs(math.degrees(_fold_quarter(wrap_angle(box[3] - yaw_now))))
        return position_error, abs(ee[2] - grasp_z), yaw_error

    def _at_grasp_pose(self, box: np.ndarray, ee: np.ndarray, yaw_now: float) -> bool:
        cfg = self.config
        position_error, height_error, yaw_error = self._grasp_errors(box, ee, yaw_now)
        return (position_error <= cfg.close_position_tol_m
                and height_error <= cfg.close_height_tol_m
                and yaw_error <= cfg.close_yaw_tol_deg)

    def _placed(self, obs: SimObservation) -> bool:
        """The box rests on the pad near its centre, aligned: nothing left to do to it."""
        cfg = self.config
        box, pad = obs.box_pose, obs.pad_pose
        bottom = box[2] - self._box_half
        yaw_error = abs(math.degrees(_fold_quarter(box[3] - pad[3])))
        return (abs(bottom - pad[2]) <= cfg.rest_height_m
                and float(np.linalg.norm(box[:2] - pad[:2])) <= cfg.placed_position_tol_m
                and yaw_error <= cfg.placed_yaw_tol_deg)

    def act(self, obs: SimObservation) -> np.ndarray:
        """Joint targets (contract order, gripper normalized) for this observation."""
        q = np.asarray(obs.joint_positions, dtype=np.float64)
        q_arm = q[self._arm_index]
        opening = float(q[self._gripper_index])
        ee, ee_rot = self.ik.forward(q_arm)
        yaw_now = gripper_yaw(ee_rot)
        box, pad = np.asarray(obs.box_pose, float), np.asarray(obs.pad_pose, float)
        box_in_gripper = ee_rot.T @ (box[:3] - ee)

        # In hand: gripped at the box's width, or gripped any other way (across an edge, a
        # grasp that turned the box) away from the grasp pose. The gate would not let the
        # gripper open away from the pad, so a box in hand goes to the pad either way.
        in_hand = self._holding(box_in_gripper, opening) or (
            self._gripping(box_in_gripper, opening) and not self._at_grasp_pose(box, ee, yaw_now))
        if in_hand and self._landed(obs, ee, box_in_gripper, yaw_now):
            self.phase, self.noise_gain = 'release', 0.0
            motion = Motion(ee.copy(), yaw_now, ee.copy(), yaw_now, GRIPPER_OPEN)  # arm still
        elif in_hand:
            motion = self._carry(obs, ee, yaw_now, box_in_gripper)
        elif self._placed(obs):
            motion = self._release_or_retreat(obs, ee, yaw_now, opening)
        else:
            motion = self._grasp(obs, ee, yaw_now, opening)

        q_cmd = self._joints_for(motion, q_arm)
        effort = (None if obs.joint_efforts is None
                  else float(obs.joint_efforts[self._gripper_index]))
        decision = self.gate.apply(motion.gripper, obs.ee_position, pad[:3],
                                   measured_gripper=opening, measured_effort=effort)
        self.gate_decisions.append(decision)
        action = np.empty(self.env.contract.num_joints)
        action[self._arm_index] = q_cmd
        action[self._gripper_index] = decision.command
        self.tick += 1
        return action

    def _joints_for(self, motion: Motion, q_arm: np.ndarray) -> np.ndarray:
        """Arm joints for this tick's Cartesian step; where the measured arm is off the
        usual branch (pushed against a joint limit, or to a pose it cannot reach pointing
        down) the step has no good solution, and the arm moves in joint space toward the
        goal's solution on the usual branch instead."""
        cfg = self.config
        rotation = down_rotation(motion.yaw)
        q_cmd, error, rotation_error = self.ik.solve_checked(motion.target, rotation, q_arm)
        if error <= cfg.ik_tolerance_m and rotation_error <= cfg.ik_rotation_tolerance_rad:
            self.max_ik_error_m = max(self.max_ik_error_m, error)
            self.recovering = False
            return q_cmd
        self.recovering = True
        goal = motion.goal
        q_goal, _, _ = self.ik.solve_checked(goal, down_rotation(motion.goal_yaw),
                                             self._usual_posture(goal, motion.goal_yaw))
        step = np.clip(q_goal - q_arm, -cfg.recovery_joint_step_rad, cfg.recovery_joint_step_rad)
        return q_arm + step

    def _place_goal(self, obs: SimObservation, ee: np.ndarray, yaw_now: float,
                    box_in_gripper: np.ndarray) -> tuple[np.ndarray, float, float]:
        """Where the tool centre point must be for the held box to sit on the pad, aligned:
        ``(xy, z, gripper yaw)``."""
        box, pad = obs.box_pose, obs.pad_pose
        relative_yaw = _fold_quarter(wrap_angle(box[3] - yaw_now))
        self._place_yaw = self._choose_yaw(pad[:2], pad[3] - relative_yaw, self._place_yaw)
        offset = down_rotation(self._place_yaw) @ box_in_gripper
        xy = pad[:2] - offset[:2]
        z = pad[2] + self._box_half + self.config.place_clearance_m - offset[2]
        return xy, z, self._place_yaw

    def _landed(self, obs: SimObservation, ee: np.ndarray, box_in_gripper: np.ndarray,
                yaw_now: float) -> bool:
        """The held box has come down on the pad at its target: time to let go."""
        cfg = self.config
        box, pad = obs.box_pose, obs.pad_pose
        lowest = obs.box_lowest_z
        if lowest is None:
            lowest = box[2] - self._box_half
        if lowest - pad[2] > cfg.land_height_m:
            return False
        xy, _, _ = self._place_goal(obs, ee, yaw_now, box_in_gripper)
        return float(np.linalg.norm(xy - ee[:2])) <= cfg.land_position_tol_m

    def _carry(self, obs, ee, yaw_now, box_in_gripper):
        cfg = self.config
        xy, z, yaw_goal = self._place_goal(obs, ee, yaw_now, box_in_gripper)
        position_error = float(np.linalg.norm(xy - ee[:2]))
        yaw_error = abs(math.degrees(wrap_angle(yaw_goal - yaw_now)))
        floor = self._funnel_height(z, position_error, yaw_error, cfg.carry_height_m)
        target = self._step_target(ee, xy, z, floor, cfg.place_speed_per_tick_m)
        goal = np.array([xy[0], xy[1], max(z, floor)])
        if position_error > cfg.over_target_m:
            lifting = floor >= cfg.carry_height_m - 1e-6 and ee[2] < cfg.carry_height_m - 0.01
            self.phase = 'lift' if lifting else 'carry'
        else:
            self.phase = 'place'  # over the target: the descent onto the pad
        self.noise_gain = self._noise_gain(position_error, cfg.land_position_tol_m)
        return Motion(target, self._yaw_step(yaw_now, yaw_goal), goal, yaw_goal, GRIPPER_CLOSED)

    def _release_or_retreat(self, obs, ee, yaw_now, opening):
        cfg = self.config
        box = obs.box_pose
        self.noise_gain = 0.0
        near = float(np.linalg.norm(box[:3] - ee)) <= cfg.release_distance_m
        if near and opening < cfg.open_opening:
            self.phase = 'release'
            return Motion(ee.copy(), yaw_now, ee.copy(), yaw_now, GRIPPER_OPEN)  # arm still
        self.phase = 'retreat'
        # Rise slowly while the fingers are beside the box, faster above it.
        height = ee[2] - (box[2] + self._box_half)
        speed = min(cfg.retreat_speed_per_tick_m, cfg.min_speed_per_tick_m + 0.1 * max(0.0, height))
        goal_z = max(ee[2], cfg.retreat_height_m)
        z = min(goal_z, ee[2] + speed)
        return Motion(np.array([ee[0], ee[1], z]), yaw_now, np.array([ee[0], ee[1], goal_z]),
                      yaw_now, GRIPPER_OPEN)

    def _grasp(self, obs, ee, yaw_now, opening):
        cfg = self.config
        box = obs.box_pose
        self._place_yaw = None
        self._grasp_yaw = self._choose_yaw(box[:2], box[3], self._grasp_yaw)
        grasp_z = box[2] + cfg.grasp_above_centre_m
        position_error, _, yaw_error = self._grasp_errors(box, ee, yaw_now)
        top = grasp_z + cfg.hover_above_grasp_m
        floor = self._funnel_height(grasp_z, position_error, yaw_error, top)
        if self._at_grasp_pose(box, ee, yaw_now):
            self.phase, self.noise_gain = 'close', 0.0
            grasp = np.array([box[0], box[1], grasp_z])
            return Motion(grasp, self._grasp_yaw, grasp, self._grasp_yaw, GRIPPER_CLOSED)
        if opening < cfg.open_opening and not self._fingers_clear(box, ee, opening):
            # Fingers closed (or closing) away from the grasp pose: open them before
            # going near the box, and stay high meanwhile.
            floor = top
        target = self._step_target(ee, box[:2], grasp_z, floor, cfg.descend_speed_per_tick_m)
        goal = np.array([box[0], box[1], max(grasp_z, floor)])
        self.phase = 'descend' if floor < top - 1e-6 else 'approach'
        self.noise_gain = self._noise_gain(position_error, cfg.close_position_tol_m)
        return Motion(target, self._yaw_step(yaw_now, self._grasp_yaw), goal, self._grasp_yaw,
                      GRIPPER_OPEN)

    def _noise_gain(self, position_error: float, tolerance: float) -> float:
        """Exploration noise that suits this tick: full far from the goal, fading to none
        as the fingers line up over it (the descent must stay possible)."""
        return min(1.0, max(0.0, (position_error - tolerance) / self.config.noise_fade_m))

    def _fingers_clear(self, box: np.ndarray, ee: np.ndarray, opening: float) -> bool:
        """Half-open fingers still fit around the box: opening while descending is fine."""
        return opening > self._box_opening + 0.15

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
