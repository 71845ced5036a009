"""What a checkpoint is, read from its files without building the model.

:func:`read_checkpoint_info` checks that a LeRobot ``pretrained_model`` directory is
complete and that its features match the contract, and returns the numbers a scheduler
needs (chunk size, camera input sizes). It reads JSON only: no torch, no LeRobot, no
weights, so ``act_node`` with the model in a child process (``execution='process'``)
validates the checkpoint in milliseconds while the child does the expensive load
(:func:`~act_ros.core.inference.checkpoint.load_checkpoint`, which runs the same checks first).
Problems are :class:`~act_ros.core.errors.CheckpointError` or
:class:`~act_ros.core.errors.ContractMismatchError` naming the file, as in the full load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from act_ros.core.contract import Contract
from act_ros.core.errors import CheckpointError, ContractMismatchError
from act_ros.core.inference.hub import SYNTAX as HUB_ID_SYNTAX
from act_ros.core.inference.hub import ResolvedCheckpoint, resolve_checkpoint
from act_ros.core.object_state import (
    ENVIRONMENT_STATE_DIM,
    ENVIRONMENT_STATE_FEATURE,
    ENVIRONMENT_STATE_NAMES,
)

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
PREPROCESSOR_FILE = 'policy_preprocessor.json'
POSTPROCESSOR_FILE = 'policy_postprocessor.json'

# LeRobot's ACTConfig default chunk size (and n_action_steps): what a run trains with
# unless its config sets chunk_size (test_checkpoint_errors checks it against LeRobot's).
LEROBOT_ACT_CHUNK_SIZE = 100
# The chunk of the project's simulated arm's policies (1 s at its 30 fps, as
# config/train_sim.yaml trains them): the tests' model (the tiny preset) and the
# benchmarks' untrained checkpoints keep it, so that their figures compare across versions.
SIM_CHUNK_SIZE = 30

# LeRobot's FeatureType values (a str enum there: its members compare equal to these).
STATE, VISUAL, ENV, ACTION = 'STATE', 'VISUAL', 'ENV', 'ACTION'


@dataclass(frozen=True)
class CheckpointInfo:
    """The validated shape of a checkpoint: enough to schedule chunks, not to run them."""

    path: Path
    image_shapes: dict[str, tuple[int, int]]  # feature key -> (H, W) the model expects
    image_features: tuple[str, ...]  # camera feature keys in the model's order
    state_dim: int
    action_dim: int
    chunk_size: int
    # Actions LeRobot's select_action plays from each chunk (config.json n_action_steps);
    # act_node's and the evaluator's default.
    n_action_steps: int
    state_key: str = 'observation.state'  # the first STATE input (the graph's first input)
    action_key: str = 'action'  # the first ACTION output
    # The ENV input (object poses, act_ros.core.object_state), or None: the checkpoint
    # then takes no environment state.
    env_state_key: str | None = None
    env_state_dim: int = 0

    @property
    def uses_environment_state(self) -> bool:
        """Whether every observation must carry ``environment_state`` (object poses)."""
        return self.env_state_key is not None


@dataclass(frozen=True)
class _Feature:
    """A feature as ``config.json`` spells it (``type`` is the FeatureType's value)."""

    type: str
    shape: tuple[int, ...]


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; :class:`CheckpointError` naming the file otherwise."""
    if not path.is_file():
        raise CheckpointError(f'{path}: missing (a LeRobot pretrained_model directory needs '
                              f'{CONFIG_FILE}, {WEIGHTS_FILE}, {PREPROCESSOR_FILE}, '
                              f'{POSTPROCESSOR_FILE})')
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f'{path}: not valid JSON ({exc})') from exc
    if not isinstance(data, dict):
        raise CheckpointError(f'{path}: expected a JSON object, got {type(data).__name__}')
    return data


def check_files(path: Path) -> None:
    """Every file a checkpoint needs exists, including the normalizer states it names."""
    if not path.exists():
        raise CheckpointError(f'{path}: checkpoint directory does not exist (a Hub '
                              f'checkpoint is named {HUB_ID_SYNTAX})')
    if not path.is_dir():
        raise CheckpointError(f'{path}: expected a checkpoint directory, found a file')
    for name in (CONFIG_FILE, WEIGHTS_FILE, PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
        if not (path / name).is_file():
            hint = (' (checkpoints from before LeRobot processors kept normalization stats '
                    'inside the model; convert them with lerobot\'s '
                    'migrate_policy_normalization)' if 'processor' in name else '')
            raise CheckpointError(f'{path / name}: missing{hint}')
    for name in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
        spec = read_json(path / name)
        for step in spec.get('steps', []):
            state_file = step.get('state_file')
            if state_file and not (path / state_file).is_file():
                raise CheckpointError(f'{path / state_file}: missing (named by {name})')


def check_policy_type(raw: dict[str, Any], path: Path) -> None:
    """``config.json`` describes an ACT policy."""
    if raw.get('type') != 'act':
        raise CheckpointError(f"{path / CONFIG_FILE}: policy type is {raw.get('type')!r}, "
                              "expected 'act'")


def validate_features(config: Any, contract: Contract, source: Path) -> dict[str, tuple[int, int]]:
    """Check the checkpoint's input/output features against the contract.

    ``config`` is a LeRobot ``ACTConfig`` or anything with ``input_features`` and
    ``output_features`` mappings of objects with ``type`` and ``shape``. The cameras may
    be any subset of the contract's (none at all only beside an environment state); an
    ``ENV`` input must be ``observation.environment_state`` with the shape of
    :data:`~act_ros.core.object_state.ENVIRONMENT_STATE_NAMES`. Returns the (H, W) each
    camera feature expects, in the model's camera order.
    """
    where = source / CONFIG_FILE
    inputs = dict(config.input_features or {})
    outputs = dict(config.output_features or {})
    state = inputs.get(contract.state_feature)
    if state is None or state.type != STATE:
        raise ContractMismatchError(f"{where}: no STATE input '{contract.state_feature}' "
                                    f'(inputs: {sorted(inputs)})')
    if tuple(state.shape) != (contract.num_joints,):
        raise ContractMismatchError(
            f"{where}: '{contract.state_feature}' has shape {tuple(state.shape)}, the contract "
            f'has {contract.num_joints} joints {list(contract.joint_names)}')
    action = outputs.get(contract.action_feature)
    if action is None:
        raise ContractMismatchError(f"{where}: no output '{contract.action_feature}' "
                                    f'(outputs: {sorted(outputs)})')
    if tuple(action.shape) != (contract.num_joints,):
        raise ContractMismatchError(
            f"{where}: '{contract.action_feature}' has shape {tuple(action.shape)}, expected "
            f'({contract.num_joints},)')
    visual = {k: f for k, f in inputs.items() if f.type == VISUAL}
    unknown = sorted(set(visual) - set(contract.image_features))
    if unknown:
        raise ContractMismatchError(
            f'{where}: camera features {unknown} are not cameras of the contract '
            f'({contract.source}: {sorted(contract.image_features)})')
    env_key = environment_state_key(inputs, where)
    if not visual and env_key is None:
        raise ContractMismatchError(
            f'{where}: no camera and no environment state among the inputs '
            f'{sorted(inputs)}: ACT needs one of them (cameras of the contract: '
            f'{sorted(contract.image_features)}, or {ENVIRONMENT_STATE_FEATURE})')
    other = sorted(k for k, f in inputs.items() if f.type not in (VISUAL, STATE, ENV))
    if other:
        raise ContractMismatchError(f'{where}: inputs {other} are not provided by the contract')
    shapes = {}
    for key, feat in visual.items():
        if len(feat.shape) != 3 or feat.shape[0] != 3:
            raise ContractMismatchError(f"{where}: '{key}' has shape {tuple(feat.shape)}, "
                                        'expected (3, H, W)')
        shapes[key] = (int(feat.shape[1]), int(feat.shape[2]))
    return shapes


def environment_state_key(inputs: dict[str, Any], where: Path) -> str | None:
    """The checkpoint's ``ENV`` input (``observation.environment_state``, object poses),
    checked; ``None`` when it has none."""
    env = {k: f for k, f in inputs.items() if f.type == ENV}
    if not env:
        return None
    if set(env) != {ENVIRONMENT_STATE_FEATURE}:
        raise ContractMismatchError(
            f'{where}: ENV inputs {sorted(env)}: the only environment state act_ros provides '
            f"is '{ENVIRONMENT_STATE_FEATURE}' (object poses, act_ros.core.object_state)")
    shape = tuple(env[ENVIRONMENT_STATE_FEATURE].shape)
    if shape != (ENVIRONMENT_STATE_DIM,):
        raise ContractMismatchError(
            f"{where}: '{ENVIRONMENT_STATE_FEATURE}' has shape {shape}, expected "
            f'({ENVIRONMENT_STATE_DIM},): {list(ENVIRONMENT_STATE_NAMES)}')
    return ENVIRONMENT_STATE_FEATURE


def check_environment_state_normalization(path: Path, key: str | None) -> None:
    """The preprocessor normalizes the environment state (``MEAN_STD`` or ``MIN_MAX``): an
    identity mode, or a normalizer that does not list the feature, would hand positions
    in metres to a model trained on normalized values. JSON only (the statistics
    themselves are checked by the loaders)."""
    if key is None:
        return
    where = path / PREPROCESSOR_FILE
    steps = [s for s in read_json(where).get('steps') or []
             if s.get('registry_name') == 'normalizer_processor']
    if not steps:
        raise CheckpointError(f"{where}: no normalizer step, so '{key}' would reach the model "
                              'unnormalized')
    for step in steps:
        config = step.get('config') or {}
        features = config.get('features') or {}
        mode = (config.get('norm_map') or {}).get(ENV, 'IDENTITY')
        if key not in features or mode not in ('MEAN_STD', 'MIN_MAX'):
            found = 'not listed' if key not in features else f'normalization mode {mode}'
            raise CheckpointError(
                f"{where}: '{key}' is {found}: it must be normalized (MEAN_STD or MIN_MAX; "
                "the act_ros trainer writes MEAN_STD with the dataset's statistics), not "
                'passed through in metres')


def _features(raw: dict[str, Any], key: str, where: Path) -> dict[str, _Feature]:
    entries = raw.get(key) or {}
    if not isinstance(entries, dict):
        raise CheckpointError(f'{where}: {key} must be a mapping, got {type(entries).__name__}')
    out = {}
    for name, entry in entries.items():
        try:
            out[name] = _Feature(type=str(entry['type']),
                                 shape=tuple(int(v) for v in entry['shape']))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: {key}['{name}'] must have a type and an integer "
                                  f'shape, got {entry!r}') from exc
    return out


@dataclass(frozen=True)
class _RawFeatures:
    input_features: dict[str, _Feature]
    output_features: dict[str, _Feature]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def chunk_settings(raw: dict[str, Any], where: Path | str) -> tuple[int, int]:
    """``(chunk_size, n_action_steps)`` of a checkpoint's ``config.json`` (``raw``): the
    actions per model call and those LeRobot's ``select_action`` plays from each (its
    ``n_action_steps``; the chunk size where the file has none)."""
    chunk_size = raw.get('chunk_size')
    if not _positive_int(chunk_size):
        raise CheckpointError(f'{where}: chunk_size must be a positive integer, got '
                              f'{chunk_size!r}')
    steps = raw.get('n_action_steps', chunk_size)
    if not _positive_int(steps) or steps > chunk_size:
        raise CheckpointError(f'{where}: n_action_steps must be an integer in [1, chunk_size '
                              f'{chunk_size}], got {steps!r}')
    return chunk_size, steps


def read_checkpoint_info(path: str | Path | ResolvedCheckpoint,
                         contract: Contract) -> CheckpointInfo:
    """Check a checkpoint's files and features against ``contract`` from JSON alone.

    The weights and the processors are not loaded: a checkpoint that passes here can
    still fail :func:`~act_ros.core.inference.checkpoint.load_checkpoint` (unreadable weights,
    missing statistics), which reports it the same way.
    """
    path = resolve_checkpoint(path).path  # a Hub id: its cached snapshot
    check_files(path)
    where = path / CONFIG_FILE
    raw = read_json(where)
    check_policy_type(raw, path)
    features = _RawFeatures(_features(raw, 'input_features', where),
                            _features(raw, 'output_features', where))
    shapes = validate_features(features, contract, path)
    env_key = environment_state_key(features.input_features, where)
    check_environment_state_normalization(path, env_key)
    chunk_size, n_action_steps = chunk_settings(raw, where)
    state_key = next(k for k, f in features.input_features.items() if f.type == STATE)
    action_key = next((k for k, f in features.output_features.items() if f.type == ACTION),
                      contract.action_feature)
    return CheckpointInfo(path=path, image_shapes=shapes, image_features=tuple(shapes),
                          state_dim=contract.num_joints, action_dim=contract.num_joints,
                          chunk_size=chunk_size, n_action_steps=n_action_steps,
                          state_key=state_key, action_key=action_key,
                          env_state_key=env_key,
                          env_state_dim=ENVIRONMENT_STATE_DIM if env_key else 0)


def checkpoint_hash(path: str | Path) -> str:
    """A short content hash of the weights and processor files (for export staleness)."""
    import hashlib

    path = Path(path)
    digest = hashlib.sha256()
    for name in sorted(p.name for p in path.iterdir() if p.suffix in ('.json', '.safetensors')):
        digest.update(name.encode())
        with (path / name).open('rb') as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                digest.update(block)
    return digest.hexdigest()[:16]
