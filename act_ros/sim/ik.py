"""Inverse kinematics of the simulated arm for top-down grasps (damped least squares).

The targets the task needs are "tool centre point at p, approach axis straight down,
fingers closing along yaw psi". The 5-joint arm reaches every such pose: the pan joint
points the arm plane at p, the three pitch joints set reach, height and the vertical
approach, and wrist_roll sets psi.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from act_ros.sim.scene import ARM_JOINTS, EE_SITE


def down_rotation(yaw: float) -> np.ndarray:
    """Gripper orientation for a top-down grasp: approach axis (z) along -z world,
    finger-closing axis (y) at angle ``yaw`` in the table plane."""
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[-s, c, 0.0],
                     [c, s, 0.0],
                     [0.0, 0.0, -1.0]])


def gripper_yaw(rotation: np.ndarray) -> float:
    """Yaw of the finger-closing axis (the gripper frame's y axis) in the table plane."""
    return math.atan2(rotation[1, 1], rotation[0, 1])


class ArmIK:
    """Forward and inverse kinematics of the end-effector site on a private ``MjData``."""

    def __init__(self, model: mujoco.MjModel, *, damping: float = 1e-2,
                 rotation_weight: float = 0.2, max_iterations: int = 50,
                 position_tolerance_m: float = 1e-5, rotation_tolerance_rad: float = 1e-4) -> None:
        self.model = model
        self.data = mujoco.MjData(model)
        self.damping = damping
        self.rotation_weight = rotation_weight
        self.max_iterations = max_iterations
        self.position_tolerance_m = position_tolerance_m
        self.rotation_tolerance_rad = rotation_tolerance_rad
        self._qadr = np.array([model.joint(n).qposadr[0] for n in ARM_JOINTS])
        self._dofs = np.array([model.joint(n).dofadr[0] for n in ARM_JOINTS])
        self.lower = np.array([model.joint(n).range[0] for n in ARM_JOINTS])
        self.upper = np.array([model.joint(n).range[1] for n in ARM_JOINTS])
        self._site = model.site(EE_SITE).id
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def forward(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Site position (3,) and rotation (3, 3) for arm joints ``q`` (5, ARM_JOINTS order)."""
        self.data.qpos[self._qadr] = q
        mujoco.mj_kinematics(self.model, self.data)
        return (self.data.site_xpos[self._site].copy(),
                self.data.site_xmat[self._site].reshape(3, 3).copy())

    def solve(self, position: np.ndarray, rotation: np.ndarray,
              q_init: np.ndarray) -> tuple[np.ndarray, float]:
        """Joints reaching the pose, iterating from ``q_init``; returns ``(q, position error)``.

        Damped least squares on the site Jacobian, clamped to the joint limits at each
        iteration. Starting from the previous tick's solution keeps the branch (elbow up,
        wrist roll near its last value), so consecutive targets give continuous joints.
        """
        q, position_error, _ = self._solve(position, rotation, q_init)
        return q, position_error

    def solve_checked(self, position: np.ndarray, rotation: np.ndarray,
                      q_init: np.ndarray) -> tuple[np.ndarray, float, float]:
        """:meth:`solve` that also returns the orientation error (rad) of the solution."""
        return self._solve(position, rotation, q_init)

    def _solve(self, position: np.ndarray, rotation: np.ndarray,
               q_init: np.ndarray) -> tuple[np.ndarray, float, float]:
        q = np.clip(np.asarray(q_init, dtype=np.float64), self.lower, self.upper)
        target_quat = np.empty(4)
        mujoco.mju_mat2Quat(target_quat, np.asarray(rotation, dtype=np.float64).ravel())
        quat = np.empty(4)
        rot_err = np.empty(3)
        pos_err = np.full(3, np.inf)
        w = self.rotation_weight
        for iteration in range(self.max_iterations + 1):
            self.data.qpos[self._qadr] = q
            mujoco.mj_kinematics(self.model, self.data)
            mujoco.mj_comPos(self.model, self.data)
            pos_err = position - self.data.site_xpos[self._site]
            xmat = self.data.site_xmat[self._site]
            mujoco.mju_mat2Quat(quat, xmat)
            mujoco.mju_subQuat(rot_err, target_quat, quat)      # in the site frame
            rot_err_world = xmat.reshape(3, 3) @ rot_err
            if ((np.linalg.norm(pos_err) < self.position_tolerance_m
                    and np.linalg.norm(rot_err) < self.rotation_tolerance_rad)
                    or iteration == self.max_iterations):
                break  # the errors are those of the q returned
            mujoco.mj_jacSite(self.model, self.data, self._jacp, self._jacr, self._site)
            jac = np.vstack([self._jacp[:, self._dofs], w * self._jacr[:, self._dofs]])
            err = np.concatenate([pos_err, w * rot_err_world])
            dq = jac.T @ np.linalg.solve(jac @ jac.T + self.damping ** 2 * np.eye(6), err)
            q = np.clip(q + dq, self.lower, self.upper)
        return q, float(np.linalg.norm(pos_err)), float(np.linalg.norm(rot_err))
