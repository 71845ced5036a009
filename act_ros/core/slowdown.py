"""A deliberately slowed build, to check that the benchmarks catch one (``make bench-check``).

``ACT_ROS_INJECT_SLOWDOWN=F`` (a factor above 1) in the environment makes every model call
of the runtime (:meth:`act_ros.core.inference.ChunkPredictor.normalized_chunk`, in the
node's inference child too: it inherits the environment) and every training step
(:meth:`act_ros.training.loop.Trainer.train_step`) take ``F`` times as long: after the
work, it sleeps ``F - 1`` times what the work took. The same results, computed ``F`` times
slower where the benchmarks measure, on any machine. Unset, or 1: nothing happens (one
float comparison per call). Never set it outside such a check.
"""

from __future__ import annotations

import os
import time

ENV = 'ACT_ROS_INJECT_SLOWDOWN'


def injected_factor() -> float:
    """The slowdown factor asked for in the environment (1.0 when unset)."""
    text = os.environ.get(ENV, '') or '1'
    try:
        factor = float(text)
    except ValueError:
        raise ValueError(f'{ENV} must be a factor >= 1, got {text!r}') from None
    if factor < 1.0:
        raise ValueError(f'{ENV} must be a factor >= 1, got {text!r}')
    return factor


FACTOR = injected_factor()


def injected_slowdown(start: float) -> None:
    """With a factor F, sleep ``F - 1`` times the time since ``start`` (``time.perf_counter``)."""
    if FACTOR > 1.0:
        time.sleep((FACTOR - 1.0) * (time.perf_counter() - start))
