"""execution='process': the model in a child process gives the same actions as in-process
execution, errors come back to the caller, and closing the runtime ends the child."""

import os
import re
import signal
import time

import numpy as np
import pytest

from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
from act_ros.core.observation import Observation

# A healthy child answers in milliseconds; the runtime's hang timeout is set this high so
# that no busy machine makes it expire. Only the stopped child of the 'hung' case gets a
# short one (HUNG_AFTER_S), and only while it is stopped.
LIVENESS_S = 60.0
HUNG_AFTER_S = 1.0


def _observations(count, seed=0):
    rng = np.random.default_rng(seed)
    return [Observation(images={'top': rng.integers(0, 256, (48, 64, 3), dtype=np.uint8),
                                'wrist': rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)},
                        state=rng.uniform(-0.5, 0.5, 6)) for _ in range(count)]


def _endless(seed=0):
    """Observations until the caller stops (its own deadline ends the loop)."""
    while True:
        yield from _observations(100, seed=seed)
        seed += 1000


def _play(runtime, observations):
    """Act on each observation, letting every requested chunk arrive before the next tick
    (so the schedule, and hence the actions, are the same for every execution)."""
    runtime.reset()
    actions = []
    for obs in observations:
        actions.append(runtime.act(obs))
        assert runtime.wait_idle(60.0)
    return actions


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_process_execution_matches_in_process(tiny_checkpoint):
    """Ensembling with every chunk awaited: one chunk per tick, so both runs blend the same
    chunks; the child's chunks must equal the in-process ones."""
    observations = _observations(15)
    common = dict(model_path=tiny_checkpoint, device='cpu', mode='ensemble', torch_threads=1)
    with PolicyRuntime(RuntimeConfig(execution='async', **common)) as local:
        expected = _play(local, observations)
        direct = [local.predictor.predict(obs) for obs in observations[:3]]
    with PolicyRuntime(RuntimeConfig(execution='process', **common)) as remote:
        assert remote.predictor is None  # the model lives in the child only
        assert remote._remote.backend_name == 'torch'
        got = _play(remote, observations)
        assert remote.stats.warmup_s > 0
        assert remote.stats.chunks_computed == len(observations) - 1  # last one not yet taken
        for obs, chunk in zip(observations[:3], direct):
            np.testing.assert_allclose(remote._remote.predict(obs), chunk, atol=1e-5)
    assert got[0] is None and expected[0] is None  # the first tick waits for the first chunk
    for a, b in zip(got[1:], expected[1:]):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_process_errors_reach_the_caller_and_close_ends_the_child(tiny_checkpoint):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu',
                                     execution='process', torch_threads=1))
    try:
        pid = rt._remote.pid
        assert _alive(pid)
        # A bad observation fails in the child; the error names the problem in the parent.
        bad = Observation(images={'top': np.zeros((48, 64, 3), np.uint8)}, state=np.zeros(6))
        rt.reset()
        assert rt.act(bad) is None
        assert rt.wait_idle(30.0)
        with pytest.raises(RuntimeError, match='lacks cameras'):
            rt.act(_observations(1)[0])
        # The child survives a failed request and keeps computing.
        rt.reset()
        rt.act(_observations(1)[0])
        assert rt.wait_idle(30.0)
        assert rt.act(_observations(1)[0]) is not None
        # A dead child is reported, not waited for forever.
        os.kill(pid, signal.SIGKILL)
        rt.reset()
        rt.act(_observations(1)[0])
        assert rt.wait_idle(30.0)
        with pytest.raises(RuntimeError, match='ended unexpectedly'):
            rt.act(_observations(1)[0])
    finally:
        rt.close()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_process_start_failure_is_reported(tmp_path, tiny_checkpoint):
    """A child that cannot build the model fails the runtime's construction with its reason."""
    with pytest.raises(RuntimeError, match='failed to start.*precision'):
        PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu',
                                    execution='process', precision='fp16'))


def _recover(rt, observations, timeout_s=300.0):
    """Tick (without reset) until an action comes back; returns the errors seen meanwhile."""
    errors = []
    deadline = time.monotonic() + timeout_s
    for obs in observations:
        try:
            if rt.act(obs) is not None:
                return errors
        except RuntimeError as exc:
            errors.append(str(exc))
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    raise AssertionError(f'no action within {timeout_s} s; errors: {errors[-3:]}')


@pytest.mark.parametrize('fault', ['killed', 'hung'])
def test_dead_or_hung_child_is_restarted_without_reset(tiny_checkpoint, fault):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu',
                                     execution='process', torch_threads=1, mode='ensemble',
                                     n_action_steps=1, inference_timeout_s=LIVENESS_S))
    try:
        rt.reset()
        first = rt._remote.pid
        _recover(rt, _endless(seed=1))  # running
        if fault == 'killed':
            os.kill(first, signal.SIGKILL)
        else:
            # No request in flight (one keeps the timeout it was sent with): the requests to
            # the stopped child are the only ones under the short timeout.
            assert rt.wait_idle(LIVENESS_S)
            rt._remote.predict_timeout_s = HUNG_AFTER_S
            os.kill(first, signal.SIGSTOP)  # alive but never answers
        expected = 'ended unexpectedly' if fault == 'killed' else 'no answer.*hung: killed'
        failure = None
        for obs in _observations(600, seed=2):  # chunks already queued play out first
            try:
                rt.act(obs)
            except RuntimeError as exc:
                failure = str(exc)
                break
            time.sleep(0.05)
        assert failure is not None and re.search(expected, failure), failure
        rt._remote.predict_timeout_s = LIVENESS_S  # for the restarted, healthy child
        computed = rt.stats.chunks_computed
        deadline = time.monotonic() + 300.0  # a hang guard: a restart imports torch again
        for obs in _endless(seed=4):  # no reset: the runtime retries by itself
            try:
                rt.act(obs)
            except RuntimeError:
                pass  # restarting: commands stop meanwhile
            if rt.stats.chunks_computed > computed + 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert rt.stats.chunks_computed > computed + 2, 'no new chunk after the fault'
        assert rt.inference_restarts == 1
        assert rt._remote.pid != first and not _alive(first)
        # And it keeps computing.
        assert _recover(rt, _endless(seed=3)) == []
    finally:
        rt.close()


def test_inference_child_runs_at_the_niceness_asked_for(tiny_checkpoint):
    """``inference_nice``: the child (and so every thread its model starts) yields the CPU
    to the parent's threads; the parent itself keeps its priority."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', backend='torch',
                                     execution='process', torch_threads=1,
                                     inference_nice=5)) as rt:
        assert os.getpriority(os.PRIO_PROCESS, rt._remote.pid) == min(own + 5, 19)
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
        rt.reset()
        rt.act(_observations(1)[0])
        assert rt.wait_idle(60.0)
    for bad in (-1, 20):
        with pytest.raises(ValueError, match=r'inference_nice must be in \[0, 19\]'):
            RuntimeConfig(model_path=tiny_checkpoint, inference_nice=bad)
