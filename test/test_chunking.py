"""Chunk queue and temporal ensembling aligned to ticks."""

import numpy as np
import pytest
import torch

from act_ros.core.chunking import ChunkQueue, TickEnsembler, TimedChunk


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
