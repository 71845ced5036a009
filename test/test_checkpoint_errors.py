"""Loading errors name the file and the problem; nothing touches the network."""

import dataclasses
import json
import shutil

import pytest
import torch

from act_ros.core.contract import load_contract
from act_ros.core.device import select_device
from act_ros.core.errors import CheckpointError, ContractMismatchError, DeviceUnavailableError
from act_ros.core.inference.checkpoint import create_checkpoint, load_checkpoint, read_checkpoint_info
from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

ENV = 'observation.environment_state'


@pytest.fixture
def ckpt(tiny_checkpoint, tmp_path):
    path = tmp_path / 'ckpt'
    shutil.copytree(tiny_checkpoint, path)
    return path


def test_loads_and_reports_shapes(ckpt):
    loaded = load_checkpoint(ckpt)
    assert loaded.image_shapes == {'observation.images.top': (48, 64),
                                   'observation.images.wrist': (48, 64)}
    assert loaded.chunk_size == 30 and loaded.config.pretrained_backbone_weights is None
    assert loaded.n_action_steps == 30 == read_checkpoint_info(ckpt, load_contract()).n_action_steps


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match='does not exist'):
        load_checkpoint(tmp_path / 'nope')


@pytest.mark.parametrize('name', ['config.json', 'model.safetensors', 'policy_preprocessor.json',
                                  'policy_postprocessor.json'])
def test_missing_file(ckpt, name):
    (ckpt / name).unlink()
    with pytest.raises(CheckpointError, match=name.replace('.', r'\.')):
        load_checkpoint(ckpt)


def test_missing_normalizer_state(ckpt):
    state = next(ckpt.glob('policy_preprocessor_step_*normalizer*.safetensors'))
    state.unlink()
    with pytest.raises(CheckpointError, match=state.name):
        load_checkpoint(ckpt)


def test_corrupt_safetensors(ckpt):
    data = (ckpt / 'model.safetensors').read_bytes()
    (ckpt / 'model.safetensors').write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match='model.safetensors'):
        load_checkpoint(ckpt)


def test_broken_config_json(ckpt):
    (ckpt / 'config.json').write_text('{"type": "act", ')
    with pytest.raises(CheckpointError, match='config.json.*not valid JSON'):
        load_checkpoint(ckpt)


def test_wrong_policy_type(ckpt):
    cfg = json.loads((ckpt / 'config.json').read_text())
    cfg['type'] = 'diffusion'
    (ckpt / 'config.json').write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="expected 'act'"):
        load_checkpoint(ckpt)


def test_feature_mismatch_joint_count(tmp_path):
    base = load_contract()
    seven = dataclasses.replace(base, joint_names=base.joint_names + ('extra',),
                                joint_lower=base.joint_lower + (-1.0,),
                                joint_upper=base.joint_upper + (1.0,))
    path = create_checkpoint(tmp_path / 'seven', contract=seven)
    with pytest.raises(ContractMismatchError, match='observation.state.*6 joints'):
        load_checkpoint(path, contract=base)


def test_feature_mismatch_cameras(tiny_checkpoint):
    """A camera the contract does not have is refused (a subset of its cameras is fine)."""
    base = load_contract()
    one_cam = dataclasses.replace(base, cameras=base.cameras[:1])
    with pytest.raises(ContractMismatchError,
                       match=r"camera features \['observation.images.wrist'\] are not cameras"):
        load_checkpoint(tiny_checkpoint, contract=one_cam)
    with pytest.raises(ContractMismatchError, match='camera features'):
        read_checkpoint_info(tiny_checkpoint, one_cam)


@pytest.mark.parametrize('cameras, poses', [(('wrist',), False), (('top',), True), ((), True)])
def test_a_subset_of_the_cameras_loads(tmp_path, cameras, poses):
    path = create_checkpoint(tmp_path / 'subset', cameras=cameras, environment_state=poses)
    contract = load_contract()
    loaded = load_checkpoint(path)
    info = read_checkpoint_info(path, contract)
    assert tuple(loaded.image_shapes) == info.image_features == tuple(
        f'observation.images.{cam}' for cam in cameras)
    assert info.uses_environment_state == poses
    assert loaded.env_state_key == info.env_state_key == (ENV if poses else None)
    assert info.env_state_dim == (10 if poses else 0)


def test_no_camera_needs_the_object_poses(tmp_path):
    with pytest.raises(ValueError, match='needs a camera or the environment state'):
        create_checkpoint(tmp_path / 'none', cameras=())
    path = create_checkpoint(tmp_path / 'poses', cameras=(), environment_state=True)
    config = json.loads((path / 'config.json').read_text())
    del config['input_features'][ENV]
    (path / 'config.json').write_text(json.dumps(config))
    for load in (load_checkpoint, lambda p: read_checkpoint_info(p, load_contract())):
        with pytest.raises(ContractMismatchError, match='no camera and no environment state'):
            load(path)


@pytest.fixture
def pose_ckpt(tiny_pose_checkpoint, tmp_path):
    path = tmp_path / 'pose_ckpt'
    shutil.copytree(tiny_pose_checkpoint, path)
    return path


def _edit_json(path, name, edit):
    data = json.loads((path / name).read_text())
    edit(data)
    (path / name).write_text(json.dumps(data))


def test_environment_state_of_another_shape_is_refused(pose_ckpt):
    _edit_json(pose_ckpt, 'config.json',
               lambda c: c['input_features'][ENV].update(shape=[8]))
    for load in (load_checkpoint, lambda p: read_checkpoint_info(p, load_contract())):
        with pytest.raises(ContractMismatchError, match=r"'observation.environment_state' has "
                           r'shape \(8,\), expected \(10,\).*box_x'):
            load(pose_ckpt)


def test_other_env_features_are_refused(pose_ckpt):
    def rename(config):
        config['input_features']['observation.environment_state.mocap'] = \
            config['input_features'].pop(ENV)
    _edit_json(pose_ckpt, 'config.json', rename)
    with pytest.raises(ContractMismatchError, match="ENV inputs.*mocap.*the only environment"):
        read_checkpoint_info(pose_ckpt, load_contract())


def _normalizer(spec):
    return next(s for s in spec['steps'] if s['registry_name'] == 'normalizer_processor')


def test_unnormalized_environment_state_is_refused(pose_ckpt):
    """LeRobot's ACT default leaves ENV out of its norm_map (IDENTITY): positions in metres
    would reach a model trained on normalized values."""
    _edit_json(pose_ckpt, 'policy_preprocessor.json',
               lambda spec: _normalizer(spec)['config']['norm_map'].pop('ENV'))
    for load in (load_checkpoint, lambda p: read_checkpoint_info(p, load_contract())):
        with pytest.raises(CheckpointError, match=r"policy_preprocessor.json: 'observation."
                           r"environment_state' is normalization mode IDENTITY"):
            load(pose_ckpt)


def test_missing_environment_state_stats_are_refused(pose_ckpt):
    from safetensors.torch import load_file, save_file
    state_file = next(pose_ckpt.glob('policy_preprocessor_step_*normalizer*.safetensors'))
    tensors = {k: v for k, v in load_file(state_file).items() if not k.startswith(ENV)}
    save_file(tensors, state_file)
    with pytest.raises(CheckpointError, match=f"stats for '{ENV}'"):
        load_checkpoint(pose_ckpt)


def test_missing_stats_are_refused(ckpt):
    """A normalizer without stats would pass the feature through silently: refuse it."""
    from safetensors.torch import load_file, save_file
    state_file = next(ckpt.glob('policy_postprocessor_step_*unnormalizer*.safetensors'))
    tensors = {k: v for k, v in load_file(state_file).items() if not k.startswith('action.')}
    save_file(tensors, state_file)
    with pytest.raises(CheckpointError, match="stats for 'action'"):
        load_checkpoint(ckpt)


def test_explicit_unavailable_device_raises_never_falls_back(ckpt):
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match='CUDA is not available'):
            select_device('cuda')
        with pytest.raises(DeviceUnavailableError):
            PolicyRuntime(RuntimeConfig(model_path=ckpt, device='cuda:0'))
    if not torch.backends.mps.is_available():
        with pytest.raises(DeviceUnavailableError, match='MPS'):
            select_device('mps')
    with pytest.raises(ValueError, match='unknown device'):
        select_device('tpu')
    assert select_device('auto').type in ('cpu', 'cuda', 'mps')


@pytest.mark.parametrize('kwargs, match', [
    (dict(mode='chunks'), 'unknown mode'),
    (dict(execution='threaded'), 'unknown execution'),
    (dict(n_action_steps=0), 'n_action_steps'),
    (dict(precision='int4'), 'unknown precision'),
    (dict(precision='int8'), "precision 'int8' runs on backend openvino only"),
    (dict(model_path=''), 'model_path is empty'),
])
def test_runtime_config_validation(kwargs, match):
    args = dict(model_path='x') | kwargs
    with pytest.raises(ValueError, match=match):
        RuntimeConfig(**args)


def test_n_action_steps_above_chunk_size(ckpt):
    with pytest.raises(ValueError, match='chunk_size'):
        PolicyRuntime(RuntimeConfig(model_path=ckpt, device='cpu', n_action_steps=31,
                                    warmup=False))


def test_fp16_on_cpu_is_an_error(ckpt):
    with pytest.raises(ValueError, match='fp16'):
        PolicyRuntime(RuntimeConfig(model_path=ckpt, device='cpu', precision='fp16',
                                    warmup=False))


def test_bf16_on_a_cpu_without_native_bf16_is_refused(ckpt):
    from act_ros.core.inference.predictor import cpu_has_native_bf16
    if cpu_has_native_bf16():  # set by name: checked against fp32, kept within the tolerance
        rt = PolicyRuntime(RuntimeConfig(model_path=ckpt, device='cpu', precision='bf16',
                                         precision_tolerance=10.0, warmup=False))
        assert rt.predictor.options.precision == 'bf16'
        assert rt.precision_check.candidate == 'bf16' and rt.precision == 'bf16'
        rt.close()
    else:
        with pytest.raises(DeviceUnavailableError, match='native bfloat16'):
            PolicyRuntime(RuntimeConfig(model_path=ckpt, device='cpu', precision='bf16',
                                        warmup=False))


def test_chunk_defaults_are_lerobots():
    """The chunk a run trains with unless told is LeRobot's ACT default."""
    from lerobot.policies.act.configuration_act import ACTConfig

    from act_ros.core.inference.checkpoint_info import LEROBOT_ACT_CHUNK_SIZE

    fields = ACTConfig.__dataclass_fields__
    assert LEROBOT_ACT_CHUNK_SIZE == fields['chunk_size'].default == \
        fields['n_action_steps'].default


@pytest.mark.parametrize('steps, match', [
    (0, r'n_action_steps must be an integer in \[1, chunk_size 30\], got 0'),
    (31, r'n_action_steps must be an integer in \[1, chunk_size 30\], got 31'),
    ('5', r"got '5'"),
])
def test_n_action_steps_of_the_checkpoint_is_checked(ckpt, steps, match):
    config = json.loads((ckpt / 'config.json').read_text())
    config['n_action_steps'] = steps
    (ckpt / 'config.json').write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint_info(ckpt, load_contract())


def test_n_action_steps_is_the_checkpoints_unless_set(ckpt):
    """A checkpoint that plays 12 of its 30 actions: the runtime plays 12 unless told."""
    config = json.loads((ckpt / 'config.json').read_text())
    config['n_action_steps'] = 12
    (ckpt / 'config.json').write_text(json.dumps(config))
    assert read_checkpoint_info(ckpt, load_contract()).n_action_steps == 12
    for given, played in ((None, 12), (5, 5)):
        runtime = PolicyRuntime(RuntimeConfig(model_path=ckpt, device='cpu', warmup=False,
                                              execution='sync', n_action_steps=given))
        assert (runtime.n_action_steps, runtime.stride) == (played, played)
