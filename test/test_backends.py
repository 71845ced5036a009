"""Inference backends: ONNX export (`act-ros export`), OpenVINO and ONNX Runtime against
torch eager through the runtime, stale-export detection, and the errors a user can hit."""

import json
import logging
import shutil

import extras
import numpy as np
import pytest

from act_ros.core.errors import DeviceUnavailableError
from act_ros.core.inference import backends
from act_ros.core.inference.checkpoint import checkpoint_hash, create_checkpoint, load_checkpoint
from act_ros.core.inference.export import (
    EXPORT_DIR,
    OPSET,
    graph_signature,
    metadata_path,
    read_metadata,
    stale_reason,
)
from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
from act_ros.core.observation import Observation

ONNX_BACKENDS = [name for name in backends.installed_backends() if name != 'torch']
needs_onnx = extras.needs_onnx
TICKS = 12
# The tests that run the exporter take tens of seconds on a small CPU.
exporting = pytest.mark.slow


def _observations(count, seed=0):
    rng = np.random.default_rng(seed)
    return [Observation(images={c: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
                                for c in ('top', 'wrist')},
                        state=rng.uniform(-1.0, 1.0, 6)) for _ in range(count)]


def _actions(checkpoint, mode, backend='torch', observations=None, **overrides):
    """Actions of a sync runtime over TICKS observations (deterministic), and the runtime."""
    config = RuntimeConfig(model_path=checkpoint, device='cpu', mode=mode, execution='sync',
                           n_action_steps=1 if mode == 'ensemble' else 4, backend=backend,
                           **overrides)
    with PolicyRuntime(config) as rt:
        rt.reset()
        actions = np.stack([rt.act(obs) for obs in observations or _observations(TICKS)])
    return actions, rt


@pytest.fixture(scope='module')
def exported(module_tmp, tiny_checkpoint):
    """A copy of the tiny checkpoint, exported to ONNX by the `act-ros export` command."""
    extras.skip_unless(bool(ONNX_BACKENDS), 'an ONNX backend (openvino or onnxruntime)',
                       'openvino,onnxruntime')
    from act_ros.cli import main
    ckpt = module_tmp('exported') / 'tiny'
    shutil.copytree(tiny_checkpoint, ckpt)
    assert main(['export', '--checkpoint', str(ckpt), '--format', 'onnx']) == 0
    return ckpt


@pytest.fixture(scope='module')
def torch_actions(tiny_checkpoint):
    return {mode: _actions(tiny_checkpoint, mode)[0] for mode in ('chunk', 'ensemble', 'blend')}


@needs_onnx
@exporting
def test_export_cli_writes_onnx_and_metadata(exported, tiny_checkpoint, capsys):
    onnx_path = exported / EXPORT_DIR / 'model_48x64.onnx'
    assert onnx_path.is_file() and metadata_path(onnx_path).is_file()
    assert sorted(p.name for p in (exported / EXPORT_DIR).iterdir()) == [
        'model_48x64.onnx', 'model_48x64.onnx.json']  # no temporary file left behind
    meta = read_metadata(onnx_path)
    assert meta['format'] == 'onnx' and meta['opset'] == OPSET and meta['normalized'] is True
    # The export lives inside the checkpoint but does not change its hash.
    assert meta['checkpoint_hash'] == checkpoint_hash(exported) == checkpoint_hash(tiny_checkpoint)
    assert meta['inputs'] == [
        {'name': 'observation.state', 'shape': [1, 6], 'dtype': 'float32'},
        {'name': 'observation.images.top', 'shape': [1, 3, 48, 64], 'dtype': 'float32'},
        {'name': 'observation.images.wrist', 'shape': [1, 3, 48, 64], 'dtype': 'float32'}]
    assert meta['output'] == {'name': 'action', 'shape': [1, 30, 6], 'dtype': 'float32'}
    assert set(meta['versions']) == {'torch', 'onnx', 'onnxscript', 'lerobot'}
    assert all(meta['versions'].values())
    import onnx
    model = onnx.load(str(onnx_path))
    assert [i.name for i in model.graph.input] == [i['name'] for i in meta['inputs']]
    assert [o.name for o in model.graph.output] == ['action']
    # A second run finds the export valid and leaves it alone.
    from act_ros.cli import main
    capsys.readouterr()
    assert main(['export', '--checkpoint', str(exported)]) == 0
    assert 'up to date' in capsys.readouterr().out


@needs_onnx
@exporting
@pytest.mark.parametrize('mode', ['chunk', 'ensemble', 'blend'])
@pytest.mark.parametrize('backend', ONNX_BACKENDS)
def test_backend_matches_torch_eager(exported, torch_actions, backend, mode):
    actions, rt = _actions(exported, mode, backend)
    assert rt.predictor.backend.name == backend
    assert rt.predictor.backend.export.exported is False  # the CLI's export was reused
    assert np.isfinite(actions).all()
    diff = np.abs(actions - torch_actions[mode]).max()
    assert diff < 1e-4, f'{backend} {mode}: max |action diff| {diff:.2e} vs torch eager'


@needs_onnx
@exporting
def test_stale_export_is_rebuilt_and_follows_new_weights(exported, torch_actions, tmp_path,
                                                         caplog):
    ckpt = tmp_path / 'ckpt'
    shutil.copytree(exported, ckpt)  # with its (now stale) export
    other = create_checkpoint(tmp_path / 'other', preset='tiny', image_size=(48, 64), seed=1)
    shutil.copy(other / 'model.safetensors', ckpt / 'model.safetensors')
    backend = ONNX_BACKENDS[0]
    with caplog.at_level(logging.INFO, logger='act_ros.core.inference.export'):
        actions, rt = _actions(ckpt, 'ensemble', backend)
    assert rt.predictor.backend.export.exported is True
    assert any('stale' in r.message and 'the checkpoint changed' in r.message
               for r in caplog.records), [r.message for r in caplog.records]
    meta = read_metadata(ckpt / EXPORT_DIR / 'model_48x64.onnx')
    assert meta['checkpoint_hash'] == checkpoint_hash(ckpt) != checkpoint_hash(exported)
    new_weights = _actions(ckpt, 'ensemble')[0]
    assert np.abs(actions - new_weights).max() < 1e-4
    assert np.abs(actions - torch_actions['ensemble']).max() > 1e-3  # not the old weights


@needs_onnx
@exporting
def test_stale_reasons(exported, tmp_path):
    """Every way an export can go stale is detected without running the exporter."""
    source = exported / EXPORT_DIR / 'model_48x64.onnx'
    onnx_path = tmp_path / source.name
    shutil.copy(source, onnx_path)
    shutil.copy(metadata_path(source), metadata_path(onnx_path))
    ckpt = load_checkpoint(exported)
    inputs, output = graph_signature(ckpt)
    good_hash = checkpoint_hash(exported)

    def reason(**kw):
        args = dict(ckpt_hash=good_hash, inputs=inputs, output=output) | kw
        return stale_reason(onnx_path, **args)

    assert reason() is None
    assert 'the checkpoint changed' in reason(ckpt_hash='0' * 16)
    assert 'input shapes differ' in reason(inputs=graph_signature(ckpt, (24, 32))[0])
    meta = json.loads(metadata_path(onnx_path).read_text())
    metadata_path(onnx_path).write_text(json.dumps(meta | {'metadata_version': 0}))
    assert 'metadata version' in reason()
    metadata_path(onnx_path).write_text(json.dumps(meta))
    with onnx_path.open('ab') as f:
        f.write(b'\0')  # a damaged or half-replaced file
    assert 'does not match its metadata' in reason()
    metadata_path(onnx_path).unlink()
    assert 'missing or unreadable' in reason()
    onnx_path.unlink()
    assert reason() == 'no export yet'


@pytest.mark.parametrize('backend', ['openvino', 'onnxruntime'])
def test_missing_backend_names_the_pip_extra(tiny_checkpoint, monkeypatch, backend):
    def not_installed(name):
        raise ImportError(f"No module named '{name}'")

    monkeypatch.setattr(backends, '_load_module', not_installed)
    with pytest.raises(DeviceUnavailableError, match=rf"pip install 'act_ros\[{backend}\]'"):
        PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', backend=backend,
                                    warmup=False))
    assert not (tiny_checkpoint / EXPORT_DIR).exists()  # failed before exporting anything


@pytest.mark.parametrize('overrides, match', [
    (dict(backend='tensorrt'), 'unknown backend'),
    (dict(backend='openvino', compile_model=True), 'compile_model applies to the torch backend'),
    (dict(backend='onnxruntime', precision='bf16'), "supports precision .*got 'bf16'"),
    (dict(backend='openvino', device='cuda'), 'runs on the CPU'),
])
def test_inconsistent_backend_settings_are_refused(tiny_checkpoint, overrides, match):
    with pytest.raises(ValueError, match=match):
        RuntimeConfig(model_path=tiny_checkpoint, **overrides)


@extras.needs_openvino
@exporting
def test_openvino_bf16_runs_natively_or_is_refused(exported, torch_actions):
    import openvino as ov
    capabilities = ov.Core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES')
    if 'BF16' not in capabilities:
        with pytest.raises(DeviceUnavailableError, match='cannot run it natively'):
            _actions(exported, 'ensemble', 'openvino', precision='bf16')
        return
    actions, rt = _actions(exported, 'ensemble', 'openvino', precision='bf16')
    assert rt.predictor.backend.precision == 'bf16'
    assert np.abs(actions - torch_actions['ensemble']).max() < 0.1


def test_export_cli_reports_bad_input(tmp_path, capsys):
    from act_ros.cli import main
    assert main(['export', '--checkpoint', str(tmp_path / 'missing')]) == 2
    assert 'does not exist' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(['export', '--checkpoint', str(tmp_path), '--image-size', '48by64'])


def test_backend_parameter_matches_the_runtime():
    from act_ros.ros.node.parameters import parameter_specs
    spec = {s.name: s for s in parameter_specs(None)}['backend']
    assert spec.default == 'auto' and spec.choices == ('auto', *backends.BACKENDS)


CPU_WITH_OPENVINO = dict(installed=['torch', 'openvino', 'onnxruntime'], accelerator=False)


@pytest.mark.parametrize('settings, expected, words', [
    ({}, 'openvino', 'CPU inference'),
    ({'device': 'cpu'}, 'openvino', 'CPU inference'),
    ({'precision': 'bf16'}, 'openvino', 'CPU inference'),
    ({'installed': ['torch', 'onnxruntime']}, 'torch', 'openvino is not installed'),
    ({'accelerator': True}, 'torch', 'a GPU is present'),
    ({'accelerator': True, 'device': 'cpu'}, 'openvino', 'CPU inference'),  # CPU asked for
    ({'device': 'cuda'}, 'torch', 'device cuda'),
    ({'device': 'mps'}, 'torch', 'device mps'),
    ({'compile_model': True}, 'torch', 'compile_model'),
    ({'precision': 'fp16'}, 'torch', 'fp16'),
    ({'precision': 'int8', 'accelerator': True}, 'openvino', 'int8'),
])
def test_backend_auto_rule(settings, expected, words):
    chosen, why = backends.resolve_backend('auto', **{**CPU_WITH_OPENVINO, **settings})
    assert chosen == expected and words in why


def test_a_named_backend_is_kept_and_an_unknown_one_refused():
    for name in backends.BACKENDS:
        assert backends.resolve_backend(name, device='cuda', **CPU_WITH_OPENVINO) == (
            name, 'set by name')
    with pytest.raises(ValueError, match="unknown backend 'tensorrt', expected one of"):
        backends.resolve_backend('tensorrt')


def test_runtime_config_resolves_backend_auto_on_this_machine():
    config = RuntimeConfig(model_path='ckpt', device='cpu', backend='auto')
    expected = 'openvino' if 'openvino' in backends.installed_backends() else 'torch'
    assert config.backend == expected and config.backend_why.startswith('auto: ')
    assert RuntimeConfig(model_path='ckpt', backend='torch').backend_why == 'set by name'
    # Settings auto cannot serve are still refused, with the backend it chose.
    config = RuntimeConfig(model_path='ckpt', device='cpu', backend='auto', compile_model=True)
    assert config.backend == 'torch'


def test_evaluator_takes_a_backend():
    from act_ros.training.evaluation.evaluate import build_parser
    for name in ('openvino', 'auto'):
        assert build_parser().parse_args(['--checkpoint', 'ckpt', '--backend', name]).backend == name
    assert build_parser().parse_args(['--checkpoint', 'ckpt']).backend == 'torch'


@needs_onnx
@exporting
def test_read_only_checkpoint_uses_its_export_or_the_user_cache(exported, tmp_path, monkeypatch):
    from act_ros.core.inference import export as export_module
    monkeypatch.setattr(export_module.os, 'access', lambda *args, **kwargs: False)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    result = export_module.ensure_onnx_export(load_checkpoint(exported))
    assert result.exported is False and result.path.parent == exported / EXPORT_DIR
    assert export_module._writable_export_dir(exported, 'abc') == (
        tmp_path / 'act_ros' / EXPORT_DIR / 'abc')


def _node(context, checkpoint, **params):
    from rclpy.parameter import Parameter

    from act_ros.ros.node.act_node import ActNode
    values = {'model_path': str(checkpoint), 'autostart': False, 'torch_threads': 1,
              'execution': 'async', **params}
    return ActNode(context=context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


@pytest.mark.ros
@pytest.mark.parametrize('params, words', [
    ({'backend': 'tensorrt'}, "backend: 'tensorrt' is not one of"),
    ({'backend': 'openvino', 'compile_model': True}, 'compile_model applies to the torch backend'),
    ({'backend': 'onnxruntime', 'precision': 'bf16'}, "supports precision ('fp32',)"),
])
def test_node_refuses_bad_backend_settings(rclpy_context, tiny_checkpoint, params, words):
    from rclpy.lifecycle import TransitionCallbackReturn
    node = _node(rclpy_context, tiny_checkpoint, **params)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert words in node.last_configure_error and '\n' not in node.last_configure_error
    finally:
        node.destroy_node()


@pytest.mark.ros
@needs_onnx
@exporting
@pytest.mark.parametrize('execution', ['async', 'process'])
def test_node_configures_with_an_onnx_backend(rclpy_context, exported, execution):
    from rclpy.lifecycle import TransitionCallbackReturn
    node = _node(rclpy_context, exported, backend=ONNX_BACKENDS[0], execution=execution)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        runtime = node.loop.runtime
        if execution == 'process':  # the child process built the backend
            assert runtime._remote.backend_name == ONNX_BACKENDS[0]
        else:
            assert runtime.predictor.backend.name == ONNX_BACKENDS[0]
    finally:
        node.destroy_node()


# Checkpoints that take the object poses (observation.environment_state): with both
# cameras, and with none (the graph's inputs are then the state and the poses only).
POSE_VARIANTS = {'cameras_and_poses': dict(environment_state=True),
                 'poses_no_camera': dict(environment_state=True, cameras=())}


def _pose_observations(count, seed=0):
    from act_ros.core.object_state import environment_state

    rng = np.random.default_rng(seed)
    out = []
    for obs in _observations(count, seed):
        obs.environment_state = environment_state(
            rng.uniform(-0.3, 0.3, 3), rng.uniform(-np.pi, np.pi), rng.uniform(-0.3, 0.3, 3),
            rng.uniform(-np.pi, np.pi))
        out.append(obs)
    return out


@pytest.fixture(scope='module', params=list(POSE_VARIANTS))
def exported_poses(request, module_tmp):
    """A checkpoint that takes the object poses, exported by `act-ros export`."""
    extras.skip_unless(bool(ONNX_BACKENDS), 'an ONNX backend (openvino or onnxruntime)',
                       'openvino,onnxruntime')
    from act_ros.cli import main
    ckpt = create_checkpoint(module_tmp('exported_poses') / request.param,
                             preset='tiny', image_size=(48, 64), seed=2,
                             **POSE_VARIANTS[request.param])
    assert main(['export', '--checkpoint', str(ckpt), '--format', 'onnx']) == 0
    return ckpt


@needs_onnx
@exporting
@pytest.mark.parametrize('backend', ONNX_BACKENDS)
def test_backend_matches_torch_eager_with_object_poses(exported_poses, backend):
    from act_ros.core.contract import load_contract
    from act_ros.core.inference.onnx_predictor import lean_onnx_predictor
    from act_ros.core.inference.options import PredictorOptions

    cameras = exported_poses.name == 'cameras_and_poses'
    name = 'model_48x64.onnx' if cameras else 'model_nocam.onnx'
    meta = read_metadata(exported_poses / EXPORT_DIR / name)
    assert [i['name'] for i in meta['inputs']] == (
        ['observation.state', 'observation.environment_state']
        + (['observation.images.top', 'observation.images.wrist'] if cameras else []))
    assert meta['inputs'][1]['shape'] == [1, 10]
    observations = _pose_observations(TICKS)
    expected, _ = _actions(exported_poses, 'ensemble', observations=observations)
    actions, rt = _actions(exported_poses, 'ensemble', backend, observations=observations)
    assert rt.predictor.backend.export.exported is False  # the CLI's export was reused
    diff = np.abs(actions - expected).max()
    assert diff < 1e-4, f'{backend} with object poses: max |action diff| {diff:.2e} vs torch eager'
    # The torch-free predictor of the inference child: the same chunks from the export.
    lean, why = lean_onnx_predictor(exported_poses, load_contract(),
                                    PredictorOptions(backend=backend, threads=1))
    assert lean is not None, why
    with PolicyRuntime(RuntimeConfig(model_path=exported_poses, device='cpu',
                                     execution='sync', warmup=False)) as full:
        for obs in observations[:3]:
            np.testing.assert_allclose(lean.predict(obs), full.predictor.predict(obs),
                                       atol=1e-4)
    # Other poses give other actions (the graph does not ignore its poses input).
    moved = _pose_observations(TICKS, seed=1)
    for obs, other in zip(observations, moved):
        other.images, other.state = obs.images, obs.state
    assert np.abs(_actions(exported_poses, 'ensemble', backend,
                           observations=moved)[0] - actions).max() > 1e-3
