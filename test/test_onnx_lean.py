"""The torch-free ONNX start-up: with a valid export, the inference child computes the same
chunks as the full predictor (bit for bit) without importing torch or LeRobot; it falls
back to the full path for anything it does not reproduce; normalization in numpy equals
LeRobot's; OpenVINO's compiled model is cached per export content."""

import json
import shutil
import sys

import extras
import numpy as np
import pytest

from act_ros.core.contract import load_contract
from act_ros.core.errors import CheckpointError
from act_ros.core.inference import backends
from act_ros.core.inference.onnx_predictor import NumpyProcessors, lean_onnx_predictor
from act_ros.core.inference.options import PredictorOptions
from act_ros.core.observation import Observation

ONNX_BACKENDS = [name for name in backends.installed_backends() if name != 'torch']
needs_onnx = extras.needs_onnx
CONTRACT = load_contract()


def _observations(count, seed=0, size=(48, 64)):
    rng = np.random.default_rng(seed)
    return [Observation(images={c: rng.integers(0, 256, (*size, 3), dtype=np.uint8)
                                for c in CONTRACT.camera_names},
                        state=rng.uniform(-1.0, 1.0, CONTRACT.num_joints))
            for _ in range(count)]


@pytest.fixture(scope='module')
def exported(module_tmp, tiny_checkpoint):
    """A copy of the tiny checkpoint with its ONNX export (only tests marked to need an
    ONNX backend use it)."""
    from act_ros.core.inference.export import main
    ckpt = module_tmp('lean') / 'tiny'
    shutil.copytree(tiny_checkpoint, ckpt)
    assert main(['--checkpoint', str(ckpt)]) == 0
    return ckpt


@needs_onnx
@pytest.mark.slow
@pytest.mark.parametrize('backend', ONNX_BACKENDS)
def test_lean_predictor_equals_the_full_one(exported, backend):
    from act_ros.core.device import select_device
    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.core.inference.predictor import ChunkPredictor

    options = PredictorOptions(backend=backend, threads=1)
    lean, why = lean_onnx_predictor(exported, CONTRACT, options)
    assert lean is not None, why
    assert lean.backend.export.exported is False
    full = ChunkPredictor(load_checkpoint(exported, contract=CONTRACT), CONTRACT,
                          select_device('cpu'), options)
    # Camera images of another size too: both resize them the same way.
    for obs in _observations(3) + _observations(2, seed=1, size=(60, 80)):
        a, b = lean.predict(obs), full.predict(obs)
        assert a.shape == (30, CONTRACT.num_joints) and a.dtype == np.float64
        # The lean path folds pixels / 255 and the normalization into one multiply-add:
        # its image inputs differ from LeRobot's by float32 rounding (checked below to a
        # few units in the last place); through the model that is far below 1e-4 rad, a
        # thousandth of the safety step limit.
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
        _check_image_feed(lean, full, obs)


def _check_image_feed(lean, full, obs):
    """The lean image inputs equal LeRobot's preprocessing (``image / 255``, then the
    normalizer) to within 4 float32 units in the last place of the largest value."""
    feed = lean._feed(obs)
    expected = full.checkpoint.preprocessor(full.observation_tensors(obs))
    for _, feature, _ in lean.cameras:
        want = expected[feature].numpy()
        if feature in lean.backend.uint8_images:
            # OpenVINO normalizes these pixels in the compiled model with the same affine
            # (the chunk's agreement above covers that step).
            pixels = feed[feature]
            assert pixels.dtype == np.uint8 and pixels.shape == (1, *want.shape[2:], 3)
            scale, offset = lean.processors.image_affine(feature)
            got = pixels[0].transpose(2, 0, 1) * scale + offset
            ulp = np.finfo(np.float32).eps * float(np.abs(want).max())
            assert np.abs(got[None] - want).max() <= 4 * ulp, feature
            continue
        ulp = np.finfo(np.float32).eps * float(np.abs(want).max())
        assert np.abs(feed[feature] - want).max() <= 4 * ulp, feature


@needs_onnx
@pytest.mark.slow
def test_inference_child_starts_without_torch_and_computes_the_same(exported):
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    backend = ONNX_BACKENDS[0]
    common = dict(model_path=exported, device='cpu', backend=backend, torch_threads=1)
    # The child's lean predictor, in this process: the same arithmetic, the same result.
    local, why = lean_onnx_predictor(exported, CONTRACT, PredictorOptions(backend=backend,
                                                                          threads=1))
    assert local is not None, why
    expected = [local.predict(obs) for obs in _observations(3)]
    with PolicyRuntime(RuntimeConfig(execution='process', **common)) as remote:
        assert remote.lean_child
        assert remote._remote.child_imported == []  # no torch, torchvision or LeRobot
        assert remote.stats.backend_cache.startswith('export hit')
        for obs, chunk in zip(_observations(3), expected):
            np.testing.assert_array_equal(remote._remote.predict(obs), chunk)


@needs_onnx
def test_no_export_means_the_full_path(tiny_checkpoint, tmp_path):
    ckpt = tmp_path / 'ckpt'
    shutil.copytree(tiny_checkpoint, ckpt, ignore=shutil.ignore_patterns('export'))
    lean, why = lean_onnx_predictor(ckpt, CONTRACT, PredictorOptions(backend=ONNX_BACKENDS[0]))
    assert lean is None and 'no export yet' in why


@needs_onnx
def test_processor_steps_it_does_not_reproduce_mean_the_full_path(tiny_checkpoint, tmp_path):
    ckpt = tmp_path / 'ckpt'
    shutil.copytree(tiny_checkpoint, ckpt)
    pre = json.loads((ckpt / 'policy_preprocessor.json').read_text())
    pre['steps'][0]['config']['rename_map'] = {'observation.images.cam': 'observation.images.top'}
    (ckpt / 'policy_preprocessor.json').write_text(json.dumps(pre))
    lean, why = lean_onnx_predictor(ckpt, CONTRACT, PredictorOptions(backend=ONNX_BACKENDS[0]))
    assert lean is None and 'rename_map' in why
    pre['steps'][0]['config']['rename_map'] = {}
    pre['steps'].append({'registry_name': 'tokenizer_processor', 'config': {}})
    (ckpt / 'policy_preprocessor.json').write_text(json.dumps(pre))
    lean, why = lean_onnx_predictor(ckpt, CONTRACT, PredictorOptions(backend=ONNX_BACKENDS[0]))
    assert lean is None and 'tokenizer_processor' in why


def test_missing_stats_are_refused_as_by_the_full_load(tiny_checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    from act_ros.core.inference.checkpoint_info import read_checkpoint_info

    ckpt = tmp_path / 'ckpt'
    shutil.copytree(tiny_checkpoint, ckpt)
    state_file = next(ckpt.glob('policy_postprocessor_step_*unnormalizer*.safetensors'))
    save_file({k: v for k, v in load_file(state_file).items() if not k.startswith('action.')},
              state_file)
    with pytest.raises(CheckpointError, match="stats for 'action'"):
        NumpyProcessors.load(ckpt, read_checkpoint_info(ckpt, CONTRACT))


@pytest.mark.parametrize('mode', ['MEAN_STD', 'MIN_MAX'])
def test_numpy_normalization_equals_lerobots(tmp_path, mode):
    """Pre- and post-processing in numpy give LeRobot's float32 values exactly."""
    import torch
    from lerobot.configs.types import NormalizationMode

    from act_ros.core.inference.checkpoint import create_checkpoint, load_checkpoint
    from act_ros.core.inference.checkpoint_info import read_checkpoint_info

    rng = np.random.default_rng(3)
    stats = {}
    for key in (CONTRACT.state_feature, CONTRACT.action_feature):
        low = rng.uniform(-2, 0, CONTRACT.num_joints).astype(np.float32)
        high = low + rng.uniform(0.5, 2, CONTRACT.num_joints).astype(np.float32)
        high[0] = low[0]  # a constant joint: MIN_MAX takes eps as its range
        stats[key] = {'mean': torch.tensor((low + high) / 2), 'std': torch.tensor(high - low),
                      'min': torch.tensor(low), 'max': torch.tensor(high)}
    for cam in CONTRACT.cameras:
        stats[cam.feature] = {'mean': torch.rand(3, 1, 1), 'std': torch.rand(3, 1, 1) + 0.1,
                              'min': torch.zeros(3, 1, 1), 'max': torch.ones(3, 1, 1)}
    ckpt = create_checkpoint(tmp_path / 'ckpt', stats=stats, normalization_mapping={
        'VISUAL': NormalizationMode.MEAN_STD, 'STATE': NormalizationMode(mode),
        'ACTION': NormalizationMode(mode)})
    loaded = load_checkpoint(ckpt)
    ours = NumpyProcessors.load(ckpt, read_checkpoint_info(ckpt, CONTRACT))
    arrays = {CONTRACT.state_feature: rng.uniform(-2, 2, CONTRACT.num_joints).astype(np.float32)}
    for key, (h, w) in loaded.image_shapes.items():
        arrays[key] = rng.uniform(0, 1, (3, h, w)).astype(np.float32)
    expected = loaded.preprocessor({k: torch.from_numpy(v.copy()) for k, v in arrays.items()})
    got = ours.preprocess(arrays)
    for key in arrays:
        np.testing.assert_array_equal(got[key], expected[key].numpy())
    actions = rng.uniform(-1.5, 1.5, (1, 30, CONTRACT.num_joints)).astype(np.float32)
    np.testing.assert_array_equal(ours.postprocess(actions),
                                  loaded.postprocessor(torch.from_numpy(actions.copy())).numpy())


@extras.needs_openvino  # the compiled-model cache is OpenVINO's
@pytest.mark.slow
def test_openvino_compiled_model_is_cached_per_export_content(exported):
    from act_ros.core.inference.backends import OPENVINO_CACHE_DIR, OpenVINOBackend
    from act_ros.core.inference.export import EXPORT_DIR, OnnxExport, read_metadata

    path = exported / EXPORT_DIR / 'model_48x64.onnx'
    meta = read_metadata(path)
    cache = exported / EXPORT_DIR / OPENVINO_CACHE_DIR / meta['onnx_sha256'][:16]
    shutil.rmtree(cache, ignore_errors=True)
    export = OnnxExport(path=path, metadata=meta, exported=False, seconds=0.0)
    first = OpenVINOBackend(export, threads=1)
    assert first.compiled_cache == 'miss' and any(cache.glob('*.blob'))
    second = OpenVINOBackend(export, threads=1)
    assert second.compiled_cache == 'hit' and second.cache_note == 'export hit, compiled hit'
    feed = {name: np.zeros(spec['shape'], np.float32)
            for name, spec in zip(export.input_names, meta['inputs'])}
    np.testing.assert_array_equal(first.run(feed), second.run(feed))
    assert OpenVINOBackend(export, threads=1, cache=False).compiled_cache == 'off'


@extras.needs_openvino
@pytest.mark.slow
def test_openvino_normalizes_uint8_images_in_the_compiled_model(exported):
    """image_affine: the images go in as uint8 pixels and OpenVINO's pre-processing
    normalizes them: the chunk of the numpy-normalized float inputs, to float32 rounding;
    the compiled model with its pre-processing is cached too; a bad affine is refused."""
    from act_ros.core.inference.backends import OPENVINO_CACHE_DIR, OpenVINOBackend
    from act_ros.core.inference.export import EXPORT_DIR, OnnxExport, read_metadata

    options = PredictorOptions(backend='openvino', threads=1)
    lean, why = lean_onnx_predictor(exported, CONTRACT, options)
    assert lean is not None, why
    images = {key for key in lean.info.image_features}
    assert lean.backend.uint8_images == images and images
    path = exported / EXPORT_DIR / 'model_48x64.onnx'
    export = OnnxExport(path=path, metadata=read_metadata(path), exported=False, seconds=0.0)
    plain = OpenVINOBackend(export, threads=1, cache=False)
    assert plain.uint8_images == frozenset()
    fused_backend = lean.backend
    for obs in _observations(3):
        fused = lean.normalized(obs)
        lean.use_backend(plain)
        float_fed = lean.normalized(obs)
        lean.use_backend(fused_backend)
        np.testing.assert_allclose(fused, float_fed, rtol=0, atol=1e-5)
    cache = exported / EXPORT_DIR / OPENVINO_CACHE_DIR / export.metadata['onnx_sha256'][:16]
    affine = {key: lean.processors.image_affine(key) for key in images}
    again = OpenVINOBackend(export, threads=1, image_affine=affine)
    assert again.compiled_cache == 'hit' and any(cache.glob('*.blob'))
    assert len(list(cache.glob('preprocessed_*.xml'))) == 1  # the graph with it, written once
    assert again.with_precision('fp32').uint8_images == images  # a rebuild keeps it
    key = sorted(images)[0]
    with pytest.raises(ValueError, match='a non-zero scale and an offset per channel'):
        OpenVINOBackend(export, threads=1, cache=False,
                        image_affine={key: (np.zeros(3), np.zeros(3))})
    with pytest.raises(ValueError, match='not inputs of the export'):
        OpenVINOBackend(export, threads=1, cache=False,
                        image_affine={'observation.images.nope': affine[key]})


def test_onnx_predictor_module_needs_no_torch():
    import subprocess

    code = ('import sys; import act_ros.core.inference.onnx_predictor, act_ros.core.inference.backends, '
            'act_ros.core.inference.export, act_ros.core.inference.runtime; '
            "print(sorted(m for m in ('torch', 'lerobot') if m in sys.modules))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == '[]'
