"""A checkpoint made with LeRobot's stock settings (chunk_size 100, n_action_steps 100) runs
in act_node with nothing but the model path, the arm's contract and what the arm lacks (no
pad: the release gate off): lock-step over real topics, its commands equal LeRobot's own
``select_action`` + postprocessor tick by tick, across the chunk boundary at tick 100.
LeRobot's ``select_action`` plays chunk after chunk, so the node is asked for ``mode:
chunk``; its default, ``blend``, crossfades the handover (docs/seams.md) and differs from
LeRobot there by design.
The played actions per chunk and the control rate come from the checkpoint and the
contract, not from the node's parameter file."""

import time

import numpy as np
import pytest

pytestmark = pytest.mark.ros
rclpy = pytest.importorskip('rclpy')

from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from test_runtime_parity import lerobot_reference  # noqa: E402

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.core.observation import Observation  # noqa: E402
from act_ros.ros.harness import RobotHarness, spinning, wait_until  # noqa: E402
from act_ros.ros.node.act_node import ActNode  # noqa: E402

CONTRACT = load_contract()
H, W = 40, 56
TICKS = 130  # past the first chunk of 100
SETTLE_S = 120.0  # a bound on waiting for what must come, not a speed requirement
# A pose inside every joint's limits; the policy's actions stay within a few hundredths of
# a radian of it (action std 0.01), so no safety rule changes them and the comparison is
# the model's, tick by tick.
POSE = np.array([0.1, -0.3, 0.4, -0.2, 0.1, 0.5])


def lerobot_checkpoint(path, *, chunk_size, n_action_steps):
    """An ACT checkpoint saved with LeRobot's own API and settings (only the network made
    small), for the package's arm: state and action of its 6 joints, both cameras."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    inputs = {'observation.state': PolicyFeature(type=FeatureType.STATE, shape=(6,))}
    for cam in CONTRACT.camera_names:
        inputs[f'observation.images.{cam}'] = PolicyFeature(type=FeatureType.VISUAL,
                                                            shape=(3, H, W))
    config = ACTConfig(
        input_features=inputs,
        output_features={'action': PolicyFeature(type=FeatureType.ACTION, shape=(6,))},
        chunk_size=chunk_size, n_action_steps=n_action_steps, pretrained_backbone_weights=None,
        dim_model=64, n_heads=4, dim_feedforward=128, n_encoder_layers=1, n_decoder_layers=1,
        n_vae_encoder_layers=1, latent_dim=8, device='cpu')
    torch.manual_seed(3)
    policy = ACTPolicy(config)
    joint = {'mean': torch.tensor(POSE, dtype=torch.float32), 'std': torch.full((6,), 0.01)}
    image = {'mean': torch.full((3, 1, 1), 0.45), 'std': torch.full((3, 1, 1), 0.25)}
    stats = {'observation.state': joint, 'action': dict(joint),
             **{f'observation.images.{cam}': dict(image) for cam in CONTRACT.camera_names}}
    pre, post = make_act_pre_post_processors(config, stats)
    for part in (policy, pre, post):
        part.save_pretrained(path)
    return path


def observations(seed):
    """One image per tick, on both cameras (the harness publishes one image on each)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(TICKS):
        image = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
        out.append(Observation(images={cam: image for cam in CONTRACT.camera_names},
                               state=POSE + rng.uniform(-0.01, 0.01, 6)))
    return out


def node_with_defaults(context, model_path):
    """act_node as a user starts it for a stock checkpoint: the model path, lock-step, and
    the release gate off (the arm has no pad); nothing about chunks or rates. LeRobot's
    playback (``mode: chunk``) to compare with it."""
    values = {'model_path': str(model_path), 'autostart': False, 'trigger': 'observation',
              'execution': 'sync', 'release_gate.enabled': False, 'mode': 'chunk',
              # The tests' usual: one thread, no ONNX export, no RViz path.
              'torch_threads': 1, 'backend': 'torch', 'visualization.enabled': False}
    return ActNode(context=context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def run_lock_step(context, model_path, obs_list):
    """Each observation published once, its command awaited: the commands in order."""
    node = node_with_defaults(context, model_path)
    harness = RobotHarness(context=context, joints=dict(zip(CONTRACT.joint_names, POSE)),
                           image=obs_list[0].images['top'], rate_hz=None)
    images = []  # the harness caches a message per image object: keep every one alive

    def publish(obs):
        images.append(obs.images)
        harness.image = obs.images['top']
        harness.joints = dict(zip(CONTRACT.joint_names, obs.state))
        return harness.publish_once()

    def step(obs):
        """Publish ``obs`` until the node answers it (a set that lost an image is sent again
        under a new stamp) with one command: one tick per answered set, so the policy sees
        each observation once."""
        seq = node.counters.commands_published
        command = harness.publish_until_answered(node, publish=lambda: publish(obs))
        assert node.counters.commands_published == seq + 1
        return command.positions

    with spinning(context, node, harness):
        assert node.start()
        runtime = node.loop.runtime
        settings = (runtime.chunk_size, runtime.n_action_steps, node.settings.control_rate_hz)
        # Discovery: publish until a command comes back; then start the episode afresh
        # (deactivate, activate: an empty queue), as lerobot-eval's policy.reset().
        assert wait_until(lambda: publish(obs_list[0]) and bool(harness.commands), SETTLE_S,
                          interval_s=0.3)
        assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
        # Whatever the discovery left in flight is answered while inactive: nothing sent.
        assert wait_until(lambda: not node.is_active, SETTLE_S)
        time.sleep(1.0)
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        chunks_before = runtime.stats.chunks_computed
        got = [step(obs) for obs in obs_list]
        chunks = runtime.stats.chunks_computed - chunks_before
        node.trigger_deactivate()
    node.destroy_node()
    harness.destroy_node()
    return np.stack(got), settings, chunks


@pytest.fixture(scope='module')
def stock_checkpoint(module_tmp):
    return lerobot_checkpoint(module_tmp('stock') / 'pretrained_model', chunk_size=100,
                              n_action_steps=100)


def test_stock_lerobot_checkpoint_commands_equal_select_action(rclpy_context,
                                                               stock_checkpoint):
    obs_list = observations(11)
    expected = lerobot_reference(stock_checkpoint, observations=obs_list)
    got, (chunk, played, rate), chunks = run_lock_step(rclpy_context, stock_checkpoint,
                                                       obs_list)
    assert (chunk, played) == (100, 100)  # from config.json
    assert rate == CONTRACT.fps  # from the contract
    assert chunks == 2  # ticks 0 and 100, as select_action's queue of 100
    assert got.shape == (TICKS, 6)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # Not trivially constant: the actions move over the episode and jump at tick 100.
    assert np.ptp(expected, axis=0).max() > 1e-3


def test_a_short_chunk_checkpoint_configures_and_plays_its_own_steps(rclpy_context,
                                                                      module_tmp):
    """chunk_size 20 (below the 30 this package's own policies use) configures; with
    n_action_steps 10 a chunk is computed every 10 ticks, as LeRobot plays it."""
    path = lerobot_checkpoint(module_tmp('short') / 'pretrained_model', chunk_size=20,
                              n_action_steps=10)
    obs_list = observations(12)[:25]
    expected = lerobot_reference(path, observations=obs_list)
    got, (chunk, played, _), chunks = run_lock_step(rclpy_context, path, obs_list)
    assert (chunk, played, chunks) == (20, 10, 3)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
