"""The I/O contract file and its validation."""

import pytest

from act_ros.core.contract import Contract, load_contract


def test_default_contract():
    c = load_contract()
    assert c.joint_names == ('shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex',
                             'wrist_roll', 'gripper')
    assert c.gripper_index == 5 and c.fps == 30
    assert not hasattr(c, 'chunk_size')  # the checkpoint's, not the arm's
    assert c.image_features == ('observation.images.top', 'observation.images.wrist')
    assert (c.lower < c.upper).all()
    assert c.camera('top').height == 480 and c.camera('top').width == 640


def _body(**changes):
    body = {'joint_names': ['a', 'b'], 'joint_lower': [-1, -1], 'joint_upper': [1, 1],
            'gripper_joint': 'b', 'cameras': {'top': {'feature': 'observation.images.top',
                                                      'height': 4, 'width': 4}},
            'fps': 50}
    body.update(changes)
    return {'contract': body}


@pytest.mark.parametrize('changes, match', [
    (dict(joint_lower=[-1]), 'joint_lower has 1 values, expected 2'),
    (dict(joint_upper=[1, -2]), "joint 'b'"),
    (dict(gripper_joint='c'), "gripper_joint 'c'"),
    (dict(joint_names=['a', 'a']), 'duplicates'),
    (dict(cameras={'top': {'feature': 'images.top', 'height': 4, 'width': 4}}), 'observation.images'),
    (dict(cameras=[]), 'cameras'),
    (dict(fps=0), 'fps must be >= 1, got 0'),
])
def test_invalid_contracts(changes, match):
    with pytest.raises(ValueError, match=match):
        Contract.from_dict(_body(**changes), source='test.yaml')


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
