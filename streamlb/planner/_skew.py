"""A keyed operator's first routing table, from a sample of its keys.

Key groups are spread over an operator's instances in contiguous ranges of equal size
(``RoutingTable.initial``) unless something is known of the keys. When the operator reads
a Parquet source's rows as they are (its exchange is the source's own, no step between
that could change or drop keys) and keys them by a column, the driver reads up to
``streamlb.exchange.sample-keys`` keys of that column before the job starts (the first
rows of up to :data:`FILES` files, spread over the source's files) and gives each instance
key groups of about equal sampled weight (largest first, each to the least loaded
instance). On the issue 27 log (Zipf 1.2 over 100k keys, one key 20% of the records) the
equal ranges put 65% of the records on one of two instances; the sampled table about 50%.
Key groups the sample did not see are dealt to the instances in turn.

Not for an ``aggregate`` whose rows arrive summed per key (``_worker/_combine.py``): its
work per group is its distinct keys per batch, not its records. The balancer, if the job
has one, starts from this table, and a rescale or a restore with another parallelism plans
its own.
"""
from __future__ import annotations

import numpy as np

from .. import config
from ..routing import RoutingTable

FILES = 64              # files read for the sample, at most


def first_tables(stages: list, key_groups: int) -> dict[int, RoutingTable]:
    """The first routing table of each keyed stage: sampled where it applies (see the
    module), else contiguous ranges."""
    by_id = {s.id: s for s in stages}
    out = {}
    for st in stages:
        if st.exchange != "keyed":
            continue
        owners = sampled_owners(st, by_id, key_groups)
        out[st.id] = (RoutingTable(owners, st.parallelism) if owners is not None
                      else RoutingTable.initial(key_groups, st.parallelism))
    return out


def sampled_owners(st, by_id: dict, key_groups: int) -> np.ndarray | None:
    """The owners array planned from a sample of ``st``'s keys, or None where it does not
    apply."""
    from .._placement import combine_for

    budget = int(config.get("exchange.sample-keys") or 0)
    if budget <= 0 or st.parallelism < 2 or len(st.inputs) != 1 or combine_for(st) is not None:
        return None
    src = by_id.get(st.inputs[0])
    if src is None or src.kind != "parquet_source" or not src.files:
        return None
    key = st.key_of(src.id)
    if not isinstance(key, str) or not any(c.kind == "exchange" and c.target == st.id for c in src.children):
        return None
    from ..keygroups import assign_to_key_group

    try:
        keys = _sample(src.files, key, budget)
        if keys is None or not len(keys):
            return None
        groups = assign_to_key_group(keys, key_groups, name=key)
    except Exception:       # files or keys the job itself refuses, naming them: leave it to it
        return None
    return balanced_owners(np.bincount(groups, minlength=key_groups).astype(np.float64), st.parallelism)


def _sample(files: list, column: str, budget: int) -> np.ndarray | None:
    """Up to ``budget`` values of ``column``: the first rows of up to :data:`FILES` files
    spread over ``files``; None if a file lacks the column."""
    import pyarrow.parquet as pq

    picked = [files[i] for i in np.unique(np.linspace(0, len(files) - 1, min(len(files), FILES)).astype(int))]
    per_file = max(budget // len(picked), 1)
    parts = []
    for f in picked:
        pf = pq.ParquetFile(f)
        if column not in pf.schema_arrow.names:
            return None
        rb = next(pf.iter_batches(batch_size=per_file, columns=[column], use_threads=False), None)
        if rb is not None and rb.num_rows:
            col = rb.column(0).drop_null()
            parts.append(col.to_numpy(zero_copy_only=False))
    return np.concatenate(parts) if parts else None


def balanced_owners(weights: np.ndarray, parallelism: int) -> np.ndarray:
    """Owners of key groups of ``weights``, about equal weight per instance: heaviest group
    first, each to the instance with the least so far (ties: the lower index); the groups
    the sample did not see are then dealt in turn, least loaded instance first.

    >>> balanced_owners(np.array([6.0, 2, 2, 2, 0, 0, 0]), 2).tolist()
    [0, 1, 1, 1, 0, 1, 0]
    """
    load = np.zeros(parallelism)
    owners = np.empty(len(weights), np.int64)
    seen = np.flatnonzero(weights > 0)
    for g in seen[np.argsort(-weights[seen], kind="stable")].tolist():
        i = int(np.argmin(load))
        owners[g] = i
        load[i] += weights[g]
    unseen = np.flatnonzero(weights <= 0)
    owners[unseen] = np.argsort(load, kind="stable")[np.arange(len(unseen)) % parallelism]
    return owners
