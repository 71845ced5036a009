"""Frozen-backbone training on cached feature maps: the cached step is the full step with
a frozen backbone (same loss, same gradients), the cache refuses frames it does not hold,
and a run that freezes mid-way resumes, saves the backbone and loads in LeRobot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from act_ros.core.contract import load_contract
from act_ros.core.inference.checkpoint_info import SIM_CHUNK_SIZE  # the tiny preset's
from act_ros.training.config import TrainConfig
from act_ros.training.feature_cache import FeatureCache, backbone_bypassed, build_feature_cache, freeze
from act_ros.training.loss import act_training_loss

pytest.importorskip('lerobot')
CONTRACT = load_contract()
KEYS = [cam.feature for cam in CONTRACT.cameras]


def _policy():
    from lerobot.policies.act.modeling_act import ACTPolicy

    from act_ros.core.inference.checkpoint import make_act_config

    torch.manual_seed(0)
    policy = ACTPolicy(make_act_config(CONTRACT, image_size=(48, 64), preset='tiny',
                                       dropout=0.0))
    policy.train()
    return policy


def _batch(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    batch = {key: torch.randn(n, 3, 48, 64, generator=g) for key in KEYS}
    batch['observation.state'] = torch.randn(n, 6, generator=g)
    batch['action'] = torch.randn(n, SIM_CHUNK_SIZE, 6, generator=g)
    batch['action_is_pad'] = torch.zeros(n, SIM_CHUNK_SIZE, dtype=torch.bool)
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


def test_a_run_cached_from_the_first_step_decodes_only_the_frames_it_reads(tmp_path):
    # With the backbone frozen at step 0 and every 3rd training frame cached, only those,
    # the validation frames and the checked frames are decoded: the pixels equal a full
    # decode's, and training and validation give the same numbers as from a full decode.
    from act_ros.training.data import DecodedFrames
    from act_ros.training.loop import Trainer
    from act_ros.training.prepare import frames_read, prepare_inputs

    data = _synthetic_dataset(tmp_path / 'syn', 21)
    values = dict(dataset_root=data, preset='synthetic', model_preset='tiny',
                  image_size=(32, 48), steps=4, batch_size=4, val_ratio=0.34, device='cpu',
                  torch_threads=1, progress=False, backbone_freeze_step=0, cache_frame_stride=3)
    subset = prepare_inputs(TrainConfig(output_dir=tmp_path / 'a', **values))
    split = subset.split
    assert split.kind == 'episode' and split.val.size == 21
    features = [cam.feature for cam in CONTRACT.cameras]
    images = subset.store.images[features[0]]
    assert isinstance(images, DecodedFrames) and images.shape[0] == 63
    cached = subset.store.seg_start.numpy()
    expected = np.union1d(split.train[(split.train - cached[split.train]) % 3 == 0], split.val)
    assert np.array_equal(images.frames, expected) and expected.size == 2 * 7 + 21
    with pytest.raises(IndexError, match='not decoded'):
        images[np.array([int(split.train[1])])]
    # The same run decoding every frame (stride 1 decodes all; the frames are then compared).
    full = prepare_inputs(TrainConfig(output_dir=tmp_path / 'b', **{**values,
                                                                     'cache_frame_stride': 1}))
    for key in features:
        assert torch.equal(subset.store.images[key][expected], full.store.images[key][expected])
    trained = []
    for inputs, out in ((subset, 'a'), (full, 'b')):
        trainer = Trainer(TrainConfig(output_dir=tmp_path / out, **values), inputs)
        for _ in range(3):
            trainer.train_step()
        trained.append((trainer.policy.state_dict(), trainer.validate()))
    (weights, val), (full_weights, full_val) = trained
    assert val == full_val and val['val_l1'] > 0
    assert all(torch.equal(weights[k], full_weights[k]) for k in weights)
    # Calibrated norms and no validation split: those training frames are read too.
    config = TrainConfig(output_dir=tmp_path / 'c', **{**values, 'val_ratio': 0.0},
                         calibrate_backbone_norm=True)
    read = frames_read(config, full.split, full.store.seg_start.numpy())
    assert read is not None and read.size > 2 * 7
    assert frames_read(TrainConfig(output_dir=tmp_path / 'd', **{**values,
                                                                 'backbone_freeze_step': 5}),
                       split, cached) is None


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


# -- the layer4 maps kept on disk (act_ros.training.feature_disk) -----------------------------

def _tiny_backbone(seed=0):
    """A stand-in for LeRobot's ResNet backbone with its stage names (conv1 ... layer4) and
    a FrozenBatchNorm2d: the disk cache sees only the stages and their state."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    torch.manual_seed(seed)
    backbone = torch.nn.Module()
    backbone.conv1 = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False)
    backbone.bn1 = FrozenBatchNorm2d(4)
    backbone.relu = torch.nn.ReLU()
    backbone.maxpool = torch.nn.MaxPool2d(2)
    for name in ('layer1', 'layer2', 'layer3', 'layer4'):
        setattr(backbone, name, torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1),
                                                    torch.nn.ReLU()))
    freeze(backbone)
    return backbone


def _pixels(n=10, seed=3):
    g = torch.Generator().manual_seed(seed)
    return {key: torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8)
            for key in KEYS}


class _Images:
    """``load_images`` of the builders: normalized camera batches; records the frames asked."""

    def __init__(self, pixels):
        self.pixels = pixels
        self.asked: list[int] = []

    def __call__(self, indices):
        self.asked += np.asarray(indices).tolist()
        idx = torch.as_tensor(indices, dtype=torch.long)
        return {k: (v[idx].float() / 255.0 - 0.45) / 0.25 for k, v in self.pixels.items()}


NORMALIZATION = {'normalizers': [{'mode': 'MEAN_STD', 'eps': 1e-8,
                                  'stats': {k: {'mean': [0.45], 'std': [0.25]} for k in KEYS}}]}


def _disk(root, backbone, normalization=NORMALIZATION):
    from act_ros.training.feature_disk import DiskFeatureCache, backbone_components

    return DiskFeatureCache(root, backbone_components(
        backbone, 'layer4', normalization=normalization, precision='fp32', dtype=torch.float32,
        device='cpu', cameras=KEYS, image_shape=(3, 16, 16)))


def _build_disk(root, backbone, pixels, frames, *, batch_size=4, normalization=NORMALIZATION):
    from act_ros.training.feature_disk import build_feature_cache_on_disk, frame_digests

    images = _Images(pixels)
    frames = np.asarray(frames)
    cache = build_feature_cache_on_disk(
        _disk(root, backbone, normalization), frame_digests(pixels, KEYS, frames), backbone,
        frames, len(next(iter(pixels.values()))), images, KEYS, batch_size=batch_size)
    return cache, images.asked


def _build_memory(backbone, pixels, frames, *, batch_size=4):
    return build_feature_cache(backbone, np.asarray(frames), len(next(iter(pixels.values()))),
                               _Images(pixels), KEYS, batch_size=batch_size)


def _equal(a, b):
    return all(torch.equal(a.maps[k], b.maps[k]) for k in KEYS)


def test_maps_read_from_disk_are_bitwise_those_computed_in_memory(tmp_path):
    backbone, pixels, frames = _tiny_backbone(), _pixels(), [0, 2, 3, 5, 6, 7, 9]
    memory = _build_memory(backbone, pixels, frames)
    first, asked = _build_disk(tmp_path, backbone, pixels, frames)
    assert (first.computed, first.reused) == (7, 0) and sorted(asked) == frames
    assert _equal(first, memory)
    again, asked = _build_disk(tmp_path, backbone, pixels, frames)
    assert (again.computed, again.reused, asked) == (0, 7, [])
    assert all(again.maps[k].dtype == torch.float32 for k in KEYS)
    assert _equal(again, memory)
    np.testing.assert_array_equal(again.rows.numpy(), memory.rows.numpy())
    assert again.location == first.location and first.location.parent == tmp_path
    meta = json.loads((first.location / 'meta.json').read_text())
    assert meta['components']['cut'] == 'layer4' and meta['map_dtype'] == 'torch.float32'
    assert [e['camera'] for e in meta['layout']] == KEYS


def _assert_equal_to_float32_rounding(a, b):
    """The same maps computed in batches of another size: the convolutions sum the same
    products in another order (another kernel), so they agree to float32 rounding of those
    sums, which scales with the largest magnitude, not with each element: within 2^-16
    (512 units in the last place) of the largest value, on any CPU."""
    scale = float(torch.maximum(a.abs().max(), b.abs().max()))
    assert float((a - b).abs().max()) <= scale * 2.0 ** -16


def test_a_superset_computes_only_the_new_frames(tmp_path):
    backbone, pixels = _tiny_backbone(), _pixels(12)
    old, _ = _build_disk(tmp_path, backbone, pixels, range(8))
    grown, asked = _build_disk(tmp_path, backbone, pixels, range(12))
    assert sorted(asked) == [8, 9, 10, 11] and (grown.computed, grown.reused) == (4, 8)
    for k in KEYS:
        assert torch.equal(grown.maps[k][:8], old.maps[k])
    new = _build_memory(backbone, pixels, [8, 9, 10, 11])  # the same batch as the disk build
    assert all(torch.equal(grown.lookup(np.arange(8, 12))[k], new.maps[k]) for k in KEYS)
    everything = _build_memory(backbone, pixels, range(12))
    for k in KEYS:
        _assert_equal_to_float32_rounding(grown.maps[k], everything.maps[k])


def test_another_backbone_or_normalization_is_another_key(tmp_path):
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    from act_ros.training.feature_disk import camera_normalization

    backbone, pixels, frames = _tiny_backbone(), _pixels(), range(6)
    first, _ = _build_disk(tmp_path, backbone, pixels, frames)
    with torch.no_grad():
        backbone.layer4[0].bias += 0.5
    changed, asked = _build_disk(tmp_path, backbone, pixels, frames)
    assert changed.location != first.location and changed.computed == 6 and len(asked) == 6
    assert not _equal(changed, first)
    with torch.no_grad():  # a FrozenBatchNorm2d statistic is part of the state too
        backbone.bn1.running_var[1] = 2.0
    assert _build_disk(tmp_path, backbone, pixels, frames)[0].computed == 6
    normalized = dict(NORMALIZATION, other=True)
    assert _build_disk(tmp_path, backbone, pixels, frames,
                       normalization=normalized)[0].computed == 6

    from act_ros.core.inference.checkpoint import make_act_config

    config = make_act_config(CONTRACT, image_size=(48, 64), preset='tiny')
    stats = {'observation.state': {'mean': torch.zeros(6), 'std': torch.ones(6)},
             'action': {'mean': torch.zeros(6), 'std': torch.ones(6)}}
    cams = {k: {'mean': torch.full((3, 1, 1), 0.5), 'std': torch.full((3, 1, 1), 0.25)}
            for k in KEYS}
    pre_a = make_act_pre_post_processors(config, {**stats, **cams})[0]
    pre_b = make_act_pre_post_processors(config, {**stats, **cams, KEYS[1]: {
        'mean': torch.full((3, 1, 1), 0.5), 'std': torch.full((3, 1, 1), 0.2)}})[0]
    norm_a, norm_b = camera_normalization(pre_a, KEYS), camera_normalization(pre_b, KEYS)
    assert norm_a['normalizers'][0]['stats'][KEYS[0]]['mean'] == pytest.approx([0.5] * 3)
    assert _disk(tmp_path, backbone, norm_a).key != _disk(tmp_path, backbone, norm_b).key
    assert _disk(tmp_path, backbone, norm_a).key == _disk(tmp_path, backbone,
                                                          camera_normalization(pre_a, KEYS)).key


def test_frames_are_found_by_their_pixels_not_their_index(tmp_path):
    backbone, pixels = _tiny_backbone(), _pixels(8)
    first, _ = _build_disk(tmp_path, backbone, pixels, range(8))
    order = torch.tensor([5, 3, 7, 0, 1, 6, 2, 4])  # a renumbered dataset, same pixels
    renumbered = {k: v[order] for k, v in pixels.items()}
    again, asked = _build_disk(tmp_path, backbone, renumbered, range(8))
    assert (again.computed, asked) == (0, [])
    assert all(torch.equal(again.maps[k], first.maps[k][order]) for k in KEYS)
    renumbered[KEYS[1]][2, 0, 0, 0] ^= 1  # one pixel of one camera differs: recomputed
    changed, asked = _build_disk(tmp_path, backbone, renumbered, range(8))
    assert (changed.computed, asked) == (1, [2])
    # Equal pixels at two indices within one build are computed once.
    doubled = {k: torch.cat([v[:3], v[:3]]) for k, v in _pixels(3, seed=9).items()}
    twice, asked = _build_disk(tmp_path, backbone, doubled, range(6))
    assert twice.computed == 3 and sorted(asked) == [0, 1, 2]
    assert all(torch.equal(twice.maps[k][:3], twice.maps[k][3:]) for k in KEYS)


@pytest.mark.parametrize('name, cut', [('maps.bin', 5), ('digests.bin', 3),
                                       ('maps.bin', 0), ('digests.bin', 0)])
def test_a_cache_cut_mid_append_keeps_its_whole_rows(tmp_path, name, cut):
    from act_ros.training.feature_disk import RECORD_SIZE

    backbone, pixels = _tiny_backbone(), _pixels(8)
    first, _ = _build_disk(tmp_path, backbone, pixels, range(8), batch_size=3)
    meta = json.loads((first.location / 'meta.json').read_text())
    path = first.location / name
    unit = meta['row_bytes'] if name == 'maps.bin' else RECORD_SIZE
    # digests.bin cut: a process killed mid-append (the last record partly written or, with
    # cut == 0, not yet). maps.bin cut: the last row's maps partly or wholly gone (warned:
    # not a crash, records follow their maps). Either way the whole rows before are kept.
    os.truncate(path, path.stat().st_size - (cut or unit))
    again, asked = _build_disk(tmp_path, backbone, pixels, range(8), batch_size=3)
    assert (again.reused, again.computed, asked) == (7, 1, [7])
    for k in KEYS:  # the whole rows as written; the last one computed alone (batch of 1)
        assert torch.equal(again.maps[k][:7], first.maps[k][:7])
        _assert_equal_to_float32_rounding(again.maps[k][7], first.maps[k][7])
    assert (first.location / 'maps.bin').stat().st_size == 8 * meta['row_bytes']
    assert (first.location / 'digests.bin').stat().st_size == 8 * RECORD_SIZE
    assert _build_disk(tmp_path, backbone, pixels, range(8))[0].computed == 0


def test_a_corrupt_cache_is_rebuilt_with_a_warning(tmp_path, caplog):
    backbone, pixels = _tiny_backbone(), _pixels(6)
    first, _ = _build_disk(tmp_path, backbone, pixels, range(6))
    meta = first.location / 'meta.json'
    text = meta.read_text()
    for broken in (text[:len(text) // 2], text.replace('"layer4"', '"layer3"'), None):
        if broken is None:
            meta.unlink()  # rows without their description
        else:
            meta.write_text(broken)
        caplog.clear()
        with caplog.at_level('WARNING', logger='act_ros.training.feature_disk'):
            again, asked = _build_disk(tmp_path, backbone, pixels, range(6))
        assert 'rebuilding' in caplog.text, broken
        assert again.computed == 6 and len(asked) == 6 and _equal(again, first)
    # A map byte changed on disk: its row fails its digest, nothing of it is used.
    maps = first.location / 'maps.bin'
    data = bytearray(maps.read_bytes())
    data[100] ^= 0xFF
    maps.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level('WARNING', logger='act_ros.training.feature_disk'):
        again, _ = _build_disk(tmp_path, backbone, pixels, range(6))
    assert 'does not match its digest' in caplog.text and again.computed == 6
    assert _equal(again, first)
    assert _build_disk(tmp_path, backbone, pixels, range(6))[0].computed == 0


def test_a_resumed_or_fine_tuned_run_reads_every_frame_from_disk(tmp_path):
    """Frozen at step 2, stopped at 4 and resumed: the resumed run computes no map and
    trains as the same run on maps kept in memory only; a run started from its weights
    with the backbone frozen from step 0 reuses them too."""
    from act_ros.training.train import run

    data = _synthetic_dataset(tmp_path / 'syn', 8)
    values = dict(dataset_root=data, output_dir=tmp_path / 'disk', preset='synthetic',
                  model_preset='tiny', image_size=(16, 24), steps=4, batch_size=2, lr=1e-3,
                  scheduler='none',  # the same learning rate whether the run stops at 4 or 6
                  val_interval=100, max_val_batches=1, checkpoint_interval=2,
                  early_stop_patience=0, min_steps=0, device='cpu', torch_threads=1,
                  progress=False, skip_infer=True, backbone_freeze_step=2)
    first = run(TrainConfig(**values))['feature_cache']['layer4']
    frames = first['cached_frames']
    assert (first['computed_frames'], first['reused_frames']) == (frames, 0)
    assert first['cache_dir'].startswith(str(tmp_path / 'disk' / 'feature_cache'))
    resumed = run(TrainConfig(**{**values, 'steps': 6, 'resume': True}))
    assert resumed['feature_cache']['layer4']['computed_frames'] == 0
    assert resumed['feature_cache']['layer4']['reused_frames'] == frames
    memory = run(TrainConfig(**{**values, 'steps': 6, 'output_dir': tmp_path / 'memory',
                                'feature_cache_dir': 'none'}))
    assert memory['feature_cache']['layer4']['cache_dir'] is None
    assert not (tmp_path / 'memory' / 'feature_cache').exists()
    losses = [[row['loss'] for row in m['history']['train']] for m in (resumed, memory)]
    assert len(losses[0]) == len(losses[1]) == 6
    # The same maps (bitwise), the same steps on one thread: the same losses, exactly.
    np.testing.assert_array_equal(losses[0], losses[1])
    tuned = run(TrainConfig(**{**values, 'steps': 1, 'output_dir': tmp_path / 'tuned',
                               'backbone_freeze_step': 0, 'init_from': tmp_path / 'disk' / 'last',
                               'feature_cache_dir': tmp_path / 'disk' / 'feature_cache'}))
    assert tuned['feature_cache']['layer4']['computed_frames'] == 0
    assert tuned['feature_cache']['layer4']['cache_dir'] == first['cache_dir']


@pytest.mark.sim
@pytest.mark.slow  # collects two full expert episodes
def test_encoder_pose_head_keeps_training_after_the_freeze(tmp_path):
    """--aux-object-pose-source encoder: the pose loss is in every step's terms, before and
    after the backbone is frozen and cached (the backbone source stops at the freeze), the
    held-out pose errors are reported, and a resume with the other source is refused."""
    pytest.importorskip('mujoco')
    from act_ros.training.drivers import collect
    from act_ros.training.train import run

    data = tmp_path / 'demos'
    # 245 ticks: the expert's shortest successful episode (collect keeps successes only)
    assert collect.main(['--output', str(data), '--episodes', '2', '--seed', '3',
                         '--image-size', '48x64', '--episode-steps', '245', '--no-progress']) == 0
    values = dict(dataset_root=data, preset='synthetic', model_preset='tiny',
                  image_size=(48, 64), steps=6, batch_size=2, lr=1e-3, val_interval=6,
                  max_val_batches=1, checkpoint_interval=6, early_stop_patience=0, min_steps=0,
                  device='cpu', torch_threads=1, progress=False, skip_infer=True,
                  backbone_freeze_step=3, aux_object_pose_weight=1.0,
                  feature_cache_dir='none')
    rows = {}
    for source in ('encoder', 'backbone'):
        out = tmp_path / source
        metrics = run(TrainConfig(output_dir=out, aux_object_pose_source=source, **values))
        assert metrics['steps_completed'] == 6
        history = json.loads((out / 'training_metrics.json').read_text())['history']
        rows[source] = {row['step']: row for row in history['train']}
        val = history['val'][-1]
        assert all(np.isfinite(val[f'val_pose_{k}']) for k in ('box_xy_m', 'box_yaw_deg'))
    assert all(np.isfinite(rows['encoder'][s]['aux_pose']) for s in range(1, 7))
    assert [s for s in range(1, 7) if 'aux_pose' in rows['backbone'][s]] == [1, 2, 3]
    # The head's position statistics are saved with it (research/pose_probe.py reads them); for
    # a state saved before they were, the probe recomputes the same from the training split.
    import torch

    from research.pose_probe import _head_statistics
    last = tmp_path / 'encoder' / 'last'
    state = torch.load(last / 'training_state.pt', map_location='cpu', weights_only=False)
    older = {k: v for k, v in state.items() if not k.startswith('aux_position_')}
    for saved, recomputed in zip(_head_statistics(state, last), _head_statistics(older, last)):
        torch.testing.assert_close(saved, recomputed)
    with pytest.raises(ValueError, match='aux-object-pose-source encoder'):
        run(TrainConfig(output_dir=tmp_path / 'encoder', aux_object_pose_source='backbone',
                        **{**values, 'steps': 8, 'resume': True}))
