"""Shared helpers for benchmark reports: statistics, markdown tables, machine description."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# Where a result came from (shared with the evaluator): re-exported for the benchmarks.
from act_ros.provenance import (  # noqa: F401
    BENCH_PACKAGES,
    library_versions,
    machine_description,
    result_provenance,
    source_commit,
)


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """Median, p99 and max in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return {'median_ms': float('nan'), 'p99_ms': float('nan'), 'max_ms': float('nan')}
    return {'median_ms': float(np.median(ms)), 'p99_ms': float(np.percentile(ms, 99)),
            'max_ms': float(ms.max())}


def fmt(value: object, digits: int = 1) -> str:
    if isinstance(value, float):
        if np.isnan(value):
            return 'n/a'
        if value != 0 and (abs(value) < 10 ** -digits or abs(value) >= 1e6):
            return f'{value:.1e}'
        return f'{value:.{digits}f}'
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]], digits: int = 1) -> str:
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '|'.join('---' for _ in headers) + '|']
    for row in rows:
        lines.append('| ' + ' | '.join(fmt(v, digits) for v in row) + ' |')
    return '\n'.join(lines)

