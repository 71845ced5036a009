"""Release gate in act_node over real rclpy: open requests far from the pad are suppressed
while holding, pass near it; the end effector comes from a pose topic or from forward
kinematics of the measured joints.

The policy is a real ACT checkpoint whose gripper output is steered by the camera image:
its action statistics are rescaled so that a black image gives one end of the gripper
range and a white image the other (found by running the model on both).
"""

import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')

from rclpy.parameter import Parameter  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.ros.harness import (  # noqa: E402
    FAST_ROBOT_MAX_JOINT_VELOCITY,
    RobotHarness,
    fast_robot_model,
    spinning,
    wait_until,
)
from act_ros.ros.node.act_node import ActNode  # noqa: E402

CONTRACT = load_contract()
JOINTS = list(CONTRACT.joint_names)
GRIPPER, = CONTRACT.gripper_indices
# The gripper measured at 0.6: fingers closed on an object (an empty gripper frees the gate).
MEASURED = np.array([0.1, -0.3, 0.4, 0.2, 0.0, 0.6])
PAD = [0.25, 0.0, 0.0]


@pytest.fixture(scope='module')
def gated(module_tmp, tiny_checkpoint):
    """(checkpoint, open_image, closed_image): the image decides the gripper request."""
    from act_ros.ros.harness import make_gated_checkpoint

    root = module_tmp('gate')
    return make_gated_checkpoint(tiny_checkpoint, root / 'gated', state=MEASURED)


def make_node(context, checkpoint, **params) -> ActNode:
    values = {'model_path': checkpoint, 'autostart': False, 'torch_threads': 1,
              'backend': 'torch',  # no ONNX export per checkpoint (auto: test_backends.py)
              'diagnostics_period_s': 0.2, 'execution': 'sync', 'n_action_steps': 1,
              'pad_position_m': PAD,
              # Commands pass the speed limit unchanged: the same kinematics, fast joints.
              'max_joint_velocity': FAST_ROBOT_MAX_JOINT_VELOCITY,
              'urdf_path': str(fast_robot_model(Path(checkpoint).parent)),
              # Generous: a busy machine can hold the publishing thread back (test_node_act).
              'max_obs_age_s': 2.0, **params}
    return ActNode(context=context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


# Bounds on waiting for what must come, not speed requirements: a stalled machine ran
# this tiny model at 2 s a chunk. The gate's transitions are counted in the node's ticks.
WAIT_S = 180.0
GATE_TICKS = 40  # HOLDING needs a few closed ticks, FREE again 5 empty ones (release_gate)


def gripper_commands(harness, since, count, timeout=WAIT_S):
    assert wait_until(lambda: len(harness.commands_since(since)) >= count, timeout), \
        f'expected {count} commands, got {len(harness.commands_since(since))}'
    return [float(c.positions[GRIPPER]) for c in harness.commands_since(since)]


def wait_gate(harness, state, ticks=GATE_TICKS, **at_least):
    """Wait until the diagnostics show the gate in ``state`` (and counters at least
    ``at_least``); fails once the node has ticked ``ticks`` times more without it."""
    first = []

    def matches(values):
        return values.get('gate_state') == state and all(
            int(values[key]) >= value for key, value in at_least.items())

    def match_or_spent():
        diag = harness.latest_diagnostics()
        if diag is None or 'runtime_ticks' not in diag[2]:
            return False
        done = int(diag[2]['runtime_ticks'])
        first[:1] = first[:1] or [done]
        return matches(diag[2]) or done - first[0] > ticks

    assert wait_until(match_or_spent, WAIT_S), \
        f'no diagnostics with the gate in {ticks} ticks: {harness.latest_diagnostics()}'
    diag = harness.latest_diagnostics()
    assert matches(diag[2]), f'gate not {state} {at_least} within {ticks} ticks: {diag}'


def test_release_suppressed_far_from_pad_and_passes_near_it(rclpy_context, gated):
    checkpoint, open_image, closed_image = gated
    node = make_node(rclpy_context, checkpoint, ee_source='topic')
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=open_image)
    harness.ee_position = np.array([0.6, 0.3, 0.3])  # 0.5 m from the pad
    with spinning(rclpy_context, node, harness):
        assert node.start()
        # FREE: an open gripper passes unchanged (approach).
        assert gripper_commands(harness, 0.0, 2)[-1] == pytest.approx(1.0)
        # Commanded closed for a few ticks: HOLDING.
        harness.image = closed_image
        wait_gate(harness, 'HOLDING')
        # Open request far from the pad: replaced by the closed command, and counted.
        harness.image = open_image
        switched = time.monotonic() + 0.1
        grips = gripper_commands(harness, switched, 3)
        assert grips == pytest.approx([0.0] * len(grips))
        wait_gate(harness, 'HOLDING', suppressed_releases=2)
        # Near the pad (3 cm away): the release passes and the gate is RELEASED.
        harness.ee_position = np.array([0.27, 0.01, 0.02])
        moved = time.monotonic() + 0.1
        assert wait_until(lambda: any(g == pytest.approx(1.0) for g in
                                      gripper_commands(harness, moved, 1)), WAIT_S)
        wait_gate(harness, 'RELEASED')


EMPTY = MEASURED.copy()
EMPTY[GRIPPER] = 0.0   # fingers closed on nothing
THIN = MEASURED.copy()
THIN[GRIPPER] = 0.02   # fingers closed on a 2 mm object (a card) in a 100 mm gripper


def _closed_far_from_pad(context, path, tiny_checkpoint, state, params, effort):
    """A node whose policy commands the gripper closed (the harness's image) with the
    measured joints ``state``, the gripper's ``effort`` in the joint states (None: none),
    the end effector 0.5 m from the pad; returns it, the harness and the image that makes
    the policy open."""
    from act_ros.ros.harness import make_gated_checkpoint

    checkpoint, open_image, closed_image = make_gated_checkpoint(tiny_checkpoint, path,
                                                                 state=state)
    node = make_node(context, checkpoint, ee_source='topic', **params)
    harness = RobotHarness(context=context, joints=dict(zip(JOINTS, state)), image=closed_image)
    if effort is not None:
        harness.efforts = {JOINTS[GRIPPER]: effort}
    harness.ee_position = np.array([0.6, 0.3, 0.3])
    return node, harness, open_image


@pytest.mark.parametrize('evidence, params, effort', [
    # The gripper's effort in JointState (fingers on nothing push nothing) ...
    ('effort', {'release_gate.empty_effort': 1.0}, 0.0),
    # ... or, opted in, the opening below the thinnest object the user assumes.
    ('opening', {'release_gate.empty_opening': 0.01}, None),
])
def test_a_gripper_closed_on_nothing_frees_the_gate(rclpy_context, tmp_path, tiny_checkpoint,
                                                    evidence, params, effort):
    """Commanded closed while the fingers measure empty (the object slipped out, or the
    grasp missed): nothing is held, HOLDING returns to FREE and an open request passes far
    from the pad, so the policy can grasp again."""
    node, harness, open_image = _closed_far_from_pad(rclpy_context, tmp_path / 'gated_empty',
                                                     tiny_checkpoint, EMPTY, params, effort)
    with spinning(rclpy_context, node, harness):
        assert node.start()
        assert evidence in node.loop.gates[0].gate.config.evidence()
        wait_gate(harness, 'FREE', objects_lost=1)
        harness.image = open_image
        switched = time.monotonic() + 0.1
        assert wait_until(lambda: any(g == pytest.approx(1.0) for g in
                                      gripper_commands(harness, switched, 1)), WAIT_S)


@pytest.mark.parametrize('params, effort', [
    ({}, None),  # the default: no evidence of an empty gripper, a closed one holds
    ({'release_gate.empty_effort': 1.0}, -2.9),  # the fingers push on the object
    # An effort that no message carries: the opening option decides, below the object.
    ({'release_gate.empty_effort': 1.0, 'release_gate.empty_opening': 0.01}, None),
])
def test_a_thin_object_stays_gated_far_from_the_pad(rclpy_context, tmp_path, tiny_checkpoint,
                                                    params, effort):
    """Fingers closed on a 2 mm object measure almost closed: the opening alone cannot tell
    it from nothing, so the gate keeps HOLDING and suppresses every open request outside
    the release radius, long past empty_ticks (the object is never released in transit)."""
    node, harness, open_image = _closed_far_from_pad(rclpy_context, tmp_path / 'gated_thin',
                                                     tiny_checkpoint, THIN, params, effort)
    with spinning(rclpy_context, node, harness):
        assert node.start()
        wait_gate(harness, 'HOLDING')
        harness.image = open_image
        switched = time.monotonic() + 0.1
        # Four times empty_ticks (5) of open requests, every one held closed.
        wait_gate(harness, 'HOLDING', suppressed_releases=20, ticks=GATE_TICKS + 20)
        grips = gripper_commands(harness, switched, 20)
        diag = harness.latest_diagnostics()[2]
    assert grips == pytest.approx([0.0] * len(grips)), grips
    assert int(diag['objects_lost']) == 0, diag


def test_stale_end_effector_pose_counts_as_far_from_pad(rclpy_context, gated):
    checkpoint, open_image, closed_image = gated
    node = make_node(rclpy_context, checkpoint, ee_source='topic')
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=closed_image)
    with spinning(rclpy_context, node, harness):  # no ee pose is ever published
        assert node.start()
        wait_gate(harness, 'HOLDING')
        harness.image = open_image
        wait_gate(harness, 'HOLDING', suppressed_releases=2)
        assert harness.latest_diagnostics()[2]['gate_distance_m'] == 'n/a'


def test_forward_kinematics_source_measures_the_distance_to_the_pad(rclpy_context, gated):
    from act_ros.core.control.kinematics import ForwardKinematics

    checkpoint, _, closed_image = gated
    fk = ForwardKinematics(joint_names=CONTRACT.arm_joint_names)
    expected = float(np.linalg.norm(fk.ee_position(np.delete(MEASURED, GRIPPER)) - PAD))
    node = make_node(rclpy_context, checkpoint)  # ee_source defaults to fk
    harness = RobotHarness(context=rclpy_context, joints=dict(zip(JOINTS, MEASURED)),
                           image=closed_image)
    with spinning(rclpy_context, node, harness):
        assert node.start()
        assert wait_until(lambda: (harness.latest_diagnostics() or (0, 0, {}))[2].get(
            'gate_distance_m', 'n/a') != 'n/a', WAIT_S)
        distance = float(harness.latest_diagnostics()[2]['gate_distance_m'])
    assert distance == pytest.approx(expected, abs=1e-3)
