"""``act-ros train`` / ``ros2 run act_ros train``: train LeRobot ACT on a LeRobot v3 dataset.

Writes LeRobot checkpoint directories (``best/``, ``best_te/``, ``last/``,
``step_NNNNNN/``), ``training_metrics.json`` and PNG plots to ``--output-dir``. See
docs/architecture.md section 8 and :mod:`act_ros.training.loop`.

Several GPUs or machines: the same command under ``accelerate launch`` trains
data-parallel (DDP; :mod:`act_ros.training.distributed`; commands for one or several
machines in docs/training.md, "Several GPUs or machines"); the global batch is
processes x ``--batch-size`` and only process 0 writes to ``--output-dir``::

    accelerate launch --multi_gpu --num_processes 2 -m act_ros.training.train \
        --preset sim --dataset-root DATASET --output-dir OUT

Without ``WORLD_SIZE`` > 1 in the environment it is one process, as before, and
Accelerate is not imported.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from act_ros.core.errors import ActRosError
from act_ros.core.logs import setup_logging
from act_ros.core.processes import signals_deferred
from act_ros.training.config import TrainConfig, build_parser, config_from_args
from act_ros.training.distributed import LocalProcess, check_launch_env, from_environment
from act_ros.training.metrics import METRICS_FILE, finite_or_none, write_json_atomic, write_plots

logger = logging.getLogger('act_ros.train')


def _check_output_dir(config: TrainConfig) -> None:
    out = config.output_dir
    if out.exists() and not out.is_dir():
        raise ValueError(f'--output-dir {out} is a file, expected a directory')
    if config.resume:
        if not (out / 'last').is_dir():
            raise FileNotFoundError(f'--resume: {out / "last"} does not exist (nothing to resume '
                                    'in --output-dir)')
    elif not config.infer_only and ((out / 'last').exists() or (out / METRICS_FILE).exists()):
        raise FileExistsError(f'--output-dir {out} already holds a run (last/ or {METRICS_FILE});'
                              ' pass --resume to continue it, or choose another directory')


def build_metrics(trainer: Any, status: str, wall_s: float) -> dict[str, Any]:
    """The content of ``training_metrics.json`` (only numbers measured in this run)."""
    cfg, inputs, history = trainer.config, trainer.inputs, trainer.history
    steps_per_s = (trainer.session_steps / trainer.train_seconds
                   if trainer.train_seconds > 0 else None)
    last_train = history.flush()
    n_params = sum(p.numel() for p in trainer.policy.parameters())
    return {
        'status': status,
        'config': cfg.to_dict(),
        'model': {'type': 'act', 'preset': cfg.model_preset, 'overrides': dict(cfg.model),
                  'init_from': str(cfg.init_from) if cfg.init_from else None,
                  'image_size': list(inputs.image_size) if inputs.image_size else None,
                  'cameras': list(inputs.cameras),
                  'environment_state': inputs.environment_state,
                  'chunk_size': int(trainer.policy.config.chunk_size), 'parameters': n_params,
                  'pretrained_backbone': None},
        'dataset': inputs.describe(),
        'normalization': {'state_action': 'dataset meta/stats.json (all episodes)',
                          'cameras': cfg.camera_stats if inputs.cameras else None,
                          'environment_state': ('dataset meta/stats.json (all episodes), std '
                                                'floored' if inputs.environment_state else None)},
        'split': inputs.split.to_dict(),
        'split_kind': inputs.split.kind,
        'device': str(inputs.device),
        'steps_completed': trainer.step,
        'resumed_from_step': trainer.resumed_from,
        'below_recommended_steps': cfg.below_recommended_steps,
        'stopped_early': trainer.stop_reason == 'early_stop',
        'interrupted': trainer.stop_reason == 'interrupted',
        'final_train_loss': finite_or_none(last_train['loss']) if last_train else None,
        'best': trainer.best,
        'history': history.to_dict(),
        'wall_time_s': wall_s,
        'cpu_time_s': trainer.cpu_seconds,
        'session_train_steps': trainer.session_steps + (trainer.first_step_s is not None),
        'first_step_s': trainer.first_step_s,
        'steps_per_s': steps_per_s,
        'steps_per_s_note': 'optimizer steps (data, forward, backward, update) in this session, '
                            'first step (compilation) excluded; validation and checkpoints '
                            'not counted',
        'compile': cfg.compile,
        'precision': trainer.precision,
        'backbone_norm_calibration': trainer.backbone_calibration,
        'feature_cache': trainer.feature_cache_info,
        **_distributed_metrics(trainer, steps_per_s),
    }


def _distributed_metrics(trainer: Any, steps_per_s: float | None) -> dict[str, Any]:
    """Data-parallel runs only: the processes, the global batch and samples/s."""
    dist = trainer.dist
    if not dist.active:
        return {}
    batch = dist.world_size * trainer.config.batch_size
    return {'distributed': {**dist.describe(), 'batch_size_per_process': trainer.config.batch_size,
                            'global_batch_size': batch,
                            'samples_per_s': steps_per_s * batch if steps_per_s else None}}


def _infer(config: TrainConfig, inputs: Any, metrics: dict[str, Any]) -> int:
    from act_ros.training.infer_check import inference_check

    for name in ('best', 'last'):
        path = config.output_dir / name
        if (path / 'model.safetensors').is_file():
            result = inference_check(path, inputs, device=str(inputs.device))
            metrics['inference_check'] = result
            logger.info('inference check of %s: finite %s, mean abs error %s over %d frames',
                        path, result['finite'], result['mean_abs_error'], result['frames'])
            return 0 if result['finite'] else 1
    raise FileNotFoundError(f'no checkpoint to check in {config.output_dir} (expected best/ or '
                            'last/)')


def _save_check_observations(config: TrainConfig, contract: Any) -> None:
    """Frames of the training dataset beside each checkpoint, for the start-up precision
    check of a reduced precision (act_ros.core.inference.precision.CHECK_OBSERVATIONS_FILE); a
    failure only loses that check's real inputs (a warning)."""
    from act_ros.training.quantize import save_dataset_check_observations

    for name in ('best', 'last'):
        path = config.output_dir / name
        if not (path / 'model.safetensors').is_file():
            continue
        try:
            saved = save_dataset_check_observations(path, config.dataset_root, contract)
            logger.info('precision check observations from the dataset: %s', saved)
        except Exception as exc:  # noqa: BLE001 - the checkpoint stays usable without them
            logger.warning('no precision check observations saved in %s (%s: %s): a reduced '
                           'precision will be checked on synthetic frames', path,
                           type(exc).__name__, exc)


def run(config: TrainConfig, *, on_step: Any = None) -> dict[str, Any]:
    """Train (or only check inference) with ``config``; returns the metrics written.

    Started as one of several processes (``accelerate launch``), every process calls this
    and trains its share; only process 0 writes, and the others return their metrics
    unwritten."""
    import torch

    start = time.perf_counter()
    check_launch_env()
    _check_output_dir(config)
    threads = torch.get_num_threads()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    try:
        dist = from_environment(config.device)
    except BaseException:
        torch.set_num_threads(threads)
        raise
    try:
        if not dist.is_main:  # one progress bar and one log: process 0's
            logging.getLogger('act_ros').setLevel(logging.WARNING)
            config = dataclasses.replace(config, progress=False)
        return _run(config, on_step, start, dist)
    finally:
        dist.close()
        torch.set_num_threads(threads)


def _run(config: TrainConfig, on_step: Any, start: float,
         dist: LocalProcess) -> dict[str, Any]:
    from act_ros.training.loop import Trainer
    from act_ros.training.prepare import prepare_inputs

    inputs = prepare_inputs(config, device=dist.device)
    main = dist.is_main
    if main:
        config.output_dir.mkdir(parents=True, exist_ok=True)
    if config.infer_only:
        metrics: dict[str, Any] = {'status': 'infer_only', 'config': config.to_dict()}
        code = 0
        if main:  # one check is enough: the others have nothing to do
            code = _infer(config, inputs, metrics)
            write_json_atomic(config.output_dir / 'inference_check.json', metrics)
        metrics['exit_code'] = code
        return metrics
    trainer = Trainer(config, inputs, on_step=on_step, dist=dist)
    if config.resume:
        trainer.resume()
    status = 'failed'
    try:
        trainer.run()
        status = {'early_stop': 'stopped_early', 'interrupted': 'interrupted'}.get(
            trainer.stop_reason, 'completed')
    except Exception as exc:
        if dist.active:
            logger.error('process %d of %d failed at step %d: %s: %s. When a peer process '
                         'exits or is killed, the others fail like this: the launcher names '
                         'the process that failed first (Root Cause)', dist.rank,
                         dist.world_size, trainer.step, type(exc).__name__, exc)
        raise
    finally:
        # The record first, plots after, with SIGINT/SIGTERM held back meanwhile: when a
        # peer process fails, the launcher stops this one within a second (seen: the
        # failure was logged, then SIGTERM came while the plots were drawn, and no
        # training_metrics.json was left).
        with signals_deferred():
            metrics = build_metrics(trainer, status, trainer.wall_seconds)
            if main:
                write_json_atomic(config.output_dir / METRICS_FILE, metrics)
                metrics['plots'] = write_plots(config.output_dir, trainer.history)
                write_json_atomic(config.output_dir / METRICS_FILE, metrics)
    code = 0
    if main and status != 'interrupted':
        _save_check_observations(config, inputs.contract)
    if main and not config.skip_infer and status != 'interrupted':
        code = _infer(config, inputs, metrics)
    metrics['wall_time_s'] = trainer.previous_wall_s + (time.perf_counter() - start)
    if main:
        write_json_atomic(config.output_dir / METRICS_FILE, metrics)
    metrics['exit_code'] = code
    return metrics


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``act-ros train``."""
    setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    try:
        metrics = run(config)
    except (ActRosError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f'act-ros train: {exc}', file=sys.stderr)
        return 2
    if metrics['status'] != 'infer_only' and os.environ.get('RANK', '0') == '0':
        sps = metrics.get('steps_per_s')
        print(f"{metrics['status']}: {metrics['steps_completed']} steps"
              f"{f', {sps:.2f} steps/s' if sps else ''}; best {list(metrics['best'])}; "
              f"metrics in {Path(config.output_dir) / METRICS_FILE}")
    if metrics['status'] == 'interrupted':
        return 130  # like a shell's Ctrl-C: the run did not finish (resume with --resume)
    return int(metrics.get('exit_code', 0))


if __name__ == '__main__':
    sys.exit(main())
