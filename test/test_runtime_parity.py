"""Sync mode reproduces LeRobot's ``select_action`` + postprocessor exactly: cameras only,
cameras with the object poses (``observation.environment_state``), and joints with object
poses and no camera."""

import numpy as np
import pytest
import torch

from act_ros.core.contract import load_contract
from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
from act_ros.core.observation import Observation

TICKS = 90


ENV = 'observation.environment_state'
# Inputs of each checkpoint variant: cameras, and whether the object poses are one.
VARIANTS = {'cameras': (('top', 'wrist'), False), 'cameras_and_poses': (('top', 'wrist'), True),
            'poses_no_camera': ((), True)}


@pytest.fixture(scope='module', params=list(VARIANTS))
def lerobot_checkpoint(request, module_tmp):
    """Saved with LeRobot's own API, with non-trivial normalization statistics."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    cameras, poses = VARIANTS[request.param]
    contract = load_contract()
    inputs = {'observation.state': PolicyFeature(type=FeatureType.STATE, shape=(6,))}
    if poses:
        inputs[ENV] = PolicyFeature(type=FeatureType.ENV, shape=(10,))
    for cam in cameras:
        inputs[f'observation.images.{cam}'] = PolicyFeature(type=FeatureType.VISUAL,
                                                            shape=(3, 40, 56))
    config = ACTConfig(
        input_features=inputs,
        output_features={'action': PolicyFeature(type=FeatureType.ACTION, shape=(6,))},
        chunk_size=30, n_action_steps=30, pretrained_backbone_weights=None, dim_model=64,
        n_heads=4, dim_feedforward=128, n_encoder_layers=1, n_decoder_layers=1,
        n_vae_encoder_layers=1, latent_dim=8, device='cpu',
        normalization_mapping={'VISUAL': NormalizationMode.MEAN_STD,
                               'STATE': NormalizationMode.MEAN_STD,
                               'ENV': NormalizationMode.MEAN_STD,
                               'ACTION': NormalizationMode.MEAN_STD})
    torch.manual_seed(3)
    policy = ACTPolicy(config)
    gen = torch.Generator().manual_seed(4)
    joint = {'mean': torch.randn(6, generator=gen) * 0.3,
             'std': torch.rand(6, generator=gen) * 0.5 + 0.2}
    image = {'mean': torch.rand(3, 1, 1, generator=gen) * 0.2 + 0.4,
             'std': torch.rand(3, 1, 1, generator=gen) * 0.1 + 0.2}
    stats = {'observation.state': joint, 'action': dict(joint)}
    for cam in cameras:
        stats[f'observation.images.{cam}'] = dict(image)
    if poses:
        stats[ENV] = {'mean': torch.randn(10, generator=gen) * 0.1,
                      'std': torch.rand(10, generator=gen) * 0.3 + 0.1}
    pre, post = make_act_pre_post_processors(config, stats)
    path = module_tmp('lerobot') / 'pretrained_model'
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    assert contract.num_joints == 6
    return path


def _observations(seed: int):
    """Both cameras and object poses every tick: each checkpoint takes what it uses."""
    from act_ros.core.object_state import environment_state

    rng = np.random.default_rng(seed)
    for _ in range(TICKS):
        yield Observation(
            images={cam: rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for cam in ('top', 'wrist')},
            state=rng.uniform(-1.0, 1.0, 6),
            environment_state=environment_state(
                rng.uniform(-0.3, 0.3, 3), rng.uniform(-np.pi, np.pi),
                rng.uniform(-0.3, 0.3, 3), rng.uniform(-np.pi, np.pi)))


def lerobot_reference(path, *, observations, n_action_steps=None, ensemble_coeff=None):
    """LeRobot's own inference over ``observations``: select_action (its queue of
    n_action_steps, or its temporal ensembler) and the postprocessor, as lerobot-eval runs
    a policy; ``n_action_steps`` None keeps the checkpoint's."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    config = PreTrainedConfig.from_pretrained(path)
    if n_action_steps is not None:
        config.n_action_steps = n_action_steps
    config.temporal_ensemble_coeff = ensemble_coeff
    policy = ACTPolicy.from_pretrained(path, config=config, strict=True)
    pre, post = make_pre_post_processors(config, pretrained_path=str(path))
    policy.reset()
    actions = []
    for obs in observations:
        batch = {'observation.state': torch.tensor(obs.state, dtype=torch.float32)}
        if config.env_state_feature is not None:
            batch[ENV] = torch.tensor(obs.environment_state, dtype=torch.float32)
        for cam, img in obs.images.items():
            key = f'observation.images.{cam}'
            if key in config.image_features:
                batch[key] = torch.from_numpy(img).permute(2, 0, 1).float() / 255
        actions.append(post(policy.select_action(pre(batch)))[0].double().numpy())
    return np.stack(actions)


@pytest.mark.parametrize('mode, n_action_steps, coeff', [
    ('chunk', 30, None),
    ('ensemble', 1, 0.01),
])
def test_sync_matches_lerobot_select_action(lerobot_checkpoint, mode, n_action_steps, coeff):
    expected = lerobot_reference(lerobot_checkpoint, n_action_steps=n_action_steps,
                                  ensemble_coeff=coeff, observations=_observations(7))
    runtime = PolicyRuntime(RuntimeConfig(
        model_path=lerobot_checkpoint, device='cpu', mode=mode, execution='sync',
        n_action_steps=n_action_steps, ensemble_coeff=coeff or 0.01))
    runtime.reset()
    got = np.stack([runtime.act(obs) for obs in _observations(7)])
    assert got.shape == (TICKS, 6)
    assert np.abs(got - expected).max() < 1e-5
    expected_chunks = TICKS // 30 if mode == 'chunk' else TICKS
    assert runtime.stats.chunks_computed == expected_chunks
    # The reference is not trivially constant: actions vary over the episode.
    assert np.ptp(expected, axis=0).max() > 1e-3
