"""Latency histograms: the fixed bins every instance counts its records' latencies in.

Each load window an instance reports how many records were applied with a latency in each
bin (``Job.metrics()`` column ``latency_hist``, and the ``latency_hist`` of its load report to
the balancer plugin). Histograms of several windows or instances add up, so a percentile
over any span (a migration, a steady stretch) is one :func:`quantile` of their sum, where a
percentile of per-window percentiles would not be a percentile of anything.

The bins grow by a factor 2**(1/4) (about 19%) from 0.25 ms; the last one is open-ended.
"""
from __future__ import annotations

import numpy as np

__all__ = ["EDGES_MS", "BINS", "histogram", "quantile"]

# 0, then 0.25 ms * 2**(i/4) up to about 0.25 * 2**20 ms (4.4 min), then infinity
EDGES_MS = np.concatenate(([0.0], 0.25 * 2.0 ** (np.arange(81) / 4), [np.inf]))
BINS = len(EDGES_MS) - 1


def histogram(latencies_ms, weights=None) -> np.ndarray:
    """Records per bin: ``latencies_ms`` of batches, each weighted by its ``weights``
    (records; 1 each if None). Negative latencies (clock skew) count in the first bin."""
    lat = np.clip(np.asarray(latencies_ms, dtype=np.float64), 0.0, None)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    counts, _ = np.histogram(lat, bins=EDGES_MS, weights=w)
    return np.rint(counts).astype(np.int64)


def quantile(counts, q: float) -> float:
    """The ``q`` quantile (0..1) of the latencies counted in ``counts`` (one histogram, or
    the sum of several), interpolated within its bin on a log scale; NaN if empty."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape != (BINS,):
        raise ValueError(f"a latency histogram has {BINS} bins (streamlb.latency.EDGES_MS), got shape {counts.shape}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must lie in 0..1, got {q!r}")
    total = counts.sum()
    if total <= 0:
        return float("nan")
    cum = np.cumsum(counts)
    if q * total <= 0:              # the smallest latency: the lower edge of the first bin used
        return float(EDGES_MS[int(np.flatnonzero(counts)[0])])
    i = int(np.searchsorted(cum, q * total, side="left"))
    i = min(i, BINS - 1)
    lo, hi = EDGES_MS[i], EDGES_MS[i + 1]
    if not np.isfinite(hi):
        return float(lo)
    before = cum[i] - counts[i]
    frac = (q * total - before) / counts[i] if counts[i] > 0 else 1.0
    if lo <= 0.0:
        return float(hi * frac)
    return float(lo * (hi / lo) ** frac)
