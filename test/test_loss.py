"""The training loss: masking, per-dimension weights, KL, reductions, LeRobot parity."""

import pytest
import torch

from act_ros.training.loss import act_loss, act_training_loss, dimension_weights


def test_hand_computed_example():
    # B=1, T=2, D=2. Errors: t0 = [1, 2], t1 = [3, 4]; t1 is padding.
    target = torch.zeros(1, 2, 2)
    pred = torch.tensor([[[1.0, -2.0], [3.0, 4.0]]])
    pad = torch.tensor([[False, True]])
    w = torch.tensor([1.0, 5.0])
    out = act_loss(pred, target, action_is_pad=pad, dim_weights=w, kl_weight=0.0)
    # (1*1 + 5*2) / (1 + 5) = 11/6; the padded step does not count.
    assert out.l1.item() == pytest.approx(11 / 6)
    assert out.loss.item() == pytest.approx(11 / 6)


def test_kl_mean_over_batch_of_sum_over_latent():
    target = pred = torch.zeros(2, 3, 1)
    mu = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    logvar = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    out = act_loss(pred, target, mu=mu, log_sigma_x2=logvar, kl_weight=10.0)
    # KL per sample = 0.5 * sum(mu^2): 0.5 and 2.0 -> mean 1.25
    assert out.kl.item() == pytest.approx(1.25)
    assert out.loss.item() == pytest.approx(12.5)


def test_reductions_and_weights():
    torch.manual_seed(0)
    pred, target = torch.randn(4, 5, 6), torch.randn(4, 5, 6)
    none = act_loss(pred, target, reduction='none')
    assert none.loss.shape == (4,)
    total = act_loss(pred, target, reduction='sum')
    assert total.loss.item() == pytest.approx(none.loss.sum().item(), rel=1e-6)
    w = dimension_weights(6, grippers=(5,), gripper_weight=5.0)
    assert w.tolist() == [1, 1, 1, 1, 1, 5]
    weighted = act_loss(pred, target, dim_weights=w)
    err = (pred - target).abs()
    assert weighted.l1.item() == pytest.approx(((err * w).sum() / (w.sum() * 20)).item(), rel=1e-6)
    with pytest.raises(ValueError, match='reduction'):
        act_loss(pred, target, reduction='avg')
    with pytest.raises(ValueError, match='gripper_weight'):
        dimension_weights(6, grippers=(5,), gripper_weight=0)


def test_unit_weights_match_lerobot_act_forward(tiny_checkpoint):
    from lerobot.policies.act.modeling_act import ACTPolicy
    policy = ACTPolicy.from_pretrained(tiny_checkpoint)
    policy.train()
    torch.manual_seed(0)
    batch = {'observation.state': torch.randn(3, 6),
             'observation.images.top': torch.randn(3, 3, 48, 64),
             'observation.images.wrist': torch.randn(3, 3, 48, 64),
             'action': torch.randn(3, 30, 6),
             'action_is_pad': torch.zeros(3, 30, dtype=torch.bool)}
    batch['action_is_pad'][1, 20:] = True
    for m in policy.modules():  # make both passes deterministic
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    torch.manual_seed(1)
    ref_loss, ref_dict = policy.forward(batch)
    torch.manual_seed(1)
    ours = act_training_loss(policy.model, batch, image_features=policy.config.image_features,
                             kl_weight=policy.config.kl_weight)
    assert ours.loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert ours.l1.item() == pytest.approx(ref_dict['l1_loss'], rel=1e-5)
    assert ours.kl.item() == pytest.approx(ref_dict['kld_loss'], rel=1e-5)
    ours.loss.backward()
    assert policy.model.action_head.weight.grad is not None
