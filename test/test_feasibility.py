"""The real-time verdict as a table: chunk execution holds the rate when 2 (L + margin) <= C,
ensembling when 2L <= C (and it reports the blend's refresh rate), synchronous execution
when one call fits in a period; an infeasible verdict names what would fit."""

import pytest

from act_ros.core.feasibility import Latency, verdict


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
