"""LeRobot ACT checkpoints: build, save and load ``pretrained_model`` directories offline.

A checkpoint directory holds ``config.json``, ``model.safetensors``,
``policy_preprocessor.json``, ``policy_postprocessor.json`` and the normalizer state
files they name. One written by ``lerobot-train`` loads here unchanged and one written
here loads in LeRobot. Loading never touches the network: ``pretrained_backbone_weights``
is cleared before the model is built, and every problem is reported as one
:class:`~act_ros.core.errors.CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import replace_dir
from act_ros.core.contract import Contract, load_contract, parse_image_size
from act_ros.core.errors import CheckpointError

# The JSON-only checks are shared with read_checkpoint_info (no torch, no LeRobot there).
from act_ros.core.inference.checkpoint_info import (  # noqa: F401
    CONFIG_FILE,
    POSTPROCESSOR_FILE,
    PREPROCESSOR_FILE,
    SIM_CHUNK_SIZE,
    WEIGHTS_FILE,
    CheckpointInfo,
    check_environment_state_normalization,
    check_files,
    check_policy_type,
    checkpoint_hash,
    environment_state_key,
    read_checkpoint_info,
    read_json,
    validate_features,
)
from act_ros.core.inference.hub import ResolvedCheckpoint, resolve_checkpoint
from act_ros.core.object_state import ENVIRONMENT_STATE_DIM, ENVIRONMENT_STATE_FEATURE

# Model sizes. 'default' is LeRobot's ACT; 'cpu' trains at a useful speed on 2 cores;
# 'tiny' is for tests. The ResNet-18 backbone is kept in all of them.
PRESETS: dict[str, dict[str, Any]] = {
    'default': {},
    'cpu': dict(dim_model=256, n_heads=8, dim_feedforward=1024, n_encoder_layers=2,
                n_decoder_layers=1, n_vae_encoder_layers=2, latent_dim=32),
    # The tests' model plays short chunks, so that a few seconds of a test see several
    # handovers.
    'tiny': dict(dim_model=64, n_heads=4, dim_feedforward=128, n_encoder_layers=1,
                 n_decoder_layers=1, n_vae_encoder_layers=1, latent_dim=8,
                 chunk_size=SIM_CHUNK_SIZE, n_action_steps=SIM_CHUNK_SIZE),
}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class LoadedCheckpoint:
    """A checkpoint loaded for inference: policy, processors and what was validated."""

    path: Path
    policy: Any  # lerobot ACTPolicy
    preprocessor: Any  # lerobot PolicyProcessorPipeline
    postprocessor: Any
    image_shapes: dict[str, tuple[int, int]]  # feature key -> (H, W) the model expects
    state_dim: int
    action_dim: int
    chunk_size: int
    n_action_steps: int  # config.json's: actions select_action plays from each chunk
    env_state_key: str | None = None  # observation.environment_state when it is an input
    env_state_dim: int = 0
    source: ResolvedCheckpoint | None = None  # the name it was loaded by (a Hub id: which commit)

    @property
    def config(self) -> Any:
        return self.policy.config

    def info(self) -> CheckpointInfo:
        """What was validated, as :func:`read_checkpoint_info` describes a checkpoint."""
        return CheckpointInfo(path=self.path, image_shapes=self.image_shapes,
                              image_features=tuple(self.image_shapes), state_dim=self.state_dim,
                              action_dim=self.action_dim, chunk_size=self.chunk_size,
                              n_action_steps=self.n_action_steps,
                              env_state_key=self.env_state_key, env_state_dim=self.env_state_dim)


def make_act_config(contract: Contract, *, image_size: tuple[int, int] | None = None,
                    preset: str = 'default', device: str = 'cpu',
                    cameras: tuple[str, ...] | list[str] | None = None,
                    environment_state: bool = False, **overrides: Any) -> Any:
    """Build a LeRobot ``ACTConfig`` whose features follow the contract.

    ``image_size`` (H, W) applies to every camera; by default each camera's contract size.
    ``cameras``: the contract cameras the policy sees (default: all; none only with
    ``environment_state``). ``environment_state``: the object poses
    (``observation.environment_state``, ``ENV``) are an input too, normalized with
    ``MEAN_STD`` like the joint state. Overrides are ``ACTConfig`` fields (``chunk_size``,
    ``n_action_steps``, ``dropout``...). The chunk size is LeRobot's (100) unless the preset or
    an override sets it; ``n_action_steps`` follows a given ``chunk_size`` unless given too.
    """
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig

    if preset not in PRESETS:
        raise ValueError(f"unknown model preset '{preset}', expected one of {sorted(PRESETS)}")
    names = contract.camera_names if cameras is None else tuple(cameras)
    unknown = [name for name in names if name not in contract.camera_names]
    if unknown:
        raise ValueError(f'cameras {unknown} are not in the contract (it has '
                         f'{list(contract.camera_names)})')
    if not names and not environment_state:
        raise ValueError('an ACT policy needs a camera or the environment state '
                         f'({ENVIRONMENT_STATE_FEATURE}): none of them was chosen')
    inputs = {contract.state_feature: PolicyFeature(type=FeatureType.STATE,
                                                    shape=(contract.num_joints,))}
    if environment_state:
        inputs[ENVIRONMENT_STATE_FEATURE] = PolicyFeature(type=FeatureType.ENV,
                                                          shape=(ENVIRONMENT_STATE_DIM,))
    for cam in contract.cameras:
        if cam.name not in names:
            continue
        h, w = image_size if image_size else (cam.height, cam.width)
        inputs[cam.feature] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, int(h), int(w)))
    outputs = {contract.action_feature: PolicyFeature(type=FeatureType.ACTION,
                                                      shape=(contract.num_joints,))}
    params: dict[str, Any] = dict(PRESETS[preset])
    params.update(overrides)
    if 'chunk_size' in overrides and 'n_action_steps' not in overrides:
        params['n_action_steps'] = overrides['chunk_size']
    params['pretrained_backbone_weights'] = overrides.get('pretrained_backbone_weights')
    if environment_state:  # LeRobot's ACT default leaves ENV unnormalized (IDENTITY)
        mapping = dict(params.get('normalization_mapping') or {
            'VISUAL': NormalizationMode.MEAN_STD, 'STATE': NormalizationMode.MEAN_STD,
            'ACTION': NormalizationMode.MEAN_STD})
        mapping.setdefault('ENV', NormalizationMode.MEAN_STD)
        params['normalization_mapping'] = mapping
    return ACTConfig(input_features=inputs, output_features=outputs, device=device, **params)


def default_stats(contract: Contract, config: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Normalization statistics for an untrained checkpoint.

    Joint features use the contract's limits (mean = centre, std = quarter range);
    cameras use the ImageNet statistics, as LeRobot does for pretrained backbones; the
    environment state (object poses) a workspace of about +-0.5 m and unit yaw harmonics.
    """
    centre = torch.tensor((contract.lower + contract.upper) / 2.0, dtype=torch.float32)
    spread = torch.tensor((contract.upper - contract.lower) / 4.0, dtype=torch.float32)
    joint = {'mean': centre, 'std': spread, 'min': torch.tensor(contract.lower, dtype=torch.float32),
             'max': torch.tensor(contract.upper, dtype=torch.float32)}
    stats = {contract.state_feature: dict(joint), contract.action_feature: dict(joint)}
    for key in config.image_features:
        stats[key] = {'mean': torch.tensor(IMAGENET_MEAN).reshape(3, 1, 1),
                      'std': torch.tensor(IMAGENET_STD).reshape(3, 1, 1),
                      'min': torch.zeros(3, 1, 1), 'max': torch.ones(3, 1, 1)}
    if getattr(config, 'env_state_feature', None) is not None:
        per_object_mean = [0.25, 0.0, 0.02, 0.0, 0.0]
        per_object_std = [0.15, 0.15, 0.02, 0.7, 0.7]
        objects = ENVIRONMENT_STATE_DIM // len(per_object_mean)
        mean = torch.tensor(per_object_mean * objects, dtype=torch.float32)
        std = torch.tensor(per_object_std * objects, dtype=torch.float32)
        stats[ENVIRONMENT_STATE_FEATURE] = {'mean': mean, 'std': std, 'min': mean - 2 * std,
                                            'max': mean + 2 * std}
    return stats


def save_checkpoint(path: str | Path, policy: Any, preprocessor: Any, postprocessor: Any,
                    *, extra_files: dict[str, str] | None = None) -> Path:
    """Write a checkpoint atomically: into a temporary sibling, then rename into place.

    An existing directory at ``path`` is replaced only after the new one is complete.
    ``extra_files`` maps file names to text written beside the model (e.g. a model card).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{path.name}.tmp-', dir=path.parent))
    try:
        policy.save_pretrained(tmp)
        preprocessor.save_pretrained(tmp)
        postprocessor.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def create_checkpoint(path: str | Path, *, contract: Contract | None = None,
                      image_size: tuple[int, int] | None = (48, 64), preset: str = 'tiny',
                      seed: int = 0, stats: dict[str, dict[str, torch.Tensor]] | None = None,
                      cameras: tuple[str, ...] | list[str] | None = None,
                      environment_state: bool = False, **overrides: Any) -> Path:
    """Write an untrained ACT checkpoint with LeRobot's own ``save_pretrained`` calls.

    Used by tests and benchmarks (the weights are random but the files are real).
    ``cameras`` and ``environment_state`` choose the inputs (:func:`make_act_config`).
    """
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    contract = contract or load_contract()
    config = make_act_config(contract, image_size=image_size, preset=preset, cameras=cameras,
                             environment_state=environment_state, **overrides)
    torch.manual_seed(seed)
    policy = ACTPolicy(config)
    pre, post = make_act_pre_post_processors(config, stats or default_stats(contract, config))
    return save_checkpoint(path, policy, pre, post)


def read_policy_config(path: str | Path) -> Any:
    """The policy config of the checkpoint directory ``path``, parsed as LeRobot's
    ``PreTrainedConfig.from_pretrained`` parses a local one (draccus, the class registered
    for its ``type``), without its litter: LeRobot 0.6 hands the JSON to draccus through a
    ``NamedTemporaryFile(delete=False)`` that nobody removes, one ``tmpXXXX.json`` in the
    temporary folder per load. Here the file lives in a directory removed at once."""
    import draccus
    import lerobot.policies.act.configuration_act  # noqa: F401  (registers LeRobot's configs)
    from lerobot.configs.policies import PreTrainedConfig

    path = Path(path)
    raw = read_json(path / CONFIG_FILE)
    policy_type = raw.pop('type', None)
    try:
        config_cls = PreTrainedConfig.get_choice_class(policy_type)
    except KeyError:
        raise CheckpointError(f'{path / CONFIG_FILE}: policy type {policy_type!r} is not one '
                              f'LeRobot knows') from None
    with tempfile.TemporaryDirectory(prefix='act_ros_config_') as tmp:
        file = Path(tmp) / CONFIG_FILE
        file.write_text(json.dumps(raw))
        with draccus.config_type('json'):
            return draccus.parse(config_cls, file, args=[])


def _load_config(path: Path, device: str) -> Any:
    check_policy_type(read_json(path / CONFIG_FILE), path)
    try:
        config = read_policy_config(path)
    except Exception as exc:  # draccus raises many types on a malformed config
        raise CheckpointError(f'{path / CONFIG_FILE}: cannot be parsed as an ACT config '
                              f'({type(exc).__name__}: {exc})') from exc
    # Never fetch backbone weights: the checkpoint's weights replace them anyway.
    config.pretrained_backbone_weights = None
    config.device = device
    return config


def _check_stats(pipeline: Any, keys: list[str], source: Path, file: str,
                 required: tuple[str, ...] = ()) -> None:
    """Refuse normalizers that would silently pass a feature through (missing stats).

    ``required``: keys that must be normalized (listed, and not in ``IDENTITY`` mode).
    """
    from lerobot.configs.types import NormalizationMode
    from lerobot.processor.normalize_processor import _NormalizationMixin

    steps = [s for s in pipeline.steps if isinstance(s, _NormalizationMixin)]
    if not steps:
        raise CheckpointError(f'{source / file}: no normalizer step')
    for step in steps:
        for key in (*keys, *required):
            feature = step.features.get(key)
            if feature is None and key in required:
                raise CheckpointError(f"{source / file}: the normalizer does not list '{key}': "
                                      'it would reach the model unnormalized')
            if feature is None:
                continue
            mode = step.norm_map.get(feature.type, NormalizationMode.IDENTITY)
            if mode == NormalizationMode.IDENTITY and key in required:
                raise CheckpointError(f"{source / file}: '{key}' has normalization mode "
                                      'IDENTITY: it would reach the model unnormalized')
            if mode == NormalizationMode.IDENTITY:
                continue
            stats = step._tensor_stats.get(key)
            needed = ('mean', 'std') if mode == NormalizationMode.MEAN_STD else ('min', 'max')
            if not stats or any(name not in stats for name in needed):
                raise CheckpointError(
                    f"{source / file}: normalization stats for '{key}' ({mode.value}) are "
                    f'missing: the feature would pass through unnormalized')
            for name in needed:
                if not torch.isfinite(stats[name]).all():
                    raise CheckpointError(f"{source / file}: stats '{name}' of '{key}' "
                                          'are not finite')


def import_lerobot() -> None:
    """Import what :func:`load_checkpoint` needs from LeRobot (seconds: it pulls in
    torchvision and LeRobot's policy registry), so a caller can time it on its own."""
    import lerobot.policies.act.modeling_act  # noqa: F401
    import lerobot.policies.factory  # noqa: F401
    import safetensors.torch  # noqa: F401


def load_checkpoint(path: str | Path | ResolvedCheckpoint, *, contract: Contract | None = None,
                    device: str | torch.device = 'cpu') -> LoadedCheckpoint:
    """Load a LeRobot ACT ``pretrained_model`` directory for inference, offline.

    ``path`` may also be a Hub id, ``org/name[@revision][/subfolder]``
    (:func:`~act_ros.core.inference.hub.resolve_checkpoint`: its snapshot in the ``huggingface_hub``
    cache, downloaded once when the Hub is reachable). Raises :class:`CheckpointError` (or
    :class:`ContractMismatchError`) naming the file and the problem.
    """
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    source = resolve_checkpoint(path)
    path = source.path
    contract = contract or load_contract()
    device = str(device)
    check_files(path)
    config = _load_config(path, device)
    shapes = validate_features(config, contract, path)
    env_key = environment_state_key(dict(config.input_features or {}), path / CONFIG_FILE)
    check_environment_state_normalization(path, env_key)

    policy = ACTPolicy(config)
    try:
        state = load_file(str(path / WEIGHTS_FILE), device='cpu')
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f'{path / WEIGHTS_FILE}: cannot be read as safetensors '
                              f'({exc})') from exc
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0:3]
        raise CheckpointError(f'{path / WEIGHTS_FILE}: weights do not match config.json '
                              f'({" ".join(first)})') from exc
    policy.to(device)
    policy.eval()

    try:
        pre, post = make_pre_post_processors(
            config, pretrained_path=str(path),
            preprocessor_overrides={'device_processor': {'device': device}},
            postprocessor_overrides={'device_processor': {'device': 'cpu'}})
    except (KeyError, ValueError, OSError, SafetensorError, json.JSONDecodeError) as exc:
        raise CheckpointError(f'{path}: processor pipelines cannot be loaded '
                              f'({type(exc).__name__}: {exc})') from exc
    for step in pre.steps:
        if hasattr(step, 'to') and hasattr(step, '_tensor_stats'):
            step.to(device)
    _check_stats(pre, [contract.state_feature, *shapes], path, PREPROCESSOR_FILE,
                 required=(env_key,) if env_key else ())
    _check_stats(post, [contract.action_feature], path, POSTPROCESSOR_FILE)
    return LoadedCheckpoint(path=path, policy=policy, preprocessor=pre, postprocessor=post,
                            image_shapes=shapes, state_dim=contract.num_joints,
                            action_dim=contract.num_joints, chunk_size=int(config.chunk_size),
                            n_action_steps=int(config.n_action_steps),
                            env_state_key=env_key,
                            env_state_dim=ENVIRONMENT_STATE_DIM if env_key else 0,
                            source=source)


def main(argv: list[str] | None = None) -> int:
    """``act-ros init-checkpoint``: write an untrained checkpoint (benchmarks, tests)."""
    parser = argparse.ArgumentParser(prog='act-ros init-checkpoint', description=main.__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument('output', type=Path, help='checkpoint directory to write')
    parser.add_argument('--preset', choices=sorted(PRESETS), default='default')
    parser.add_argument('--image-size', default=None, help='HxW for every camera '
                        '(default: the contract sizes)')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    size = parse_image_size(args.image_size) if args.image_size else None
    out = create_checkpoint(args.output, image_size=size, preset=args.preset, seed=args.seed)
    print(f'wrote {out}')
    return 0


__all__ = ['LoadedCheckpoint', 'CheckpointInfo', 'PRESETS', 'make_act_config', 'default_stats',
           'save_checkpoint', 'create_checkpoint', 'load_checkpoint', 'read_checkpoint_info',
           'validate_features', 'checkpoint_hash', 'parse_image_size']
