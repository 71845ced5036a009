"""Seams of a command stream (act_ros.core.control.seams) against a direct computation."""

import math

import numpy as np
import pytest

from act_ros.core.control.seams import EDGES, SeamMeter, SeamSamples, arm_seam_meter, histogram_quantile

DT = 1 / 30
NAMES = ('a', 'b', 'gripper')


def smooth_chunk(start: int, length: int = 30, offset: float = 0.0) -> np.ndarray:
    t = np.arange(start, start + length) * DT
    return np.stack([np.sin(t) + offset, np.cos(t) + offset, np.zeros(length)], axis=1)


def play_chunks(meter: SeamMeter, offsets, stride: int = 30) -> list[np.ndarray]:
    """Chunk execution: chunk c starts at tick c * stride, its first ``stride`` rows played."""
    sent = []
    for c, offset in enumerate(offsets):
        rows = smooth_chunk(c * stride, offset=offset)
        meter.add_chunk(rows)
        for row in rows[:stride]:
            meter.add_command(row, c * stride)
            sent.append(row)
    return sent


def test_offset_at_handover_is_its_velocity_jump_over_the_arm():
    """A position offset d (per arm joint) at a handover steps the velocity by |d| / dt
    (norm over the arm joints), on top of the motion's own step."""
    meter = SeamMeter(NAMES, DT, measured=[0, 1])
    offsets = [0.0, 0.01, 0.0, 0.02, 0.02]
    play_chunks(meter, offsets)
    s = meter.summary()
    assert s['handovers'] == 4 and s['ticks'] == 150 and s['chunks'] == 5
    assert s['arm_joints'] == ['a', 'b']
    # Direct computation on the stream sent.
    sent = np.stack(play_chunks(SeamMeter(NAMES, DT), offsets))
    d2 = np.linalg.norm(np.diff(sent[:, :2], n=2, axis=0), axis=1) / DT
    expected = [max(d2[h - 2], d2[h - 1]) for h in (30, 60, 90, 120)]  # D2 at ticks h, h+1
    samples = meter.samples()
    np.testing.assert_allclose(samples.jumps['velocity'][:, 0], expected, rtol=1e-12)
    # No offset between the last two chunks: the step of the motion itself.
    assert expected[3] == pytest.approx(DT, rel=0.01)
    assert expected[0] == pytest.approx(math.hypot(0.01, 0.01) / DT, rel=0.1)
    # The reference: the rows' own velocity steps (the motion at 1 rad/s: dt rad/s per tick).
    assert s['within_chunk_velocity_step_p99'] == pytest.approx(DT, rel=0.08)
    # The three offsets are over it (the fourth handover sits on it: either way).
    assert s['over_within_p99'] in (3, 4)
    assert sum(j > 2 * DT for j in samples_jumps(meter)) == 3
    assert s['velocity_jump_max'] == pytest.approx(max(expected))
    assert s['velocity_jump_median'] == pytest.approx(np.median(expected))
    # Per joint: the gripper never moved.
    assert s['per_joint']['gripper']['velocity_jump_max'] == 0.0
    assert s['per_joint']['a']['velocity_jump_max'] == pytest.approx(0.02 / DT, rel=0.1)


def samples_jumps(meter: SeamMeter) -> list[float]:
    return list(meter.samples().jumps['velocity'][:, 0])


def test_acceleration_jump_spans_three_ticks():
    meter = SeamMeter(NAMES, DT, measured=[0])
    sent = np.stack(play_chunks(meter, [0.0, 0.01]))
    d3 = np.abs(np.diff(sent[:, 0], n=3)) / DT ** 2
    expected = max(d3[30 - 3], d3[31 - 3], d3[32 - 3])  # D3 at ticks 30, 31, 32
    assert meter.samples().jumps['acceleration'][0, 0] == pytest.approx(expected)
    assert expected == pytest.approx(2 * 0.01 / DT ** 2, rel=0.05)


def test_gaps_and_episodes_break_the_stream():
    """No step is taken across a tick without a command or an episode boundary, and a
    handover too close to a break to measure is left out."""
    meter = SeamMeter(NAMES, DT)
    rows = smooth_chunk(0)
    for row in rows[:10]:
        meter.add_command(row, 0)
    meter.add_command(None, None)          # a stale tick
    meter.add_command(rows[11] + 1.0, 7)   # another chunk after the gap: no handover
    for row in rows[12:20]:
        meter.add_command(row + 1.0, 7)
    meter.break_stream()                   # new episode
    meter.add_command(rows[0], 0)
    meter.add_command(rows[1] + 5.0, 1)    # handover one tick after the break: not measurable
    meter.add_command(rows[2] + 5.0, 1)
    meter.add_command(rows[3] + 5.0, 1)
    assert meter.summary()['handovers'] == 0
    assert meter.summary()['velocity_jump_max'] is None  # JSON null, not NaN
    assert meter.summary()['over_within_p99_fraction'] is None
    assert meter.summary()['ticks'] == 10 + 1 + 8 + 4  # commands sent, the gap not


def test_non_finite_rows_stay_out_of_the_reference():
    meter = SeamMeter(NAMES, DT)
    bad = smooth_chunk(0)
    bad[4, 1] = np.nan
    meter.add_chunk(bad)
    assert meter.summary()['chunks'] == 0
    with pytest.raises(ValueError, match=r'shape \(T, 3\)'):
        meter.add_chunk(np.zeros((5, 2)))


def test_rolling_window_forgets_old_handovers():
    meter = SeamMeter(NAMES, DT, window_ticks=60)
    play_chunks(meter, [0.0, 0.05, 0.0, 0.0, 0.0, 0.0], stride=30)  # jump at tick 30 only
    s = meter.summary()
    assert s['handovers'] == 2  # handovers at 120 and 150 are within the last 60 ticks
    assert s['velocity_jump_max'] < 0.05
    assert 45 <= s['ticks'] <= 60  # the reference and counts roll by quarters


def test_merge_equals_one_meter_over_everything():
    one, first, second = (SeamMeter(NAMES, DT, measured=[0, 1]) for _ in range(3))
    offsets = [0.0, 0.01, -0.02, 0.03, 0.0, 0.01]
    play_chunks(one, offsets[:3])
    one.break_stream()
    play_chunks(one, offsets[3:])
    play_chunks(first, offsets[:3])
    play_chunks(second, offsets[3:])
    parts = [SeamSamples.from_dict(m.samples().to_dict()) for m in (first, second)]
    merged = SeamSamples.merge(parts).summary()
    expected = one.summary()
    for key in ('handovers', 'over_within_p99', 'velocity_jump_median', 'velocity_jump_max',
                'within_chunk_velocity_step_p99', 'acceleration_jump_max', 'ticks', 'chunks'):
        assert merged[key] == pytest.approx(expected[key]), key
    with pytest.raises(ValueError, match='different joints'):
        SeamSamples.merge([parts[0], SeamSamples(('x',), (0,), DT)])


def test_histogram_quantile_within_a_bin_of_the_exact_quantile():
    rng = np.random.default_rng(0)
    values = rng.lognormal(mean=-3.0, sigma=1.0, size=20000)
    counts = np.bincount(np.searchsorted(EDGES, values, side='right'), minlength=EDGES.size + 1)
    for q in (0.5, 0.9, 0.99):
        assert histogram_quantile(counts, q) == pytest.approx(np.quantile(values, q), rel=0.08)
    assert math.isnan(histogram_quantile(np.zeros_like(counts), 0.5))
    zeros = np.zeros_like(counts)
    zeros[0] = 5
    assert histogram_quantile(zeros, 0.99) == 0.0


def test_arm_meter_leaves_grippers_out_of_the_norm():
    meter = arm_seam_meter(NAMES, (2,), DT)
    assert meter.measured == (0, 1)
    assert arm_seam_meter(('g',), (0,), DT).measured == (0,)
    with pytest.raises(ValueError, match='period_s'):
        SeamMeter(NAMES, 0.0)
    with pytest.raises(ValueError, match='measured joints'):
        SeamMeter(NAMES, DT, measured=[3])


def test_a_crossfade_is_judged_over_all_its_ticks():
    """A handover spread over a 6-tick crossfade (``transition`` ticks): its jump is the
    largest velocity step anywhere from the handover through the tick after the fade, not
    only over its first two ticks (here the fade's weights kink at its fifth tick)."""
    w = np.array([0.1, 0.2, 0.3, 0.4, 0.9, 0.95, 1.0])
    stream = [np.zeros(3)] * 10 + [np.array([0.3, 0.0, 0.0]) * wk for wk in w] \
        + [np.array([0.3, 0.0, 0.0])] * 5
    sources = [0] * 10 + [10] * 12
    fading = [False] * 10 + [True] * 6 + [False] * 6
    expected = np.abs(np.diff(np.stack(stream)[:, 0], n=2)).max() / DT
    judged, first_ticks = SeamMeter(NAMES, DT, measured=[0]), SeamMeter(NAMES, DT, measured=[0])
    for q, source, transition in zip(stream, sources, fading):
        judged.add_command(q, source, transition=transition)
        first_ticks.add_command(q, source)
    assert judged.summary()['handovers'] == first_ticks.summary()['handovers'] == 1
    assert judged.summary()['velocity_jump_max'] == pytest.approx(expected)
    assert expected == pytest.approx(0.45 * 0.3 / DT)  # after the kink (weights .4, .9, .95)
    assert first_ticks.summary()['velocity_jump_max'] == pytest.approx(0.1 * 0.3 / DT)
