"""The training loop: steps, validation, closed-loop selection, checkpoints, resume, signals.

Checkpoints in ``output_dir``: ``last/`` (with ``training_state.pt``, for ``--resume``),
``best/`` (lowest validation L1 with the loss's dimension weights, or with the sim preset
the best closed-loop chunk execution by ``(align_rate, -mean_position_error)``),
``best_te/`` (best temporal ensembling), ``step_NNNNNN/`` every ``checkpoint_interval``
steps.

Under ``accelerate launch`` (:mod:`act_ros.training.distributed`) every process runs this
loop on its share of each global batch (N x ``batch_size``), with the loss module in
DDP. The L1 term of each process is rescaled by its share of the valid (unpadded) action
steps, so the averaged gradient is that of the global batch's loss, as one process with
batch N x ``batch_size`` computes it. Every process takes the same decisions (validation
and closed-loop results are reduced first, a stop request is agreed at each step) and
only process 0 writes checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from act_ros.core.inference.predictor import autocast_context, native_reduced_precision
from act_ros.training.config import TrainConfig
from act_ros.training.data import evenly_spread, strided_frames
from act_ros.training.distributed import LocalProcess
from act_ros.training.evaluation.rollout import merge_mode_results
from act_ros.training.loss import act_loss, act_training_loss, dimension_weights
from act_ros.training.metrics import History
from act_ros.training.prepare import CALIBRATION_FRAMES, RunInputs, build_optimizer, build_policy
from act_ros.training.state import (
    BatchOrder,
    capture_rng,
    copy_checkpoint,
    load_training_state,
    restore_rng,
    save_model,
    seed_everything,
)

logger = logging.getLogger(__name__)
CANDIDATE_DIR = '.closed_loop_candidate'
PROGRESS_SYNC_EVERY = 10  # steps between .item() syncs for the progress bar and history
LOG_EVERY = 100  # steps between log lines when the progress bar is off (runs logged to a file)


def resolve_precision(requested: str, device: torch.device) -> str:
    """The training step's precision: ``auto`` is bf16 where the device has it natively."""
    if requested == 'auto':
        return native_reduced_precision(device) or 'fp32'
    autocast_context(device, requested)  # refuses an unsupported choice with a clear error
    return requested


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift each image of (B, C, H, W) by a random whole-pixel offset in [-pad, pad] on both
    axes, filling with the edge pixels (DrQ's augmentation for image-based control)."""
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad), mode='replicate')
    offsets = torch.randint(0, 2 * pad + 1, (b, 2))
    return torch.stack([padded[i, :, y:y + h, x:x + w]
                        for i, (y, x) in enumerate(offsets.tolist())])


def perturb_state(state: torch.Tensor, noise_std: float, dropout: float) -> torch.Tensor:
    """The normalized joint state (B, D) of a training batch with Gaussian noise of
    ``noise_std`` added and, with probability ``dropout`` per sample, replaced by 0 (the
    dataset mean): the policy cannot take the arm's configuration as a substitute for
    looking at the objects (a copycat policy). A new tensor; ``state`` is not changed."""
    out = state
    if noise_std:
        out = out + noise_std * torch.randn_like(out)
    if dropout:
        keep = torch.rand(out.shape[0], *(1,) * (out.dim() - 1), device=out.device) >= dropout
        out = out * keep.to(out.dtype)
    return out


class _LossModule(torch.nn.Module):
    """What DDP wraps: the ACT network and the auxiliary head while it trains, with the loss
    step as ``forward`` (DDP then averages the gradient of every trained parameter)."""

    def __init__(self, model: torch.nn.Module, head: torch.nn.Module | None,
                 loss_step: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        super().__init__()
        self.model = model
        self.head = head
        self.loss_step = loss_step

    def forward(self, batch: dict[str, torch.Tensor], l1_scale: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        return self.loss_step(batch, l1_scale)


class Trainer:
    """One training run (see module docstring); ``run()`` returns the metrics dict.

    ``dist``: this process's place in a data-parallel run (default: the only process).
    """

    def __init__(self, config: TrainConfig, inputs: RunInputs, *,
                 on_step: Callable[[Trainer, int], None] | None = None,
                 dist: LocalProcess | None = None) -> None:
        self.config = config
        self.inputs = inputs
        self.on_step = on_step
        self.dist = dist or LocalProcess()
        self.out = config.output_dir
        seed_everything(config.seed)
        self.policy, self.preprocessor, self.postprocessor = build_policy(config, inputs)
        self.features = list(self.policy.config.image_features)
        self.precision = resolve_precision(config.precision, inputs.device)
        self.backbone_calibration: dict[str, float] | None = None
        if config.calibrate_backbone_norm:
            self.backbone_calibration = self._calibrate_backbone()
        self.aux = self._make_auxiliary() if config.aux_object_pose_weight > 0 else None
        # The dataset feature the auxiliary head predicts (popped from every batch).
        self.aux_key = self.aux.target.feature if self.aux is not None else None
        from act_ros.sim.tasks import sim_task

        self.task = sim_task(config.task)
        self.saved_preprocessor = preprocessor_for_saving(self.preprocessor, self.task,
                                                          inputs.image_size)
        self.optimizer, self.scheduler = build_optimizer(
            config, self.policy, self.aux.head.parameters() if self.aux else ())
        self.weights = dimension_weights(inputs.contract.num_joints,
                                         grippers=inputs.contract.gripper_indices,
                                         gripper_weight=config.gripper_loss_weight).to(inputs.device)
        self.order = self._batch_order(inputs.split.train)
        self.history = History()
        self.step = 0
        self.best: dict[str, dict[str, Any]] = {}
        self.evals_without_improvement = 0
        self.stop_reason: str | None = None
        self.resumed_from: int | None = None
        self.previous_wall_s = 0.0
        self.previous_cpu_s = 0.0  # CPU time of the run's earlier sessions (--resume)
        self._cpu_start = time.process_time()
        self.train_seconds = 0.0
        self.first_step_s: float | None = None
        self.session_steps = 0
        self._stop_requested: str | None = None
        self._env = None
        self._start = time.perf_counter()
        self.feature_cache = None  # act_ros.training.feature_cache.FeatureCache once frozen
        self.feature_cache_info: dict[str, Any] | None = None
        self._loss_step = self._make_loss_step()
        self._ddp: torch.nn.Module | None = None  # the DDP-wrapped loss module, built lazily
        self._stop_agreed = False  # a stop request on any process (data-parallel runs)
        self._candidate_tmp: Path | None = None
        if self.dist.active:  # own dropout masks, latent samples and shifts per process
            seed_everything(config.seed + self.dist.rank)

    # -- pieces -----------------------------------------------------------------------------
    def _batch_order(self, frames: np.ndarray) -> BatchOrder:
        return BatchOrder(frames, self.config.batch_size, self.config.seed, rank=self.dist.rank,
                          world_size=self.dist.world_size)

    def _make_auxiliary(self):
        from act_ros.training.auxiliary import ObjectPoseAuxiliary, aux_target

        target = aux_target(self.config.task)
        store = self.inputs.store
        poses = store.extras[target.feature][torch.from_numpy(self.inputs.split.train)]
        shapes = [tuple(self.policy.config.input_features[key].shape) for key in self.features]
        return ObjectPoseAuxiliary(self.policy.model, shapes, poses, self.inputs.device,
                                   source=self.config.aux_object_pose_source,
                                   yaw_readout=self.config.aux_object_pose_yaw_readout,
                                   target=target)

    def _calibrate_backbone(self) -> dict[str, float]:
        """Standardize the backbone's frozen norms on ``CALIBRATION_FRAMES`` evenly spread
        training frames (every camera), before the first step."""
        from act_ros.training.backbone import calibrate_frozen_batchnorm

        picks = evenly_spread(self.inputs.split.train, CALIBRATION_FRAMES)
        batch = self.preprocessor(self.inputs.store.batch(picks))
        return calibrate_frozen_batchnorm(self.policy.model.backbone,
                                          [batch[key] for key in self.features])

    def _make_loss_step(self, cut: str | None = None
                        ) -> Callable[..., tuple[torch.Tensor, ...]]:
        """The loss step on images, or with ``cut`` on the cached output of the backbone's
        stages up to it (:mod:`act_ros.training.feature_cache`). The auxiliary pose loss
        applies while some of the backbone still trains (``cut`` is not ``layer4``), or
        throughout when its head reads the transformer encoder.

        ``l1_scale`` (data-parallel runs): factor of the L1 term, this process's share of
        the global batch's valid action steps times the number of processes."""
        from act_ros.training.feature_cache import backbone_bypassed

        model, features, weights, kl = self.policy.model, self.features, self.weights, \
            self.config.kl_weight
        device, precision = self.inputs.device, self.precision
        aux = self.aux if cut != 'layer4' or (
            self.aux is not None and self.aux.trains_with_frozen_backbone) else None
        aux_weight = self.config.aux_object_pose_weight
        aux_key = self.aux_key

        def loss_step(batch: dict[str, torch.Tensor], l1_scale: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, ...]:
            poses = batch.pop(aux_key, None) if aux_key else None
            with autocast_context(device, precision):
                with aux.capture() if aux is not None else contextlib.nullcontext():
                    out = act_training_loss(model, batch, image_features=features,
                                            dim_weights=weights, kl_weight=kl)
                aux_loss = aux.loss(poses) if aux is not None else torch.zeros((), device=device)
            if l1_scale is not None:  # data-parallel: this process's part of the global L1
                l1 = out.l1.float() * l1_scale
                loss = l1 + kl * out.kl.float() + aux_weight * aux_loss.float()
                return loss, l1.detach(), out.kl.detach().float(), aux_loss.detach()
            loss = out.loss.float() + aux_weight * aux_loss.float()
            return loss, out.l1.detach().float(), out.kl.detach().float(), aux_loss.detach()

        step = torch.compile(loss_step, fullgraph=True) if self.config.compile else loss_step
        if cut is None:
            return step

        def bypassed(batch: dict[str, torch.Tensor], l1_scale: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, ...]:
            with backbone_bypassed(model, cut):
                return step(batch) if l1_scale is None else step(batch, l1_scale)

        return bypassed

    @property
    def _aux_training(self) -> bool:
        """Whether the auxiliary pose head trains at this step."""
        return self.aux is not None and (not self.backbone_frozen
                                         or self.aux.trains_with_frozen_backbone)

    @property
    def backbone_frozen(self) -> bool:
        """Whether the whole backbone is frozen (its output comes from the cache)."""
        return self.feature_cache is not None and self.feature_cache.cut == 'layer4'

    def freeze_backbone(self, cut: str = 'layer4') -> None:
        """Freeze the backbone's stages up to ``cut`` and cache their output for every
        training frame (from the current cache when it holds an earlier cut)."""
        from act_ros.training.feature_cache import build_feature_cache, freeze

        backbone = self.policy.model.backbone
        frozen = freeze(backbone, cut)
        store, train = self.inputs.store, self.cached_frames()

        def load_images(indices: np.ndarray) -> dict[str, torch.Tensor]:
            raw = store.batch(indices)
            return self.preprocessor({k: v for k, v in raw.items() if k not in store.extras})

        source = self.feature_cache
        self.feature_cache = None  # the earlier cache is released once the new one exists
        # Early cuts hold large maps: float16 halves their memory (used in float32).
        dtype = torch.float32 if cut == 'layer4' else torch.float16
        disk = self._disk_feature_cache(cut, source, dtype)
        # The maps are computed in the training step's precision, as the step itself would
        # compute them (bf16 autocast, where chosen, is about twice as fast on a CPU).
        with autocast_context(self.inputs.device, self.precision):
            if disk is not None:
                self.feature_cache = self._build_on_disk(disk, train, load_images)
            if self.feature_cache is None:
                self.feature_cache = build_feature_cache(
                    backbone, train, len(store), load_images, self.features, cut=cut,
                    device=self.inputs.device, progress=self.config.progress, source=source,
                    dtype=dtype)
        del source
        self._loss_step = self._make_loss_step(cut)
        self._ddp = None  # rebuilt at the next step for the parameters that still train
        if train.size != self.inputs.split.train.size:  # batches from the cached frames only
            self.order = self._batch_order(train)
        info = {'frozen_at_step': self.step, 'frozen_parameters': frozen,
                'cached_frames': int(train.size), 'cameras': len(self.features),
                'map_shape': list(next(iter(self.feature_cache.maps.values())).shape[1:]),
                'megabytes': round(self.feature_cache.nbytes / 1e6, 1),
                'build_s': round(self.feature_cache.seconds, 3),
                'reused_frames': self.feature_cache.reused,
                'computed_frames': self.feature_cache.computed,
                'cache_dir': (str(self.feature_cache.location)
                              if self.feature_cache.location is not None else None)}
        self.feature_cache_info = {**(self.feature_cache_info or {}), cut: info}
        where = (f' ({self.feature_cache.reused} found on disk in '
                 f'{self.feature_cache.location}, {self.feature_cache.computed} computed)'
                 if self.feature_cache.location is not None else '')
        logger.info('step %d: backbone frozen up to %s (%d parameters); feature cache of %d '
                    'frames built in %.0f s%s', self.step, cut, frozen, train.size,
                    self.feature_cache.seconds, where)

    def _disk_feature_cache(self, cut: str, source: Any, dtype: torch.dtype) -> Any:
        """The on-disk store of this backbone's maps (``feature_cache_dir``), or None where
        the cache stays in memory: an earlier cut, layer4 built from an earlier cut's cache,
        ``feature_cache_dir`` 'none', a data-parallel run."""
        from act_ros.training.feature_disk import DiskFeatureCache, backbone_components, camera_normalization

        root = self.config.feature_cache_path
        if root is None or cut != 'layer4' or source is not None:
            return None
        if self.dist.active:
            logger.info('data-parallel run: the feature cache stays in memory in every process '
                        '(--feature-cache-dir applies to single-process runs)')
            return None
        store = self.inputs.store
        try:
            components = backbone_components(
                self.policy.model.backbone, cut,
                normalization=camera_normalization(self.preprocessor, self.features),
                precision=self.precision, dtype=dtype, device=self.inputs.device,
                cameras=self.features,
                image_shape=tuple(store.images[self.features[0]].shape[1:]))
        except (ValueError, KeyError) as exc:
            logger.warning('feature cache: cannot tell what the maps depend on (%s); it stays '
                           'in memory', exc)
            return None
        return DiskFeatureCache(root, components)

    def _build_on_disk(self, disk: Any, frames: np.ndarray,
                       load_images: Callable[[np.ndarray], dict[str, torch.Tensor]]) -> Any:
        """The layer4 cache read from ``disk`` where it holds the frames' pixels and computed
        (and appended) elsewhere; None when the directory cannot be used (warned)."""
        from act_ros.training.feature_disk import build_feature_cache_on_disk, frame_digests

        digests = frame_digests(self.inputs.store.images, self.features, frames)
        try:
            return build_feature_cache_on_disk(
                disk, digests, self.policy.model.backbone, frames, len(self.inputs.store),
                load_images, self.features, device=self.inputs.device,
                progress=self.config.progress)
        except OSError as exc:
            logger.warning('feature cache %s cannot be used (%s); it stays in memory', disk.dir,
                           exc)
            return None

    def cached_frames(self) -> np.ndarray:
        """The training frames a cache holds: every ``cache_frame_stride``-th of each
        episode (all of them with stride 1)."""
        return strided_frames(self.inputs.split.train, self.inputs.store.seg_start.numpy(),
                              self.config.cache_frame_stride)

    def _apply_freeze_schedule(self) -> None:
        cfg = self.config
        early, full = cfg.early_freeze_layer, cfg.backbone_freeze_step
        if early and self.step >= cfg.early_freeze_step and self.feature_cache is None:
            self.freeze_backbone(early)
        if full is not None and self.step >= full and not self.backbone_frozen:
            self.freeze_backbone('layer4')

    @property
    def _trained_parameters(self) -> list[torch.nn.Parameter]:
        params = list(self.policy.parameters())
        return params + list(self.aux.head.parameters()) if self.aux is not None else params

    def request_stop(self, reason: str) -> None:
        """Finish the current step, save ``last/`` and return (signal handlers call this)."""
        self._stop_requested = reason

    def _info_json(self, **extra: Any) -> str:
        sizes = (self.inputs.image_size, self.inputs.stored_image_size)
        image_size, stored = (list(size) if size else None for size in sizes)
        return json.dumps({'step': self.step, 'preset': self.config.preset,
                           'task': self.config.task,
                           'model_preset': self.config.model_preset,
                           'model': dict(self.config.model), 'image_size': image_size,
                           'dataset_image_size': stored,
                           'cameras': list(self.inputs.cameras),
                           'environment_state': self.inputs.environment_state,
                           'dataset_root': str(self.config.dataset_root), **extra}, indent=2)

    def training_state(self) -> dict[str, Any]:
        """What ``--resume`` restores. Data-parallel runs add every process's RNG states
        (``rng_ranks``, gathered: every process must call this) and ``world_size``."""
        state = {'step': self.step, 'optimizer': self.optimizer.state_dict(),
                 'scheduler': self.scheduler.state_dict(), 'rng': capture_rng(),
                 'history': self.history.to_dict(), 'best': self.best,
                 'evals_without_improvement': self.evals_without_improvement,
                 'wall_s': self.previous_wall_s + (time.perf_counter() - self._start),
                 'cpu_s': self.cpu_seconds,
                 'config': self.config.to_dict(),
                 'dataset_frames': len(self.inputs.store),
                 'aux_head': self.aux.head.state_dict() if self.aux is not None else None,
                 'aux_source': self.aux.source if self.aux is not None else None,
                 # the head's position standardization (research/pose_probe.py reads the head)
                 'aux_position_mean': self.aux.mean.cpu() if self.aux is not None else None,
                 'aux_position_std': self.aux.std.cpu() if self.aux is not None else None}
        if self.dist.active:
            state['rng_ranks'] = self.dist.gather_objects(state['rng'])
            state['world_size'] = self.dist.world_size
        return state

    def save(self, name: str, *, with_state: bool = False) -> None:
        """Write checkpoint ``name`` (process 0 only; with ``with_state`` every process must
        call this, as the RNG states are gathered)."""
        state = self.training_state() if with_state else None
        if not self.dist.is_main:
            return
        save_model(self.out / name, self.policy, self.saved_preprocessor, self.postprocessor,
                   info_json=self._info_json(), training_state=state)

    def resume(self) -> None:
        """Restore model, optimizer, scheduler, step, RNG and history from ``last/``."""
        from safetensors.torch import load_file

        last = self.out / 'last'
        state = load_training_state(last)
        saved = state['config']
        # Runs from before environment_state/cameras existed had neither: their defaults.
        saved = {'environment_state': False, 'cameras': None, 'model': {}, **saved}
        for key in ('model_preset', 'image_size', 'batch_size', 'seed', 'environment_state',
                    'cameras', 'model'):
            now = self.config.to_dict()[key]
            if saved.get(key) != now:
                raise ValueError(f"--resume: {key} was {saved.get(key)!r} in {last}, now {now!r};"
                                 ' resume with the same settings or start a new --output-dir')
        if state['dataset_frames'] != len(self.inputs.store):
            raise ValueError(f"--resume: the dataset had {state['dataset_frames']} frames when "
                             f'{last} was written, it has {len(self.inputs.store)} now')
        world = int(state.get('world_size', 1))
        if world != self.dist.world_size:
            raise ValueError(f'--resume: {last} was written by a run of {world} process(es), '
                             f'this run has {self.dist.world_size}; the global batch (processes '
                             'x --batch-size) and the batch order depend on it: resume with '
                             f'{world} process(es) or start a new --output-dir')
        for key in ('steps', 'lr', 'scheduler', 'warmup_steps'):
            if saved.get(key) != self.config.to_dict()[key]:
                logger.warning('--resume: %s changed from %r to %r (the learning-rate schedule '
                               'differs from the interrupted run)', key, saved.get(key),
                               self.config.to_dict()[key])
        self.policy.load_state_dict(load_file(str(last / 'model.safetensors')), strict=True)
        if self.aux is not None:
            if state.get('aux_head') is None:
                raise ValueError(f'--resume: {last} was trained without the auxiliary pose head; '
                                 'resume with the same --aux-object-pose-weight')
            source = state.get('aux_source', 'backbone')  # runs before sources existed
            if source != self.aux.source:
                raise ValueError(f'--resume: the pose head of {last} read the {source}, now the '
                                 f'{self.aux.source}; resume with --aux-object-pose-source '
                                 f'{source} or start a new --output-dir')
            self.aux.head.load_state_dict(state['aux_head'])
        self.optimizer.load_state_dict(state['optimizer'])
        self.scheduler.load_state_dict(state['scheduler'])
        self.step = self.resumed_from = int(state['step'])
        self.history = History.from_dict(state['history'])
        self.best = state['best']
        self.evals_without_improvement = state['evals_without_improvement']
        self.previous_wall_s = float(state['wall_s'])
        self.previous_cpu_s = float(state.get('cpu_s', 0.0))  # runs from before it: 0
        restore_rng(state['rng_ranks'][self.dist.rank] if 'rng_ranks' in state
                    else state['rng'])
        logger.info('resumed from %s at step %d', last, self.step)

    # -- validation ----------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float] | None:
        """Mean per-sample masked L1 (normalized units) over the validation frames: plain
        (``val_l1``) and with the training's dimension weights (``val_l1_weighted``).

        Data-parallel: the batches are dealt out to the processes and the sums reduced, so
        every process gets the values one process computes over all the frames."""
        val = self.inputs.split.val
        if val.size == 0:
            return None
        b = self.config.batch_size
        n = val.size if self.config.max_val_batches == 0 else min(val.size,
                                                                  self.config.max_val_batches * b)
        frames = evenly_spread(val, n)
        self.policy.eval()
        plain = torch.zeros((), device=self.inputs.device)
        weighted = torch.zeros((), device=self.inputs.device)
        pose_errors: dict[str, list[torch.Tensor]] = {}
        store = self.inputs.store
        for start in range(0, n, b)[self.dist.rank::self.dist.world_size]:
            raw = store.batch(frames[start:start + b])
            poses = raw.pop(self.aux_key, None) if self.aux_key else None
            raw = {k: v for k, v in raw.items() if k not in store.extras}
            batch = self.preprocessor(raw)
            inputs = dict(batch)
            if self.features:  # a policy without cameras: none (LeRobot's ACT then reads none)
                inputs['observation.images'] = [batch[key] for key in self.features]
            if self.aux is not None and poses is not None:
                with self.aux.capture():
                    actions_hat, _ = self.policy.model(inputs)
                for key, value in self.aux.errors(poses).items():
                    pose_errors.setdefault(key, []).append(value)
            else:
                actions_hat, _ = self.policy.model(inputs)
            kwargs = dict(action_is_pad=batch.get('action_is_pad'), reduction='sum')
            plain += act_loss(actions_hat, batch['action'], **kwargs).l1
            weighted += act_loss(actions_hat, batch['action'], dim_weights=self.weights,
                                 **kwargs).l1
        self.policy.train()
        if self.dist.active:
            plain, weighted = self.dist.sum_(torch.stack([plain, weighted])).unbind()
            pose_errors = self._gather_pose_errors(pose_errors)
        result = {'val_l1': float(plain.item()) / n, 'val_l1_weighted': float(weighted.item()) / n}
        for key, values in pose_errors.items():  # the auxiliary head on held-out frames
            result[f'val_pose_{key}'] = float(torch.cat(values).median())
        return result

    def _gather_pose_errors(self, errors: dict[str, list[torch.Tensor]]
                            ) -> dict[str, list[torch.Tensor]]:
        """Every process's auxiliary-head errors on its validation batches, per key."""
        local = {key: torch.cat(values).cpu() for key, values in errors.items()}
        merged: dict[str, list[torch.Tensor]] = {}
        for part in self.dist.gather_objects(local):
            for key, value in part.items():
                merged.setdefault(key, []).append(value)
        return merged

    def closed_loop(self) -> dict[str, Any]:
        """Evaluate the current weights in the simulation (chunk; ensemble when asked).

        Data-parallel: each process runs its block of the episodes (same seeds as one
        process would) on a simulation of its own and the results are gathered."""
        from act_ros.training.evaluation.rollout import run_policy_episodes

        candidate = self.out / CANDIDATE_DIR
        if self.dist.is_main:
            self.save(CANDIDATE_DIR)
        else:  # the same weights, in a directory of this process's own
            if self._candidate_tmp is None:
                self._candidate_tmp = Path(tempfile.mkdtemp(
                    prefix=f'act_ros_candidate_rank{self.dist.rank}_'))
            candidate = self._candidate_tmp / CANDIDATE_DIR
            save_model(candidate, self.policy, self.saved_preprocessor, self.postprocessor,
                       info_json=self._info_json())
        if self._env is None:
            self._env = self._closed_loop_env(candidate)
        results = {}
        for mode, episodes in (('chunk', self.config.closed_loop_val_episodes),
                               ('ensemble', self.config.closed_loop_te_episodes)):
            if not episodes:
                continue
            if not self.dist.active:
                res = run_policy_episodes(candidate, episodes=episodes, mode=mode,
                                          seed=self.config.closed_loop_seed,
                                          device=str(self.inputs.device),
                                          contract=self.inputs.contract, env=self._env)
                results[mode] = {k: v for k, v in res.to_dict().items() if k != 'episodes'}
                continue
            first, end = self.dist.share(episodes)
            part = None
            if end > first:
                part = run_policy_episodes(candidate, episodes=end - first, mode=mode,
                                           seed=self.config.closed_loop_seed + first,
                                           device=str(self.inputs.device),
                                           contract=self.inputs.contract,
                                           env=self._env).to_dict()
            results[mode] = merge_mode_results(mode, self.dist.gather_objects(part))
        return results

    def _closed_loop_env(self, candidate: Path) -> Any:
        """The task's simulation for the closed-loop evaluations (built once)."""
        if self.task.is_aloha:
            from act_ros.sim.aloha.env import AlohaEnv

            return AlohaEnv(self.task.aloha_task, cameras=self.inputs.cameras,
                            image_size=self.task.image_size,
                            episode_steps=self.config.closed_loop_episode_steps,
                            terminate_on_success=True)
        import dataclasses

        from act_ros.sim import PortPickAlignEnv
        from act_ros.training.evaluation.rollout import make_sim_config

        sim_config = make_sim_config(candidate, episode_steps=self.config.closed_loop_episode_steps)
        if not self.features:  # a policy without cameras: nothing to render
            sim_config = dataclasses.replace(sim_config, render=False)
        return PortPickAlignEnv(sim_config, self.inputs.contract)

    def _selection(self, result: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """How a closed-loop result ranks (higher is better) and what is recorded: the
        success rate, ties broken by the lower position error (the package's task) or the
        higher mean reward stage (gym-aloha)."""
        if self.task.is_aloha:
            keys = ('success_rate', 'mean_max_reward')
            return (result['success_rate'], result['mean_max_reward']), {k: result[k] for k in keys}
        keys = ('success_rate', 'align_rate', 'mean_position_error', 'mean_yaw_error')
        return ((result['success_rate'], -result['mean_position_error']),
                {k: result[k] for k in keys})

    def _improved(self, key: str, value: tuple, checkpoint: str, record: dict) -> bool:
        old = self.best.get(key)
        if old is not None and tuple(old['key']) >= value:
            return False
        self.best[key] = {'key': list(value), 'step': self.step, 'path': checkpoint, **record}
        return True

    def evaluate_and_select(self) -> None:
        rng = capture_rng()  # evaluation must not change the training's random stream
        val = self.validate()
        entry: dict[str, Any] = {'step': self.step, 'wall_s': self.wall_seconds,
                                 'cpu_s': self.cpu_seconds}
        improved = False
        if val is not None:
            entry.update(val)
            self.history.val.append(entry)
            if not self.config.closed_loop and self._improved(
                    'val_l1', (-val['val_l1_weighted'],), 'best', val):
                self.save('best')
                improved = True
        if self.config.closed_loop:
            results = self.closed_loop()
            self.history.closed_loop.append({'step': self.step, 'wall_s': entry['wall_s'],
                                             'cpu_s': entry['cpu_s'],
                                             **results})
            for mode, name in (('chunk', 'best'), ('ensemble', 'best_te')):
                if mode in results:
                    rank, record = self._selection(results[mode])
                    if self._improved(f'closed_loop_{mode}', rank, name, record):
                        if self.dist.is_main:
                            copy_checkpoint(self.out / CANDIDATE_DIR, self.out / name)
                        improved = True
            if self.dist.is_main:
                shutil.rmtree(self.out / CANDIDATE_DIR, ignore_errors=True)
            logger.info('step %d closed loop: %s', self.step, {
                m: f"success {r['success_rate']:.2f}" + (
                    f", pos {r['mean_position_error'] * 100:.1f} cm"
                    if 'mean_position_error' in r else f", mean stage {r['mean_max_reward']:.2f}")
                for m, r in results.items()})
        if val is not None:
            poses = ''.join(f", {k[len('val_pose_'):]} {v * 100:.2f} cm" if k.endswith('_m')
                            else f", {k[len('val_pose_'):]} {v:.1f} deg"
                            for k, v in val.items() if k.startswith('val_pose_'))
            logger.info('step %d: val L1 %.4f (weighted %.4f)%s', self.step, val['val_l1'],
                        val['val_l1_weighted'], f'; pose head medians{poses}' if poses else '')
        self.evals_without_improvement = 0 if improved else self.evals_without_improvement + 1
        restore_rng(rng)
        patience = self.config.early_stop_patience
        if patience and self.evals_without_improvement >= patience \
                and self.step >= self.config.min_steps:
            self.stop_reason = 'early_stop'
            logger.info('early stop at step %d: no improvement in %d evaluations', self.step,
                        patience)

    # -- loop ----------------------------------------------------------------------------------
    def _step_control(self, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        """Data-parallel: agree on a stop request and return this process's L1 factor (its
        share of the global batch's valid action steps, times the number of processes)."""
        store = self.inputs.store
        valid = int((~raw[f'{store.action_key}_is_pad']).sum())
        total, stop = self.dist.step_control(valid, bool(self._stop_requested))
        self._stop_agreed = self._stop_agreed or stop
        scale = valid * self.dist.world_size / max(total, 1)
        return torch.tensor(scale, dtype=torch.float32).to(self.inputs.device, non_blocking=True)

    def _loss_module(self) -> torch.nn.Module:
        """The DDP-wrapped loss module; built at the first step and again after a freeze,
        so that it holds exactly the parameters that train."""
        if self._ddp is None:
            head = self.aux.head if self._aux_training else None
            self._ddp = self.dist.wrap(_LossModule(self.policy.model, head, self._loss_step))
        return self._ddp

    def train_step(self) -> None:
        self._apply_freeze_schedule()
        start = time.perf_counter()
        indices = self.order.indices(self.step)
        cached = self.feature_cache is not None
        raw = self.inputs.store.batch(indices, images=not cached)
        l1_scale = self._step_control(raw) if self.dist.active else None
        extras = {key: raw.pop(key) for key in list(raw) if key in self.inputs.store.extras}
        batch = self.preprocessor(raw)
        batch.update(extras)
        if cached:
            batch.update(self.feature_cache.lookup(indices))
        elif self.config.image_shift_px:
            for key in self.features:
                batch[key] = random_shift(batch[key], self.config.image_shift_px)
        if self.config.state_noise_std or self.config.state_dropout:
            key = self.inputs.store.state_key
            batch[key] = perturb_state(batch[key], self.config.state_noise_std,
                                       self.config.state_dropout)
        if l1_scale is None:
            loss, l1, kl, aux_loss = self._loss_step(batch)
        else:
            loss, l1, kl, aux_loss = self._loss_module()(batch, l1_scale)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self._trained_parameters,
                                                   self.config.grad_clip_norm)
        lr = self.optimizer.param_groups[0]['lr']
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        if l1_scale is not None:  # the global batch's loss terms (grad_norm is already)
            loss, l1, kl, aux_loss = self.dist.mean_(torch.stack(
                [loss.detach(), l1, kl, aux_loss.float()])).unbind()
        terms = {'loss': loss.detach(), 'l1': l1, 'kl': kl, 'grad_norm': grad_norm.detach()}
        if self._aux_training:
            terms['aux_pose'] = aux_loss
        self.history.add_train(self.step, terms, lr,
                               wall_s=self.wall_seconds)
        elapsed = time.perf_counter() - start
        if self.first_step_s is None:
            self.first_step_s = elapsed
        else:
            self.train_seconds += elapsed
            self.session_steps += 1

    def run(self) -> None:
        """Train until ``steps``, an early stop or a stop request (SIGINT/SIGTERM)."""
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._start = time.perf_counter()
        self.policy.train()
        handlers = self._install_signal_handlers()
        cfg = self.config
        try:
            with logging_redirect_tqdm(), tqdm(total=cfg.steps, initial=self.step, unit='step',
                                               desc='train', dynamic_ncols=True,
                                               disable=not cfg.progress or not self.dist.is_main
                                               ) as bar:
                while self.step < cfg.steps and self.stop_reason is None:
                    self.train_step()
                    bar.update(1)
                    if self.step % PROGRESS_SYNC_EVERY == 0 or self.step == cfg.steps:
                        row = self.history.flush()
                        bar.set_postfix(loss=f"{row['loss']:.3f}", l1=f"{row['l1']:.3f}",
                                        lr=f"{row['lr']:.1e}")
                        if not cfg.progress and self.step % LOG_EVERY == 0:
                            self._log_progress(row)
                    if self.step % cfg.val_interval == 0 or self.step == cfg.steps:
                        try:
                            self.evaluate_and_select()
                        except Exception:
                            self._save_before_failing('the evaluation')
                            raise
                    if self.step % cfg.checkpoint_interval == 0:
                        self.save(f'step_{self.step:06d}')
                        self.save('last', with_state=True)
                    if self.on_step is not None:
                        self.on_step(self, self.step)
                    if self._stop_now() and self.stop_reason is None:
                        self.stop_reason = 'interrupted'
                        logger.warning('%s: saving last/ at step %d and exiting',
                                       self._stop_requested or 'a stop request on another '
                                       'process', self.step)
            self.save('last', with_state=True)
        finally:
            self._restore_signal_handlers(handlers)
            if self._env is not None:
                self._env.close()
                self._env = None
            if self._candidate_tmp is not None:
                shutil.rmtree(self._candidate_tmp, ignore_errors=True)
                self._candidate_tmp = None

    def _save_before_failing(self, what: str) -> None:
        """``what`` raised after a completed step: keep that step in ``last/`` (one process
        only: under several, the others would wait in the state's gather) so that
        ``--resume`` continues from it instead of the previous checkpoint."""
        if self.dist.active:
            return
        try:
            self.save('last', with_state=True)
        except Exception:  # the original error is the one to report
            logger.exception('could not save last/ after %s failed', what)
        else:
            logger.error('%s failed at step %d; last/ holds this step (continue with '
                         '--resume once the cause is fixed)', what, self.step)

    def _stop_now(self) -> bool:
        """Whether to stop after this step: a stop request here, or (data-parallel) one on
        any process, agreed at this step's start so that every process stops at the same
        step."""
        return self._stop_agreed if self.dist.active else bool(self._stop_requested)

    def _log_progress(self, row: dict[str, float]) -> None:
        recent = self.history.train[-LOG_EVERY:]
        mean = {key: float(np.mean([r[key] for r in recent])) for key in ('loss', 'l1')
                if all(key in r for r in recent)}
        aux = f", aux pose {row['aux_pose']:.3f}" if 'aux_pose' in row else ''
        span = recent[-1].get('wall_s', 0.0) - recent[0].get('wall_s', 0.0)
        rate = (len(recent) - 1) / span if span > 0 else 0.0
        logger.info('step %d/%d: loss %.4f, l1 %.4f (mean of the last %d)%s, lr %.2e, %.2f '
                    'steps/s (wall clock)%s, wall %.0f s', self.step, self.config.steps,
                    mean.get('loss', 0.0), mean.get('l1', 0.0), len(recent), aux, row['lr'], rate,
                    ', backbone frozen' if self.backbone_frozen else '', self.wall_seconds)

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        from act_ros.core.processes import StopRequests

        requests = StopRequests()

        def handler(signum: int, _frame: Any) -> None:
            # A second signal (not one that came with the first): stop now, without saving.
            if not requests(signum):
                return
            self.request_stop(signal.Signals(signum).name)
            logger.warning('%s: the run stops and saves last/ after the current step (a feature '
                           'cache being built is finished first); send it again to stop now '
                           'without saving (the maps computed so far stay in the disk cache)',
                           signal.Signals(signum).name)

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for sig, old in previous.items():
            # None: the handler before was not set from Python (a C library's, e.g. one
            # that rclpy installs); it cannot be put back, so the default takes its place.
            signal.signal(sig, signal.SIG_DFL if old is None else old)

    @property
    def wall_seconds(self) -> float:
        return self.previous_wall_s + (time.perf_counter() - self._start)

    @property
    def cpu_seconds(self) -> float:
        """CPU time this run has used (every thread of this process, all its sessions):
        what a curve against CPU hours plots; on a busy machine wall time says less."""
        return self.previous_cpu_s + (time.process_time() - self._cpu_start)


def preprocessor_for_saving(preprocessor: Any, task: Any, image_size: tuple[int, int] | None
                            ) -> Any:
    """The preprocessor a checkpoint is saved with: the training one, and for a gym-aloha
    task whose model input is smaller than the camera, LeRobot's own
    ``image_crop_resize_processor`` step before normalization, so that LeRobot's
    ``lerobot-eval --env.type=aloha``, which hands the policy gym-aloha's 480x640 frames,
    runs the checkpoint unchanged (act_ros's runtime resizes to the model input itself and
    the step then has nothing to do)."""
    if not task.is_aloha or image_size is None or tuple(image_size) == tuple(task.image_size):
        return preprocessor
    from lerobot.processor import ImageCropResizeProcessorStep, NormalizerProcessorStep

    steps = list(preprocessor.steps)
    at = next((i for i, step in enumerate(steps) if isinstance(step, NormalizerProcessorStep)),
              len(steps))
    steps.insert(at, ImageCropResizeProcessorStep(resize_size=tuple(int(v) for v in image_size)))
    return type(preprocessor)(steps=steps, name=preprocessor.name,
                              to_transition=preprocessor.to_transition,
                              to_output=preprocessor.to_output)
