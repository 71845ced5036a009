"""Trainer settings: one validated dataclass, presets from ``config/train_<preset>.yaml``.

Precedence: an option given on the command line wins over the preset file, which wins
over the dataclass defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from act_ros.core.arguments import HelpFormatter
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


@dataclass
class TrainConfig:
    """Everything one training run depends on (written to ``training_metrics.json``)."""

    dataset_root: Path
    output_dir: Path
    preset: str = 'synthetic'
    # The simulated task the data comes from (act_ros.sim.tasks): its robot's contract (when
    # contract_path is not given), the closed-loop evaluation and the auxiliary target;
    # recorded in every checkpoint so that act-ros evaluate runs the right environment.
    task: str = 'port_pick_align'
    # Actions per model call (ACT's chunk_size; the checkpoint's n_action_steps too, as in
    # LeRobot, unless n_action_steps is given). None: the model preset's, else LeRobot's
    # ACT default (100).
    chunk_size: int | None = None
    n_action_steps: int | None = None
    model_preset: str = 'tiny'
    image_size: tuple[int, int] | None = (48, 64)
    steps: int = 500
    batch_size: int = 8
    lr: float = 1e-4
    lr_backbone: float | None = None  # None: same as lr (LeRobot's ACT preset)
    weight_decay: float = 1e-4
    grad_clip_norm: float = 10.0
    scheduler: str = 'cosine'
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    gripper_loss_weight: float = 5.0
    kl_weight: float = 10.0
    device: str = 'auto'
    torch_threads: int | None = None  # CPU threads for PyTorch; None = PyTorch's default
    val_ratio: float = 0.1
    val_interval: int = 100
    max_val_batches: int = 32
    checkpoint_interval: int = 500
    early_stop_patience: int = 10
    min_steps: int = 3000
    closed_loop_val_episodes: int = 0  # the sim preset uses 10
    closed_loop_te_episodes: int = 0
    # Selection episodes use seeds from here: far from the seeds demonstrations are collected
    # with (0, 1, ...) and from act-ros evaluate's default (2_000_000).
    closed_loop_seed: int = 1_000_000
    closed_loop_episode_steps: int | None = None  # None: config/sim.yaml (quick checks only)
    camera_stats: str = 'imagenet'
    # Standardize the backbone's FrozenBatchNorm2d statistics on training images before the
    # first step (act_ros.training.backbone); from-scratch backbones then train faster.
    calibrate_backbone_norm: bool = False
    # Random shift augmentation: pad each camera image by this many pixels (edge values)
    # and crop it back at a random offset, per sample (0 = off).
    image_shift_px: int = 0
    # Joint-state perturbation while training (act_ros.training.loop.perturb_state), against a
    # policy that continues the arm's own motion instead of looking (in demonstrations the
    # expert's arm already points where the box is): Gaussian noise on the normalized
    # observation.state, in units of the dataset's standard deviation, and the probability
    # that a sample's state is replaced by the dataset mean (0 = off for both).
    state_noise_std: float = 0.0
    state_dropout: float = 0.0
    # Weight of the auxiliary object-pose loss (act_ros.training.auxiliary): a training-only
    # head predicts box and pad poses from the backbone features. Needs the dataset
    # feature sim.object_poses (simulation datasets); 0 = off.
    aux_object_pose_weight: float = 0.0
    # What the pose head reads (AUX_SOURCES, act_ros.training.auxiliary): 'backbone', the camera
    # feature maps (shapes the backbone until it is frozen), or 'encoder', the transformer
    # encoder's output (shapes the encoder; also trains on cached maps).
    aux_object_pose_source: str = 'backbone'
    # How the 'backbone' head reads the yaws (YAW_READOUTS): 'flatten', one MLP over the
    # whole grid (what the recorded recipes used), or 'attention', per cell where the
    # object is (act-ros pose-pretrain's default: the one whose yaws leave chance).
    aux_object_pose_yaw_readout: str = 'flatten'
    # From this step on the backbone is frozen and its feature maps of every training frame
    # are computed once and reused (act_ros.training.feature_cache): later steps cost a
    # fraction of a full one. None = the backbone trains throughout.
    backbone_freeze_step: int | None = None
    # From early_freeze_step on, the backbone's stages up to early_freeze_layer (layer1..3)
    # are frozen and their outputs cached; the later stages and the rest keep training.
    early_freeze_layer: str | None = None
    early_freeze_step: int = 0
    # Cache (and train on, once a stage is frozen) every k-th frame of each training
    # episode: consecutive frames at 30 Hz are near duplicates, so more episodes fit the
    # same cache memory and build time. Action chunks still come from every frame.
    cache_frame_stride: int = 1
    # Where the decoded frames are kept (FRAME_STORES): 'auto' keeps them in memory unless
    # they would take over half of what is available, then in a file in the run directory.
    frame_store: str = 'auto'
    # Where the frozen backbone's layer4 maps are kept on disk (act_ros.training.feature_disk)
    # so that a later build with the same backbone, normalization and precision (a --resume,
    # the next DAgger iteration) reads the frames it has instead of computing them again.
    # None: OUTPUT_DIR/feature_cache; 'none': memory only.
    feature_cache_dir: Path | str | None = None
    # The object poses (dataset feature observation.environment_state, act_ros.core.object_
    # state) as a policy input, normalized with the dataset's statistics like the state.
    environment_state: bool = False
    # Contract cameras the policy sees (None: all of them); () trains on the joints and
    # the object poses alone (needs environment_state).
    cameras: tuple[str, ...] | None = None
    # ACTConfig fields set on top of the model preset (e.g. {'use_vae': False}); a preset
    # file gives them under `model:`, the command line as --model KEY=VALUE.
    model: dict[str, Any] = field(default_factory=dict)
    # Start from this checkpoint's weights (same model settings and inputs): fine-tuning,
    # e.g. the next DAgger iteration on the grown dataset. Normalization follows the new
    # dataset.
    init_from: Path | None = None
    precision: str = 'fp32'
    compile: bool = False
    seed: int = 0
    resume: bool = False
    skip_infer: bool = False
    infer_only: bool = False
    contract_path: Path | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        self.dataset_root = Path(self.dataset_root).expanduser()
        self.output_dir = Path(self.output_dir).expanduser()
        if self.image_size is not None:
            self.image_size = (int(self.image_size[0]), int(self.image_size[1]))
            if min(self.image_size) < 16:
                raise ValueError(f'image_size must be at least 16x16, got {self.image_size}')
        if self.preset not in TRAIN_PRESETS:
            raise ValueError(f"unknown preset '{self.preset}', expected one of {TRAIN_PRESETS}")
        from act_ros.sim.tasks import sim_task

        sim_task(self.task)  # a clear error for an unknown task
        for name in ('chunk_size', 'n_action_steps'):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f'{name} must be >= 1, got {value}')
        if self.chunk_size and self.n_action_steps and self.n_action_steps > self.chunk_size:
            raise ValueError(f'n_action_steps ({self.n_action_steps}) cannot exceed chunk_size '
                             f'({self.chunk_size})')
        if self.model_preset not in PRESETS:
            raise ValueError(f"unknown model_preset '{self.model_preset}', expected one of "
                             f'{sorted(PRESETS)}')
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler '{self.scheduler}', expected one of {SCHEDULERS}")
        if self.camera_stats not in CAMERA_STATS:
            raise ValueError(f"unknown camera_stats '{self.camera_stats}', expected one of "
                             f'{CAMERA_STATS}')
        if self.precision not in TRAIN_PRECISIONS:
            raise ValueError(f"unknown precision '{self.precision}', expected one of "
                             f'{TRAIN_PRECISIONS}')
        if self.aux_object_pose_source not in AUX_SOURCES:
            raise ValueError(f"unknown aux_object_pose_source '{self.aux_object_pose_source}', "
                             f'expected one of {AUX_SOURCES}')
        if self.aux_object_pose_yaw_readout not in YAW_READOUTS:
            raise ValueError(f"unknown aux_object_pose_yaw_readout "
                             f"'{self.aux_object_pose_yaw_readout}', expected one of "
                             f'{YAW_READOUTS}')
        if self.image_shift_px < 0:
            raise ValueError(f'image_shift_px must be >= 0, got {self.image_shift_px}')
        if not self.state_noise_std >= 0:  # NaN too
            raise ValueError(f'state_noise_std must be >= 0, got {self.state_noise_std}')
        if not 0 <= self.state_dropout <= 1:
            raise ValueError(f'state_dropout must be in [0, 1], got {self.state_dropout}')
        if self.backbone_freeze_step is not None and self.backbone_freeze_step < 0:
            raise ValueError(f'backbone_freeze_step must be >= 0 or None, got '
                             f'{self.backbone_freeze_step}')
        if self.early_freeze_layer not in (None, 'layer1', 'layer2', 'layer3'):
            raise ValueError(f"early_freeze_layer must be layer1, layer2 or layer3, got "
                             f"'{self.early_freeze_layer}'")
        if self.frame_store not in FRAME_STORES:
            raise ValueError(f'frame_store must be one of {FRAME_STORES}, got '
                             f'{self.frame_store!r}')
        if self.cache_frame_stride < 1:
            raise ValueError(f'cache_frame_stride must be >= 1, got {self.cache_frame_stride}')
        if self.feature_cache_dir is not None:
            text = str(self.feature_cache_dir).strip()
            if not text:
                raise ValueError("feature_cache_dir is empty (give a directory, or 'none')")
            self.feature_cache_dir = ('none' if text.lower() == 'none'
                                      else Path(text).expanduser())
        if self.early_freeze_step < 0:
            raise ValueError(f'early_freeze_step must be >= 0, got {self.early_freeze_step}')
        if self.early_freeze_layer and self.backbone_freeze_step is not None \
                and self.backbone_freeze_step < self.early_freeze_step:
            raise ValueError(f'backbone_freeze_step ({self.backbone_freeze_step}) comes before '
                             f'early_freeze_step ({self.early_freeze_step})')
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f'torch_threads must be >= 1, got {self.torch_threads}')
        self._check_cameras()
        for name in ('steps', 'batch_size', 'val_interval', 'checkpoint_interval'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        for name in ('max_val_batches', 'early_stop_patience', 'min_steps', 'warmup_steps',
                     'closed_loop_val_episodes', 'closed_loop_te_episodes'):
            if getattr(self, name) < 0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')
        for name in ('lr', 'weight_decay', 'grad_clip_norm', 'gripper_loss_weight', 'kl_weight',
                     'aux_object_pose_weight'):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name in ('lr', 'gripper_loss_weight')
                                                         and value == 0):
                raise ValueError(f'{name} must be finite and {"> 0" if name == "lr" else ">= 0"},'
                                 f' got {value}')
        if self.lr_backbone is not None and not (math.isfinite(self.lr_backbone)
                                                 and self.lr_backbone >= 0):
            raise ValueError(f'lr_backbone must be finite and >= 0, got {self.lr_backbone}')
        if not 0.0 <= self.val_ratio < 1.0:
            raise ValueError(f'val_ratio must be in [0, 1), got {self.val_ratio}')
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f'min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}')
        for name in ('closed_loop_te_episodes', 'closed_loop_val_episodes'):
            if getattr(self, name) and self.preset not in CLOSED_LOOP_PRESETS:
                raise ValueError(f'closed-loop evaluation needs a simulation preset '
                                 f'{CLOSED_LOOP_PRESETS} (got preset {self.preset!r} with '
                                 f'{name} > 0)')
        if self.closed_loop_episode_steps is not None and self.closed_loop_episode_steps < 1:
            raise ValueError('closed_loop_episode_steps must be >= 1, got '
                             f'{self.closed_loop_episode_steps}')
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


def parse_model_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as YAML (``use_vae=false``, ``dim_model=128``)."""
    if '=' not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. use_vae=false), got '{text}'")
    key, value = text.split('=', 1)
    return key.strip(), yaml.safe_load(value)


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
    """Parser of ``act-ros train``; options left unset take the preset's value."""
    p = argparse.ArgumentParser(
        prog='act-ros train', description='Train an ACT policy (LeRobot) on a LeRobot v3 dataset.',
        epilog='Several GPUs or machines: accelerate launch --multi_gpu --num_processes N -m '
               'act_ros.training.train OPTIONS (docs/training.md, "Several GPUs or machines"). '
               'Presets: config/train_<preset>.yaml.',
        formatter_class=HelpFormatter)
    p.add_argument('--dataset-root', type=Path, help='LeRobot v3 dataset directory')
    p.add_argument('--output-dir', type=Path, required=True, help='run directory (checkpoints, '
                   'training_metrics.json, plots)')
    p.add_argument('--preset', choices=TRAIN_PRESETS,
                   help="default: by the dataset's robot_type (meta/info.json): this package's "
                   "simulations' and generator's datasets take theirs, any other dataset "
                   "'arm'. synthetic: smoke runs on act-ros generate-synthetic data; sim: the "

                   "scripted expert's demonstrations, best/ by success in the simulation; "
                   "aloha: gym-aloha's transfer cube, likewise; arm: a real arm's recordings "
                   '(record_node, act-ros import-bag), nothing from the simulation needed, '
                   'best/ by validation L1')
    p.add_argument('--model-preset', choices=sorted(PRESETS), help='model size (preset default)')
    p.add_argument('--image-size', type=parse_image_size, help='model input HxW (preset default)')
    p.add_argument('--task', help='the simulated task the dataset comes from: port_pick_align '
                   '(the default) or aloha_transfer_cube (its robot contract, closed-loop '
                   'evaluation and auxiliary target; recorded in every checkpoint)')
    p.add_argument('--chunk-size', type=int, help="actions per model call (ACT's chunk_size; "
                   "default: the preset's, else the model preset's, else LeRobot's 100)")
    p.add_argument('--n-action-steps', type=int, help='actions played from each chunk before '
                   'the next model call, stored in the checkpoint (default: chunk size, as '
                   "LeRobot's ACT)")
    p.add_argument('--steps', type=int)
    p.add_argument('--batch-size', type=int)
    p.add_argument('--lr', type=float, help='peak learning rate')
    p.add_argument('--lr-backbone', type=float, help='backbone learning rate (default: --lr)')
    p.add_argument('--weight-decay', type=float)
    p.add_argument('--grad-clip-norm', type=float)
    p.add_argument('--scheduler', choices=SCHEDULERS)
    p.add_argument('--warmup-steps', type=int)
    p.add_argument('--gripper-loss-weight', type=float, help='L1 weight of the gripper (5)')
    p.add_argument('--kl-weight', type=float)
    p.add_argument('--device', help='auto | cpu | cuda | cuda:N | mps (explicit = must exist)')
    p.add_argument('--torch-threads', type=int, help='PyTorch CPU threads (default: PyTorch '
                   'decides; 1 is fastest on a CPU shared with other work)')
    p.add_argument('--val-ratio', type=float, help='fraction of episodes held out (0.1)')
    p.add_argument('--val-interval', type=int, help='steps between validations')
    p.add_argument('--max-val-batches', type=int, help='validation batches (0 = full pass)')
    p.add_argument('--checkpoint-interval', type=int, help='steps between step_NNNNNN/ saves')
    p.add_argument('--early-stop-patience', type=int, help='evaluations without improvement '
                   'before stopping (0 = off)')
    p.add_argument('--min-steps', type=int, help='no early stop before this step')
    p.add_argument('--closed-loop-val-episodes', type=int, help='sim episodes per closed-loop '
                   'evaluation, chunk execution (selects best/)')
    p.add_argument('--closed-loop-te-episodes', type=int, help='sim episodes with temporal '
                   'ensembling (selects best_te/; 0 = off)')
    p.add_argument('--closed-loop-seed', type=int, help='first seed of the evaluation episodes')
    p.add_argument('--closed-loop-episode-steps', type=int,
                   help='ticks per closed-loop episode (default: config/sim.yaml)')
    p.add_argument('--camera-stats', choices=CAMERA_STATS, help='camera normalization: ImageNet '
                   "statistics (LeRobot's default) or the dataset's")
    p.add_argument('--calibrate-backbone-norm', action=argparse.BooleanOptionalAction,
                   default=None, help="standardize the backbone's FrozenBatchNorm2d statistics "
                   'on training images before the first step')
    p.add_argument('--image-shift-px', type=int, help='random shift augmentation in pixels '
                   '(0 = off)')
    p.add_argument('--state-noise-std', type=float, help='Gaussian noise on the normalized joint '
                   "state while training, in the dataset's standard deviations (0 = off)")
    p.add_argument('--state-dropout', type=float, help="probability that a training sample's "
                   'joint state is replaced by the dataset mean (0 = off)')
    p.add_argument('--aux-object-pose-weight', type=float, help='weight of the auxiliary '
                   'object-pose loss (needs sim.object_poses in the dataset; 0 = off)')
    p.add_argument('--aux-object-pose-source', choices=AUX_SOURCES,
                   help="what the auxiliary pose head reads: the cameras' backbone feature "
                   "maps (default; stops when the backbone is frozen) or the transformer "
                   "encoder's output (keeps training on cached maps)")
    p.add_argument('--aux-object-pose-yaw-readout', choices=YAW_READOUTS,
                   help="how the backbone pose head reads the yaws: flatten (one MLP over the "
                   "grid, default) or attention (per cell, where the object is)")
    p.add_argument('--backbone-freeze-step', type=int, help='freeze the backbone from this step '
                   'on and train the rest on cached feature maps (much faster steps)')
    p.add_argument('--early-freeze-layer', choices=('layer1', 'layer2', 'layer3'),
                   help='freeze the backbone stages up to this one (from --early-freeze-step) '
                   'and train the rest on their cached outputs')
    p.add_argument('--early-freeze-step', type=int, help='step of --early-freeze-layer (0)')
    p.add_argument('--cache-frame-stride', type=int, help='cache and train on every k-th frame '
                   'of each episode once a backbone stage is frozen (1 = every frame)')
    p.add_argument('--frame-store', choices=FRAME_STORES,
                   help='where the decoded camera frames are kept while training: memory, '
                   'or disk (a file in OUTPUT_DIR mapped into memory, removed when the run '
                   'ends, also when it is killed: for datasets larger than the RAM); auto '
                   '(default) takes disk when the frames would fill over half the available '
                   'memory (3 x H x W bytes per frame and camera: 2.7 GB for 54 000 frames of '
                   'two cameras at 96x128)')
    p.add_argument('--feature-cache-dir', metavar='DIR',
                   help="where the frozen backbone's layer4 maps are kept on disk and reused "
                   'by a later build with the same backbone weights, camera normalization, '
                   'precision and image size (a --resume after the freeze, the next DAgger '
                   'iteration): frames are found by their pixels, only new ones are computed. '
                   'One subdirectory per backbone (4 x C x h x w bytes per frame and camera: '
                   '24 KB for ResNet-18 at 96x128); delete it, or a subdirectory, to free the '
                   "space. Default OUTPUT_DIR/feature_cache; 'none' keeps the maps in memory "
                   'only')
    p.add_argument('--environment-state', action=argparse.BooleanOptionalAction, default=None,
                   help='take the object poses (dataset feature observation.environment_state: '
                   'box and pad position and yaw) as a policy input, normalized with the '
                   "dataset's statistics (default off)")
    p.add_argument('--cameras', type=parse_cameras, help='contract cameras the policy sees, '
                   "comma-separated ('top,wrist'; default: all), or 'none' for a policy on the "
                   'joints and the object poses alone (needs --environment-state)')
    p.add_argument('--model', dest='model_items', action='append', type=parse_model_override,
                   metavar='KEY=VALUE', help='an ACTConfig field on top of the model preset, '
                   'e.g. --model use_vae=false --model dim_feedforward=512 (repeatable)')
    p.add_argument('--init-from', type=Path, help='start from the weights of this checkpoint '
                   '(same model settings and inputs; fine-tuning, e.g. a DAgger iteration)')
    p.add_argument('--precision', choices=TRAIN_PRECISIONS, help='autocast precision of the '
                   'training step; auto = bf16 where the device has native bfloat16, else fp32')
    p.add_argument('--compile', action='store_true', default=None,
                   help='torch.compile(fullgraph=True) the loss step')
    p.add_argument('--seed', type=int)
    p.add_argument('--resume', action='store_true', default=None,
                   help='continue from OUTPUT_DIR/last (model, optimizer, scheduler, RNG, step)')
    p.add_argument('--skip-infer', action='store_true', default=None,
                   help='skip the inference check of the final checkpoint')
    p.add_argument('--infer-only', action='store_true', default=None,
                   help='only run the inference check on OUTPUT_DIR/best (or last)')
    p.add_argument('--contract', dest='contract_path', type=Path, help='contract YAML')
    p.add_argument('--no-progress', dest='progress', action='store_false', default=None)
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
