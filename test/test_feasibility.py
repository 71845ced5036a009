"""The real-time verdict as a table: chunk execution holds the rate when 2 (L + margin) <= C,
ensembling when 2L <= C (and it reports the blend's refresh rate), synchronous execution
when one call fits in a period; an infeasible verdict names what would fit. At the
boundary (C = 30, L = 13 vs 14) the runtime itself runs the schedule against simulated
time and holds the rate exactly where the verdict says it does."""

import pytest

from act_ros.core.inference.feasibility import Latency, verdict


def _v(mode='chunk', execution='process', worst=0.1, chunk=30, rate=30.0, size=(480, 640)):
    return verdict(mode=mode, execution=execution, rate_hz=rate, chunk_size=chunk,
                   n_action_steps=30 if mode == 'chunk' else 1,
                   latency=Latency(median_s=worst * 0.9, worst_s=worst, samples=3),
                   image_size=size, backends=('openvino',))


@pytest.mark.parametrize('mode, execution, worst_s, chunk, feasible, ticks', [
    ('chunk', 'process', 0.10, 30, True, 3),      # 2 x (3 + 2) = 10 <= 30
    ('chunk', 'process', 0.43, 30, True, 13),     # 2 x (13 + 2) = 30 <= 30: just fits
    ('chunk', 'process', 0.45, 30, False, 14),    # 32 > 30
    ('chunk', 'async', 0.95, 30, False, 29),      # default ACT at 480x640 on 2 cores
    ('chunk', 'process', 0.95, 100, True, 29),    # LeRobot's default chunk of 100
    ('ensemble', 'process', 0.45, 30, True, 14),  # 28 <= 30
    ('ensemble', 'process', 0.55, 30, False, 17),
    ('chunk', 'sync', 0.03, 30, True, 1),
    ('chunk', 'sync', 0.2, 30, False, 6),
])
def test_verdict_table(mode, execution, worst_s, chunk, feasible, ticks):
    v = _v(mode, execution, worst_s, chunk)
    assert v.feasible is feasible
    assert v.latency_ticks == ticks
    assert ('NOT feasible' in v.line()) is not feasible
    assert bool(v.alternatives) is not feasible


def test_ensemble_reports_its_refresh_rate():
    v = _v('ensemble', worst=0.25)
    assert v.effective_refresh_hz == pytest.approx(4.0)
    assert v.as_values()['ensemble_refresh_hz'] == pytest.approx(4.0)
    assert _v('chunk').effective_refresh_hz is None


def test_infeasible_verdict_says_what_would_fit():
    v = _v('chunk', 'process', worst=0.95, chunk=30, size=(480, 640))
    text = '; '.join(v.alternatives)
    assert 'chunk_size >= 62' in text          # 2 x (29 + 2)
    assert 'model input 240x320' in text       # 0.95 s / 4 = 0.24 s <= 13 ticks of 33 ms
    assert 'control_rate_hz <= 13.6' in text   # 13 ticks / 0.95 s
    assert 'openvino' in text
    assert v.as_values()['feasible'] is False


def test_latency_needs_measurements():
    with pytest.raises(ValueError, match='no latency'):
        Latency.from_samples([float('nan')])
    lat = Latency.from_samples([0.2, 0.1, 0.3])
    assert (lat.median_s, lat.worst_s, lat.samples) == (0.2, 0.3, 3)


# ---- the verdict's boundary, run by the runtime against simulated time --------------------

def _zero_observation():
    import numpy as np

    from act_ros.core.observation import Observation
    img = np.zeros((48, 64, 3), np.uint8)
    return Observation(images={'top': img, 'wrist': img}, state=np.zeros(6))


def _run_simulated(checkpoint, delivery_ticks: int, ticks: int = 240):
    """Chunk execution against simulated time: every chunk delivered ``delivery_ticks``
    ticks after its request (execution 'simulated', the schedule of 'async'); the actions
    of ``ticks`` ticks (None where the queue had none) and the runtime."""
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
    runtime = PolicyRuntime(RuntimeConfig(model_path=checkpoint, device='cpu', mode='chunk',
                                          execution='simulated', warmup=False,
                                          simulated_latency_ticks=delivery_ticks))
    # The schedule is under test, not the network: a fixed chunk stands for the model's.
    chunk = runtime.predictor.predict(_zero_observation())
    runtime.predictor.predict = lambda observation: chunk
    obs = _zero_observation()
    try:
        return [runtime.act(obs) for _ in range(ticks)], runtime
    finally:
        runtime.close()


@pytest.mark.parametrize('latency_ticks, feasible', [(13, True), (14, False)])
def test_the_runtime_holds_the_rate_exactly_where_the_verdict_says(tiny_checkpoint,
                                                                  latency_ticks, feasible):
    """At C = 30 the verdict's boundary lies between L = 13 (2 x (13 + 2) = 30) and L = 14
    (32 > 30). The margin of 2 ticks is slack for chunks that come later than measured: with
    every chunk delivered L + 2 ticks after its request, the runtime never runs dry at
    L = 13, and runs dry at L = 14, as the verdict says."""
    from act_ros.core.inference.runtime import REQUEST_MARGIN_TICKS

    margin = REQUEST_MARGIN_TICKS
    actions, runtime = _run_simulated(tiny_checkpoint, latency_ticks + margin)
    assert runtime.chunk_size == 30 and runtime.n_action_steps == 30
    period = runtime.period_s
    measured = Latency(median_s=(latency_ticks - 0.5) * period,
                       worst_s=(latency_ticks - 0.5) * period, samples=2)
    v = runtime.feasibility(30.0, measured)
    assert (v.latency_ticks, v.margin_ticks, v.feasible) == (latency_ticks, margin, feasible)
    first = next(i for i, a in enumerate(actions) if a is not None)
    assert first == latency_ticks + margin  # the first chunk: nothing to play before it
    dry = [i for i, a in enumerate(actions) if a is None and i > first]
    if feasible:
        assert not dry and runtime.stats.chunks_late == 0
    else:
        # Each chunk lands 2 ticks after the previous one ran out: 2 silent ticks a cycle.
        assert dry and runtime.stats.empty_ticks == first + len(dry), dry
        assert len(dry) >= 2 * ((len(actions) - first) // (2 * (latency_ticks + margin)))


@pytest.mark.parametrize('delivery_ticks, holds', [(13, True), (14, True), (15, True),
                                                    (16, False)])
def test_without_late_chunks_the_queue_holds_up_to_half_a_chunk(tiny_checkpoint,
                                                                delivery_ticks, holds):
    """Chunks exactly on time: one request in flight keeps the queue full while 2L <= C
    (so the verdict's margin, not the schedule, is what separates 13 from 14), and not at
    L = 16."""
    actions, _ = _run_simulated(tiny_checkpoint, delivery_ticks, ticks=200)
    first = next(i for i, a in enumerate(actions) if a is not None)
    dry = [i for i, a in enumerate(actions) if a is None and i > first]
    assert (not dry) is holds, dry


def test_a_model_slower_than_a_chunk_is_the_reason_given_for_no_command(tiny_checkpoint):
    """Every chunk lands after its last action was due: the control step sends nothing, and
    says why (the node logs it as a warning) instead of "waiting for the first chunk"."""
    import numpy as np

    from act_ros.core.control.inputs import JOINT_STATES, PAD_POSE, image_stream
    from act_ros.core.control.loop import CHUNKS_LATE, WAITING_FOR_CHUNK
    from act_ros.training.evaluation.rollout import SimPolicy

    policy = SimPolicy(tiny_checkpoint, latency_ticks=35)  # the tiny chunk is 30 steps
    try:
        assert policy.runtime.chunk_size == 30
        image = np.zeros((48, 64, 3), np.uint8)
        reasons = []
        for tick in range(110):
            now = tick * policy.period_s
            policy.store.put(JOINT_STATES, np.zeros(6), now, now)
            for cam in policy.cameras:
                policy.store.put(image_stream(cam), image, now, now)
            policy.store.put(PAD_POSE, np.zeros(3), now, now)
            result = policy.loop.tick(policy.store.snapshot(now))
            assert result.command is None, f'tick {tick} played an action of a late chunk'
            reasons.append(result.reason)
        # The first chunk, asked for at tick 0, lands 35 ticks later, after its 30 actions.
        late = next(t for t, reason in enumerate(reasons) if reason != WAITING_FOR_CHUNK)
        assert late in (35, 36)
        assert reasons[late].startswith(CHUNKS_LATE) and '(1 of 1 chunks so far' in reasons[late]
        n = policy.runtime.stats.chunks_computed
        assert n >= 2 and policy.runtime.stats.chunks_late == n
        assert f'({n} of {n} chunks so far; the model takes 1167 ms)' in reasons[-1]  # 35 ticks
    finally:
        policy.close()
