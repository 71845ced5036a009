"""Chunk queue and temporal ensembling aligned to ticks."""

import numpy as np
import pytest
import torch

from act_ros.core.inference.chunking import ChunkQueue, TickEnsembler, TimedChunk


def test_ensembler_matches_lerobot_online_ensembler_one_chunk_per_tick():
    from lerobot.policies.act.modeling_act import ACTTemporalEnsembler

    rng = np.random.default_rng(0)
    chunk_size, coeff = 10, 0.01
    reference = ACTTemporalEnsembler(coeff, chunk_size)
    ours = TickEnsembler(coeff, max_chunks=chunk_size)
    for tick in range(35):
        chunk = rng.normal(size=(chunk_size, 3))
        expected = reference.update(torch.tensor(chunk[None], dtype=torch.float64))[0].numpy()
        ours.add(TimedChunk(tick, chunk))
        # LeRobot keeps its weights in float32.
        np.testing.assert_allclose(ours.action(tick), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize('coeff', [0.0, 0.01, 0.5, -0.2])
def test_ensembler_equals_offline_weighted_average_with_irregular_chunks(coeff):
    """Chunks arrive at irregular ticks (async): each tick blends the chunks covering it."""
    rng = np.random.default_rng(1)
    size = 8
    starts = [0, 3, 4, 9, 15, 16, 17]
    chunks = [TimedChunk(s, rng.normal(size=(size, 2))) for s in starts]
    ens = TickEnsembler(coeff, max_chunks=size)
    arrivals = {s: c for s, c in zip(starts, chunks)}
    for tick in range(30):
        if tick in arrivals:
            ens.add(arrivals[tick])
        covering = [c for c in chunks if c.start_tick <= tick and c.covers(tick)]
        got = ens.action(tick)
        if not covering:
            assert got is None
            continue
        w = np.exp(-coeff * np.arange(len(covering)))
        expected = sum(wi * c.actions[tick - c.start_tick] for wi, c in zip(w, covering)) / w.sum()
        np.testing.assert_allclose(got, expected, atol=1e-12)


def test_ensembler_late_chunk_is_aligned_to_its_observation_tick():
    ens = TickEnsembler(0.0, max_chunks=10)
    ens.add(TimedChunk(0, np.arange(10, dtype=float)[:, None]))
    # A chunk computed from the observation of tick 2 arrives at tick 5.
    ens.add(TimedChunk(2, 100 + np.arange(10, dtype=float)[:, None]))
    assert ens.action(5)[0] == pytest.approx((5 + 103) / 2)
    assert ens.action(10)[0] == pytest.approx(108)   # only the second chunk covers tick 10
    assert ens.action(12) is None


def test_queue_plays_newest_chunk_and_drops_past_actions():
    q = ChunkQueue(horizon=5)
    assert q.action(0) is None and q.remaining(0) == 0
    q.add(TimedChunk(0, np.arange(8, dtype=float)[:, None]))
    assert [q.action(t)[0] for t in range(5)] == [0, 1, 2, 3, 4]
    assert q.action(5) is None  # horizon = n_action_steps
    q.add(TimedChunk(3, 30 + np.arange(8, dtype=float)[:, None]))
    assert q.remaining(4) == 4 and q.action(4)[0] == 31  # tick 3 is already past
    q.add(TimedChunk(1, np.full((8, 1), -1.0)))  # older than the current chunk: ignored
    assert q.action(4)[0] == 31


def test_invalid_settings():
    with pytest.raises(ValueError):
        ChunkQueue(0)
    with pytest.raises(ValueError):
        TickEnsembler(float('nan'), 5)


# ---- blended handover ---------------------------------------------------------------------

def _line(start: int, length: int = 10, base: float = 0.0, slope: float = 1.0) -> TimedChunk:
    """A chunk whose row i (for tick start + i) is base + slope * (start + i), one joint."""
    ticks = np.arange(start, start + length, dtype=float)
    return TimedChunk(start, (base + slope * ticks)[:, None])


def test_blend_keeps_committed_actions_and_crossfades_the_rest_from_the_arrival_tick():
    """A chunk computed at tick 4 arrives at tick 6 (2 ticks of latency): ticks before 6
    keep the old chunk's actions; from 6 on, (1 - w_k) old + w_k new with the new chunk's
    row for that tick (rows 2, 3, ...: not its row 0, meant for a tick already past)."""
    from act_ros.core.inference.chunking import BlendQueue, smoothstep_weights

    q = BlendQueue(blend_ticks=4)
    old, new = _line(0), _line(4, base=100.0)
    q.add(old, now_tick=0)
    before = [float(q.action(t)[0]) for t in range(6)]
    q.add(new, now_tick=6)
    assert before == [float(old.actions[t][0]) for t in range(6)]
    w = smoothstep_weights(4)
    for k in range(4):
        t = 6 + k
        expected = (1 - w[k]) * old.actions[t][0] + w[k] * new.actions[t - 4][0]
        assert q.action(t)[0] == pytest.approx(expected), t
        assert q.fading(t) and q.source(t) == 4
    for t in range(10, 14):  # after the fade: the new chunk alone, to its end
        assert q.action(t)[0] == pytest.approx(new.actions[t - 4][0]) and not q.fading(t)
    assert q.action(14) is None and q.source(14) is None


def test_blend_weights_rise_with_flat_ends_and_zero_window_switches():
    from act_ros.core.inference.chunking import BlendQueue, smoothstep_weights

    w = smoothstep_weights(6)
    assert np.all(np.diff(w) > 0) and 0 < w[0] < 0.1 and 0.9 < w[-1] < 1
    np.testing.assert_allclose(w + w[::-1], 1.0)  # symmetric about the middle
    assert np.diff(w)[0] < np.diff(w)[2] and np.diff(w)[-1] < np.diff(w)[2]  # flat ends
    switch, queue = BlendQueue(0), ChunkQueue(horizon=10)
    for chunk, now in ((_line(0), 0), (_line(4, base=100.0), 6)):
        switch.add(chunk, now_tick=now)
        queue.add(chunk)
    for t in range(6, 14):
        assert switch.action(t)[0] == queue.action(t)[0]


def test_blend_fades_from_the_old_plan_however_it_ends():
    """The old chunk runs out inside the fade: its last action is held (as a position
    controller holds it). A chunk arriving during a fade fades from the blend playing."""
    from act_ros.core.inference.chunking import BlendQueue, smoothstep_weights

    w = smoothstep_weights(4)
    q = BlendQueue(4)
    q.add(_line(0, length=8), now_tick=0)
    q.add(_line(6, base=50.0), now_tick=6)
    # ticks 6, 7 from the old rows; 8, 9 from its last row (7), held.
    for k, old in enumerate([6.0, 7.0, 7.0, 7.0]):
        assert q.action(6 + k)[0] == pytest.approx((1 - w[k]) * old + w[k] * (56.0 + k))
    playing = [float(q.action(t)[0]) for t in range(8, 12)]  # the fade in progress
    q.add(_line(7, base=-50.0), now_tick=8)
    for k in range(4):
        assert q.action(8 + k)[0] == pytest.approx(
            (1 - w[k]) * playing[k] + w[k] * (-50.0 + 8 + k))
    # Older or late chunks are ignored.
    q.add(_line(2, base=1e3), now_tick=9)
    q.add(_line(-20, base=1e3), now_tick=9)
    assert q.latest_start == 7


def test_blend_hides_an_offset_that_chunk_switching_shows():
    """Two chunks that disagree by 0.3: switching steps the command by 0.3 in one tick;
    the 6-tick crossfade spreads it with no tick-to-tick change above a third of it."""
    from act_ros.core.inference.chunking import BlendQueue

    old, new = _line(0, 40, slope=0.01), _line(20, 40, base=0.3, slope=0.01)
    steps = {}
    for name, q in (('switch', BlendQueue(0)), ('blend', BlendQueue(6))):
        q.add(old, now_tick=0)
        played = [q.action(t)[0] for t in range(20, 24)]  # before the new chunk arrives
        q.add(new, now_tick=24)
        played += [q.action(t)[0] for t in range(24, 40)]
        steps[name] = np.abs(np.diff(played)) - 0.01
    assert steps['switch'].max() == pytest.approx(0.3)
    assert steps['blend'].max() < 0.1


@pytest.mark.parametrize('text, ticks', [('6', 6), ('0', 0), ('0.2s', 6), (' 0.5s', 15),
                                         ('0s', 0)])
def test_blend_window_in_ticks_or_seconds(text, ticks):
    from act_ros.core.inference.chunking import blend_window_ticks

    assert blend_window_ticks(text, 30.0) == ticks


@pytest.mark.parametrize('text', ['-1', 'abc', '0.2', '-0.1s', 'nans', 's'])
def test_blend_window_refuses_what_it_cannot_read(text):
    from act_ros.core.inference.chunking import blend_window_ticks

    with pytest.raises(ValueError, match="expected ticks .* or seconds"):
        blend_window_ticks(text, 30.0)


@pytest.mark.parametrize('store', ['queue', 'ensemble', 'blend'])
def test_preview_is_what_the_next_ticks_play_and_changes_nothing(store):
    from act_ros.core.inference.chunking import BlendQueue

    q = {'queue': lambda: ChunkQueue(10), 'ensemble': lambda: TickEnsembler(0.01, 10),
         'blend': lambda: BlendQueue(3)}[store]()
    for chunk, now in ((_line(0), 0), (_line(4, base=20.0), 5)):
        q.add(chunk, now_tick=now) if store == 'blend' else q.add(chunk)
    preview = q.preview(5, 100)
    assert preview.shape == (9, 1)  # ticks 5 .. 13: the newest chunk's end
    assert q.preview(5, 3).shape == (3, 1)
    played = np.stack([q.action(t) for t in range(5, 14)])
    np.testing.assert_allclose(preview, played)
    assert q.preview(14, 5) is None
