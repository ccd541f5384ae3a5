"""What one epoch moves, as one owner sees it, and the rows an owner holds back meanwhile."""
from __future__ import annotations

import asyncio
import collections
import time

import numpy as np


def budget_chunks(items: list, step: int, size, budget: int) -> list[list]:
    """Cut ``items`` in order into chunks of at least ``step`` items, each taking more while
    the sizes (``size(item)``, keys held) it adds up stay within ``budget``: small key groups
    move together rather than a round (or a scan of the state) apiece. A ``budget`` of 0
    (or less) leaves ``step`` items a chunk, and ``size`` is not called.

    >>> budget_chunks([1, 2, 3, 4, 5], 2, lambda g: {3: 9}.get(g, 1), 4)
    [[1, 2], [3, 4], [5]]
    >>> budget_chunks([1, 2, 3, 4, 5], 2, None, 0)
    [[1, 2], [3, 4], [5]]
    """
    step = max(1, int(step))
    if budget <= 0:
        return [items[i:i + step] for i in range(0, len(items), step)]
    chunks: list[list] = []
    cur: list = []
    held = 0
    for item in items:
        n = size(item)
        if len(cur) >= step and held + n > budget:
            chunks.append(cur)
            cur, held = [], 0
        cur.append(item)
        held += n
    return chunks + [cur] if cur else chunks


class EpochMove:
    """The part of epoch ``epoch`` one owner takes part in."""

    def __init__(self, epoch: int, strategy: str) -> None:
        self.epoch = epoch
        self.strategy = strategy
        self.outgoing: dict[int, int] = {}     # key group -> new owner
        self.incoming: dict[int, int] = {}     # key group -> old owner
        self.aligned = False
        # old owner: ship once aligned *and* armed (the coordinator arms it with the switch,
        # once every new owner accepted the epoch)
        self.armed = True
        self.watching = False                  # asked the aligner to say when it is aligned
        self.sent: set[int] = set()
        self.installed: set[int] = set()
        self.flush_to: set[int] = set()        # split keys leaving this helper: their homes
        self.flushed = False
        self.key_requests: list[tuple] = []    # lazy, old owner: key requests before alignment
        self.pulled = asyncio.Event()          # lazy, old owner: a key request was served
        # lazy, new owner: per (router, old owner), how many of the router's key requests
        # have been served in a row from the first (and those served out of order)
        self.served: dict[tuple[int, int], int] = {}
        self.served_early: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
        self.applied_while_waiting = 0
        self.first_applied: float | None = None      # first held row of a moved group applied
        self.aligned_at: float | None = None         # old owner: markers from every router
        self.installed_at: float | None = None       # new owner: the last incoming group installed
        self.settling = False                        # new owner: what the moved groups owe is going out

    @property
    def done(self) -> bool:
        # an owner may give and take key groups in the same epoch: both sides must be through
        return (len(self.sent) == len(self.outgoing) and len(self.installed) == len(self.incoming)
                and (self.flushed or not self.flush_to))

    def serve(self, router: int, old: int, request: int) -> None:
        """Key request ``request`` of ``router`` to ``old`` is installed here."""
        early = self.served_early[(router, old)]
        early.add(request)
        n = self.served.get((router, old), 0)
        while n + 1 in early:
            early.discard(n + 1)
            n += 1
        self.served[(router, old)] = n

    def ready(self, router: int, need: dict) -> bool:
        """Whether every key request ``router`` had sent by a batch (``need``: old owner ->
        requests) is installed: then each key of that batch has its state here, or none."""
        return all(self.served.get((router, o), 0) >= n for o, n in need.items())

    def lazy_rows(self, groups: np.ndarray, pending: dict) -> np.ndarray:
        """Rows of ``groups`` whose state this (lazy) epoch is still bringing."""
        mine = [g for g, m in pending.items() if m is self]
        return np.isin(groups, np.asarray(mine, np.int64)) if mine else np.zeros(len(groups), bool)

    def status(self) -> dict:
        return {"applied_while_waiting": self.applied_while_waiting, "first_applied": self.first_applied,
                "aligned_at": self.aligned_at, "installed_at": self.installed_at}


class Held:
    """Rows of key groups whose state has not arrived yet, with their batch's credit and,
    for a lazy epoch, what the batch needs (epoch, router, old owner -> requests)."""

    __slots__ = ("frame", "groups", "emitted", "fut", "need")

    def __init__(self, frame, groups, emitted, fut, need=None) -> None:
        self.frame, self.groups, self.emitted, self.fut, self.need = frame, groups, emitted, fut, need


def unique(moves) -> list[EpochMove]:
    """Each move once, in order of first appearance."""
    return list({id(m): m for m in moves}.values())


def mark_first(moves) -> None:
    now = time.time()
    for m in moves:
        m.first_applied = m.first_applied or now
