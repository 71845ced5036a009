"""Async execution: ticks never wait for a slow model, chunks stay aligned, reset discards."""

import statistics
import time

import numpy as np
import pytest

from act_ros.core.observation import Observation
from act_ros.core.runtime import PolicyRuntime, RuntimeConfig

PERIOD = 1 / 30
MODEL_S = 0.12  # slower than 3 ticks


def _tick_coded_model(runtime, delay_s, offset=0.0):
    """Replace the chunk computation with the real preprocessing plus a delay, and a chunk
    that encodes the tick of its observation: row i = observed tick + i (all joints)."""
    def predict(obs):
        runtime.predictor.observation_tensors(obs)  # the real conversion still runs
        time.sleep(delay_s)
        start = obs.state[0]
        return np.repeat((start + np.arange(runtime.chunk_size, dtype=float))[:, None], 6, axis=1)
    runtime.predictor.predict = predict


def _obs(tick_value):
    img = np.zeros((48, 64, 3), np.uint8)
    return Observation(images={'top': img, 'wrist': img}, state=np.full(6, float(tick_value)))


def _run(runtime, ticks, offset=0.0):
    actions, durations = [], []
    next_t = time.perf_counter()
    for t in range(ticks):
        start = time.perf_counter()
        a = runtime.act(_obs(offset + t))
        durations.append(time.perf_counter() - start)
        actions.append(a)
        next_t += PERIOD
        time.sleep(max(0.0, next_t - time.perf_counter()))
    return actions, durations


@pytest.mark.parametrize('mode', ['chunk', 'ensemble'])
def test_async_ticks_never_block_and_actions_follow_ticks(tiny_checkpoint, mode):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode=mode,
                                     execution='async', n_action_steps=30))
    try:
        _tick_coded_model(rt, MODEL_S)
        rt.reset()
        actions, durations = _run(rt, 90)
        assert max(durations) < 0.03, f'a tick blocked for {max(durations) * 1000:.1f} ms'
        assert statistics.median(durations) < 0.005
        first = next(i for i, a in enumerate(actions) if a is not None)
        assert first >= 2  # the first chunk needs MODEL_S; nothing is invented before it
        # Aligned: the action played at tick t is the row meant for tick t.
        for t, a in enumerate(actions[first:], start=first):
            assert a is not None, f'queue ran dry at tick {t}'
            np.testing.assert_allclose(a, t, atol=1e-9)
        assert rt.stats.chunks_computed >= (2 if mode == 'chunk' else 15)
    finally:
        rt.close()


def test_reset_discards_in_flight_chunk(tiny_checkpoint):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='chunk',
                                     execution='async'))
    try:
        _tick_coded_model(rt, 0.2)
        rt.reset()
        assert rt.act(_obs(0)) is None  # request in flight
        rt.reset()
        assert rt.wait_idle(5.0)
        # New episode: observations now code 1000 + tick. The old chunk must not appear.
        actions, _ = _run(rt, 20, offset=1000.0)
        played = [a for a in actions if a is not None]
        assert played, 'no chunk arrived after reset'
        assert all(a[0] >= 1000 for a in played)
        assert rt.stats.chunks_discarded == 1
    finally:
        rt.close()


def test_sync_chunk_mode_calls_model_once_per_n_action_steps(tiny_checkpoint):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='chunk',
                                     execution='sync', n_action_steps=10))
    _tick_coded_model(rt, 0.0)
    actions = [rt.act(_obs(t)) for t in range(25)]
    assert rt.stats.chunks_computed == 3
    np.testing.assert_allclose([a[0] for a in actions], np.arange(25))


def test_worker_error_surfaces(tiny_checkpoint):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', execution='async'))
    try:
        def broken(obs):
            raise FloatingPointError('boom')
        rt.predictor.predict = broken
        rt.act(_obs(0))
        rt.wait_idle(5.0)
        with pytest.raises(RuntimeError, match='boom'):
            rt.act(_obs(1))
    finally:
        rt.close()


@pytest.mark.parametrize('mode', ['chunk', 'ensemble'])
def test_failed_request_is_retried_without_reset(tiny_checkpoint, mode):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', execution='async',
                                     mode=mode, n_action_steps=30 if mode == 'chunk' else 1))
    try:
        _tick_coded_model(rt, 0.0)
        working = rt.predictor.predict
        calls = {'n': 0}

        def fails_once(obs):
            calls['n'] += 1
            if calls['n'] == 1:
                raise FloatingPointError('boom')
            return working(obs)
        rt.predictor.predict = fails_once
        assert rt.act(_obs(0)) is None
        assert rt.wait_idle(5.0)
        with pytest.raises(RuntimeError, match='boom'):
            rt.act(_obs(1))
        # No reset(): the next ticks request again and actions flow.
        actions = []
        for t in range(2, 40):
            actions.append(rt.act(_obs(t)))
            rt.wait_idle(5.0)
        assert calls['n'] >= 2
        played = [a for a in actions if a is not None]
        assert len(played) >= 30, f'only {len(played)} of 38 ticks had an action after the failure'
        assert all(np.all(np.isfinite(a)) for a in played)
    finally:
        rt.close()


def test_chunk_slower_than_its_horizon_is_counted_late_and_never_played(tiny_checkpoint):
    """A model slower than a whole chunk (30 ticks = 1 s) cannot keep up: its chunks
    arrive after their last tick; none of their (stale) actions may be played."""
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='chunk',
                                     execution='async'))
    try:
        _tick_coded_model(rt, 1.1)
        rt.reset()
        actions, durations = _run(rt, 75)
        assert max(durations) < 0.03
        assert all(a is None for a in actions)
        assert rt.stats.chunks_late >= 1
    finally:
        rt.close()


@pytest.mark.parametrize('mode', ['chunk', 'ensemble'])
def test_simulated_execution_delivers_chunks_latency_ticks_late(tiny_checkpoint, mode):
    """Against simulated time: the first action comes at tick L, every action is the one
    meant for its tick (the chunk computed L ticks earlier, aligned), on any machine."""
    latency = 7
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu',
                                     execution='simulated', mode=mode,
                                     n_action_steps=30 if mode == 'chunk' else 1,
                                     simulated_latency_ticks=latency))
    try:
        _tick_coded_model(rt, 0.0)
        rt.reset()
        actions = [rt.act(_obs(t)) for t in range(90)]
    finally:
        rt.close()
    assert all(a is None for a in actions[:latency])
    for t in range(latency, 90):
        assert actions[t] is not None, t
        np.testing.assert_allclose(actions[t], t, atol=1e-9)  # tick-coded: row i = tick + i
    assert rt.stats.chunks_late == 0
    if mode == 'chunk':  # one request in flight, re-requested early enough: 90 ticks, L = 7
        assert 3 <= rt.stats.chunks_computed <= 8
