"""Frozen-backbone training on cached feature maps: the cached step is the full step with
a frozen backbone (same loss, same gradients), the cache refuses frames it does not hold,
and a run that freezes mid-way resumes, saves the backbone and loads in LeRobot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from act_ros.core.contract import load_contract
from act_ros.core.loss import act_training_loss
from act_ros.training.config import TrainConfig
from act_ros.training.feature_cache import (FeatureCache, backbone_bypassed,
                                            build_feature_cache, freeze)

pytest.importorskip('lerobot')
CONTRACT = load_contract()
KEYS = [cam.feature for cam in CONTRACT.cameras]


def _policy():
    from lerobot.policies.act.modeling_act import ACTPolicy

    from act_ros.core.checkpoint import make_act_config

    torch.manual_seed(0)
    policy = ACTPolicy(make_act_config(CONTRACT, image_size=(48, 64), preset='tiny',
                                       dropout=0.0))
    policy.train()
    return policy


def _batch(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    batch = {key: torch.randn(n, 3, 48, 64, generator=g) for key in KEYS}
    batch['observation.state'] = torch.randn(n, 6, generator=g)
    batch['action'] = torch.randn(n, CONTRACT.chunk_size, 6, generator=g)
    batch['action_is_pad'] = torch.zeros(n, CONTRACT.chunk_size, dtype=torch.bool)
    batch['action_is_pad'][0, -5:] = True
    return batch


def _loss_and_grads(model, inputs, cut=None):
    """Loss and non-None gradients of one training step (latent sample seeded)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # the VAE's latent sample
    if cut is not None:
        with backbone_bypassed(model, cut):
            out = act_training_loss(model, inputs, image_features=KEYS)
    else:
        out = act_training_loss(model, inputs, image_features=KEYS)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}


def test_cached_step_equals_the_full_step_with_a_frozen_backbone():
    policy = _policy()
    model = policy.model
    freeze(model.backbone)
    batch = _batch()
    cached = dict(batch)
    with torch.no_grad():
        for key in KEYS:
            cached[key] = model.backbone(batch[key])['feature_map']

    full_loss, full_grads = _loss_and_grads(model, batch)
    cached_loss, cached_grads = _loss_and_grads(model, cached, 'layer4')
    assert torch.allclose(full_loss, cached_loss, rtol=1e-5, atol=1e-6)
    assert full_grads.keys() == cached_grads.keys()
    assert not any(name.startswith('backbone.') for name in full_grads)
    assert len(full_grads) > 10
    for name, grad in full_grads.items():
        assert torch.allclose(grad, cached_grads[name], rtol=1e-4, atol=1e-6), name
    # The real backbone is back after the bypass, also in the state dict.
    assert any(k.startswith('backbone.') for k in model.state_dict())


def test_cached_early_stages_give_the_full_step_for_the_rest():
    """Stem..layer2 cached: the loss and every gradient (layer3, layer4 and the rest) are
    those of the full step with the early stages frozen."""
    from act_ros.training.feature_cache import stages_up_to

    policy = _policy()
    model = policy.model
    frozen = freeze(model.backbone, 'layer2')
    assert 0 < frozen < sum(p.numel() for p in model.backbone.parameters())
    batch = _batch()
    cached = dict(batch)
    with torch.no_grad():
        for key in KEYS:
            x = batch[key]
            for stage in stages_up_to(model.backbone, 'layer2'):
                x = stage(x)
            cached[key] = x
    half = dict(cached)  # the trainer stores early maps as float16 (used as float32)
    cache = FeatureCache({k: cached[k].half() for k in KEYS}, np.arange(4), 4, 0.0, cut='layer2')
    half.update(cache.lookup(np.arange(4)))

    full_loss, full_grads = _loss_and_grads(model, batch)
    cached_loss, cached_grads = _loss_and_grads(model, cached, 'layer2')
    assert full_grads.keys() == cached_grads.keys()
    assert any(n.startswith('backbone.layer4') for n in full_grads)
    assert not any(n.startswith(('backbone.layer2', 'backbone.conv1')) for n in full_grads)
    assert torch.allclose(full_loss, cached_loss, rtol=1e-5)
    for name, grad in full_grads.items():
        assert torch.allclose(grad, cached_grads[name], rtol=1e-3, atol=1e-6), name
    # float16 storage: the same step to float16's precision.
    half_loss, _ = _loss_and_grads(model, half, 'layer2')
    assert torch.allclose(full_loss, half_loss, rtol=2e-3)


def test_bypass_restores_the_backbone_on_error():
    policy = _policy()
    real = policy.model.backbone
    with pytest.raises(RuntimeError):
        with backbone_bypassed(policy.model):
            raise RuntimeError('boom')
    assert policy.model.backbone is real


def test_cache_holds_the_frozen_maps_of_the_chosen_frames_only():
    policy = _policy()
    backbone = policy.model.backbone
    freeze(backbone)
    images = {key: torch.randn(10, 3, 48, 64) for key in KEYS}
    frames = np.array([1, 3, 4, 8])
    cache = build_feature_cache(backbone, frames, 10,
                                lambda idx: {k: v[torch.as_tensor(idx)] for k, v in images.items()},
                                KEYS, batch_size=3)
    assert isinstance(cache, FeatureCache)
    got = cache.lookup(np.array([8, 1]))
    with torch.no_grad():
        want = backbone(images[KEYS[0]][[8, 1]])['feature_map']
    assert torch.allclose(got[KEYS[0]], want, rtol=1e-4, atol=1e-5)  # batch sizes differ
    with pytest.raises(KeyError, match=r'\[2\]'):
        cache.lookup(np.array([1, 2]))


def _synthetic_dataset(root, frames):
    """Three synthetic episodes of ``frames`` frames, 48x64 PNG cameras."""
    pytest.importorskip('lerobot.datasets.lerobot_dataset')
    from act_ros.data.synthetic import write_synthetic_dataset

    write_synthetic_dataset(root, episodes=3, frames=frames, image_size=(48, 64), video=False,
                            seed=5, contract=CONTRACT)
    return root


def test_frame_stride_caches_every_kth_frame_and_trains_on_those(tmp_path):
    from act_ros.training.loop import Trainer
    from act_ros.training.prepare import prepare_inputs

    data = _synthetic_dataset(tmp_path / 'syn', 21)
    config = TrainConfig(dataset_root=data, output_dir=tmp_path / 'run', preset='synthetic',
                         model_preset='tiny', image_size=(32, 48), steps=4, batch_size=4,
                         val_ratio=0.0, device='cpu', torch_threads=1, progress=False,
                         backbone_freeze_step=0, cache_frame_stride=3)
    inputs = prepare_inputs(config)
    trainer = Trainer(config, inputs)
    cached = trainer.cached_frames()
    assert cached.size == 3 * 7  # frames 0, 3, ..., 18 of each 21-frame episode
    positions = cached - inputs.store.seg_start.numpy()[cached]
    assert set((positions % 3).tolist()) == {0}
    for _ in range(3):
        trainer.train_step()
    assert set(trainer.order.indices(3).tolist()) <= set(cached.tolist())
    assert trainer.feature_cache_info['layer4']['cached_frames'] == 21


def test_train_config_checks_the_freeze_step(tmp_path):
    with pytest.raises(ValueError, match='backbone_freeze_step'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path / 'o', backbone_freeze_step=-1)
    with pytest.raises(ValueError, match='early_freeze_layer'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path / 'o', early_freeze_layer='fc')
    with pytest.raises(ValueError, match='cache_frame_stride'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path / 'o', cache_frame_stride=0)
    with pytest.raises(ValueError, match='comes before'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path / 'o', early_freeze_layer='layer2',
                    early_freeze_step=10, backbone_freeze_step=5)


def test_run_freezes_mid_way_resumes_and_keeps_the_backbone(tmp_path):
    from lerobot.policies.act.modeling_act import ACTPolicy
    from safetensors.torch import load_file

    from act_ros.training.train import run

    data = _synthetic_dataset(tmp_path / 'syn', 30)
    out = tmp_path / 'run'
    values = dict(dataset_root=data, output_dir=out, preset='synthetic', model_preset='tiny',
                  image_size=(32, 48), steps=6, batch_size=2, lr=1e-3, val_interval=3,
                  max_val_batches=1, checkpoint_interval=3, early_stop_patience=0, min_steps=0,
                  device='cpu', torch_threads=1, progress=False, skip_infer=True,
                  backbone_freeze_step=3)
    first = run(TrainConfig(**values))
    assert first['feature_cache']['layer4']['frozen_at_step'] == 3
    assert first['feature_cache']['layer4']['cached_frames'] == \
        len(first['split']['train_episodes']) * 30
    step3 = load_file(str(out / 'step_000003' / 'model.safetensors'))
    last = load_file(str(out / 'last' / 'model.safetensors'))
    backbone = [k for k in step3 if k.startswith('model.backbone.')]
    assert backbone and all(torch.equal(step3[k], last[k]) for k in backbone)
    # The rest of the network kept training on the cached maps.
    assert any(not torch.equal(step3[k], last[k]) for k in step3 if k not in backbone)
    # Resuming past the freeze step rebuilds the cache and goes on.
    resumed = run(TrainConfig(**{**values, 'steps': 9, 'resume': True,
                                 'early_freeze_layer': 'layer2', 'early_freeze_step': 0}))
    assert resumed['steps_completed'] == 9
    assert resumed['feature_cache']['layer4']['frozen_at_step'] == 6
    assert resumed['feature_cache']['layer2']['frozen_at_step'] == 6  # built first, then layer4
    final = load_file(str(out / 'last' / 'model.safetensors'))
    assert all(torch.equal(step3[k], final[k]) for k in backbone)
    history = json.loads((out / 'training_metrics.json').read_text())['history']['train']
    assert all(np.isfinite(row['loss']) for row in history)
    policy = ACTPolicy.from_pretrained(str(Path(out) / 'last'))
    assert sum(p.numel() for p in policy.model.backbone.parameters()) > 1e6
