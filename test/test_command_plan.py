"""The rest of the plan as safe points (act_ros.core.control.command_plan), and the control loop
that sends them and measures the seams of what it sends."""

import numpy as np
import pytest

from act_ros.core.control.command_plan import interpolate, limit_plan, plan_velocities
from act_ros.core.control.safety import SafetyLimits

LIMITS = SafetyLimits(lower=np.array([-1.0, -1.0, 0.0]), upper=np.array([1.0, 1.0, 1.0]),
                      max_step=np.array([0.1, 0.1, 0.2]))


def test_every_later_point_passes_the_chain():
    plan = np.array([[0.0, 0.0, 1.0],     # the tick's raw action (replaced by the command)
                     [0.05, 5.0, 1.0],    # joint 1 over its upper limit and far away
                     [0.1, 5.0, 0.0],     # gripper closes: at most 0.2 a tick
                     [0.15, -1.0, 0.0]])
    command = np.array([0.01, 0.2, 1.0])
    points = limit_plan(plan, command, LIMITS)
    np.testing.assert_allclose(points[0], command)
    np.testing.assert_allclose(points[:, 0], [0.01, 0.05, 0.1, 0.15])
    np.testing.assert_allclose(points[:, 1], [0.2, 0.3, 0.4, 0.3])   # limits, then max step
    np.testing.assert_allclose(points[:, 2], [1.0, 1.0, 0.8, 0.6])
    assert np.all(np.abs(np.diff(points, axis=0)) <= LIMITS.max_step + 1e-12)


def test_plan_ends_at_its_first_non_finite_point_and_holds_a_held_gripper():
    plan = np.array([[0.0, 0.0, 0.0], [0.1, 0.0, 1.0], [np.nan, 0.0, 1.0], [0.2, 0.0, 1.0]])
    points = limit_plan(plan, np.zeros(3), LIMITS, hold=(2,))
    assert points.shape == (2, 3)
    assert points[1, 2] == 0.0  # the gate holds: no opening in transit, whatever is planned
    with pytest.raises(ValueError, match='finite'):
        limit_plan(plan, np.array([np.inf, 0, 0]), LIMITS)
    with pytest.raises(ValueError, match='shape'):
        limit_plan(np.zeros((3, 2)), np.zeros(3), LIMITS)


def test_velocities_and_interpolation():
    dt = 0.1
    points = np.array([[0.0], [0.1], [0.3], [0.6]])
    v = plan_velocities(points, dt)
    np.testing.assert_allclose(v[:, 0], [1.0, 1.5, 2.5, 0.0])
    samples = interpolate(points, dt, 50.0)  # 5 samples in one 0.1 s period
    np.testing.assert_allclose(samples[:, 0], [0.0, 0.02, 0.04, 0.06, 0.08])
    np.testing.assert_allclose(interpolate(points[:1], dt, 50.0), np.zeros((5, 1)))
    assert plan_velocities(points[:1], dt).tolist() == [[0.0]]
