"""Trainer settings: one validated dataclass, presets from ``config/train_<preset>.yaml``.

Each setting is declared once, as a :class:`TrainConfig` field with its help, choices and
bounds; ``act-ros train``'s options are made from the fields and a preset may set only
fields (:mod:`act_ros.core.arguments`: a small generator rather than draccus, whose
``--field_name`` options and ``--config_path`` files would change the command line).
Precedence: an option given on the command line wins over the preset file, which wins
over the dataclass defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from act_ros.core.arguments import HelpFormatter, add_options, check_options, option
from act_ros.core.inference.checkpoint import PRESETS, parse_image_size
from act_ros.core.paths import config_path
from act_ros.data.episode import ROBOT_TYPE_ALOHA_SIM, ROBOT_TYPE_SIM, ROBOT_TYPE_SYNTHETIC

TRAIN_PRESETS = ('synthetic', 'sim', 'aloha', 'arm')
# The preset a dataset trains with when --preset is not given, by the robot_type in its
# meta/info.json: this package's simulations and synthetic generator name theirs; any other
# dataset (record_node's 'ros2', import-bag's 'ros2_bag', lerobot-record's robot names) is
# a real arm's.
PRESET_FOR_ROBOT_TYPE = {ROBOT_TYPE_SIM: 'sim', ROBOT_TYPE_ALOHA_SIM: 'aloha',
                         ROBOT_TYPE_SYNTHETIC: 'synthetic'}
DEFAULT_PRESET = 'arm'
# Presets that select checkpoints by closed-loop episodes in their task's simulation.
CLOSED_LOOP_PRESETS = ('sim', 'aloha')
# Where the auxiliary object-pose head reads (act_ros.training.auxiliary).
AUX_SOURCES = ('backbone', 'encoder')
# How its backbone head reads the yaws (act_ros.training.auxiliary.ObjectPoseHead).
YAW_READOUTS = ('flatten', 'attention')
SCHEDULERS = ('cosine', 'none')
CAMERA_STATS = ('imagenet', 'dataset')
# 'auto': bf16 autocast where the device computes bfloat16 natively (a CPU with
# AVX512-BF16 or AMX, a CUDA GPU that supports it), fp32 elsewhere.
TRAIN_PRECISIONS = ('auto', 'fp32', 'bf16', 'fp16')
# Where the decoded camera frames live while a run trains (act_ros.training.data):
# 'memory'; 'disk', a file in the run directory mapped into memory (the page cache keeps
# what fits, reads the rest); 'auto', disk when the frames would take over half the
# memory available at the start.
FRAME_STORES = ('auto', 'memory', 'disk')
# A run shorter than this is a smoke test, not a result (training_metrics.json says so).
RECOMMENDED_MIN_STEPS = 1000
# Settings that act on camera images: without cameras (cameras=[]) they cannot apply.
IMAGE_ONLY = {'backbone_freeze_step': None, 'early_freeze_layer': None,
              'calibrate_backbone_norm': False, 'image_shift_px': 0,
              'aux_object_pose_weight': 0.0}

logger = logging.getLogger(__name__)


def parse_cameras(text: str) -> tuple[str, ...]:
    """``--cameras``: comma-separated contract camera names (``top,wrist``), or ``none``
    (a policy on the joints and the object poses alone)."""
    if text.strip().lower() == 'none':
        return ()
    names = tuple(part.strip() for part in text.split(','))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected camera names like 'top,wrist' or 'none', "
                                         f"got '{text}'")
    return names


def parse_model_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as YAML (``use_vae=false``, ``dim_model=128``)."""
    if '=' not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. use_vae=false), got '{text}'")
    key, value = text.split('=', 1)
    return key.strip(), yaml.safe_load(value)


@dataclass
class TrainConfig:
    """Everything one training run depends on (written to ``training_metrics.json``); each
    field made by :func:`option` is an ``act-ros train`` option and a preset key too."""

    dataset_root: Path = option(help='LeRobot v3 dataset directory')
    output_dir: Path = option(help='run directory (checkpoints, training_metrics.json, plots)',
                              required=True)
    preset: str = option(
        'synthetic', "default: by the dataset's robot_type (meta/info.json): this package's "
        "simulations' and generator's datasets take theirs, any other dataset 'arm'. "
        "synthetic: smoke runs on act-ros generate-synthetic data; sim: the scripted expert's "
        "demonstrations, best/ by success in the simulation; aloha: gym-aloha's transfer "
        "cube, likewise; arm: a real arm's recordings (record_node, act-ros import-bag), "
        'nothing from the simulation needed, best/ by validation L1', choices=TRAIN_PRESETS)
    model_preset: str = option('tiny', 'model size', choices=sorted(PRESETS))
    image_size: tuple[int, int] | None = option((48, 64), 'model input HxW',
                                                type=parse_image_size)
    # Recorded in every checkpoint so that act-ros evaluate runs the right environment.
    task: str = option('port_pick_align', 'the simulated task the dataset comes from: '
                       'port_pick_align or aloha_transfer_cube (its robot contract when '
                       '--contract is not given, closed-loop evaluation and auxiliary target)')
    chunk_size: int | None = option(None, "actions per model call (ACT's chunk_size; default: "
                                    "the preset's, else the model preset's, else LeRobot's 100)",
                                    bounds='>= 1')
    n_action_steps: int | None = option(
        None, 'actions played from each chunk before the next model call, stored in the '
        "checkpoint (default: chunk size, as LeRobot's ACT)", bounds='>= 1')
    steps: int = option(500, bounds='>= 1')
    batch_size: int = option(8, bounds='>= 1')
    lr: float = option(1e-4, 'peak learning rate', bounds='> 0')
    lr_backbone: float | None = option(None, 'backbone learning rate (default: --lr, as '
                                       "LeRobot's ACT preset)", bounds='>= 0')
    weight_decay: float = option(1e-4, bounds='>= 0')
    grad_clip_norm: float = option(10.0, bounds='>= 0')
    scheduler: str = option('cosine', choices=SCHEDULERS)
    warmup_steps: int = option(0, bounds='>= 0')
    min_lr_ratio: float = option(0.1, 'the cosine decay ends at this fraction of --lr',
                                 bounds='[0, 1]')
    gripper_loss_weight: float = option(5.0, 'L1 weight of the gripper', bounds='> 0')
    kl_weight: float = option(10.0, bounds='>= 0')
    device: str = option('auto', 'auto | cpu | cuda | cuda:N | mps (explicit = must exist)')
    torch_threads: int | None = option(None, 'PyTorch CPU threads (default: PyTorch decides; 1 '
                                       'is fastest on a CPU shared with other work)',
                                       bounds='>= 1')
    val_ratio: float = option(0.1, 'fraction of episodes held out', bounds='[0, 1)')
    val_interval: int = option(100, 'steps between validations', bounds='>= 1')
    max_val_batches: int = option(32, 'validation batches (0 = full pass)', bounds='>= 0')
    checkpoint_interval: int = option(500, 'steps between step_NNNNNN/ saves', bounds='>= 1')
    early_stop_patience: int = option(10, 'evaluations without improvement before stopping '
                                      '(0 = off)', bounds='>= 0')
    min_steps: int = option(3000, 'no early stop before this step', bounds='>= 0')
    closed_loop_val_episodes: int = option(0, 'sim episodes per closed-loop evaluation, chunk '
                                           'execution (selects best/)', bounds='>= 0')
    closed_loop_te_episodes: int = option(0, 'sim episodes with temporal ensembling (selects '
                                          'best_te/; 0 = off)', bounds='>= 0')
    # Far from the seeds demonstrations are collected with (0, 1, ...) and from act-ros
    # evaluate's default (2_000_000).
    closed_loop_seed: int = option(1_000_000, 'first seed of the evaluation episodes')
    closed_loop_episode_steps: int | None = option(
        None, 'ticks per closed-loop episode (default: config/sim.yaml)', bounds='>= 1')
    camera_stats: str = option('imagenet', "camera normalization: ImageNet statistics "
                               "(LeRobot's) or the dataset's", choices=CAMERA_STATS)
    # act_ros.training.backbone: from-scratch backbones then train faster.
    calibrate_backbone_norm: bool = option(
        False, "standardize the backbone's FrozenBatchNorm2d statistics on training images "
        'before the first step', action=argparse.BooleanOptionalAction)
    # Each camera image is padded (edge values) and cropped back at a random offset.
    image_shift_px: int = option(0, 'random shift augmentation in pixels (0 = off)',
                                 bounds='>= 0')
    # act_ros.training.loop.perturb_state, against a policy that continues the arm's own
    # motion instead of looking (in demonstrations the expert's arm already points where
    # the box is).
    state_noise_std: float = option(0.0, 'Gaussian noise on the normalized joint state while '
                                    "training, in the dataset's standard deviations (0 = off)",
                                    bounds='>= 0')
    state_dropout: float = option(0.0, "probability that a training sample's joint state is "
                                  'replaced by the dataset mean (0 = off)', bounds='[0, 1]')
    # act_ros.training.auxiliary: a training-only head predicts box and pad poses.
    aux_object_pose_weight: float = option(0.0, 'weight of the auxiliary object-pose loss '
                                           '(needs sim.object_poses in the dataset; 0 = off)',
                                           bounds='>= 0')
    aux_object_pose_source: str = option(
        'backbone', "what the auxiliary pose head reads: the cameras' backbone feature maps "
        "(stops when the backbone is frozen) or the transformer encoder's output (keeps "
        'training on cached maps)', choices=AUX_SOURCES)
    # 'flatten' is what the recorded recipes used; 'attention' is act-ros pose-pretrain's
    # default, the one whose yaws leave chance.
    aux_object_pose_yaw_readout: str = option(
        'flatten', 'how the backbone pose head reads the yaws: flatten (one MLP over the '
        'grid) or attention (per cell, where the object is)', choices=YAW_READOUTS)
    # act_ros.training.feature_cache: later steps cost a fraction of a full one.
    backbone_freeze_step: int | None = option(
        None, 'freeze the backbone from this step on and train the rest on cached feature '
        'maps (much faster steps)', bounds='>= 0')
    early_freeze_layer: str | None = option(
        None, 'freeze the backbone stages up to this one (from --early-freeze-step) and train '
        'the rest on their cached outputs', choices=('layer1', 'layer2', 'layer3'))
    early_freeze_step: int = option(0, 'step of --early-freeze-layer', bounds='>= 0')
    # Consecutive frames at 30 Hz are near duplicates, so more episodes fit the same cache
    # memory and build time. Action chunks still come from every frame.
    cache_frame_stride: int = option(1, 'cache and train on every k-th frame of each episode '
                                     'once a backbone stage is frozen (1 = every frame)',
                                     bounds='>= 1')
    frame_store: str = option(
        'auto', 'where the decoded camera frames are kept while training: memory, or disk (a '
        'file in OUTPUT_DIR mapped into memory, removed when the run ends, also when it is '
        'killed: for datasets larger than the RAM); auto takes disk when the frames would '
        'fill over half the available memory (3 x H x W bytes per frame and camera: 2.7 GB '
        'for 54 000 frames of two cameras at 96x128)', choices=FRAME_STORES)
    # act_ros.training.feature_disk.
    feature_cache_dir: Path | str | None = option(
        None, "where the frozen backbone's layer4 maps are kept on disk and reused by a later "
        'build with the same backbone weights, camera normalization, precision and image '
        'size (a --resume after the freeze, the next DAgger iteration): frames are found by '
        'their pixels, only new ones are computed. One subdirectory per backbone (4 x C x h '
        'x w bytes per frame and camera: 24 KB for ResNet-18 at 96x128); delete it, or a '
        "subdirectory, to free the space. Default OUTPUT_DIR/feature_cache; 'none' keeps the "
        'maps in memory only', metavar='DIR')
    # The dataset feature observation.environment_state (act_ros.core.object_state).
    environment_state: bool = option(
        False, 'take the object poses (dataset feature observation.environment_state: box and '
        "pad position and yaw) as a policy input, normalized with the dataset's statistics",
        action=argparse.BooleanOptionalAction)
    cameras: tuple[str, ...] | None = option(
        None, "contract cameras the policy sees, comma-separated ('top,wrist'; default: all), "
        "or 'none' for a policy on the joints and the object poses alone (needs "
        '--environment-state)', type=parse_cameras)
    # A preset file gives them under `model:`.
    model: dict[str, Any] = option(
        help='an ACTConfig field on top of the model preset, e.g. --model use_vae=false --model '
        'dim_feedforward=512 (repeatable)', factory=dict, flag='--model', dest='model_items',
        action='append', type=parse_model_override, metavar='KEY=VALUE')
    # Normalization follows the new dataset.
    init_from: Path | None = option(None, 'start from the weights of this checkpoint (same model '
                                    'settings and inputs; fine-tuning, e.g. a DAgger iteration)')
    precision: str = option('fp32', 'autocast precision of the training step; auto = bf16 where '
                            'the device has native bfloat16, else fp32', choices=TRAIN_PRECISIONS)
    compile: bool = option(False, 'torch.compile(fullgraph=True) the loss step')
    seed: int = option(0)
    resume: bool = option(False, 'continue from OUTPUT_DIR/last (model, optimizer, scheduler, '
                          'RNG, step)')
    skip_infer: bool = option(False, 'skip the inference check of the final checkpoint')
    infer_only: bool = option(False, 'only run the inference check on OUTPUT_DIR/best (or last)')
    contract_path: Path | None = option(None, 'contract YAML', flag='--contract')
    progress: bool = option(True)

    def __post_init__(self) -> None:
        self.dataset_root = Path(self.dataset_root).expanduser()
        self.output_dir = Path(self.output_dir).expanduser()
        if self.image_size is not None:
            self.image_size = (int(self.image_size[0]), int(self.image_size[1]))
            if min(self.image_size) < 16:
                raise ValueError(f'image_size must be at least 16x16, got {self.image_size}')
        check_options(self)  # choices and bounds, as declared above
        from act_ros.sim.tasks import sim_task

        sim_task(self.task)  # a clear error for an unknown task
        if self.chunk_size and self.n_action_steps and self.n_action_steps > self.chunk_size:
            raise ValueError(f'n_action_steps ({self.n_action_steps}) cannot exceed chunk_size '
                             f'({self.chunk_size})')
        if self.feature_cache_dir is not None:
            text = str(self.feature_cache_dir).strip()
            if not text:
                raise ValueError("feature_cache_dir is empty (give a directory, or 'none')")
            self.feature_cache_dir = ('none' if text.lower() == 'none'
                                      else Path(text).expanduser())
        if self.early_freeze_layer and self.backbone_freeze_step is not None \
                and self.backbone_freeze_step < self.early_freeze_step:
            raise ValueError(f'backbone_freeze_step ({self.backbone_freeze_step}) comes before '
                             f'early_freeze_step ({self.early_freeze_step})')
        self._check_cameras()
        for name in ('closed_loop_te_episodes', 'closed_loop_val_episodes'):
            if getattr(self, name) and self.preset not in CLOSED_LOOP_PRESETS:
                raise ValueError(f'closed-loop evaluation needs a simulation preset '
                                 f'{CLOSED_LOOP_PRESETS} (got preset {self.preset!r} with '
                                 f'{name} > 0)')
        self.model = dict(self.model or {})
        check_model_overrides(self.model)
        if self.init_from is not None:
            self.init_from = Path(self.init_from).expanduser()
            if not (self.init_from / 'model.safetensors').is_file():
                raise ValueError(f'--init-from {self.init_from}: no model.safetensors (expected a '
                                 'checkpoint directory written by act-ros train)')
            if self.resume:
                raise ValueError('--init-from and --resume contradict each other (--resume '
                                 'continues OUTPUT_DIR/last)')
        if self.infer_only and self.skip_infer:
            raise ValueError('--infer-only and --skip-infer contradict each other')

    def _check_cameras(self) -> None:
        if self.cameras is None:
            return
        if isinstance(self.cameras, str):
            self.cameras = parse_cameras(self.cameras)
        self.cameras = tuple(str(name) for name in self.cameras)
        if len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f'cameras lists a camera twice: {list(self.cameras)}')
        if self.cameras:
            return
        if not self.environment_state:
            raise ValueError('cameras is empty (--cameras none) but environment_state is off: ACT '
                             'needs cameras or the object poses; add --environment-state')
        image_only = [name for name, off in IMAGE_ONLY.items() if getattr(self, name) != off]
        if image_only:
            off = ', '.join(f'{name}={IMAGE_ONLY[name]!r}' for name in image_only)
            raise ValueError(f'cameras is empty (--cameras none), so {image_only} cannot apply '
                             '(they act on camera images and the backbone that sees them): '
                             f'turn them off ({off})')

    @property
    def closed_loop(self) -> bool:
        """Whether checkpoints are selected by closed-loop evaluation in the simulation."""
        return self.preset in CLOSED_LOOP_PRESETS and self.closed_loop_val_episodes > 0

    @property
    def feature_cache_path(self) -> Path | None:
        """The directory of the on-disk feature cache (None: memory only)."""
        if self.feature_cache_dir is None:
            return self.output_dir / 'feature_cache'
        return None if self.feature_cache_dir == 'none' else Path(self.feature_cache_dir)

    @property
    def below_recommended_steps(self) -> bool:
        return self.steps < RECOMMENDED_MIN_STEPS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (paths as strings)."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, Path):
                data[key] = str(value)
        data['image_size'] = list(self.image_size) if self.image_size else None
        data['cameras'] = list(self.cameras) if self.cameras is not None else None
        return data


# ACTConfig fields that describe features, chunking or training only the trainer sets.
_NOT_OVERRIDABLE = ('input_features', 'output_features', 'chunk_size', 'n_action_steps',
                    'device', 'normalization_mapping', 'pretrained_backbone_weights')


def check_model_overrides(model: dict[str, Any]) -> None:
    """Refuse overrides that are not ``ACTConfig`` fields or that the trainer owns."""
    from lerobot.policies.act.configuration_act import ACTConfig

    known = {f.name for f in fields(ACTConfig)}
    for key in model:
        if key not in known:
            raise ValueError(f"model setting '{key}' is not an ACTConfig field (e.g. use_vae, "
                             'dim_model, dim_feedforward, n_encoder_layers, dropout)')
        if key in _NOT_OVERRIDABLE:
            raise ValueError(f"model setting '{key}' is set by the trainer from the contract "
                             'and the dataset; it cannot be overridden')


def load_preset(name: str, path: str | Path | None = None) -> dict[str, Any]:
    """Values of ``config/train_<name>.yaml`` (or ``path``) as TrainConfig field names."""
    if name not in TRAIN_PRESETS:
        raise ValueError(f"unknown preset '{name}', expected one of {TRAIN_PRESETS}")
    path = Path(path) if path else config_path(f'train_{name}.yaml')
    if not path.is_file():
        raise FileNotFoundError(f'trainer preset file not found: {path}')
    data = yaml.safe_load(path.read_text()) or {}
    body = data.get('train', data) if isinstance(data, dict) else None
    if not isinstance(body, dict):
        raise ValueError(f'{path}: expected a mapping under "train", got {type(body).__name__}')
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f'{path}: unknown settings {unknown} (TrainConfig fields: {sorted(known)})')
    return dict(body)


def preset_for_dataset(root: str | Path | None) -> str:
    """The preset for a dataset when none is given: by the ``robot_type`` in its
    ``meta/info.json`` (:data:`PRESET_FOR_ROBOT_TYPE`), else :data:`DEFAULT_PRESET` (a real
    arm's recordings). Logs which it took and why. A dataset that cannot be read here gets
    the default; opening it later says what is wrong with it."""
    robot_type = None
    if root is not None:
        try:
            robot_type = json.loads((Path(root) / 'meta' / 'info.json').read_text()).get(
                'robot_type')
        except (OSError, ValueError, AttributeError):
            robot_type = None
    name = PRESET_FOR_ROBOT_TYPE.get(robot_type, DEFAULT_PRESET)
    logger.info('preset %s (not given; the dataset\'s robot_type is %r%s)', name, robot_type,
                '' if robot_type in PRESET_FOR_ROBOT_TYPE else ": a real arm's data")
    return name


def build_parser() -> argparse.ArgumentParser:
    """Parser of ``act-ros train``, made from :class:`TrainConfig`'s fields; options left
    unset take the preset's value."""
    p = argparse.ArgumentParser(
        prog='act-ros train', description='Train an ACT policy (LeRobot) on a LeRobot v3 dataset.',
        epilog='An option left out takes the value in config/train_<preset>.yaml, else the '
               'default shown. Several GPUs or machines: accelerate launch --multi_gpu '
               '--num_processes N -m act_ros.training.train OPTIONS (docs/training.md, '
               '"Several GPUs or machines").',
        formatter_class=HelpFormatter)
    add_options(p, TrainConfig)
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Merge defaults, the preset file and the given options into a TrainConfig.

    Without cameras (``--cameras none``), the preset's image settings (backbone freeze,
    calibration, shifts, the pose head) do not apply and are dropped (logged); the same
    settings given on the command line are an error.
    """
    name = args.preset or preset_for_dataset(args.dataset_root)
    values = load_preset(name)
    preset = dict(values)
    values['preset'] = name
    for f in fields(TrainConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
    if getattr(args, 'model_items', None):
        values['model'] = {**values.get('model', {}), **dict(args.model_items)}
    if values.get('cameras') is not None and len(values['cameras']) == 0:
        dropped = [name for name in IMAGE_ONLY
                   if name in preset and getattr(args, name, None) is None]
        for name in dropped:
            del values[name]
        if dropped:
            logger.info('--cameras none: preset %s settings %s act on camera images and are '
                        'left off', name, dropped)
    if values.get('dataset_root') is None:
        raise ValueError('--dataset-root is required (a LeRobot v3 dataset directory)')
    return TrainConfig(**values)
