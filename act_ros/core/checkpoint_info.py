"""What a checkpoint is, read from its files without building the model.

:func:`read_checkpoint_info` checks that a LeRobot ``pretrained_model`` directory is
complete and that its features match the contract, and returns the numbers a scheduler
needs (chunk size, camera input sizes). It reads JSON only: no torch, no LeRobot, no
weights, so ``act_node`` with the model in a child process (``execution='process'``)
validates the checkpoint in milliseconds while the child does the expensive load
(:func:`~act_ros.core.checkpoint.load_checkpoint`, which runs the same checks first).
Problems are :class:`~act_ros.core.errors.CheckpointError` or
:class:`~act_ros.core.errors.ContractMismatchError` naming the file, as in the full load.
"""

from __future__ import annotations

from dataclasses import dataclass
import json
from pathlib import Path
from typing import Any

from act_ros.core.contract import Contract
from act_ros.core.errors import CheckpointError, ContractMismatchError

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
PREPROCESSOR_FILE = 'policy_preprocessor.json'
POSTPROCESSOR_FILE = 'policy_postprocessor.json'

# LeRobot's FeatureType values (a str enum there: its members compare equal to these).
STATE, VISUAL, ACTION = 'STATE', 'VISUAL', 'ACTION'


@dataclass(frozen=True)
class CheckpointInfo:
    """The validated shape of a checkpoint: enough to schedule chunks, not to run them."""

    path: Path
    image_shapes: dict[str, tuple[int, int]]  # feature key -> (H, W) the model expects
    image_features: tuple[str, ...]  # camera feature keys in the model's order
    state_dim: int
    action_dim: int
    chunk_size: int
    state_key: str = 'observation.state'  # the first STATE input (the graph's first input)
    action_key: str = 'action'  # the first ACTION output


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
        raise CheckpointError(f'{path}: checkpoint directory does not exist')
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
    ``output_features`` mappings of objects with ``type`` and ``shape``. Returns the
    (H, W) each camera feature expects, in the model's camera order.
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
    expected = set(contract.image_features)
    if set(visual) != expected:
        raise ContractMismatchError(
            f'{where}: camera features {sorted(visual)} do not match the contract cameras '
            f'{sorted(expected)}')
    other = sorted(k for k, f in inputs.items() if f.type not in (VISUAL, STATE))
    if other:
        raise ContractMismatchError(f'{where}: inputs {other} are not provided by the contract')
    shapes = {}
    for key, feat in visual.items():
        if len(feat.shape) != 3 or feat.shape[0] != 3:
            raise ContractMismatchError(f"{where}: '{key}' has shape {tuple(feat.shape)}, "
                                        'expected (3, H, W)')
        shapes[key] = (int(feat.shape[1]), int(feat.shape[2]))
    return shapes


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


def read_checkpoint_info(path: str | Path, contract: Contract) -> CheckpointInfo:
    """Check a checkpoint's files and features against ``contract`` from JSON alone.

    The weights and the processors are not loaded: a checkpoint that passes here can
    still fail :func:`~act_ros.core.checkpoint.load_checkpoint` (unreadable weights,
    missing statistics), which reports it the same way.
    """
    path = Path(path).expanduser()
    check_files(path)
    where = path / CONFIG_FILE
    raw = read_json(where)
    check_policy_type(raw, path)
    features = _RawFeatures(_features(raw, 'input_features', where),
                            _features(raw, 'output_features', where))
    shapes = validate_features(features, contract, path)
    chunk_size = raw.get('chunk_size')
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise CheckpointError(f'{where}: chunk_size must be a positive integer, got '
                              f'{chunk_size!r}')
    state_key = next(k for k, f in features.input_features.items() if f.type == STATE)
    action_key = next((k for k, f in features.output_features.items() if f.type == ACTION),
                      contract.action_feature)
    return CheckpointInfo(path=path, image_shapes=shapes, image_features=tuple(shapes),
                          state_dim=contract.num_joints, action_dim=contract.num_joints,
                          chunk_size=chunk_size, state_key=state_key, action_key=action_key)


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
