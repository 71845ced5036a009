"""``act-ros package-model``: turn a training checkpoint into a deployable model folder.

Copies a LeRobot ``pretrained_model`` directory (``best/`` of a run) to ``--output``
(``models/<name>`` to ship it with the package), optionally with the weights stored as
float16 (half the size; they are loaded into a float32 model as before), and the run's
``training_metrics.json``, plots and evaluation summary beside it. Before the folder appears it
is checked: it loads with the package's strict loader, and its actions on observations
from the training dataset agree with the source checkpoint's within ``--tolerance``
(normalized units, after postprocessing in radians). The folder is written atomically.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.errors import ActRosError

WEIGHTS = 'model.safetensors'
DTYPES = ('fp32', 'fp16')


def convert_weights(path: Path, dtype: str) -> dict[str, int]:
    """Rewrite ``path`` (safetensors) with floating-point tensors in ``dtype``; sizes in bytes."""
    import torch
    from safetensors.torch import load_file, save_file

    before = path.stat().st_size
    if dtype == 'fp32':
        return {'bytes_before': before, 'bytes_after': before}
    tensors = load_file(str(path))
    out = {k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous()
           for k, v in tensors.items()}
    save_file(out, str(path), metadata={'format': 'pt'})
    return {'bytes_before': before, 'bytes_after': path.stat().st_size}


def checkpoint_contract(checkpoint: Path) -> Any:
    """The I/O contract of the robot a checkpoint was trained for (its task's)."""
    from act_ros.core.contract import load_contract
    from act_ros.sim.tasks import checkpoint_task

    return load_contract(checkpoint_task(checkpoint).contract_path())


def action_agreement(source: Path, packaged: Path, observations: list[Any]) -> float:
    """Largest difference (radians / gripper units) between the two checkpoints' first
    chunks on ``observations``."""
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    contract = checkpoint_contract(source)
    chunks = []
    for path in (source, packaged):
        with PolicyRuntime(RuntimeConfig(model_path=path, device='cpu', execution='sync',
                                         warmup=False, contract=contract)) as runtime:
            chunks.append([runtime.predictor.predict(obs) for obs in observations])
    return float(max(np.abs(a - b).max() for a, b in zip(*chunks)))


def _input_shape(checkpoint: Path, contract: Any) -> tuple[int, int]:
    """The camera input size (H, W) of ``checkpoint``; one without cameras takes any size
    (its observations carry the object poses)."""
    from act_ros.core.inference.checkpoint import load_checkpoint

    return next(iter(load_checkpoint(checkpoint, device='cpu', contract=contract)
                     .image_shapes.values()), (96, 128))


def sample_observations(checkpoint: Path, count: int = 4) -> list[Any]:
    """Observations to compare on: simulation frames at the checkpoint's input size (the
    start of ``count`` episodes), or random images where MuJoCo is not installed; with
    the object poses, for a checkpoint that takes them."""
    from act_ros.core.object_state import environment_state
    from act_ros.core.observation import Observation
    from act_ros.sim.tasks import checkpoint_task

    task = checkpoint_task(checkpoint)
    contract = checkpoint_contract(checkpoint)
    shape = _input_shape(checkpoint, contract)
    if task.is_aloha:
        return _aloha_observations(task, contract, shape, count)
    try:
        from act_ros.sim import PortPickAlignEnv, SimConfig
    except ImportError:
        rng = np.random.default_rng(0)
        return [Observation(images={cam: rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
                                    for cam in contract.camera_names},
                            state=rng.uniform(contract.lower, contract.upper),
                            environment_state=environment_state(
                                rng.uniform(0.15, 0.35, 3), rng.uniform(-np.pi, np.pi),
                                rng.uniform(0.15, 0.35, 3), rng.uniform(-np.pi, np.pi)))
                for _ in range(count)]
    config = SimConfig.from_yaml(None, camera_height=shape[0], camera_width=shape[1])
    out = []
    with PortPickAlignEnv(config, contract) as env:
        for k in range(count):
            obs = env.reset(seed=3_000_000 + k)
            out.append(Observation(images=dict(obs.images),
                                   state=np.asarray(obs.joint_positions, dtype=np.float64),
                                   environment_state=obs.environment_state))
    return out


def _aloha_observations(task: Any, contract: Any, shape: tuple[int, int],
                        count: int) -> list[Any]:
    """The first observations of ``count`` gym-aloha episodes (seeds 3 000 000+), the
    contract's cameras rendered at ``shape``."""
    from act_ros.core.observation import Observation
    from act_ros.sim.aloha.env import AlohaEnv

    out = []
    with AlohaEnv(task.aloha_task, cameras=contract.camera_names, image_size=shape) as env:
        for k in range(count):
            obs = env.reset(seed=3_000_000 + k)
            out.append(Observation(images={cam: obs.images[cam] for cam in contract.camera_names},
                                   state=np.asarray(obs.joint_positions, dtype=np.float64)))
    return out


def _save_check_observations(source: Path, staging: Path, contract: Any) -> str:
    """Real observations beside the packaged model for its start-up precision check
    (act_ros.core.inference.precision.CHECK_OBSERVATIONS_FILE): the source's own when it has them,
    else frames of its training dataset (training_info.json's dataset_root) when that is
    here, else its task's simulation (episodes' first frames at its input size). Returns
    where they came from."""
    from act_ros.core.inference.precision import (
        CHECK_OBSERVATIONS_FILE,
        SAVED_CHECK_OBSERVATIONS,
        save_check_observations,
    )

    if (source / CHECK_OBSERVATIONS_FILE).is_file():
        shutil.copy2(source / CHECK_OBSERVATIONS_FILE, staging / CHECK_OBSERVATIONS_FILE)
        return 'the source checkpoint'
    info = source / 'training_info.json'
    root = json.loads(info.read_text()).get('dataset_root') if info.is_file() else None
    from act_ros.training.quantize import save_dataset_check_observations

    if root and (Path(root) / 'meta' / 'info.json').is_file():
        save_dataset_check_observations(staging, Path(root), contract)
        return f'the training dataset {root}'
    try:
        return _save_expert_check_observations(source, staging, contract)
    except ImportError:  # no simulation installed: episode starts (or random frames)
        save_check_observations(staging, sample_observations(source, SAVED_CHECK_OBSERVATIONS))
        return 'the task simulation (episode starts)'


# Expert episodes recorded for the check observations of a checkpoint without its dataset,
# and their first seed (apart from the evaluation seeds, 2 000 000+).
CHECK_EPISODES, CHECK_SEED = 2, 1_000_000


def _save_expert_check_observations(source: Path, staging: Path, contract: Any) -> str:
    """Frames along ``CHECK_EPISODES`` scripted-expert episodes of the checkpoint's task
    (its simulation, at its input size), evenly spaced: the approach, the grasp, the carry
    and the placement, as the policy sees them."""
    from act_ros.data.collect import CollectConfig, collect
    from act_ros.sim.tasks import checkpoint_task
    from act_ros.training.quantize import save_dataset_check_observations

    task = checkpoint_task(source)
    shape = _input_shape(source, contract)
    with tempfile.TemporaryDirectory(prefix='act_ros_check_') as tmp:
        demos = Path(tmp) / 'demos'
        collect(CollectConfig(output=demos, episodes=CHECK_EPISODES, seed=CHECK_SEED,
                              image_height=shape[0], image_width=shape[1], task=task.name,
                              contract_path=task.contract_path()), progress=False)
        save_dataset_check_observations(staging, demos, contract)
    return (f'the task simulation ({CHECK_EPISODES} scripted-expert episodes from seed '
            f'{CHECK_SEED})')


def package(source: Path, output: Path, *, dtype: str = 'fp16', tolerance: float = 1e-2,
            run_dir: Path | None = None, evaluation: Path | None = None,
            card: str | None = None, observations: list[Any] | None = None,
            overwrite: bool = False) -> dict[str, Any]:
    """Copy, convert, check and place the model folder; returns what was measured.

    ``source``: a checkpoint directory or a Hub id (its snapshot in the huggingface_hub
    cache; the report names the commit).
    """
    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.core.inference.hub import resolve_checkpoint

    resolved = resolve_checkpoint(source)
    source, output = resolved.path, Path(output)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype '{dtype}', expected one of {DTYPES}")
    if not (source / WEIGHTS).is_file():
        raise FileNotFoundError(f'{source}: no {WEIGHTS} (expected a LeRobot pretrained_model '
                                'directory, e.g. the best/ folder of an act-ros train run)')
    if output.exists() and not overwrite:
        raise FileExistsError(f'{output} exists; pass --overwrite to replace it')
    contract = checkpoint_contract(source)
    load_checkpoint(source, device='cpu', contract=contract)  # the source itself must be sound
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f'.{output.name}.tmp-', dir=output.parent))
    try:
        for item in source.iterdir():
            if item.is_file() and item.name != 'training_state.pt':
                shutil.copy2(item, staging / item.name)
        sizes = convert_weights(staging / WEIGHTS, dtype)
        load_checkpoint(staging, device='cpu', contract=contract)
        obs = observations if observations is not None else sample_observations(source)
        diff = action_agreement(source, staging, obs)
        check_source = _save_check_observations(source, staging, contract)
        if not diff <= tolerance:
            raise ValueError(f'the {dtype} model differs from {source} by {diff:.3g} in its '
                             f'actions (tolerance {tolerance}); keep fp32 or raise --tolerance')
        files = {}
        if run_dir is not None:
            metrics = Path(run_dir) / 'training_metrics.json'
            if not metrics.is_file():
                raise FileNotFoundError(f'{metrics}: missing (--run-dir is an act-ros train '
                                        'output directory)')
            shutil.copy2(metrics, staging / 'training_metrics.json')
            files['training_metrics'] = 'training_metrics.json'
            # The run's plots (loss, closed-loop align rate, learning curve) go with it.
            plots = sorted(p.name for p in Path(run_dir).glob('plot_*.png'))
            for name in plots:
                shutil.copy2(Path(run_dir) / name, staging / name)
            if plots:
                files['plots'] = plots
        if evaluation is not None:
            shutil.copy2(evaluation, staging / 'evaluation.json')
            files['evaluation'] = 'evaluation.json'
        if card is not None:
            (staging / 'MODEL_CARD.md').write_text(card)
        origin = ({'source': resolved.spec, 'source_commit': resolved.commit}
                  if resolved.from_hub else {'source': str(source)})
        report = {**origin, 'dtype': dtype, **sizes,
                  'max_action_difference': diff, 'compared_observations': len(obs),
                  'precision_check_observations': check_source, **files}
        (staging / 'packaging.json').write_text(json.dumps(report, indent=2) + '\n')
        from act_ros.core.atomic import replace_dir

        replace_dir(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros package-model', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--checkpoint', type=Path, required=True,
                   help='source pretrained_model dir, or Hub id org/name[@revision][/subfolder]')
    p.add_argument('--output', type=Path, required=True, help='model folder to write')
    p.add_argument('--dtype', choices=DTYPES, default='fp16', help='stored weight type')
    p.add_argument('--tolerance', type=float, default=1e-2,
                   help='largest action difference allowed against the source (default 0.01)')
    p.add_argument('--run-dir', type=Path, help='training run whose training_metrics.json '
                   'goes with the model')
    p.add_argument('--evaluation', type=Path, help='act-ros evaluate --output JSON to include')
    p.add_argument('--card', type=Path, help='MODEL_CARD.md to include')
    p.add_argument('--overwrite', action='store_true')
    args = p.parse_args(argv)
    try:
        report = package(args.checkpoint, args.output, dtype=args.dtype,
                         tolerance=args.tolerance, run_dir=args.run_dir,
                         evaluation=args.evaluation,
                         card=args.card.read_text() if args.card else None,
                         overwrite=args.overwrite)
    except (ActRosError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f'act-ros package-model: {exc}', file=sys.stderr)
        return 2
    print(f"packaged {args.checkpoint} -> {args.output} ({report['dtype']}, "
          f"{report['bytes_after'] / 1e6:.1f} MB of weights, max action difference "
          f"{report['max_action_difference']:.2e})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
