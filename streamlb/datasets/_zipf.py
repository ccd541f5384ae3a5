"""Zipf keys and per-row randomness for the generated datasets (``streamlb.datasets``):
every value is a deterministic function of ``(seed, row id)``, whatever batches the rows
come in. The tables a key draw needs (the Zipf CDF, its guide, the key permutation) are
built once per process."""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pandas as pd

_BLOCK = 1 << 16                 # rows per RNG block: randomness depends on the row id only


def _blocks(ids: np.ndarray, seed: int, salt: int, draw: Callable[[np.random.Generator, int], dict]):
    """Columns for ``ids`` where each 65536-row block has its own RNG stream."""
    out: dict[str, list] = {}
    for b in np.unique(ids // _BLOCK):
        sel = ids[(ids // _BLOCK) == b]
        cols = draw(np.random.default_rng([seed, salt, int(b)]), _BLOCK)
        for k, v in cols.items():
            out.setdefault(k, []).append(v[sel - b * _BLOCK])
    return {k: np.concatenate(v) for k, v in out.items()}


def _masked(values: np.ndarray, keep: np.ndarray):
    """Nullable Int64 with nulls where ``keep`` is False."""
    out = pd.array(values, dtype="Int64")
    out[~keep] = pd.NA
    return out


def _zipf_cdf(keys: int, skew: float) -> np.ndarray:
    w = np.arange(1, keys + 1, dtype=np.float64) ** -float(skew)
    cdf = np.cumsum(w)
    return cdf / cdf[-1]


@functools.lru_cache(maxsize=1)
def _zipf_table(keys: int, skew: float) -> tuple[np.ndarray, np.ndarray]:
    """The Zipf CDF over ``keys`` ranks and a guide to it, built once per process (read-only).

    ``guide[j]`` is ``searchsorted(cdf, j / G, "right")`` for ``G = len(guide) - 1``, a power
    of two: the rank of a draw ``u`` lies in ``guide[floor(u * G)] .. guide[floor(u * G) + 1]``
    (``u * G`` is exact), a few entries where a plain search of a large CDF would miss the
    cache some 20 times per draw.
    """
    cdf = _zipf_cdf(keys, skew)
    g = 1 << min(22, max(0, keys - 1).bit_length())
    guide = np.searchsorted(cdf, np.arange(g + 1) / g, side="right")
    for a in (cdf, guide):
        a.flags.writeable = False
    return cdf, guide


def _zipf_ranks(u: np.ndarray, keys: int, skew: float) -> np.ndarray:
    """``min(searchsorted(cdf, u, "right"), keys - 1)`` for draws ``u`` in [0, 1), through
    the guide of :func:`_zipf_table`: a bisection of each draw's few candidate entries, run
    on all draws at once and on fewer each step."""
    cdf, guide = _zipf_table(keys, skew)
    j = (u * (len(guide) - 1)).astype(np.int64)
    lo, hi = guide[j], guide[j + 1]
    todo = np.flatnonzero(lo < hi)
    while todo.size:               # the rank is the count of cdf entries <= u, in lo..hi
        l, h, x = lo[todo], hi[todo], u[todo]
        mid = (l + h) >> 1
        up = cdf[mid] <= x
        lo[todo] = np.where(up, mid + 1, l)
        hi[todo] = np.where(up, h, mid)
        todo = todo[lo[todo] < hi[todo]]
    return np.minimum(lo, keys - 1)


@functools.lru_cache(maxsize=1)
def _key_permutation(keys: int, seed: int) -> np.ndarray:
    """Key id of each Zipf rank, computed once per process (read-only; int32 when it fits)."""
    perm = np.random.default_rng([seed, 0]).permutation(keys)
    if keys <= np.iinfo(np.int32).max:
        perm = perm.astype(np.int32)
    perm.flags.writeable = False
    return perm


def zipf_keys(ids: np.ndarray, keys: int, skew: float, drift_every: int | None, seed: int) -> np.ndarray:
    """The key of each row id: Zipf(skew) ranks mapped to key ids; hot set rotates with drift.

    The CDF and the rank-to-key permutation (about 200 MB at 14M keys) are built once per
    process and kept for the next call with the same ``keys``, ``skew`` and ``seed``, so each
    Spark batch costs only its own rows.
    """
    u = _blocks(ids, seed, 1, lambda r, n: {"u": r.random(n)})["u"]
    ranks = _zipf_ranks(u, int(keys), float(skew))
    if drift_every:
        ranks = (ranks + (ids // drift_every) * (keys // 3 + 7)) % keys
    return _key_permutation(int(keys), int(seed))[ranks].astype(np.int64)
