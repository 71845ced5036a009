"""``act-ros train`` for the data-parallel tests (``test_distributed_training.py``).

Run as a script, alone or under ``accelerate launch``. It trains a deterministic ACT (no
dropout, no VAE latent sampling): every step is then a function of the weights and the
global batch only, so runs with different numbers of processes at the same global batch
can be compared step by step. Environment:

- ``ACT_ROS_TEST_SIGTERM_LAUNCHER_AT=K``: process 0 sends SIGTERM to its parent (the
  launcher) after step K, as a user's ``kill`` or a scheduler's preemption would.
- ``ACT_ROS_TEST_MODULES_FILE=PATH``: write whether Accelerate was imported (JSON).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import signal
import sys

from act_ros.training import prepare, train

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

if __name__ == '__main__':
    code = train.main(sys.argv[1:])
    modules_file = os.environ.get('ACT_ROS_TEST_MODULES_FILE')
    if modules_file:
        Path(modules_file).write_text(json.dumps({'accelerate': 'accelerate' in sys.modules}))
    sys.exit(code)
