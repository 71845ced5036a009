"""Build what a run needs before its first step: data, model, processors, optimizer.

Everything that can be wrong with the inputs (dataset path, empty dataset, features
missing from the contract, an explicit device that is not there) fails here, before any
training, with a message that says what was expected and what was found.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from act_ros.core.contract import Contract, load_contract
from act_ros.core.device import select_device
from act_ros.core.inference.checkpoint import PRESETS, make_act_config
from act_ros.core.inference.checkpoint_info import LEROBOT_ACT_CHUNK_SIZE
from act_ros.training.config import TrainConfig
from act_ros.training.data import (
    FrameStore,
    Split,
    TrainingDataError,
    dataset_image_size,
    evenly_spread,
    load_frames,
    make_split,
    normalization_stats,
    open_dataset,
    select_cameras,
    strided_frames,
)
from act_ros.training.infer_check import INFERENCE_CHECK_FRAMES

logger = logging.getLogger(__name__)
CALIBRATION_FRAMES = 64  # training frames that standardize the backbone's frozen norms


@dataclass
class RunInputs:
    """The dataset side of a run."""

    contract: Contract
    device: torch.device
    dataset: Any  # LeRobotDataset
    split: Split
    store: FrameStore
    stats: dict[str, dict[str, torch.Tensor]]
    image_size: tuple[int, int] | None  # None: the policy takes no camera
    stored_image_size: tuple[int, int] | None
    cameras: tuple[str, ...] = ()  # contract cameras the policy takes
    environment_state: bool = False  # the object poses are an input

    def describe(self) -> dict[str, Any]:
        meta = self.dataset.meta
        return {'root': str(self.dataset.root), 'episodes': int(meta.total_episodes),
                'frames': int(meta.total_frames), 'fps': int(meta.fps),
                'stored_image_size': (list(self.stored_image_size) if self.stored_image_size
                                      else None),
                'camera_storage': 'video' if meta.video_keys else 'image',
                'robot_type': meta.robot_type, 'cameras': list(self.cameras),
                'environment_state': self.environment_state}


def prepare_inputs(config: TrainConfig, *, device: torch.device | None = None) -> RunInputs:
    """Open, check, split and decode the dataset; resolve the device (``device``: the one
    a data-parallel launch gave this process, instead of ``config.device``)."""
    contract = run_contract(config)
    cameras = select_cameras(contract, config.cameras)
    device = select_device(config.device) if device is None else device
    chunk_size = chunk_settings(config)['chunk_size']
    dataset = open_dataset(config.dataset_root, contract, cameras=cameras,
                           environment_state=config.environment_state, chunk_size=chunk_size)
    stored = dataset_image_size(dataset.meta, contract, cameras)
    size = (config.image_size or stored) if cameras else None
    if cameras and config.image_size and (stored[0] < size[0] or stored[1] < size[1]):
        logger.warning('dataset images are %dx%d, smaller than the model input %dx%d: they are '
                       'upscaled', stored[0], stored[1], size[0], size[1])
    hf = dataset.hf_dataset
    episode_index = hf.data.column('episode_index').to_numpy() if 'episode_index' in \
        hf.column_names else None
    split, seg_start, seg_end = make_split(episode_index, config.val_ratio, config.seed, len(hf))
    logger.info('split (%s): %d train frames (%d episodes), %d val frames (%d episodes)',
                split.kind, split.train.size, len(split.train_episodes), split.val.size,
                len(split.val_episodes))
    extra_keys: tuple[str, ...] = ()
    if config.aux_object_pose_weight > 0:
        from act_ros.training.auxiliary import aux_target

        feature = aux_target(config.task).feature
        if feature not in dataset.meta.features:
            raise TrainingDataError(
                f"--aux-object-pose-weight needs the feature '{feature}' (object poses, "
                f'recorded by act-ros collect --task {config.task} in the simulation); this '
                f'dataset has {sorted(dataset.meta.features)}: set --aux-object-pose-weight 0')
        extra_keys = (feature,)
    read = frames_read(config, split, seg_start) if cameras else None
    if read is not None:
        logger.info('the backbone is frozen and cached from the first step on 1 in %d '
                    'training frames: %d of the %d frames are decoded (those cached, the '
                    'validation frames and those the run checks on)', config.cache_frame_stride,
                    read.size, len(hf))
    decoded = len(hf) if read is None else read.size
    frame_bytes = decoded * len(cameras) * 3 * size[0] * size[1] if cameras else 0
    frame_dir = _frame_dir(config, frame_bytes)
    store = load_frames(dataset, contract, size, seg_start=seg_start, seg_end=seg_end,
                        progress=config.progress, extra_keys=extra_keys, cameras=cameras,
                        environment_state=config.environment_state, frame_dir=frame_dir,
                        chunk_size=chunk_size,
                        frames=read)
    stats = normalization_stats(dataset.meta.stats, contract, camera_stats=config.camera_stats,
                                cameras=cameras, environment_state=config.environment_state)
    return RunInputs(contract=contract, device=device, dataset=dataset, split=split, store=store,
                     stats=stats, image_size=size, stored_image_size=stored,
                     cameras=tuple(cam.name for cam in cameras),
                     environment_state=config.environment_state)


def run_contract(config: TrainConfig) -> Contract:
    """The run's contract: ``config.contract_path``, else the task robot's."""
    from act_ros.sim.tasks import sim_task

    return load_contract(config.contract_path or sim_task(config.task).contract_path())


def frames_read(config: TrainConfig, split: Split, seg_start: np.ndarray) -> np.ndarray | None:
    """The dataset frames whose pixels a run reads, or None for all of them.

    A run whose backbone is frozen and cached from the first step with
    ``--cache-frame-stride`` k > 1 trains on the cached maps of every k-th training frame
    and reads pixels only there, on the validation frames (the validation loss runs the
    backbone), on the frames that calibrate the backbone's norms (when asked) and on those
    a written checkpoint is checked on. Any other run reads every frame."""
    if config.backbone_freeze_step != 0 or config.cache_frame_stride == 1:
        return None
    parts = [strided_frames(split.train, seg_start, config.cache_frame_stride), split.val]
    if config.calibrate_backbone_norm:
        parts.append(evenly_spread(split.train, CALIBRATION_FRAMES))
    if split.val.size == 0:  # the inference check then takes training frames
        parts.append(evenly_spread(split.train, INFERENCE_CHECK_FRAMES))
    return np.unique(np.concatenate(parts).astype(np.int64))


def _frame_dir(config: TrainConfig, frame_bytes: int) -> Path | None:
    """Where the decoded frames go: None for memory, else the run directory (a mapped file,
    :func:`~act_ros.training.data.frame_buffer`), as ``config.frame_store`` says."""
    if frame_bytes == 0 or config.frame_store == 'memory':
        return None
    if config.frame_store == 'auto':
        import psutil

        available = psutil.virtual_memory().available
        if frame_bytes <= available // 2:
            return None
        logger.info('the decoded frames take %.1f GB, over half of the %.1f GB of memory '
                    'available: they are kept in a file in %s mapped into memory '
                    '(--frame-store memory to keep them in memory)', frame_bytes / 1e9,
                    available / 1e9, config.output_dir)
    return config.output_dir


def build_policy(config: TrainConfig, inputs: RunInputs) -> tuple[Any, Any, Any]:
    """LeRobot ACTPolicy (chunk_size from the contract) and its pre/post processors."""
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    lr_backbone = config.lr if config.lr_backbone is None else config.lr_backbone
    act_config = make_act_config(inputs.contract, image_size=inputs.image_size,
                                 preset=config.model_preset, device=str(inputs.device),
                                 cameras=inputs.cameras,
                                 environment_state=inputs.environment_state,
                                 kl_weight=config.kl_weight, optimizer_lr=config.lr,
                                 optimizer_lr_backbone=lr_backbone,
                                 optimizer_weight_decay=config.weight_decay,
                                 **chunk_settings(config), **config.model)
    torch.manual_seed(config.seed)
    policy = ACTPolicy(act_config).to(inputs.device)
    if config.init_from is not None:
        load_initial_weights(policy, config.init_from)
    pre, post = make_act_pre_post_processors(act_config, inputs.stats)
    return policy, pre, post


def chunk_settings(config: TrainConfig) -> dict[str, int]:
    """ACT's ``chunk_size`` and ``n_action_steps`` for a run: as configured, else the model
    preset's (act_ros.core.inference.checkpoint.PRESETS), else LeRobot's ACT default;
    ``n_action_steps`` defaults to the chunk size (LeRobot's ACT)."""
    chunk = (config.chunk_size or PRESETS[config.model_preset].get('chunk_size')
             or LEROBOT_ACT_CHUNK_SIZE)
    return {'chunk_size': chunk, 'n_action_steps': config.n_action_steps or chunk}


def load_initial_weights(policy: Any, checkpoint: Path) -> dict[str, list[str]]:
    """Copy ``checkpoint``'s weights into ``policy`` where name and shape match.

    The same model (a DAgger iteration's fine-tuning) matches everywhere. A model with
    more inputs (cameras beside the object poses, say) starts from the checkpoint where it
    can: the new input projections keep their initialization. Nothing in common, or a
    weight of the same name with another shape, is an error. Returns what was loaded and
    what kept its initialization (logged).
    """
    from safetensors.torch import load_file

    weights = load_file(str(Path(checkpoint) / 'model.safetensors'))
    own = policy.state_dict()
    shapes = [f'{k}: {tuple(weights[k].shape)} vs {tuple(v.shape)}' for k, v in own.items()
              if k in weights and tuple(weights[k].shape) != tuple(v.shape)]
    loaded = sorted(k for k in own if k in weights)
    unused = sorted(set(weights) - set(own))
    if shapes or not loaded or unused:
        raise ValueError(f'--init-from {checkpoint}: its weights do not fit this model (the same '
                         f'--model-preset and --model settings are needed): shapes differ '
                         f'{shapes[:5]}, weights this model does not have {unused[:5]}'
                         + ('' if loaded else ', nothing in common'))
    fresh = sorted(set(own) - set(weights))
    state = dict(own)
    state.update({k: weights[k].to(own[k].dtype) for k in loaded})
    policy.load_state_dict(state, strict=True)
    if fresh:
        logger.info('--init-from %s: %d tensors loaded, %d keep their initialization (inputs '
                    'the checkpoint did not have), e.g. %s', checkpoint, len(loaded), len(fresh),
                    fresh[:4])
    return {'loaded': loaded, 'initialized': fresh}


def build_optimizer(config: TrainConfig, policy: Any, extra_params: Any = ()
                    ) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with LeRobot's parameter groups (backbone lr) and a warm-up + cosine schedule.

    ``extra_params``: parameters trained beside the policy (an auxiliary head), at ``lr``.
    """
    groups = list(policy.get_optim_params())
    extra = list(extra_params)
    if extra:
        groups.append({'params': extra})
    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    warmup, total, floor = config.warmup_steps, config.steps, config.min_lr_ratio

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if config.scheduler == 'none':
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
