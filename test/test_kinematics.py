"""Forward kinematics of the robot URDF (pinocchio), as used by the release gate."""

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('pinocchio')

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.core.control.kinematics import ForwardKinematics, default_urdf_path  # noqa: E402


@pytest.fixture(scope='module')
def fk():
    return ForwardKinematics()


def test_default_urdf_is_the_packaged_model():
    path = default_urdf_path()
    assert path.name == 'so101_class.urdf' and path.is_file()


@pytest.mark.parametrize('q, expected', [
    # Zero pose: upper arm up (0.1 + 0.116), forearm + wrist + TCP forward (0.135 + 0.03 + 0.07).
    ([0, 0, 0, 0, 0], [0.235, 0.0, 0.216]),
    # Wrist bent down 90 degrees: the TCP hangs 0.1 m below the wrist joint.
    ([0, 0, 0, math.pi / 2, 0], [0.135, 0.0, 0.116]),
    # Pan 90 degrees turns the arm to +y; wrist roll does not move the TCP.
    ([math.pi / 2, 0, 0, 0, 1.0], [0.0, 0.235, 0.216]),
    # Lift forward 90 degrees: upper arm horizontal, forearm pointing down.
    ([0, math.pi / 2, 0, 0, 0], [0.116, 0.0, 0.1 - 0.235]),
])
def test_known_poses(fk, q, expected):
    np.testing.assert_allclose(fk.ee_position(np.array(q)), expected, atol=1e-6)


def test_gripper_entry_is_accepted_and_ignored(fk):
    q = np.array([0.3, -0.4, 0.5, 0.6, -0.7])
    closed = fk.ee_position(np.append(q, 0.0))
    opened = fk.ee_position(np.append(q, 1.0))
    np.testing.assert_array_equal(closed, fk.ee_position(q))
    np.testing.assert_array_equal(closed, opened)


def test_urdf_limits_match_the_contract(fk):
    contract = load_contract()
    model = fk.model
    for name, lo, hi in zip(contract.joint_names, contract.joint_lower, contract.joint_upper):
        if name in contract.gripper_joints:
            continue
        idx = model.joints[model.getJointId(name)].idx_q
        assert model.lowerPositionLimit[idx] == pytest.approx(lo), name
        assert model.upperPositionLimit[idx] == pytest.approx(hi), name


def test_wrong_number_of_joints_is_rejected(fk):
    with pytest.raises(ValueError, match='expected 5 joint positions'):
        fk.ee_position(np.zeros(4))
    with pytest.raises(ValueError, match='finite'):
        fk.ee_position(np.array([0, 0, np.nan, 0, 0]))


def test_missing_file_frame_and_joint_are_clear_errors(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match='not found'):
        ForwardKinematics(tmp_path / 'nope.urdf')
    with pytest.raises(ValueError, match="no frame 'tool0'"):
        ForwardKinematics(ee_frame='tool0')
    with pytest.raises(ValueError, match=r"joints \['elbow'\] not in the model"):
        ForwardKinematics(joint_names=['shoulder_pan', 'elbow'])


def test_gripper_kinematics_serves_the_contracts_model_or_says_why_not(tmp_path):
    """One model per gripper's end effector from the contract's URDF (or urdf_path); an arm
    whose contract names no model, or whose joints or frames the model lacks, gets none
    and the reason: the package's model is never taken for another arm."""
    from dataclasses import replace

    from act_ros.core.control.kinematics import gripper_kinematics

    contract = load_contract()
    fks, why = gripper_kinematics(contract)
    assert why == '' and [fk.ee_frame for fk in fks] == ['ee_link']
    assert fks[0].joint_names == contract.arm_joint_names
    assert fks[0].urdf_path.resolve() == default_urdf_path().resolve()
    # Same joint names, no urdf in the contract (an SO-101 in degrees): no model.
    so101 = load_contract('robots/so101/contract.yaml')
    assert so101.arm_joint_names == contract.arm_joint_names
    fks, why = gripper_kinematics(so101)
    assert fks == [] and 'no robot model' in why and 'urdf_path is not set' in why
    # Given a model that lacks the contract's joints (the bimanual arm's): none, and why.
    aloha = load_contract('robots/aloha/contract.yaml')
    fks, why = gripper_kinematics(aloha, urdf_path=default_urdf_path(), ee_frame='')
    assert fks == [] and 'no end-effector frame' in why
    with_frames = replace(aloha, grippers=tuple(replace(g, ee_frame='ee_link')
                                                for g in aloha.grippers))
    fks, why = gripper_kinematics(with_frames, urdf_path=default_urdf_path())
    assert fks == [] and 'left_arm_waist' in why and 'not in the model' in why
    fks, why = gripper_kinematics(contract, urdf_path=tmp_path / 'none.urdf')
    assert fks == [] and 'not found' in why
    fks, why = gripper_kinematics(contract, ee_frame='tool0')
    assert fks == [] and "no frame 'tool0'" in why
    with pytest.raises(ValueError, match='names one end effector; the contract has 2 grippers'):
        gripper_kinematics(aloha, ee_frame='ee_link')
