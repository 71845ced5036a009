"""Training speed of the real trainer step, eager or compiled, on random in-memory frames.

``python -m act_ros.training.speed --model-preset cpu --image-size 96x128 --batch-size 8``
prints optimizer steps per second (batch assembly, normalization, forward, backward,
clipping, AdamW, scheduler), after warm-up steps that also absorb compilation.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from act_ros.core.arguments import HelpFormatter
from act_ros.core.inference.checkpoint import PRESETS, parse_image_size
from act_ros.core.inference.checkpoint_info import SIM_CHUNK_SIZE

if TYPE_CHECKING:
    from act_ros.training.config import TrainConfig
    from act_ros.training.prepare import RunInputs


def synthetic_inputs(*, image_size: tuple[int, int], batch_size: int, device: str = 'cpu',
                     seed: int = 0, chunk_size: int = SIM_CHUNK_SIZE) -> RunInputs:
    """A trainer's inputs without a dataset: random in-memory frames and fixed statistics.

    Shared by this measurement and the training/compile benchmarks (``act_ros.bench``).
    """
    from act_ros.core.contract import load_contract
    from act_ros.core.device import select_device
    from act_ros.training.data import FrameStore, Split
    from act_ros.training.prepare import RunInputs

    contract = load_contract()
    n = max(64, batch_size * 4)
    h, w = image_size
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    mid = (contract.lower + contract.upper) / 2
    store = FrameStore(
        state=mid + rng.normal(0, 0.1, (n, contract.num_joints)),
        action=mid + rng.normal(0, 0.1, (n, contract.num_joints)),
        images={c.feature: torch.randint(0, 255, (n, 3, h, w), dtype=torch.uint8,
                                         generator=generator)
                for c in contract.cameras},
        seg_start=np.zeros(n, np.int64), seg_end=np.full(n, n, np.int64),
        chunk_size=chunk_size, state_key=contract.state_feature,
        action_key=contract.action_feature)
    joint = {'mean': torch.tensor(mid, dtype=torch.float32), 'std': torch.full((6,), 0.1)}
    stats = {contract.state_feature: joint, contract.action_feature: joint}
    for c in contract.cameras:
        stats[c.feature] = {'mean': torch.full((3, 1, 1), 0.5), 'std': torch.full((3, 1, 1), 0.25)}
    return RunInputs(contract=contract, device=select_device(device), dataset=None,
                     split=Split('episode', np.arange(n), np.zeros(0, np.int64)), store=store,
                     stats=stats, image_size=image_size, stored_image_size=image_size,
                     cameras=contract.camera_names)


def synthetic_config(inputs: RunInputs, workdir: Path, **fields: Any) -> TrainConfig:
    """A :class:`TrainConfig` for :func:`synthetic_inputs` (``fields``: its other fields).

    ``workdir`` stands in for the dataset and output directories; a :class:`Trainer`
    writes nothing there unless asked to save a checkpoint.
    """
    from act_ros.training.config import TrainConfig

    fields.setdefault('progress', False)
    fields.setdefault('chunk_size', inputs.store.chunk_size)
    fields.setdefault('feature_cache_dir', 'none')  # nothing on disk: see above
    return TrainConfig(dataset_root=workdir, output_dir=workdir, image_size=inputs.image_size,
                       device=str(inputs.device), **fields)


def measure(*, model_preset: str, image_size: tuple[int, int], batch_size: int, steps: int,
            warmup: int, compile_step: bool, device: str = 'cpu') -> dict:
    """Steps/s of :meth:`Trainer.train_step` on random frames (no dataset on disk)."""
    from act_ros.training.loop import Trainer

    inputs = synthetic_inputs(image_size=image_size, batch_size=batch_size, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(synthetic_config(inputs, Path(tmp), model_preset=model_preset,
                                           batch_size=batch_size, steps=steps + warmup,
                                           compile=compile_step), inputs)
        start = time.perf_counter()
        for _ in range(warmup):
            trainer.train_step()
        warm_s = time.perf_counter() - start
        if inputs.device.type == 'cuda':
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        trainer.history.flush()
        elapsed = time.perf_counter() - start
    return {'model_preset': model_preset, 'image_size': list(image_size), 'batch_size': batch_size,
            'compile': compile_step, 'device': str(inputs.device),
            'torch_threads': torch.get_num_threads(), 'warmup_steps': warmup,
            'warmup_s': warm_s, 'steps': steps, 'steps_per_s': steps / elapsed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='python -m act_ros.training.speed', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--model-preset', choices=sorted(PRESETS), default='cpu')
    p.add_argument('--image-size', type=parse_image_size, default=(96, 128))
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--compile', action='store_true')
    p.add_argument('--device', default='cpu')
    p.add_argument('--torch-threads', type=int, default=None)
    args = p.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    result = measure(model_preset=args.model_preset, image_size=args.image_size,
                     batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                     compile_step=args.compile, device=args.device)
    print(json.dumps(result))
    return 0


if __name__ == '__main__':
    sys.exit(main())
