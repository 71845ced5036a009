"""Training aids of the CPU recipe: backbone norm calibration, random shift, joint-state
perturbation, precision, failure phases, the learning-curve plot. Small models and tensors: seconds in all."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from act_ros.core.contract import load_contract
from act_ros.sim.metrics import FAILURE_PHASES, EpisodeResult, failure_phase, summarize_results
from act_ros.training.backbone import TrainableBatchNorm, calibrate_frozen_batchnorm, frozen_batchnorm_layers
from act_ros.training.config import TrainConfig
from act_ros.training.loop import perturb_state, random_shift, resolve_precision


def _act_model(image_size=(48, 64)):
    pytest.importorskip('lerobot')
    from lerobot.policies.act.modeling_act import ACTPolicy

    from act_ros.core.inference.checkpoint import make_act_config

    torch.manual_seed(0)
    return ACTPolicy(make_act_config(load_contract(), image_size=image_size, preset='tiny'))


def test_calibration_standardizes_every_frozen_norm_in_order():
    policy = _act_model()
    backbone = policy.model.backbone
    images = [torch.rand(6, 3, 48, 64) * 2 - 1, torch.rand(6, 3, 48, 64)]
    layers = frozen_batchnorm_layers(backbone)
    assert len(layers) == 20  # ResNet-18: stem + 16 in blocks + 3 downsample
    before = calibrate_frozen_batchnorm(backbone, images)
    assert list(before) == [name for name, _ in layers]
    # Every layer's output is now zero-mean, unit-variance per channel on the calibration
    # batch (cloned: the ReLU after it works in place).
    outputs = {}
    handles = [layer.register_forward_hook(
        lambda _m, _i, out, name=name: outputs.__setitem__(name, out.clone()))
        for name, layer in layers]
    with torch.no_grad():
        backbone(torch.cat(images))
    for handle in handles:
        handle.remove()
    for name, out in outputs.items():
        mean = out.mean(dim=(0, 2, 3))
        std = out.std(dim=(0, 2, 3), unbiased=False)
        assert mean.abs().max() < 1e-3, name
        live = std > 1e-3  # channels that carry signal (a channel can be dead after a ReLU)
        assert live.float().mean() > 0.9, name
        assert (std[live] - 1).abs().max() < 1e-2, name
    # The stem saw inputs far from unit scale: identity norms were not standardizing.
    assert before['bn1'] < 0.5


def test_calibrated_checkpoint_keeps_its_statistics_through_lerobot(tmp_path):
    from lerobot.policies.act.modeling_act import ACTPolicy

    policy = _act_model()
    calibrate_frozen_batchnorm(policy.model.backbone, [torch.rand(8, 3, 48, 64)])
    policy.save_pretrained(tmp_path)
    config = json.loads((tmp_path / 'config.json').read_text())
    assert config['pretrained_backbone_weights'] is None
    loaded = ACTPolicy.from_pretrained(tmp_path)
    mine = dict(policy.model.backbone.named_buffers())
    theirs = dict(loaded.model.backbone.named_buffers())
    assert mine.keys() == theirs.keys()
    changed = 0
    for name, value in mine.items():
        torch.testing.assert_close(theirs[name], value)
        changed += name.endswith('running_var') and not torch.allclose(value, torch.ones_like(value))
    assert changed == 20


def test_calibration_refuses_a_model_without_frozen_norms():
    with pytest.raises(ValueError, match='no FrozenBatchNorm2d'):
        calibrate_frozen_batchnorm(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)),
                                   [torch.rand(2, 3, 8, 8)])
    backbone = _act_model().model.backbone
    with pytest.raises(ValueError, match='at least 2 images'):
        calibrate_frozen_batchnorm(backbone, [torch.rand(1, 3, 48, 64)])


def test_trainable_norms_learn_and_are_saved_as_the_frozen_layers_they_replace(tmp_path):
    """While they train, the norms standardize each batch and keep running statistics; what
    is saved is LeRobot's frozen layout, and it computes what the trained backbone computes
    in eval mode."""
    from lerobot.policies.act.modeling_act import ACTPolicy

    policy = _act_model()
    backbone = policy.model.backbone
    keys = set(backbone.state_dict())
    frozen_stem = [backbone.conv1, backbone.bn1, backbone.layer1]
    for module in frozen_stem:
        module.requires_grad_(False)
    stem_before = {k: v.clone() for k, v in backbone.layer1.state_dict().items()}
    norms = TrainableBatchNorm(backbone, skip=frozen_stem)
    assert len(norms) == 20 - 5  # the stem's norm and layer1's four stay frozen
    assert len(frozen_batchnorm_layers(backbone)) == 5
    trained = [p for p in backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trained, lr=0.1)
    backbone.train()
    torch.manual_seed(1)
    for _ in range(3):
        out = backbone(torch.rand(4, 3, 48, 64) * 3 + 1)['feature_map']
        optimizer.zero_grad()
        (out.mean() ** 2 + out.std()).backward()
        optimizer.step()
    probe = torch.rand(2, 3, 48, 64) * 3 + 1
    backbone.eval()
    with torch.no_grad():
        expected = backbone(probe)['feature_map']
    # The same map up to float rounding (the frozen layer folds scale and shift): errors
    # relative to the map's own scale, 1e-4 of it (hundreds of float32 ulps), on any CPU.
    close = dict(rtol=0, atol=1e-4 * float(expected.abs().max()))
    with norms.frozen():
        assert len(frozen_batchnorm_layers(backbone)) == 20
        assert set(backbone.state_dict()) == keys  # no num_batches_tracked: LeRobot's layout
        policy.save_pretrained(tmp_path)
        with torch.no_grad():
            torch.testing.assert_close(backbone(probe)['feature_map'], expected, **close)
    assert len(frozen_batchnorm_layers(backbone)) == 5  # training layers back in place
    loaded = ACTPolicy.from_pretrained(tmp_path).model.backbone.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(probe)['feature_map'], expected, **close)
    # The statistics and the affine moved (the inputs are far from the calibrated scale);
    # the frozen stages' did not.
    saved = loaded.state_dict()
    assert not torch.allclose(saved['layer4.1.bn2.running_var'], torch.ones(512))
    assert not torch.allclose(saved['layer2.0.bn1.weight'], torch.ones(128))
    for key, value in stem_before.items():
        torch.testing.assert_close(saved[f'layer1.{key}'], value)
    with pytest.raises(ValueError, match='no FrozenBatchNorm2d outside the frozen stages'):
        TrainableBatchNorm(loaded, skip=[loaded])


def test_random_shift_moves_whole_images_within_the_pad():
    torch.manual_seed(1)
    images = torch.arange(2 * 1 * 10 * 12, dtype=torch.float32).reshape(2, 1, 10, 12)
    shifted = random_shift(images, 2)
    assert shifted.shape == images.shape
    for i in range(2):
        # The interior is the original shifted by (dy, dx) with |dy|, |dx| <= 2.
        found = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                 if torch.equal(shifted[i, 0, 2:-2, 2:-2], images[i, 0, 2 + dy:8 + dy, 2 + dx:10 + dx])]
        assert len(found) == 1
    # Over many draws every offset occurs, so no direction is favoured.
    seen = set()
    for _ in range(200):
        out = random_shift(images[:1], 1)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if torch.equal(out[0, 0, 1:-1, 1:-1], images[0, 0, 1 + dy:9 + dy, 1 + dx:11 + dx]):
                    seen.add((dy, dx))
    assert len(seen) == 9


def test_perturb_state_adds_noise_and_drops_whole_samples():
    torch.manual_seed(2)
    state = torch.randn(4000, 6)
    before = state.clone()
    assert torch.equal(perturb_state(state, 0.0, 0.0), state)
    noisy = perturb_state(state, 0.3, 0.0)
    assert torch.equal(state, before)  # the batch's own tensor is not changed
    assert abs(float((noisy - state).std()) - 0.3) < 0.01
    assert abs(float((noisy - state).mean())) < 0.01
    assert torch.equal(perturb_state(state, 0.0, 1.0), torch.zeros_like(state))
    dropped = perturb_state(state, 0.0, 0.25)
    zero_rows = (dropped == 0).all(dim=1)
    assert 0.22 < float(zero_rows.float().mean()) < 0.28
    # A sample is kept or dropped whole: its kept rows are the input's exactly.
    assert torch.equal(dropped[~zero_rows], state[~zero_rows])


@pytest.mark.parametrize('dropout', [0.0, 1.0])
def test_trainer_feeds_the_perturbed_state_to_the_policy(tmp_path, dropout):
    """With every sample's state dropped (replaced by the dataset mean, 0 once normalized),
    the joint-state projection's weight gets no gradient from a training step; without,
    it does."""
    pytest.importorskip('lerobot.datasets.lerobot_dataset')
    from act_ros.data.synthetic import write_synthetic_dataset
    from act_ros.training.loop import Trainer
    from act_ros.training.prepare import prepare_inputs

    root = tmp_path / 'syn'
    write_synthetic_dataset(root, episodes=2, frames=12, image_size=(48, 64), video=False,
                            seed=5, contract=load_contract())
    config = TrainConfig(dataset_root=root, output_dir=tmp_path / 'run', preset='synthetic',
                         model_preset='tiny', image_size=(32, 48), steps=2, batch_size=4,
                         val_ratio=0.0, device='cpu', torch_threads=1, progress=False,
                         backbone_freeze_step=0, state_dropout=dropout)
    trainer = Trainer(config, prepare_inputs(config))
    trainer.train_step()
    proj = trainer.policy.model.encoder_robot_state_input_proj
    assert proj.bias.grad.abs().sum() > 0
    assert (proj.weight.grad.abs().sum() > 0) == (dropout == 0.0)


def test_precision_auto_follows_the_hardware(monkeypatch):
    import act_ros.core.inference.predictor as inference

    cpu = torch.device('cpu')
    monkeypatch.setattr(inference, 'cpu_has_native_bf16', lambda: False)
    assert resolve_precision('auto', cpu) == 'fp32'
    with pytest.raises(Exception, match='no native bfloat16'):
        resolve_precision('bf16', cpu)
    with pytest.raises(ValueError, match='fp16'):
        resolve_precision('fp16', cpu)
    monkeypatch.setattr(inference, 'cpu_has_native_bf16', lambda: True)
    assert resolve_precision('auto', cpu) == 'bf16'
    assert resolve_precision('fp32', cpu) == 'fp32'


def test_train_config_checks_the_new_options(tmp_path):
    with pytest.raises(ValueError, match='precision'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, precision='int8')
    with pytest.raises(ValueError, match='image_shift_px'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, image_shift_px=-1)
    for bad in (-0.1, float('nan')):
        with pytest.raises(ValueError, match='state_noise_std must be >= 0'):
            TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, state_noise_std=bad)
    with pytest.raises(ValueError, match=r'state_dropout must be in \[0, 1\], got 1.5'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, state_dropout=1.5)
    with pytest.raises(ValueError, match="aux_object_pose_yaw_readout 'mean'"):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path,
                    aux_object_pose_yaw_readout='mean')


@pytest.mark.parametrize('kwargs, expected', [
    (dict(success=True, max_box_height_m=0.06, released=True, box_on_pad=True,
          position_ok=True, yaw_ok=True), None),
    (dict(success=False, max_box_height_m=0.005, released=True, box_on_pad=False,
          position_ok=False, yaw_ok=False), 'grasp'),
    (dict(success=False, max_box_height_m=0.06, released=False, box_on_pad=False,
          position_ok=False, yaw_ok=True), 'release'),
    (dict(success=False, max_box_height_m=0.06, released=True, box_on_pad=False,
          position_ok=False, yaw_ok=False), 'carry'),
    (dict(success=False, max_box_height_m=0.06, released=True, box_on_pad=True,
          position_ok=False, yaw_ok=True), 'position'),
    (dict(success=False, max_box_height_m=0.06, released=True, box_on_pad=True,
          position_ok=True, yaw_ok=False), 'yaw'),
    (dict(success=False, max_box_height_m=0.06, released=False, box_on_pad=True,
          position_ok=True, yaw_ok=True), 'settle'),
])
def test_failure_phase_names_the_first_stage_that_failed(kwargs, expected):
    assert failure_phase(**kwargs) == expected
    assert expected is None or expected in FAILURE_PHASES


def test_summary_counts_failures_by_phase():
    results = [EpisodeResult(True, 0.004, 2.0, True, True, True, 0.05, 300),
               EpisodeResult(False, 0.1, 30.0, True, False, True, 0.0, 300,
                             failure_phase='grasp'),
               EpisodeResult(False, 0.03, 3.0, True, True, True, 0.05, 300,
                             failure_phase='position')]
    summary = summarize_results(results)
    assert list(summary['failures']) == list(FAILURE_PHASES)
    assert summary['failures']['grasp'] == 1 and summary['failures']['position'] == 1
    assert sum(summary['failures'].values()) == 2
    assert summary['align_rate'] == pytest.approx(1 / 3)


def test_learning_curve_plot_has_a_wall_clock_axis(tmp_path):
    pytest.importorskip('matplotlib')
    from act_ros.training.metrics import CURVE_PLOT, History, write_plots

    history = History()
    for step in range(1, 21):
        history.add_train(step, {'loss': torch.tensor(1.0 / step), 'l1': torch.tensor(0.5 / step)},
                          1e-4, wall_s=3.0 * step)
    history.flush()
    assert [r['wall_s'] for r in history.train[:2]] == [3.0, 6.0]
    history.val.append({'step': 10, 'wall_s': 31.0, 'val_l1': 0.1, 'val_l1_weighted': 0.1})
    history.closed_loop.append({'step': 10, 'wall_s': 31.0,
                                'chunk': {'align_rate': 0.5, 'count': 4}})
    written = write_plots(tmp_path, history)
    assert CURVE_PLOT in written
    from PIL import Image

    with Image.open(tmp_path / CURVE_PLOT) as image:
        assert image.size[0] > 400 and np.asarray(image).std() > 10


def test_wall_clock_ticks_do_not_pile_up_where_no_steps_ran():
    pytest.importorskip('matplotlib')
    from act_ros.training.metrics import _spread_ticks

    # 2000 steps in 30 min, then 25 min without a step (a cache build), then fast steps.
    steps = np.array([0.0, 2000.0, 2001.0, 10000.0])
    minutes = np.array([0.0, 30.0, 55.0, 80.0])
    ticks = _spread_ticks(minutes, steps)
    at = np.interp(ticks, minutes, steps)
    assert len(ticks) >= 3
    assert np.all(np.diff(at) >= 0.07 * 10000 - 1e-6)
    assert all(0.0 <= t <= 80.0 for t in ticks)


@pytest.mark.slow
@pytest.mark.parametrize('yaw_readout', ['flatten', 'attention'])
def test_object_pose_head_trains_the_backbone_and_stays_out_of_the_checkpoint(tmp_path,
                                                                              yaw_readout):
    from act_ros.training.auxiliary import TARGET_DIM, ObjectPoseAuxiliary

    policy = _act_model()
    model = policy.model
    torch.manual_seed(0)
    poses = torch.rand(64, 8)
    aux = ObjectPoseAuxiliary(model, [(3, 48, 64), (3, 48, 64)], poses, torch.device('cpu'),
                              yaw_readout=yaw_readout)
    assert aux.head.yaw_readout == yaw_readout
    assert aux.targets(poses[:4]).shape == (4, TARGET_DIM)
    # Yaw targets are 4-fold symmetric: a quarter turn gives the same target.
    turned = poses[:4].clone()
    turned[:, 3] += np.pi / 2
    torch.testing.assert_close(aux.targets(turned), aux.targets(poses[:4]), atol=1e-5, rtol=0)
    images = [torch.rand(4, 3, 48, 64), torch.rand(4, 3, 48, 64)]
    optimizer = torch.optim.Adam([{'params': aux.head.parameters(), 'lr': 1e-3},
                                  {'params': model.backbone.parameters(), 'lr': 1e-4}])
    losses = []
    for _ in range(60):
        with aux.capture():  # the head reads the maps as they enter ACT's image projection
            for img in images:
                model.encoder_img_feat_input_proj(model.backbone(img)['feature_map'])
        loss = aux.loss(poses[:4])
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    assert min(losses[-5:]) < 0.3 * losses[0]
    assert model.backbone.conv1.weight.grad.abs().sum() > 0  # the loss reaches the stem
    with pytest.raises(RuntimeError, match='capture'):
        aux.loss(poses[:4])
    aux.close()
    policy.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    assert not any('reduce' in k or 'mlp' in k or 'cells' in k
                   for k in load_file(tmp_path / 'model.safetensors'))


def test_object_pose_errors_are_physical_and_symmetric():
    from act_ros.training.auxiliary import ObjectPoseAuxiliary

    policy = _act_model()
    torch.manual_seed(1)
    poses = torch.rand(32, 8) * torch.tensor([0.1, 0.3, 0.02, 3.0, 0.1, 0.3, 0.0, 3.0])
    aux = ObjectPoseAuxiliary(policy.model, [(3, 48, 64)], poses, torch.device('cpu'))
    truth = poses[:4].clone()
    shifted = truth.clone()
    shifted[:, 0] += 0.03      # box 3 cm off in x
    shifted[:, 3] += np.pi / 2 + np.radians(5.0)  # a quarter turn (symmetric) plus 5 degrees
    aux.head = lambda maps: aux.targets(shifted)  # a head that predicts the shifted poses
    with aux.capture():
        model = policy.model
        model.encoder_img_feat_input_proj(model.backbone(torch.rand(4, 3, 48, 64))['feature_map'])
    errors = aux.errors(truth)
    torch.testing.assert_close(errors['box_xy_m'], torch.full((4,), 0.03), atol=1e-5, rtol=0)
    torch.testing.assert_close(errors['box_yaw_deg'], torch.full((4,), 5.0), atol=1e-3, rtol=0)
    assert float(errors['pad_xy_m'].max()) < 1e-5 and float(errors['pad_yaw_deg'].max()) < 1e-3
    with pytest.raises(RuntimeError, match='capture'):
        aux.errors(truth)
    aux.close()


def test_attention_yaw_readout_reads_an_object_the_same_in_any_cell():
    """The attention readout weighs cells by their own content with weights shared over the
    cells: an object's features moved to another cell (or camera) give the same yaws; the
    flattened readout gives other ones. The positions come from the flattened grid."""
    from act_ros.training.auxiliary import _POSITIONS, TARGET_DIM, ObjectPoseHead

    torch.manual_seed(0)
    grids = [(3, 4), (3, 4)]
    obj = torch.randn(16) * 3.0
    maps = [torch.zeros(2, 16, 3, 4), torch.zeros(2, 16, 3, 4)]
    maps[0][0, :, 0, 1] = obj  # the same object features: camera 0 at (0, 1) ...
    maps[1][1, :, 2, 3] = obj  # ... and camera 1 at (2, 3)
    attention = ObjectPoseHead(16, grids, yaw_readout='attention')
    attention.cells[1].load_state_dict(attention.cells[0].state_dict())  # one camera's weights
    out = attention(maps)
    assert out.shape == (2, TARGET_DIM)
    n = len(_POSITIONS)
    torch.testing.assert_close(out[0, n:], out[1, n:])
    assert not torch.allclose(out[0, :n], out[1, :n])
    flatten = ObjectPoseHead(16, grids, yaw_readout='flatten')
    out = flatten(maps)
    assert out.shape == (2, TARGET_DIM) and not torch.allclose(out[0, n:], out[1, n:])
    with pytest.raises(ValueError, match="unknown yaw readout 'mean'"):
        ObjectPoseHead(16, grids, yaw_readout='mean')


def test_encoder_pose_head_trains_the_encoder_with_the_backbone_frozen(tmp_path):
    """source='encoder': the head reads every token of ACT's encoder output, so its loss
    reaches the encoder and the image projection while the backbone is frozen (its maps
    cached), and the head stays out of the checkpoint."""
    from act_ros.training.auxiliary import EncoderPoseHead, ObjectPoseAuxiliary

    policy = _act_model()
    model = policy.model
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    torch.manual_seed(0)
    poses = torch.rand(64, 8)
    aux = ObjectPoseAuxiliary(model, [(3, 48, 64), (3, 48, 64)], poses, torch.device('cpu'),
                              source='encoder')
    assert isinstance(aux.head, EncoderPoseHead) and aux.trains_with_frozen_backbone
    grid = model.backbone(torch.zeros(1, 3, 48, 64))['feature_map'].shape[-2:]
    # latent, joints (no object poses here) and both cameras' grid cells
    assert aux.head.tokens == 2 + 2 * grid[0] * grid[1]
    joints = load_contract().num_joints
    batch = {'observation.state': torch.rand(4, joints),
             'observation.images': [torch.rand(4, 3, 48, 64), torch.rand(4, 3, 48, 64)],
             'action': torch.rand(4, model.config.chunk_size, joints),
             'action_is_pad': torch.zeros(4, model.config.chunk_size, dtype=torch.bool)}
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam([{'params': aux.head.parameters(), 'lr': 1e-3},
                                  {'params': trained, 'lr': 1e-4}])
    losses = []
    for _ in range(40):
        with aux.capture():
            model(batch)
        loss = aux.loss(poses[:4])
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    assert min(losses[-5:]) < 0.5 * losses[0]
    assert model.encoder.layers[0].self_attn.in_proj_weight.grad.abs().sum() > 0
    assert model.encoder_img_feat_input_proj.weight.grad.abs().sum() > 0
    assert model.backbone.conv1.weight.grad is None
    aux.close()
    policy.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    assert not any('reduce' in k or 'mlp' in k or 'cells' in k
                   for k in load_file(tmp_path / 'model.safetensors'))
    with pytest.raises(ValueError, match='source'):
        ObjectPoseAuxiliary(model, [(3, 48, 64)], poses, torch.device('cpu'), source='decoder')


def test_history_keeps_rows_whose_terms_differ():
    """A freeze between two syncs: the rows before it carry the pose loss, those after not
    (a freeze step that is not a multiple of the sync interval once raised KeyError)."""
    from act_ros.training.metrics import History

    history = History()
    one = torch.tensor(1.0)
    history.add_train(1, {'loss': one, 'aux_pose': torch.tensor(0.5)}, 1e-4)
    history.add_train(2, {'loss': one * 2}, 1e-4, wall_s=3.0)
    history.add_train(3, {'loss': one * 3, 'aux_pose': torch.tensor(0.25)}, 1e-4)
    assert history.flush() == {'step': 3, 'loss': 3.0, 'aux_pose': 0.25, 'lr': 1e-4}
    assert history.train[:2] == [{'step': 1, 'loss': 1.0, 'aux_pose': 0.5, 'lr': 1e-4},
                                 {'step': 2, 'loss': 2.0, 'lr': 1e-4, 'wall_s': 3.0}]
