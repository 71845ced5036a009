"""The I/O contract file and its validation."""

import pytest

from act_ros.core.contract import Contract, GripperSpec, load_contract
from act_ros.core.control.kinematics import default_urdf_path


def test_default_contract():
    c = load_contract()
    assert c.joint_names == ('shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex',
                             'wrist_roll', 'gripper')
    assert c.gripper_indices == (5,) and c.fps == 30
    assert not hasattr(c, 'chunk_size')  # the checkpoint's, not the arm's
    assert c.arm_joint_names == c.joint_names[:5]
    assert (c.grippers[0].closed, c.grippers[0].open, c.grippers[0].ee_frame) == (0.0, 1.0, 'ee_link')
    assert c.urdf_path.resolve() == default_urdf_path().resolve()
    assert c.image_features == ('observation.images.top', 'observation.images.wrist')
    assert (c.lower < c.upper).all()
    assert c.camera('top').height == 480 and c.camera('top').width == 640


def _body(**changes):
    body = {'joint_names': ['a', 'b'], 'joint_lower': [-1, -1], 'joint_upper': [1, 1],
            'grippers': ['b'], 'cameras': {'top': {'feature': 'observation.images.top',
                                                      'height': 4, 'width': 4}},
            'fps': 50}
    body.update(changes)
    return {'contract': body}


@pytest.mark.parametrize('changes, match', [
    (dict(joint_lower=[-1]), 'joint_lower has 1 values, expected 2'),
    (dict(joint_upper=[1, -2]), "joint 'b'"),
    (dict(grippers=['c']), "gripper 'c' is not in joint_names"),
    (dict(grippers={'c': None}), "gripper 'c' is not in joint_names"),
    (dict(grippers=['b', 'b']), 'grippers has duplicates'),
    (dict(grippers={'b': {'closed': 0.5, 'open': 0.5}}), 'must be finite and differ'),
    (dict(grippers={'b': {'closed': 0.0, 'open': 2.0}}), r'within its limits \[-1.0, 1.0\]'),
    (dict(grippers={'b': {'close': 0.0}}), r"unknown settings \['close'\]"),
    (dict(grippers='b'), 'list of joint names or a mapping'),
    (dict(gripper_joint='b'), 'not both'),
    (dict(joint_names=['a', 'a']), 'duplicates'),
    (dict(cameras={'top': {'feature': 'images.top', 'height': 4, 'width': 4}}), 'observation.images'),
    (dict(cameras=[]), 'cameras'),
    (dict(fps=0), 'fps must be >= 1, got 0'),
])
def test_invalid_contracts(changes, match):
    with pytest.raises(ValueError, match=match):
        Contract.from_dict(_body(**changes), source='test.yaml')


def test_grippers_zero_one_several_and_the_older_gripper_joint():
    body = _body()['contract']
    body.pop('grippers')
    none = Contract.from_dict({'contract': {**body, 'grippers': []}})
    assert none.grippers == () and none.gripper_indices == () and none.arm_joint_names == ('a', 'b')
    # The older key loads as a list of one, closed and open at the joint's limits.
    old = Contract.from_dict({'contract': {**body, 'gripper_joint': 'b'}})
    assert old.grippers == (GripperSpec('b', -1.0, 1.0),) and old.gripper_indices == (1,)
    assert old == Contract.from_dict({'contract': {**body, 'grippers': ['b']}})
    both = Contract.from_dict({'contract': {**body, 'grippers': {
        'b': {'closed': 1.0, 'open': -1.0, 'units': 'rad', 'ee_frame': 'tool_b'}, 'a': None}}})
    assert both.gripper_joints == ('b', 'a') and both.gripper_indices == (1, 0)
    assert both.arm_joint_names == ()
    b = both.grippers[0]
    assert (b.units, b.ee_frame) == ('rad', 'tool_b')
    # Openings: 0 closed, 1 open, whatever the joint's units and direction.
    assert b.opening(1.0) == 0.0 and b.opening(-1.0) == 1.0 and b.opening(0.0) == 0.5
    assert b.position(0.0) == 1.0 and b.position(1.0) == -1.0
    with pytest.raises(ValueError, match='missing keys.*grippers'):
        Contract.from_dict({'contract': body})


@pytest.mark.parametrize('name, joints, grippers', [
    ('robots/aloha/contract.yaml', 14, ('left_arm_gripper', 'right_arm_gripper')),
    ('robots/so101/contract.yaml', 6, ('gripper',)),
])
def test_example_arms_load_from_the_package_config(name, joints, grippers):
    """A relative contract path that is not a file here is the package's config/ one."""
    c = load_contract(name)
    assert c.num_joints == joints and c.gripper_joints == grippers
    assert c.urdf_path is None  # no robot model ships for them
    for g, i in zip(c.grippers, c.gripper_indices):
        assert (c.joint_lower[i], c.joint_upper[i]) == (g.closed, g.open)


def test_missing_keys_and_files(tmp_path):
    with pytest.raises(ValueError, match='missing keys'):
        Contract.from_dict({'contract': {'joint_names': ['a']}})
    with pytest.raises(FileNotFoundError):
        load_contract(tmp_path / 'none.yaml')
    bad = tmp_path / 'bad.yaml'
    bad.write_text('contract: [1, 2')
    with pytest.raises(ValueError, match='not valid YAML'):
        load_contract(bad)


def test_fps_is_required_and_chunk_size_is_the_checkpoints(caplog):
    """The arm's rate must be written down; a chunk size in a contract (older files) is
    ignored with one warning that says where the chunk size comes from."""
    body = _body()
    del body['contract']['fps']
    with pytest.raises(ValueError, match=r"missing keys \['fps'\]"):
        Contract.from_dict(body, source='test.yaml')
    with caplog.at_level('WARNING', logger='act_ros.core.contract'):
        c = Contract.from_dict(_body(chunk_size=30), source='old.yaml')
    assert c.fps == 50
    assert [r.getMessage() for r in caplog.records] == [
        "old.yaml: chunk_size is ignored: the chunk size is the checkpoint's (its "
        "config.json), and a training run's is its chunk_size setting (act-ros train "
        '--chunk-size)']
