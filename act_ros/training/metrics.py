"""``training_metrics.json`` and the PNG plots beside it.

Only numbers measured in the run are written: a value that was not measured (no
validation set, no closed-loop evaluation) is absent or ``null``, never a placeholder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from act_ros.core.atomic import write_json_atomic  # noqa: F401  (used by train, demo)

logger = logging.getLogger(__name__)
METRICS_FILE = 'training_metrics.json'
LOSS_PLOT = 'plot_loss.png'
ALIGN_PLOT = 'plot_align_rate.png'
CURVE_PLOT = 'plot_learning_curve.png'


@dataclass
class History:
    """What was measured, step by step (``step`` = optimizer steps completed)."""

    train: list[dict[str, float]] = field(default_factory=list)
    val: list[dict[str, float]] = field(default_factory=list)
    closed_loop: list[dict[str, Any]] = field(default_factory=list)
    _pending: list[tuple[int, dict[str, torch.Tensor], float, float | None]] = field(
        default_factory=list, repr=False)

    def add_train(self, step: int, terms: dict[str, torch.Tensor], lr: float, *,
                  wall_s: float | None = None) -> None:
        """Keep the detached loss terms of a step (and the run's wall clock when it ended,
        resumed sessions included); converted to floats in :meth:`flush`."""
        self._pending.append((step, terms, lr, wall_s))

    def flush(self) -> dict[str, float] | None:
        """Convert pending terms with one device sync; returns the latest entry."""
        if not self._pending:
            return self.train[-1] if self.train else None
        # Rows may carry different terms (the pose loss stops where the backbone freezes).
        values = iter(torch.stack([v.float() for _, t, _, _ in self._pending
                                   for v in t.values()]).cpu().tolist())
        for step, terms, lr, wall_s in self._pending:
            entry = {'step': step, **{k: next(values) for k in terms}, 'lr': lr}
            if wall_s is not None:
                entry['wall_s'] = wall_s
            self.train.append(entry)
        self._pending.clear()
        return self.train[-1]

    def to_dict(self) -> dict[str, Any]:
        self.flush()
        return {'train': self.train, 'val': self.val, 'closed_loop': self.closed_loop}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> History:
        return cls(train=list(data.get('train', [])), val=list(data.get('val', [])),
                   closed_loop=list(data.get('closed_loop', [])))


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/inf: an unmeasured or non-finite value is written as null."""
    if value is None:
        return None
    value = float(value)
    return value if value == value and abs(value) != float('inf') else None


def write_plots(output_dir: Path, history: History) -> list[str]:
    """PNG plots of train loss / L1 / val L1 and of the closed-loop align rate.

    Returns the file names written (none when matplotlib is not installed: logged).
    """
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning('matplotlib is not installed: no plots written (pip install matplotlib)')
        return []
    history.flush()
    written = []
    if history.train:
        fig, ax = plt.subplots(figsize=(7, 4))
        steps = [r['step'] for r in history.train]
        ax.plot(steps, [r['loss'] for r in history.train], lw=0.8, alpha=0.6, label='train loss')
        ax.plot(steps, [r['l1'] for r in history.train], lw=0.8, alpha=0.8,
                label='train L1 (weighted)')
        if history.val:
            val_steps = [r['step'] for r in history.val]
            ax.plot(val_steps, [r['val_l1_weighted'] for r in history.val], 'o-',
                    label='val L1 (weighted)')
            ax.plot(val_steps, [r['val_l1'] for r in history.val], 's--', label='val L1')
        ax.set_yscale('log')
        written.append(_save_plot(plt, fig, ax, 'loss (normalized units)', output_dir, LOSS_PLOT))
    if history.closed_loop:
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode in ('chunk', 'ensemble'):
            rows = [r for r in history.closed_loop if mode in r]
            if rows:
                ax.plot([r['step'] for r in rows], [_success(r[mode]) for r in rows], 'o-',
                        label=f'success rate ({mode})')
        ax.set_ylim(-0.02, 1.02)
        written.append(_save_plot(plt, fig, ax, 'success rate', output_dir, ALIGN_PLOT))
    if history.train and history.closed_loop:
        written.append(_learning_curve(plt, history, output_dir))
    return written


def _success(result: dict) -> float:
    """A closed-loop result's success rate (results from before tasks had one: the
    package task's align rate, the same figure)."""
    return result.get('success_rate', result.get('align_rate', 0.0))


def _learning_curve(plt, history: History, output_dir: Path) -> str:
    """Train/val L1 and closed-loop align rate against steps, with the run's wall clock
    (minutes, from the logged ``wall_s``) as a second axis along the top."""
    import numpy as np

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    steps = [r['step'] for r in history.train]
    top.plot(steps, [r['l1'] for r in history.train], lw=0.6, alpha=0.7,
             label='train L1 (weighted)')
    if history.val:
        top.plot([r['step'] for r in history.val], [r['val_l1'] for r in history.val], 'o-',
                 label='val L1')
    top.set_yscale('log')
    top.set_ylabel('L1 (normalized units)')
    for mode in ('chunk', 'ensemble'):
        rows = [r for r in history.closed_loop if mode in r]
        if rows:
            bottom.plot([r['step'] for r in rows], [_success(r[mode]) for r in rows], 'o-',
                        label=f'success rate, {mode} ({rows[-1][mode]["count"]} episodes)')
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_ylabel('closed-loop success rate')
    bottom.set_xlabel('optimizer step')
    timed = [(r['step'], r['wall_s'] / 60.0) for r in history.train if 'wall_s' in r]
    if len(timed) >= 2:
        s, m = (np.array(v, dtype=float) for v in zip(*timed))
        wall = top.secondary_xaxis('top', functions=(lambda x: np.interp(x, s, m),
                                                     lambda x: np.interp(x, m, s)))
        wall.set_xlabel('wall clock (min)')
        wall.set_xticks(_spread_ticks(m, s))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(loc='best')
    fig.tight_layout()
    fig.savefig(output_dir / CURVE_PLOT, dpi=100)
    plt.close(fig)
    return CURVE_PLOT


def _spread_ticks(minutes, steps, count: int = 8, min_gap: float = 0.07) -> list[float]:
    """Wall-clock ticks (minutes) for the step axis, dropping any that would sit closer
    than ``min_gap`` of the step range to the previous one: the clock is not linear in
    steps (a frozen stage's cache is built in minutes without a step), so evenly spaced
    minutes can pile up at one step."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    span = max(float(steps[-1] - steps[0]), 1e-9)
    kept: list[float] = []
    last = None
    for tick in MaxNLocator(count).tick_values(float(minutes[0]), float(minutes[-1])):
        if not minutes[0] <= tick <= minutes[-1]:
            continue
        at = float(np.interp(tick, minutes, steps))
        if last is None or (at - last) / span >= min_gap:
            kept.append(float(tick))
            last = at
    return kept


def _save_plot(plt, fig, ax, ylabel: str, output_dir: Path, name: str) -> str:
    """Label the step axis, add grid and legend, write ``output_dir / name``; return ``name``."""
    ax.set_xlabel('step')
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(output_dir / name, dpi=100)
    plt.close(fig)
    return name
