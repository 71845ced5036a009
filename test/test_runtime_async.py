"""Async execution: ticks never wait for a slow model, chunks stay aligned, reset discards.

No assertion here depends on how fast the machine is: the model is held by the test
(:class:`_HeldModel`) for a given number of ticks, and a tick that waited for it would
still be inside ``act()`` when the model gives up. How long a tick takes is measured by
``act-ros bench runtime`` (median, p99 and max tick time of the async loops).
"""

import threading

import numpy as np
import pytest

from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
from act_ros.core.observation import Observation

# A request held this many ticks after the tick that made it: its chunk is taken on the
# tick after that. Chunk mode asks for the next chunk when at most 3 ticks of the current
# one remain (a latency of at least one tick plus REQUEST_MARGIN_TICKS = 2), so the queue
# never runs dry while a model holds for 2 ticks, however long the test's ticks take.
HOLD_TICKS = 2
GIVE_UP_S = 120.0  # a held model returns by itself after this: act() blocked on it
LIVENESS_S = 30.0  # waits that end at once when the code works; only a hang reaches them


def _tick_coded_chunk(obs, chunk_size):
    """Row i = the observation's tick (coded in its state) + i, all joints."""
    return np.repeat((obs.state[0] + np.arange(chunk_size, dtype=float))[:, None], 6, axis=1)


def _tick_coded_model(runtime):
    """Replace the chunk computation with the real preprocessing and a tick-coded chunk."""
    def predict(obs):
        runtime.predictor.observation_tensors(obs)  # the real conversion still runs
        return _tick_coded_chunk(obs, runtime.chunk_size)
    runtime.predictor.predict = predict


class _HeldModel:
    """The tick-coded model (real preprocessing; row i = observed tick + i), held inside
    the worker until the test calls :meth:`release`. It never waits longer than
    ``GIVE_UP_S``; then it records ``gave_up``: something kept the test from releasing
    it, which is a tick (``act()``) waiting for the model."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.inside = threading.Event()  # a request is being computed (and held)
        self._go = threading.Event()
        self.free = False  # closing: compute without holding
        self.calls = 0
        self.gave_up = False
        runtime.predictor.predict = self.predict

    def predict(self, obs):
        self.runtime.predictor.observation_tensors(obs)  # the real conversion still runs
        self.calls += 1
        self.inside.set()
        if not self.free and not self._go.wait(GIVE_UP_S):
            self.gave_up = True
        self._go.clear()
        self.inside.clear()
        return _tick_coded_chunk(obs, self.runtime.chunk_size)

    def release(self):
        """Let the held request finish and wait until its chunk is ready to be taken."""
        self._go.set()
        assert self.runtime.wait_idle(LIVENESS_S), 'the released model did not finish'

    def close(self):
        self.free = True
        self._go.set()


def _obs(tick_value):
    img = np.zeros((48, 64, 3), np.uint8)
    return Observation(images={'top': img, 'wrist': img}, state=np.full(6, float(tick_value)))


def _run_held(runtime, model, ticks, hold_ticks=HOLD_TICKS, offset=0.0):
    """``ticks`` control ticks (observation ``offset + t``) against ``model``: every request
    is held while ``hold_ticks`` more ticks run and released after the last of them, so its
    chunk is taken ``hold_ticks + 1`` ticks after the tick that asked for it. Fails at the
    first tick that returned only once the held model gave up."""
    actions, held = [], 0
    for t in range(ticks):
        actions.append(runtime.act(_obs(offset + t)))
        assert not model.gave_up, f'tick {t} waited for the model'
        if runtime.wait_idle(0):  # nothing in flight
            continue
        assert model.inside.wait(LIVENESS_S), 'the request never reached the model'
        held += 1
        if held > hold_ticks:
            model.release()
            held = 0
    return actions


@pytest.mark.parametrize('mode', ['chunk', 'ensemble'])
def test_async_ticks_never_block_and_actions_follow_ticks(tiny_checkpoint, mode):
    """90 ticks against a model slower than 2 ticks: every tick returns while the model is
    still computing, nothing is played before the first chunk, and from then on the
    action of tick t is the row meant for tick t (tick-coded chunks)."""
    ticks = 90
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode=mode,
                                     execution='async', n_action_steps=30))
    model = _HeldModel(rt)
    try:
        rt.reset()
        actions = _run_held(rt, model, ticks)
        first = next(i for i, a in enumerate(actions) if a is not None)
        assert first == HOLD_TICKS + 1  # the first chunk's wait; nothing invented before it
        assert rt.stats.empty_ticks == first
        # Aligned: the action played at tick t is the row meant for tick t.
        for t, a in enumerate(actions[first:], start=first):
            assert a is not None, f'queue ran dry at tick {t}'
            np.testing.assert_allclose(a, t, atol=1e-9)
        if mode == 'ensemble':  # the worker is kept busy: a request whenever it is free
            assert rt.stats.chunks_computed == (ticks - 1) // (HOLD_TICKS + 1)
        else:  # one chunk per at most 30 ticks, asked for before the queue runs dry
            assert rt.stats.chunks_computed >= ticks // 30
        assert model.calls in (rt.stats.chunks_computed, rt.stats.chunks_computed + 1)
    finally:
        model.close()
        rt.close()


def test_reset_discards_in_flight_chunk(tiny_checkpoint):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='chunk',
                                     execution='async'))
    model = _HeldModel(rt)
    try:
        rt.reset()
        assert rt.act(_obs(0)) is None
        assert model.inside.wait(LIVENESS_S)  # the request is being computed
        rt.reset()
        model.release()  # its chunk is ready before the new episode's first tick
        # New episode: observations now code 1000 + tick. The old chunk must not appear.
        actions = _run_held(rt, model, 20, offset=1000.0)
        assert rt.stats.chunks_discarded == 1
        first = HOLD_TICKS + 1  # the new episode's first chunk, asked for at its tick 0
        assert all(a is None for a in actions[:first])
        for t, a in enumerate(actions[first:], start=first):
            np.testing.assert_allclose(a, 1000 + t, atol=1e-9)
    finally:
        model.close()
        rt.close()


def test_sync_chunk_mode_calls_model_once_per_n_action_steps(tiny_checkpoint):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='chunk',
                                     execution='sync', n_action_steps=10))
    _tick_coded_model(rt)
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
        assert rt.wait_idle(LIVENESS_S)
        with pytest.raises(RuntimeError, match='boom'):
            rt.act(_obs(1))
    finally:
        rt.close()


@pytest.mark.parametrize('mode', ['chunk', 'ensemble'])
def test_failed_request_is_retried_without_reset(tiny_checkpoint, mode):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', execution='async',
                                     mode=mode, n_action_steps=30 if mode == 'chunk' else 1))
    try:
        _tick_coded_model(rt)
        working = rt.predictor.predict
        calls = {'n': 0}

        def fails_once(obs):
            calls['n'] += 1
            if calls['n'] == 1:
                raise FloatingPointError('boom')
            return working(obs)
        rt.predictor.predict = fails_once
        assert rt.act(_obs(0)) is None
        assert rt.wait_idle(LIVENESS_S)
        with pytest.raises(RuntimeError, match='boom'):
            rt.act(_obs(1))
        # No reset(): the next ticks request again and actions flow.
        actions = []
        for t in range(2, 40):
            actions.append(rt.act(_obs(t)))
            assert rt.wait_idle(LIVENESS_S)
        assert calls['n'] >= 2
        played = [a for a in actions if a is not None]
        assert len(played) >= 30, f'only {len(played)} of 38 ticks had an action after the failure'
        assert all(np.all(np.isfinite(a)) for a in played)
    finally:
        rt.close()


def test_chunk_slower_than_its_horizon_is_counted_late_and_never_played(tiny_checkpoint):
    """A model slower than a whole chunk (30 ticks) cannot keep up: its chunks arrive
    after their last tick; none of their (stale) actions may be played, and no tick
    waits for it."""
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='chunk',
                                     execution='async'))
    model = _HeldModel(rt)
    try:
        rt.reset()
        hold = rt.chunk_size + 2  # as a model taking 1.1 s at 30 Hz
        actions = _run_held(rt, model, 75, hold_ticks=hold)
        assert all(a is None for a in actions)
        # Asked for at ticks 0 and 33, taken (late) at 33 and 66; the third still held.
        assert rt.stats.chunks_late == rt.stats.chunks_computed == 75 // (hold + 1)
    finally:
        model.close()
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
        _tick_coded_model(rt)
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


def _call_coded_model(runtime, step=100.0):
    """Row i = observed tick + i + step * (number of the call): consecutive chunks disagree
    by ``step``, so where each action comes from shows in its value."""
    calls = {'n': 0}

    def predict(obs):
        runtime.predictor.observation_tensors(obs)
        calls['n'] += 1
        return _tick_coded_chunk(obs, runtime.chunk_size) + step * (calls['n'] - 1)
    runtime.predictor.predict = predict
    return calls


def test_sync_blend_asks_every_stride_and_crossfades_each_chunk_in(tiny_checkpoint):
    from act_ros.core.inference.chunking import smoothstep_weights

    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='blend',
                                     execution='sync', n_action_steps=10, blend_ticks=4))
    try:
        _call_coded_model(rt)
        assert rt.stride == 10
        actions, sources, fading = [], [], []
        for t in range(25):
            actions.append(rt.act(_obs(t))[0])
            sources.append(rt.last_source)
            fading.append(rt.last_transition)
    finally:
        rt.close()
    assert rt.stats.chunks_computed == 3  # at ticks 0, 10, 20
    assert sources == [0] * 10 + [10] * 10 + [20] * 5
    assert [t for t, f in enumerate(fading) if f] == [10, 11, 12, 13, 20, 21, 22, 23]
    w = smoothstep_weights(4)
    np.testing.assert_allclose(actions[:10], np.arange(10))
    for k in range(4):  # the fade from chunk 0 (row t) into chunk 1 (t + 100)
        assert actions[10 + k] == pytest.approx(10 + k + 100 * w[k])
    np.testing.assert_allclose(actions[14:20], 100 + np.arange(14, 20))


def test_blend_stride_leaves_rows_to_fade_from(tiny_checkpoint):
    """With the whole chunk played (n_action_steps = chunk size), blend mode asks for the
    next chunk blend_ticks before the end; a window as long as the chunk is refused."""
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='blend',
                                     execution='sync', n_action_steps=30, blend_ticks=6))
    try:
        assert rt.stride == rt.chunk_size - 6
    finally:
        rt.close()
    with pytest.raises(ValueError, match='blend_ticks .* must be below'):
        PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='blend',
                                    execution='sync', blend_ticks=rt.chunk_size))


def test_blend_against_latency_fades_in_from_the_arrival_tick(tiny_checkpoint):
    """With chunks delivered 5 ticks after their observation, every action before a chunk
    arrives is the old chunk's (committed), and the fade starts at the arrival tick with
    the new chunk's row for that tick."""
    from act_ros.core.inference.chunking import smoothstep_weights

    latency, window = 5, 4
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='blend',
                                     execution='simulated', n_action_steps=20,
                                     blend_ticks=window, simulated_latency_ticks=latency))
    try:
        _call_coded_model(rt)
        rt.reset()
        actions, sources = [], []
        for t in range(70):
            action = rt.act(_obs(t))
            actions.append(None if action is None else action[0])
            sources.append(rt.last_source)
    finally:
        rt.close()
    assert actions[:latency] == [None] * latency
    handovers = [t for t in range(latency + 1, 70) if sources[t] != sources[t - 1]]
    assert handovers, 'no second chunk arrived'
    w = smoothstep_weights(window)
    for arrival in handovers:
        assert arrival - sources[arrival] == latency  # from the observation 5 ticks earlier
        old = actions[arrival - 1] + 1.0  # the old chunk's next row (tick-coded, slope 1)
        new_offset = (handovers.index(arrival) + 1) * 100.0
        for k in range(window):
            t = arrival + k
            expected = (1 - w[k]) * (old + k) + w[k] * (t + new_offset)
            assert actions[t] == pytest.approx(expected), (arrival, k)


def test_plan_is_what_the_next_ticks_play(tiny_checkpoint):
    rt = PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu', mode='blend',
                                     execution='sync', n_action_steps=10, blend_ticks=4))
    try:
        _call_coded_model(rt)
        assert rt.plan(5) is None  # nothing acted yet
        for t in range(12):
            rt.act(_obs(t))
        plan = rt.plan(6)  # ticks 11 .. 16: the rest of the fade and the new chunk
        played = [rt.act(_obs(t)) for t in range(12, 17)]
    finally:
        rt.close()
    assert plan.shape == (6, 6)
    np.testing.assert_allclose(plan[1:], np.stack(played))
