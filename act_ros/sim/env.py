"""The port-pick-align environment: reset from a seed, step with joint targets, evaluate."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Self

import mujoco
import numpy as np

from act_ros.core.contract import Contract, load_contract
from act_ros.core.object_state import environment_state, symmetric_yaw, tilt_deg
from act_ros.sim.config import SimConfig
from act_ros.sim.metrics import LIFT_HEIGHT_M, EpisodeResult, failure_phase, symmetric_yaw_error_deg
from act_ros.sim.scene import BOX_BODY, CAMERAS, EE_SITE, FINGER_JOINTS, FINGER_LINKS, PAD_BODY, build_model


@dataclass(frozen=True)
class SimObservation:
    """One observation, world frame (table top at z = 0, base axis at x = y = 0).

    ``joint_positions``: contract order, radians, gripper normalized (0 closed, 1 open).
    ``ee_position``: tool centre point between the fingers (URDF ``ee_link``).
    ``box_pose``: box centre ``(x, y, z, yaw)``, the yaw of the cube on whichever face it
    rests (:func:`~act_ros.core.object_state.symmetric_yaw`, meaningful modulo 90
    degrees); ``pad_pose``: pad centre on its top face ``(x, y, z_top, yaw)``, yaw along
    the pad's stripe. ``images``: camera name to an ``HxWx3`` uint8 RGB array (empty when
    rendering is off).
    """

    images: dict[str, np.ndarray]
    joint_positions: np.ndarray
    ee_position: np.ndarray
    box_pose: np.ndarray
    pad_pose: np.ndarray
    step_index: int
    time_s: float
    box_quaternion: np.ndarray | None = None  # (w, x, y, z); None where only the yaw is known
    box_half_m: float = 0.015
    # Actuator efforts in contract order: N m for the arm joints, the gripper's mean finger
    # force in N (negative: closing); what sim_bridge publishes as JointState.effort.
    joint_efforts: np.ndarray | None = None

    @property
    def box_lowest_z(self) -> float | None:
        """Height of the box's lowest corner (a tilted box touches down there first), or
        None without its orientation."""
        if self.box_quaternion is None:
            return None
        from act_ros.core.object_state import quaternion_to_matrix

        rotation = quaternion_to_matrix(self.box_quaternion)
        return float(self.box_pose[2] - self.box_half_m * np.abs(rotation[2, :]).sum())

    @property
    def environment_state(self) -> np.ndarray:
        """The object poses as the policy feature ``observation.environment_state``."""
        return environment_state(self.box_pose[:3], self.box_pose[3], self.pad_pose[:3],
                                 self.pad_pose[3])


@dataclass(frozen=True)
class EpisodeLayout:
    """The randomized part of an episode: object poses and the start joints."""

    seed: int
    box_pose: np.ndarray = field(repr=False)   # (x, y, yaw)
    pad_pose: np.ndarray = field(repr=False)   # (x, y, yaw)
    start_joints: np.ndarray = field(repr=False)


def yaw_quat(yaw: float) -> np.ndarray:
    return np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


def sample_layout(config: SimConfig, seed: int, lower: np.ndarray,
                  upper: np.ndarray) -> EpisodeLayout:
    """Draw box pose, pad pose and start joints from ``seed`` (same seed, same layout).

    Positions are redrawn until both lie within ``[reach_min_m, reach_max_m]`` of the base
    axis and at least ``min_separation_m`` apart.
    """
    rng = np.random.default_rng(seed)

    def draw_xy(xr, yr) -> np.ndarray:
        for _ in range(10_000):
            xy = np.array([rng.uniform(*xr), rng.uniform(*yr)])
            if config.reach_min_m <= np.hypot(*xy) <= config.reach_max_m:
                return xy
        raise ValueError(f'no position in x {xr}, y {yr} lies within reach '
                         f'[{config.reach_min_m}, {config.reach_max_m}] m')

    box_xy = draw_xy(config.box_x_range_m, config.box_y_range_m)
    for _ in range(10_000):
        pad_xy = draw_xy(config.pad_x_range_m, config.pad_y_range_m)
        if np.linalg.norm(pad_xy - box_xy) >= config.min_separation_m:
            break
    else:
        raise ValueError(f'could not place the pad {config.min_separation_m} m from the box; '
                         'the randomization ranges are too tight')
    box_yaw = math.radians(rng.uniform(*config.box_yaw_range_deg))
    pad_yaw = math.radians(rng.uniform(*config.pad_yaw_range_deg))
    start = np.array(config.home_joint_positions, dtype=np.float64)
    start[:5] += rng.uniform(-config.home_noise_rad, config.home_noise_rad, 5)
    start = np.clip(start, lower, upper)
    return EpisodeLayout(seed, np.array([*box_xy, box_yaw]), np.array([*pad_xy, pad_yaw]), start)


FLAT_TOLERANCE_DEG = 10.0  # a box resting on the pad: one face within this of level


class PortPickAlignEnv:
    """Pick the box and place it aligned on the pad; 30 Hz joint-position control.

    ``step(action)`` takes joint targets in contract order (gripper normalized), clips them
    to the joint limits (the servos cannot go further), runs the physics for one control
    period and returns the next :class:`SimObservation`. The simulation does what it is
    told: an opened gripper lets go, a dropped box falls.
    """

    def __init__(self, config: SimConfig | None = None, contract: Contract | None = None) -> None:
        self.config = config or SimConfig.from_yaml()
        self.contract = contract or load_contract(self.config.contract_path)
        if self.contract.num_joints != 6:
            raise ValueError(f'the simulated arm has 6 joints, the contract has '
                             f'{self.contract.num_joints}: {list(self.contract.joint_names)}')
        self.model, self.urdf = build_model(self.config)
        self.data = mujoco.MjData(self.model)
        self.finger_open_m = float(self.urdf.joints[FINGER_JOINTS[0]].upper)
        grippers = self.contract.grippers
        if len(grippers) != 1 or (grippers[0].closed, grippers[0].open) != (0.0, 1.0):
            raise ValueError('the simulated arm has one gripper, normalized (closed 0, open 1); '
                             f'the contract has {[(g.joint, g.closed, g.open) for g in grippers]}')
        self._arm_names = list(self.contract.arm_joint_names)
        self.arm_index = [self.contract.joint_names.index(n) for n in self._arm_names]
        self.gripper_index = self.contract.gripper_indices[0]
        missing = [n for n in self._arm_names
                   if mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, n) < 0]
        if missing:
            raise ValueError(f'contract joints {missing} are not joints of the robot model')
        self._arm_qadr = np.array([self.model.joint(n).qposadr[0] for n in self._arm_names])
        self._arm_act = np.array([self.model.actuator(n).id for n in self._arm_names])
        self._finger_qadr = np.array([self.model.joint(n).qposadr[0] for n in FINGER_JOINTS])
        self._finger_act = np.array([self.model.actuator(n).id for n in FINGER_JOINTS])
        self._box_qadr = self.model.joint('box_free').qposadr[0]
        self._box_vadr = self.model.joint('box_free').dofadr[0]
        self._box_body = self.model.body(BOX_BODY).id
        self._pad_mocap = self.model.body(PAD_BODY).mocapid[0]
        self._ee_site = self.model.site(EE_SITE).id
        self._finger_geoms = {g for g in range(self.model.ngeom)
                              if self.model.geom_bodyid[g] in
                              {self.model.body(n).id for n in FINGER_LINKS}}
        self._box_geom = self.model.geom('box_geom').id
        self._renderer: mujoco.Renderer | None = None
        self._seed_source = np.random.default_rng()
        self.layout: EpisodeLayout | None = None
        self.step_index = 0
        self.max_box_height_m = 0.0
        self.max_lifted_tilt_deg = 0.0

    # ----------------------------------------------------------------- episode control
    @property
    def fps(self) -> int:
        """Control steps per second."""
        return self.config.fps

    @property
    def episode_steps(self) -> int:
        """Control steps per episode."""
        return self.config.episode_steps

    @property
    def seed(self) -> int | None:
        """The seed of the episode (None before the first reset)."""
        return self.layout.seed if self.layout is not None else None

    @property
    def done(self) -> bool:
        """True once ``episode_steps`` control steps have run."""
        return self.layout is not None and self.step_index >= self.config.episode_steps

    def reset(self, seed: int | None = None) -> SimObservation:
        """Start an episode; the same ``seed`` gives the same episode (``None``: a fresh seed)."""
        if seed is None:
            seed = int(self._seed_source.integers(0, 2**31 - 1))
        self.layout = sample_layout(self.config, int(seed), self.contract.lower,
                                    self.contract.upper)
        mujoco.mj_resetData(self.model, self.data)
        start = self.layout.start_joints
        self.data.qpos[self._arm_qadr] = start[self.arm_index]
        self.data.qpos[self._finger_qadr] = start[self.gripper_index] * self.finger_open_m
        bx, by, byaw = self.layout.box_pose
        self.data.qpos[self._box_qadr:self._box_qadr + 7] = [
            bx, by, self.config.box_size_m / 2, *yaw_quat(byaw)]
        px, py, pyaw = self.layout.pad_pose
        self.data.mocap_pos[self._pad_mocap] = [px, py, 0.0]
        self.data.mocap_quat[self._pad_mocap] = yaw_quat(pyaw)
        self._set_ctrl(start)
        mujoco.mj_forward(self.model, self.data)
        self.step_index = 0
        self.max_box_height_m = 0.0
        self.max_lifted_tilt_deg = 0.0
        return self.observe()

    def step(self, action: np.ndarray) -> SimObservation:
        """Apply joint targets for one control period and return the next observation."""
        if self.layout is None:
            raise RuntimeError('call reset() before step()')
        if self.done:
            raise RuntimeError(f'episode is over ({self.config.episode_steps} steps); call reset()')
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (self.contract.num_joints,):
            raise ValueError(f'action must have {self.contract.num_joints} joint targets '
                             f'{list(self.contract.joint_names)}, got shape {action.shape}')
        if not np.all(np.isfinite(action)):
            raise ValueError(f'action must be finite, got {action}')
        self._set_ctrl(np.clip(action, self.contract.lower, self.contract.upper))
        mujoco.mj_step(self.model, self.data, nstep=self.config.substeps)
        self.step_index += 1
        box_bottom = self.data.xpos[self._box_body][2] - self.config.box_size_m / 2
        self.max_box_height_m = max(self.max_box_height_m, float(box_bottom))
        if box_bottom > LIFT_HEIGHT_M:
            tilt = tilt_deg(self.data.xmat[self._box_body].reshape(3, 3))
            self.max_lifted_tilt_deg = max(self.max_lifted_tilt_deg, tilt)
        return self.observe()

    def move_box(self, offset_xy: np.ndarray) -> bool:
        """Shift the box on the table by ``offset_xy`` (m), at rest: an outside push.

        Refused (returns False, nothing changed) when the box would overlap the arm there.
        """
        if self.layout is None:
            raise RuntimeError('call reset() before move_box()')
        adr, vadr = self._box_qadr, self._box_vadr
        saved_q = self.data.qpos[adr:adr + 7].copy()
        saved_v = self.data.qvel[vadr:vadr + 6].copy()
        self.data.qpos[adr:adr + 2] += np.asarray(offset_xy, dtype=np.float64)[:2]
        self.data.qvel[vadr:vadr + 6] = 0.0
        mujoco.mj_forward(self.model, self.data)
        box_bodies = {self._box_body}
        for i in range(self.data.ncon):
            contact = self.data.contact[i]
            bodies = {int(self.model.geom_bodyid[contact.geom1]),
                      int(self.model.geom_bodyid[contact.geom2])}
            other = bodies - box_bodies
            if bodies & box_bodies and other and contact.dist < -1e-4 \
                    and other != {0} and self.model.body(next(iter(other))).name != PAD_BODY:
                self.data.qpos[adr:adr + 7] = saved_q
                self.data.qvel[vadr:vadr + 6] = saved_v
                mujoco.mj_forward(self.model, self.data)
                return False
        return True

    def pose_scene(self, arm_joints: np.ndarray, opening: float,
                   box_pose: np.ndarray | None = None) -> SimObservation:
        """Place the arm (arm joints in contract order without the gripper, as
        :class:`~act_ros.sim.ik.ArmIK` solves them; gripper ``opening`` normalized)
        and, where given, the box (``x, y, z, yaw``) without simulating: a still scene to
        render (pose-supervised renders; the episode's layout and pad stay)."""
        if self.layout is None:
            raise RuntimeError('pose_scene needs a layout: call reset(seed) first')
        arm_joints = np.asarray(arm_joints, dtype=np.float64)
        if arm_joints.shape != (len(self._arm_qadr),) or not np.all(np.isfinite(arm_joints)):
            raise ValueError(f'arm_joints: expected {len(self._arm_qadr)} finite values, got '
                             f'{arm_joints.tolist()}')
        self.data.qpos[self._arm_qadr] = arm_joints
        self.data.qpos[self._finger_qadr] = float(np.clip(opening, 0.0, 1.0)) * self.finger_open_m
        if box_pose is not None:
            x, y, z, yaw = (float(v) for v in box_pose)
            self.data.qpos[self._box_qadr:self._box_qadr + 7] = [x, y, z, *yaw_quat(yaw)]
        self.data.qvel[:] = 0.0
        mujoco.mj_forward(self.model, self.data)
        return self.observe()

    def _set_ctrl(self, target: np.ndarray) -> None:
        self.data.ctrl[self._arm_act] = target[self.arm_index]
        self.data.ctrl[self._finger_act] = target[self.gripper_index] * self.finger_open_m

    # ----------------------------------------------------------------- state readout
    def joint_positions(self) -> np.ndarray:
        """Measured joints in contract order; gripper = mean finger opening, normalized."""
        q = np.empty(self.contract.num_joints)
        q[self.arm_index] = self.data.qpos[self._arm_qadr]
        opening_m = float(np.mean(self.data.qpos[self._finger_qadr]))
        q[self.gripper_index] = opening_m / self.finger_open_m
        return q

    def joint_efforts(self) -> np.ndarray:
        """Actuator efforts in contract order: N m per arm joint, the gripper's mean finger
        force in N (about -2.9 closed on the box, 0 closed on nothing or at rest)."""
        effort = np.empty(self.contract.num_joints)
        effort[self.arm_index] = self.data.actuator_force[self._arm_act]
        effort[self.gripper_index] = float(np.mean(self.data.actuator_force[self._finger_act]))
        return effort

    def box_pose(self) -> np.ndarray:
        pos = self.data.xpos[self._box_body]
        return np.array([*pos, symmetric_yaw(self.data.xmat[self._box_body].reshape(3, 3))])

    def pad_pose(self) -> np.ndarray:
        px, py, _ = self.data.mocap_pos[self._pad_mocap]
        top = self.config.pad_thickness_m
        q = self.data.mocap_quat[self._pad_mocap]
        return np.array([px, py, top, 2.0 * math.atan2(q[3], q[0])])

    def ee_position(self) -> np.ndarray:
        return self.data.site_xpos[self._ee_site].copy()

    def observe(self) -> SimObservation:
        """The current observation (renders the cameras when ``config.render``)."""
        return SimObservation(
            images=self.render() if self.config.render else {},
            joint_positions=self.joint_positions(),
            ee_position=self.ee_position(),
            box_pose=self.box_pose(),
            pad_pose=self.pad_pose(),
            step_index=self.step_index,
            time_s=self.step_index / self.config.fps,
            box_quaternion=self.data.xquat[self._box_body].copy(),
            box_half_m=self.config.box_size_m / 2,
            joint_efforts=self.joint_efforts(),
        )

    def render(self) -> dict[str, np.ndarray]:
        """Render every camera at the configured size: ``{name: HxWx3 uint8 RGB}``."""
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.config.camera_height,
                                             self.config.camera_width)
        images = {}
        for name in CAMERAS:
            self._renderer.update_scene(self.data, camera=name)
            images[name] = self._renderer.render().copy()
        return images

    def close(self) -> None:
        """Release the renderer (its GL context)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ----------------------------------------------------------------- scoring
    def box_touches_fingers(self) -> bool:
        for i in range(self.data.ncon):
            pair = {int(self.data.contact[i].geom1), int(self.data.contact[i].geom2)}
            if self._box_geom in pair and pair & self._finger_geoms:
                return True
        return False

    def evaluate(self) -> EpisodeResult:
        """Score the current state (at the episode end: the episode's result)."""
        if self.layout is None:
            raise RuntimeError('call reset() before evaluate()')
        cfg = self.config
        box, pad = self.box_pose(), self.pad_pose()
        offset = box[:2] - pad[:2]
        c, s = math.cos(pad[3]), math.sin(pad[3])
        local = np.array([c * offset[0] + s * offset[1], -s * offset[0] + c * offset[1]])
        # A cube may rest on any of its faces: flat = some face within 10 degrees of level.
        flat = tilt_deg(self.data.xmat[self._box_body].reshape(3, 3)) <= FLAT_TOLERANCE_DEG
        bottom = box[2] - cfg.box_size_m / 2
        on_pad = bool(np.all(np.abs(local) <= cfg.pad_size_m / 2) and flat
                      and abs(bottom - pad[2]) <= 0.003)
        speed = float(np.linalg.norm(self.data.qvel[self._box_vadr:self._box_vadr + 3]))
        still = speed <= cfg.box_still_speed_m_s
        opening = self.joint_positions()[self.gripper_index]
        released = bool(opening >= cfg.released_opening and not self.box_touches_fingers())
        position_error = float(np.linalg.norm(offset))
        yaw_error = symmetric_yaw_error_deg(box[3], pad[3])
        position_ok = position_error <= cfg.success_position_tol_m
        yaw_ok = yaw_error <= cfg.success_yaw_tol_deg
        success = bool(on_pad and still and released and position_ok and yaw_ok)
        return EpisodeResult(success=success, position_error_m=position_error,
                             yaw_error_deg=yaw_error, released=released, box_on_pad=on_pad,
                             box_still=bool(still), max_box_height_m=self.max_box_height_m,
                             steps=self.step_index, seed=self.layout.seed,
                             max_lifted_tilt_deg=self.max_lifted_tilt_deg,
                             final_joints=tuple(float(q) for q in self.joint_positions()),
                             failure_phase=failure_phase(
                                 success=success, max_box_height_m=self.max_box_height_m,
                                 released=released, box_on_pad=on_pad,
                                 position_ok=position_ok, yaw_ok=yaw_ok))
