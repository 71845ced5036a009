"""Camera frames to the inference child through shared memory (act_ros.core.inference.shared_frames):
the round trip between two mappings of one region, a region that grows, what cannot go
through it, and a real child process computing from frames it read there."""

import os
import subprocess
import sys

import numpy as np
import pytest

from act_ros.core.inference.shared_frames import SharedFrames, is_reference

linux_only = pytest.mark.skipif(not hasattr(os, 'memfd_create'),
                                reason='memfd_create is Linux-only (elsewhere: the socket)')


def _frames(seed=0, size=(48, 64)):
    rng = np.random.default_rng(seed)
    return {'top': rng.integers(0, 256, (*size, 3), dtype=np.uint8),
            'wrist': rng.integers(0, 256, (*size, 3), dtype=np.uint8)}


@linux_only
def test_frames_round_trip_between_two_mappings_and_the_region_grows():
    parent = SharedFrames.create()
    child = SharedFrames.attach(os.dup(parent.fd))  # a second mapping, as the child's
    try:
        for seed, size in [(0, (48, 64)), (1, (48, 64)), (2, (480, 640)), (3, (96, 128))]:
            images = _frames(seed, size)
            reference = parent.pack(images)
            assert is_reference(reference) and not is_reference(images)
            got = child.unpack(reference)
            assert list(got) == ['top', 'wrist']
            for name, image in images.items():
                np.testing.assert_array_equal(got[name], image)
                assert not got[name].flags.writeable  # the child only reads them
            # Only the layout travels: tens of bytes, whatever the frame size.
            assert len(repr(reference)) < 200
        assert os.fstat(parent.fd).st_size >= 2 * 480 * 640 * 3
    finally:
        parent.close()
        child.close()


@linux_only
def test_a_reference_past_the_region_is_refused():
    parent = SharedFrames.create()
    child = SharedFrames.attach(os.dup(parent.fd))
    try:
        _, size, layout = parent.pack(_frames())
        with pytest.raises(ValueError, match='shared frame region holds'):
            child.unpack(('frames', size * 100, layout))
    finally:
        parent.close()
        child.close()


def test_only_numeric_arrays_are_packed():
    assert SharedFrames.packable(_frames())
    assert not SharedFrames.packable({'top': [[1, 2, 3]]})
    assert not SharedFrames.packable({'top': np.array([object()])})


@linux_only
def test_the_inference_child_reads_frames_from_the_region(tiny_checkpoint):
    """A real child: the chunk it computes from shared frames equals the in-process
    one, a bad frame still gets the child's one-line error, and the region is the
    frames' size."""
    from act_ros.core.contract import load_contract
    from act_ros.core.inference.inference_process import InferenceProcessError, ProcessSpec, RemotePredictor
    from act_ros.core.inference.options import PredictorOptions
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
    from act_ros.core.observation import Observation

    contract = load_contract()
    rng = np.random.default_rng(5)
    obs = Observation(images=_frames(7), state=rng.uniform(-1, 1, contract.num_joints))
    with PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', backend='torch',
                                     execution='sync', torch_threads=1)) as local:
        expected = local.predictor.predict(obs)
    spec = ProcessSpec(model_path=str(tiny_checkpoint), contract=contract, device='cpu',
                       options=PredictorOptions(), torch_threads=1, warmup_iterations=0)
    remote = RemotePredictor(spec)
    try:
        assert remote._frames is not None
        np.testing.assert_array_equal(remote.predict(obs), expected)
        assert os.fstat(remote._frames.fd).st_size >= sum(i.nbytes for i in obs.images.values())
        bad = Observation(images={**obs.images, 'top': obs.images['top'].astype(np.float32)},
                          state=obs.state)
        with pytest.raises(InferenceProcessError, match='uint8'):
            remote.predict(bad)
        np.testing.assert_array_equal(remote.predict(obs), expected)  # still serving
    finally:
        remote.close()


def test_shared_frames_module_needs_no_torch():
    code = ('import sys; import act_ros.core.inference.shared_frames; '
            'assert "torch" not in sys.modules, "torch imported"')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
