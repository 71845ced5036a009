"""The rest of the plan as safe points, for a controller that interpolates at its own rate.

``act_node`` can send, at each tick, the remaining chunk as one multi-point
``JointTrajectory`` instead of one point, or stream commands faster than the policy rate
to a forward controller (:mod:`act_ros.ros.node.command_stream`). Every point it sends
passes the safety chain here, as the tick's own command does
(:func:`act_ros.core.control.safety.limit_command`):

- point 0 is the tick's command, as the chain let it through;
- each later point is refused from its first non-finite value on (the plan ends there),
  clamped to the joint limits, and moves each joint at most ``max_step`` from the point
  before it (one control period apart), so the plan never asks for more than the tick
  by tick commands could;
- each gripper follows its release gate: while the gate holds an object, every later
  point keeps the tick's (closed) command of that gripper; a release can only pass on a tick of
  its own, near the pad, when the gate sees it.

:func:`plan_velocities` gives each point a velocity (central differences of the safe
points; the last point comes to rest), and :func:`interpolate` samples the plan at a
rate above the policy's for a forward position controller.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from act_ros.core.control.safety import SafetyLimits


def limit_plan(plan: np.ndarray, command: np.ndarray, limits: SafetyLimits, *,
               hold: Sequence[int] = ()) -> np.ndarray:
    """The safe points of ``plan`` (``(T, J)``: the raw actions for this tick and the next
    ones), starting with ``command`` (the tick's command after the safety chain): ``(K, J)``,
    ``1 <= K <= T`` (see the module docstring). ``hold``: the indices of the grippers whose
    release gate holds an object; they stay at ``command``'s value."""
    plan = np.asarray(plan, dtype=np.float64)
    first = np.asarray(command, dtype=np.float64).reshape(-1)
    if plan.ndim != 2 or plan.shape[1] != limits.num_joints or plan.shape[0] < 1:
        raise ValueError(f'plan must have shape (T >= 1, {limits.num_joints}), got {plan.shape}')
    if first.size != limits.num_joints or not np.all(np.isfinite(first)):
        raise ValueError(f'command must be {limits.num_joints} finite values, got {first}')
    points = [first]
    held = list(hold)
    for row in plan[1:]:
        if not np.all(np.isfinite(row)):
            break
        target = np.clip(row, limits.lower, limits.upper)
        target[held] = first[held]
        previous = points[-1]
        points.append(np.clip(target, previous - limits.max_step, previous + limits.max_step))
    return np.stack(points)


def plan_velocities(points: np.ndarray, period_s: float) -> np.ndarray:
    """A velocity per point (``(K, J)``, per second): the central difference of its
    neighbours, the one-sided difference at the first point, zero at the last (the plan
    ends at rest there; a controller given positions and velocities fits cubic segments
    through them)."""
    points = np.asarray(points, dtype=np.float64)
    velocities = np.zeros_like(points)
    if points.shape[0] >= 2:
        velocities[0] = (points[1] - points[0]) / period_s
        velocities[1:-1] = (points[2:] - points[:-2]) / (2.0 * period_s)
    return velocities


def interpolate(points: np.ndarray, period_s: float, rate_hz: float) -> np.ndarray:
    """The plan sampled at ``rate_hz`` from its first point for one control period
    (``(n, J)``, ``n = round(rate_hz * period_s)`` samples, the first equal to point 0),
    linearly toward point 1; a plan of one point holds it."""
    points = np.asarray(points, dtype=np.float64)
    samples = max(1, int(round(rate_hz * period_s)))
    if points.shape[0] < 2:
        return np.repeat(points[:1], samples, axis=0)
    fractions = np.arange(samples, dtype=np.float64)[:, None] / samples
    return points[0] + fractions * (points[1] - points[0])
