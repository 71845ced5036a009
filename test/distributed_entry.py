"""``act-ros train`` for the data-parallel tests (``test_distributed_training.py``).

Run as a script, alone or under ``accelerate launch``. It trains a deterministic ACT (no
dropout, no VAE latent sampling): every step is then a function of the weights and the
global batch only, so runs with different numbers of processes at the same global batch
can be compared step by step. Environment:

- ``ACT_ROS_TEST_SIGTERM_LAUNCHER_AT=K``: process 0 sends SIGTERM to its parent (the
  launcher) after step K, as a user's ``kill`` or a scheduler's preemption would.
- ``ACT_ROS_TEST_MODULES_FILE=PATH``: write whether Accelerate was imported (JSON).
- ``ACT_ROS_TEST_FLOAT64=1``: train in float64 (:func:`use_float64`), so that runs which
  compute the same sums in a different order agree to float64 rounding.
- ``ACT_ROS_TEST_FLOAT64_NOISE=SIGMA`` (with ``ACT_ROS_TEST_FLOAT64=1``): multiply the
  output of every layer and the gradient that comes back into it by ``1 + SIGMA * x``, x
  uniform in [-1, 1] (seed ``ACT_ROS_TEST_NOISE_SEED``): rounding of a chosen size in
  otherwise exact arithmetic, to measure how far this training carries it (the float32
  tolerances of ``test_distributed_training.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from act_ros.training import distributed, loop, prepare, train

_make_act_config = prepare.make_act_config


def _deterministic_act_config(*args, **kwargs):
    kwargs.update(dropout=0.0, use_vae=False)
    return _make_act_config(*args, **kwargs)


prepare.make_act_config = _deterministic_act_config
_stop_at = int(os.environ.get('ACT_ROS_TEST_SIGTERM_LAUNCHER_AT', '0'))
_run = train.run


def _run_with_hook(config, *, on_step=None):
    def hook(trainer, step):
        # Only under a launcher (torchrun sets LOCAL_WORLD_SIZE): the parent is the launcher.
        if step == _stop_at and trainer.dist.is_main and os.environ.get('LOCAL_WORLD_SIZE'):
            os.kill(os.getppid(), signal.SIGTERM)

    return _run(config, on_step=hook if _stop_at else on_step)


train.run = _run_with_hook


def use_float64() -> None:
    """Weights, inputs, losses, the data-parallel L1 factor and the recorded metrics in
    float64. The weights start from the float32 run's initial values (built in float32,
    then converted exactly), the inputs are the float32 run's (the store keeps float32;
    the preprocessor converts them exactly). The trainer's ``.float()`` (its "at least
    float32" for reduced-precision autocast) leaves float64 tensors as they are here."""
    from lerobot.processor import DeviceProcessorStep

    torch.set_default_dtype(torch.float64)  # accumulators the trainer makes (validation sums)
    to_float32 = torch.Tensor.float

    def at_least_float32(tensor, *args, **kwargs):
        return tensor if tensor.dtype == torch.float64 else to_float32(tensor, *args, **kwargs)

    torch.Tensor.float = at_least_float32
    build = loop.build_policy

    def build_float64(config, inputs):
        torch.set_default_dtype(torch.float32)  # the float32 run's initial weights
        try:
            policy, pre, post = build(config, inputs)
        finally:
            torch.set_default_dtype(torch.float64)
        pre.steps = [DeviceProcessorStep(device=step.device, float_dtype='float64')
                     if isinstance(step, DeviceProcessorStep) else step for step in pre.steps]
        return policy.double(), pre, post

    loop.build_policy = build_float64

    def inputs_float64(_module, args):
        # Float32 inputs made inside the model (LeRobot's zero latent without the VAE) and
        # the closed loop's camera images: exact in float64.
        return tuple(a.double() if isinstance(a, torch.Tensor) and a.dtype == torch.float32
                     else a for a in args)

    torch.nn.modules.module.register_module_forward_pre_hook(inputs_float64)
    sigma = float(os.environ.get('ACT_ROS_TEST_FLOAT64_NOISE', '0'))
    if sigma:
        noise = torch.Generator().manual_seed(int(os.environ.get('ACT_ROS_TEST_NOISE_SEED', '0')))

        def rounded(tensor):
            return tensor * (1 + sigma * (2 * torch.rand(tensor.shape, generator=noise) - 1))

        def round_output(module, _args, out):
            if next(module.children(), None) is not None or not isinstance(out, torch.Tensor) \
                    or out.dtype != torch.float64:
                return None  # layers only (no containers), tensors only
            out = rounded(out)
            if out.requires_grad:
                out.register_hook(rounded)
            return out

        torch.nn.modules.module.register_module_forward_hook(round_output)
    agree = distributed.DataParallel.step_control

    def step_control(self, valid_steps, stop):
        total, stop = agree(self, valid_steps, stop)
        self.test_valid_steps_total = total
        return total, stop

    distributed.DataParallel.step_control = step_control
    factor = loop.Trainer._step_control

    def step_control_float64(self, raw):
        """The trainer's L1 factor (float32), recomputed in float64."""
        scale = factor(self, raw)
        valid = int((~raw[f'{self.inputs.store.action_key}_is_pad']).sum())
        exact = valid * self.dist.world_size / max(self.dist.test_valid_steps_total, 1)
        if np.float32(exact) != scale.item():
            raise AssertionError(f'the L1 factor is no longer valid * processes / total: '
                                 f'{scale.item()} != {exact}')
        return torch.tensor(exact, dtype=torch.float64, device=scale.device)

    loop.Trainer._step_control = step_control_float64


if os.environ.get('ACT_ROS_TEST_FLOAT64') == '1':
    use_float64()

if __name__ == '__main__':
    code = train.main(sys.argv[1:])
    modules_file = os.environ.get('ACT_ROS_TEST_MODULES_FILE')
    if modules_file:
        Path(modules_file).write_text(json.dumps({'accelerate': 'accelerate' in sys.modules}))
    sys.exit(code)
