"""Scripted experts for gym-aloha's tasks, made the ACT paper's way.

The paper scripted its demonstrations in the end-effector variant of each task, where
two mocap bodies welded to the grippers follow a waypoint plan, and replayed the joint
trajectory this produced in the joint-space task, whose episodes become the dataset. The
same here:

1. :func:`plan_transfer_cube` turns the cube's start pose into a waypoint plan for each
   arm (position, orientation, gripper opening at given steps), linearly interpolated
   (orientation by slerp) between waypoints;
2. :func:`end_effector_rollout` runs the plan in gym-aloha's end-effector task (no
   rendering) and records, per step, the 12 arm joints it reached and the two gripper
   commands: the joint-space trajectory;
3. :class:`JointTrajectoryExpert` replays that trajectory in :class:`~act_ros.sim.aloha.env.AlohaEnv`
   step by step (the dataset's actions), and the episode counts only if the joint-space
   task succeeds (reward 4), as the paper kept only successful replays.

The plan is open loop in the object's start pose: it labels the states of its own
replay, not arbitrary ones (no DAgger labels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from act_ros.sim.aloha.env import (
    ALOHA_JOINTS,
    AlohaEnv,
    AlohaTaskSpec,
    build_environment,
    object_poses,
    task_spec,
)

# The step at which the right arm has brought the cube to the meeting point: the left
# arm's grasp is planned again from where the cube is then (the arms follow their mocap
# targets only to within centimetres, the cube's hold in the right gripper varies).
RECEIVE_REPLAN_STEP = 220
# Where the right arm's shoulder stands on the table (gym-aloha's vx300s_right body).
RIGHT_BASE_XY = (0.469, 0.5)
# Half the cube's edge (gym-aloha's red_box: a 4 cm cube); it rests with its centre there.
CUBE_HALF_M = 0.02


# ---------------------------------------------------------------------- quaternions (w x y z)
def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b`` of two quaternions ``(w, x, y, z)``."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw])


def axis_angle_quat(axis: Sequence[float], degrees: float) -> np.ndarray:
    """The rotation of ``degrees`` about ``axis`` as a unit quaternion ``(w, x, y, z)``."""
    axis = np.asarray(axis, dtype=np.float64)
    axis = axis / np.linalg.norm(axis)
    half = math.radians(degrees) / 2
    return np.array([math.cos(half), *(math.sin(half) * axis)])


def slerp(a: np.ndarray, b: np.ndarray, fraction: float) -> np.ndarray:
    """Spherical interpolation from ``a`` (fraction 0) to ``b`` (1), shortest way."""
    a = a / np.linalg.norm(a)
    b = b / np.linalg.norm(b)
    dot = float(np.dot(a, b))
    if dot < 0.0:
        b, dot = -b, -dot
    if dot > 0.9995:
        q = a + fraction * (b - a)
        return q / np.linalg.norm(q)
    theta = math.acos(dot)
    return (math.sin((1 - fraction) * theta) * a + math.sin(fraction * theta) * b) / math.sin(theta)


# ---------------------------------------------------------------------- waypoint plans
@dataclass(frozen=True)
class Waypoint:
    """Where one gripper should be at step ``step``: position (m, world), orientation
    ``(w, x, y, z)`` and opening (normalized, 0 closed, 1 open)."""

    step: int
    xyz: np.ndarray
    quat: np.ndarray
    gripper: float


def interpolate(plan: Sequence[Waypoint], step: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The pose and opening a plan asks for at ``step`` (held after its last waypoint)."""
    if step <= plan[0].step:
        first = plan[0]
        return first.xyz.copy(), first.quat.copy(), first.gripper
    for before, after in zip(plan, plan[1:]):
        if before.step <= step <= after.step:
            f = (step - before.step) / (after.step - before.step)
            return (before.xyz + f * (after.xyz - before.xyz), slerp(before.quat, after.quat, f),
                    before.gripper + f * (after.gripper - before.gripper))
    last = plan[-1]
    return last.xyz.copy(), last.quat.copy(), last.gripper


@dataclass(frozen=True)
class BimanualPlan:
    """A waypoint plan per arm."""

    left: tuple[Waypoint, ...]
    right: tuple[Waypoint, ...]

    def action(self, step: int) -> np.ndarray:
        """The end-effector task's action at ``step`` (16,): per arm position, orientation
        and gripper opening, left arm first."""
        parts = []
        for plan in (self.left, self.right):
            xyz, quat, gripper = interpolate(plan, step)
            parts += [xyz, quat, [gripper]]
        return np.concatenate(parts)

    def grippers(self, step: int) -> tuple[float, float]:
        """The two planned gripper openings at ``step`` (left, right)."""
        return interpolate(self.left, step)[2], interpolate(self.right, step)[2]


@dataclass(frozen=True)
class GraspFrames:
    """Where each gripper's grasp centre (the midpoint of its two fingers) lies in the frame
    of the mocap body that drives it, from the scene's weld constraints and finger
    geometry: a waypoint names where the grasp centre should be, and the mocap target is
    ``centre - R(quat) @ offset``."""

    left: np.ndarray
    right: np.ndarray

    def mocap_target(self, side: str, centre: np.ndarray, quat: np.ndarray) -> np.ndarray:
        """The mocap position that puts the ``side`` gripper's grasp centre at ``centre``
        with orientation ``quat``."""
        return np.asarray(centre, dtype=np.float64) - quat_to_matrix(quat) @ getattr(self, side)


def quat_to_matrix(quat: np.ndarray) -> np.ndarray:
    """Rotation matrix of a unit quaternion ``(w, x, y, z)``."""
    w, x, y, z = np.asarray(quat, dtype=np.float64) / np.linalg.norm(quat)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def grasp_frames(physics) -> GraspFrames:
    """:class:`GraspFrames` of gym-aloha's end-effector scene (``physics`` after reset).

    MuJoCo holds each gripper link at ``mocap * relpose`` (the weld's relative pose, which
    gym-aloha's scene leaves for MuJoCo to derive from the reference configuration); the
    grasp centre is the midpoint of the two fingers' bounding boxes in the link's frame.
    """
    model, data = physics.model, physics.data
    offsets = {}
    for index, side in enumerate(('left', 'right')):
        link = model.name2id(f'vx300s_{side}/gripper_link', 'body')
        rotation = data.xmat[link].reshape(3, 3)
        centres = []
        for finger in ('left', 'right'):
            geom = model.name2id(f'vx300s_{side}/10_{finger}_gripper_finger', 'geom')
            centres.append(data.geom_xpos[geom]
                           + data.geom_xmat[geom].reshape(3, 3) @ model.geom_aabb[geom][:3])
        in_link = rotation.T @ (np.mean(centres, axis=0) - data.xpos[link])
        relpose = model.eq_data[index]  # anchor (3), relpose position (3), quaternion (4)
        offsets[side] = relpose[3:6] + quat_to_matrix(relpose[6:10]) @ in_link
    return GraspFrames(left=offsets['left'], right=offsets['right'])


@dataclass(frozen=True)
class TransferCubeSettings:
    """The transfer-cube plan's geometry (m, deg): grasp-centre heights relative to the
    resting cube's centre, the meeting point and the grippers' tilts."""

    approach_height_m: float = 0.08   # above the cube before going down
    grasp_height_m: float = 0.01      # grasp centre relative to the cube's centre
    meet_xyz: tuple[float, float, float] = (0.0, 0.5, 0.25)  # where the cube is handed over
    receive_offset_x_m: float = -0.02  # left grasp centre beside the cube's centre
    receive_standoff_m: float = 0.1    # the left gripper waits this far left of the cube
    pick_tilt_deg: float = -60.0       # right gripper pitched towards the cube
    # Right gripper turned about the vertical to point from the arm's base at the cube
    # (0: along the table's x axis whatever the cube's place; 1: straight at it).
    pick_yaw_gain: float = 1.0
    receive_roll_deg: float = 90.0     # left gripper turned to close across the right's fingers
    # The steps at which each arm's mocap target is corrected for the weld's sag
    # (MocapTracker): the left arm until it closes on the cube, the right once it holds it
    # (before, its lag above the cube is part of the grasp the plan was tuned with).
    tracked_steps: dict = field(default_factory=lambda: {
        'left': ((0, 290),), 'right': ((175, 400),)})
    # Replay: each arm joint target taken this many steps ahead of the end-effector
    # rollout (the joint position servos lag their targets).
    replay_lead_steps: int = 2


def plan_transfer_cube(cube_xyz: np.ndarray, left_start: np.ndarray, right_start: np.ndarray,
                       frames: GraspFrames, episode_steps: int = 400,
                       settings: TransferCubeSettings = TransferCubeSettings(),
                       held_xyz: np.ndarray | None = None) -> BimanualPlan:
    """Transfer cube: the right arm grasps the cube from above, tilted towards it, lifts it
    to the meeting point and lets go once the left arm, turned to face it, has closed on
    the cube; both arms then back away. ``cube_xyz``: the resting cube's centre;
    ``left_start``/``right_start``: the mocap poses at reset (position, quaternion). Timing
    as the paper's 400-step episodes. Waypoints name grasp-centre positions (``frames``
    turns them into mocap targets). ``held_xyz``: where the lifted cube's centre is, once
    measured (:data:`RECEIVE_REPLAN_STEP`); before that, where the plan expects it."""
    s = settings
    cube = np.asarray(cube_xyz, dtype=np.float64)
    meet = np.asarray(s.meet_xyz, dtype=np.float64)
    right_q0, left_q0 = right_start[3:7], left_start[3:7]
    # Pointed from the right arm's base at the cube: a cube off the arm's axis is reached
    # with the wrist straight (a fixed heading misses cubes near the base's corners).
    dx, dy = cube[0] - RIGHT_BASE_XY[0], cube[1] - RIGHT_BASE_XY[1]
    heading = math.degrees(math.atan2(-dy, -dx)) * s.pick_yaw_gain  # 0: along -x
    pick_q = quat_multiply(axis_angle_quat([0, 0, 1], heading),
                           quat_multiply(right_q0, axis_angle_quat([0, 1, 0], s.pick_tilt_deg)))
    receive_q = axis_angle_quat([1, 0, 0], s.receive_roll_deg)
    # Where the cube hangs once lifted: the right grasp centre carries it at the same
    # offset as at the grasp (the right gripper keeps its orientation), until measured.
    expected = meet - [0, 0, s.grasp_height_m]
    held = expected if held_xyz is None else np.asarray(held_xyz, dtype=np.float64)
    receive = held + [s.receive_offset_x_m, 0, 0]
    standoff = expected + [s.receive_offset_x_m - s.receive_standoff_m, 0, 0]
    end = max(episode_steps, 360)

    def right(step, centre, gripper):
        return Waypoint(step, frames.mocap_target('right', centre, pick_q), pick_q, gripper)

    def left(step, centre, gripper):
        return Waypoint(step, frames.mocap_target('left', centre, receive_q), receive_q, gripper)

    right_plan = (
        Waypoint(0, right_start[:3], right_q0, 0.0),
        right(90, cube + [0, 0, s.approach_height_m], 1.0),   # above the cube, open
        right(130, cube + [0, 0, s.grasp_height_m], 1.0),     # down around it
        right(170, cube + [0, 0, s.grasp_height_m], 0.0),     # close
        right(200, meet + [0.05, 0, 0], 0.0),                 # lift towards the meeting point
        right(220, meet, 0.0),
        right(310, meet, 1.0),                                # let go: the left arm holds it
        right(360, meet + [0.1, 0, 0], 1.0),                  # back away
        right(end, meet + [0.1, 0, 0], 1.0),
    )
    left_plan = (
        Waypoint(0, left_start[:3], left_q0, 0.0),
        left(100, standoff, 1.0),                                # beside the meeting point
        left(260, receive, 1.0),                                 # around the held cube
        left(310, receive, 0.0),                                 # close
        left(360, receive - [s.receive_standoff_m, 0, 0], 0.0),  # take it away
        left(end, receive - [s.receive_standoff_m, 0, 0], 0.0),
    )
    return BimanualPlan(left=left_plan, right=right_plan)


# ---------------------------------------------------------------------- end-effector rollout
def _end_effector_environment(spec: AlohaTaskSpec, poses: np.ndarray):
    """gym-aloha's end-effector task of ``spec`` with the objects at ``poses`` (its own
    reset draws them from an unseeded generator; here they follow the episode's seed)."""
    env = build_environment(spec, end_effector=True)
    task = env.task
    base_initialize = type(task).__mro__[1].initialize_episode  # gym-aloha's task class

    def initialize_episode(physics) -> None:
        base_initialize(task, physics)  # robots, mocaps and randomly drawn objects ...
        start = 16  # ... then the objects where the seed puts them: qpos after the 16 arm dofs
        physics.data.qpos[start:start + poses.size] = poses
        physics.forward()

    task.initialize_episode = initialize_episode
    return env


class MocapTracker:
    """Integral correction of the mocap targets, so that each gripper link reaches the
    pose the plan asks for.

    The welds pulling the passive arms after the mocap bodies are soft (gym-aloha's
    ``solimp .25 .25``), so the links sag under gravity and lag by centimetres: enough to
    miss a 4 cm cube in the hand-over. Each step the error between where the plan puts
    the link (mocap target times the weld's relative pose) and where it is accumulates
    into an offset added to the targets (``gain`` per step, at most ``limit_m``).
    """

    def __init__(self, physics, gain: float = 0.05, limit_m: float = 0.08, *,
                 measured=None) -> None:
        self.physics = physics
        self.gain = gain
        self.limit_m = limit_m
        # Where the gripper links are measured: the end-effector simulation itself, or the
        # joint-space one it drives (``measured``, same arms).
        self.measured = measured if measured is not None else physics
        self._links = [self.measured.model.name2id(f'vx300s_{side}/gripper_link', 'body')
                       for side in ('left', 'right')]
        self._relpose = [physics.model.eq_data[i, 3:6].copy() for i in range(2)]
        self.offsets = [np.zeros(3), np.zeros(3)]

    def corrected(self, action: np.ndarray, hold: Sequence[str] = ()) -> np.ndarray:
        """The end-effector action with each arm's position target corrected; the arms in
        ``hold`` keep their offset unchanged this step (a gripper pressing on an object
        would otherwise push harder and harder)."""
        action = np.asarray(action, dtype=np.float64).copy()
        data = self.measured.data
        for arm, base in enumerate((0, 8)):
            target, quat = action[base:base + 3], action[base + 3:base + 7]
            wanted = target + quat_to_matrix(quat) @ self._relpose[arm]
            error = wanted - data.xpos[self._links[arm]]
            held = ('left', 'right')[arm] in hold
            offset = self.offsets[arm] + (0.0 if held else self.gain) * error
            norm = float(np.linalg.norm(offset))
            if norm > self.limit_m:
                offset *= self.limit_m / norm
            self.offsets[arm] = offset
            action[base:base + 3] = target + offset
        return action


@dataclass(frozen=True)
class JointTrajectory:
    """The joint-space targets of one planned episode: ``actions`` (T, 14) in
    :data:`~act_ros.sim.aloha.env.ALOHA_JOINTS` order, and how the end-effector rollout
    itself scored (``ee_max_reward``)."""

    seed: int
    actions: np.ndarray
    ee_max_reward: float


def end_effector_rollout(task: str, seed: int, episode_steps: int | None = None, *,
                         settings: TransferCubeSettings = TransferCubeSettings()
                         ) -> JointTrajectory:
    """Run the scripted plan of episode ``seed`` in the end-effector task; return the joint
    trajectory it produced (the arm joints reached after each step, the planned gripper
    openings)."""
    spec = task_spec(task)
    if spec.name != 'transfer_cube':
        raise NotImplementedError(f"no scripted expert for '{spec.name}' yet (transfer_cube has one)")
    steps = int(episode_steps or spec.episode_steps)
    poses = object_poses(spec, seed)
    env = _end_effector_environment(spec, poses)
    try:
        env.reset()
        physics = env.physics
        left_start = np.concatenate([physics.data.mocap_pos[0], physics.data.mocap_quat[0]])
        right_start = np.concatenate([physics.data.mocap_pos[1], physics.data.mocap_quat[1]])
        cube = poses[:3] - [0, 0, poses[2] - CUBE_HALF_M]  # resting on the table
        frames = grasp_frames(physics)
        plan = plan_transfer_cube(cube, left_start, right_start, frames, steps, settings)
        actions = np.empty((steps, len(ALOHA_JOINTS)))
        max_reward = 0.0
        # MuJoCo's joint limits are soft: a joint can pass its range by a few mrad (a wrist
        # at 3.1566 against 3.14158); the targets replayed stay inside the servo ranges.
        arm_qpos = np.r_[0:6, 8:14]
        low, high = _qpos_ranges(physics, arm_qpos)
        tracker = MocapTracker(physics)
        cube_qpos = 16  # the cube's free joint follows the 16 arm dofs
        for step in range(steps):
            if step == RECEIVE_REPLAN_STEP:
                plan = plan_transfer_cube(cube, left_start, right_start, frames, steps, settings,
                                          held_xyz=physics.data.qpos[cube_qpos:cube_qpos + 3])
            # An arm's offset is held outside its tracked steps: while its gripper goes down
            # to and closes on what it grasps (it would press harder and harder).
            hold = [arm for arm, windows in settings.tracked_steps.items()
                    if not any(first <= step < last for first, last in windows)]
            timestep = env.step(tracker.corrected(plan.action(step), hold))
            max_reward = max(max_reward, float(timestep.reward or 0.0))
            qpos = physics.data.qpos
            left_grip, right_grip = plan.grippers(step)
            arm = np.clip(qpos[arm_qpos], low, high)
            actions[step, 0:6] = arm[:6]
            actions[step, 6] = left_grip
            actions[step, 7:13] = arm[6:]
            actions[step, 13] = right_grip
    finally:
        env.physics.free()
    lead = settings.replay_lead_steps
    if lead:
        arm = [i for i in range(len(ALOHA_JOINTS)) if i not in (6, 13)]
        ahead = np.concatenate([actions[lead:], np.repeat(actions[-1:], lead, axis=0)])
        actions[:, arm] = ahead[:, arm]
    return JointTrajectory(seed=int(seed), actions=actions, ee_max_reward=max_reward)


def _qpos_ranges(physics, qpos_indices) -> tuple[np.ndarray, np.ndarray]:
    """The range of the hinge joints at ``qpos_indices`` (from the model; unbounded where a
    joint has none)."""
    model = physics.model
    low = np.full(len(qpos_indices), -np.inf)
    high = np.full(len(qpos_indices), np.inf)
    for joint in range(model.njnt):
        where = np.flatnonzero(np.asarray(qpos_indices) == model.jnt_qposadr[joint])
        if where.size and model.jnt_limited[joint]:
            low[where], high[where] = model.jnt_range[joint]
    return low, high


class JointTrajectoryExpert:
    """Replays a :class:`JointTrajectory` in the joint-space task, one target per step."""

    def __init__(self, trajectory: JointTrajectory) -> None:
        self.trajectory = trajectory

    def act(self, step_index: int) -> np.ndarray:
        """The target of step ``step_index`` (the last one held beyond the end)."""
        actions = self.trajectory.actions
        return actions[min(step_index, len(actions) - 1)].copy()


def replay(env: AlohaEnv, trajectory: JointTrajectory, on_step=None):
    """Replay ``trajectory`` in ``env`` (reset with the trajectory's seed; an env that does
    not end at success plays the whole of it); ``on_step(obs, action)`` sees every step
    before it is taken. Returns the joint-space episode's result."""
    expert = JointTrajectoryExpert(trajectory)
    obs = env.reset(trajectory.seed)
    while not env.done:
        action = expert.act(env.step_index)
        if on_step is not None:
            on_step(obs, action)
        obs = env.step(action)
    return env.evaluate()
