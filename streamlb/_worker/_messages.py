"""Everything that crosses an actor boundary, as frozen dataclasses.

Data lane (router -> owner, numbered per channel): :class:`Batch`, :class:`Marker`,
:class:`Checkpoint`, :class:`Watermark`, :class:`EndOfStream`. Control lane (owner -> owner,
numbered per pair, applied ahead of the data): :class:`Install`, :class:`InstallKeys`,
:class:`Partial`, :class:`PeerEnd`, :class:`Barrier`, :class:`CheckpointPeer`. An
:class:`Envelope` carries one of them with its sender, the sender's incarnation (``run``)
and its sequence number on that lane, so a receiver restores FIFO order and drops messages
of an incarnation it no longer knows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class LazyNeed:
    """What a batch routed in a lazy epoch needs at its new owner: the key requests its
    router had sent by then, per old owner (``old owner -> requests``)."""

    epoch: int
    requests: dict[int, int]


@dataclass(frozen=True)
class Batch:
    """Rows for an owner, with the key group of each row (computed once, by the router;
    None after a non-keyed exchange), when the source emitted them, and, in a lazy epoch,
    what the rows need. ``partials``: rows of split keys this instance aggregates for
    their homes, ``(home, rows, groups)``. ``arrived``: batches queued here, applied as one
    (:mod:`._coalesce`), each already marked as its sender's (``OperatorLogic.arrive``)."""

    frame: pd.DataFrame
    emitted: float
    groups: np.ndarray | None = None
    need: LazyNeed | None = None
    partials: tuple = ()
    arrived: bool = False


@dataclass(frozen=True)
class Marker:
    """The router switched to ``epoch``: no later record on this channel was routed by an
    older table. (Checkpoint barriers are :class:`Checkpoint`.)"""

    epoch: int


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint barrier: no later record on this channel counts towards checkpoint
    ``id``. ``full``: write every key group (no reference to earlier files)."""

    kind = "checkpoint"      # the name errors give it

    id: int
    full: bool = False
    target: str | None = None       # a savepoint's path (None: the job's checkpoint path)


@dataclass(frozen=True)
class CheckpointPeer:
    """Sibling ``sender`` aligned on checkpoint ``id``: every partial aggregate it sent
    for records before the barrier came before this (control lane, FIFO per pair)."""

    kind = "checkpoint_peer"      # the name errors give it

    id: int
    sender: int


@dataclass(frozen=True)
class Watermark:
    """No later record on this channel has an event time before ``time`` (int64
    nanoseconds), unless it is late; ``idle``: the sender is idle and holds nothing back
    until it sends again; ``made_at``: wall-clock time the source made it (what the
    latency of a window's row counts from)."""

    time: int
    idle: bool = False
    made_at: float = 0.0


@dataclass(frozen=True)
class EndOfStream:
    """The sender sends nothing more on this channel."""


@dataclass(frozen=True)
class Install:
    """The state of whole key groups, cut by their old owner in ``epoch``."""

    kind = "install"      # the name errors give it

    epoch: int
    groups: list[int]
    blob: dict


@dataclass(frozen=True)
class InstallKeys:
    """Lazy: the state of single keys the routers asked ``src`` for; ``requests`` lists
    the (router, request number) pairs it serves."""

    kind = "install_keys"      # the name errors give it

    epoch: int
    src: int
    requests: list[tuple[int, int]]
    blob: dict


@dataclass(frozen=True)
class Partial:
    """A helper's partial aggregate of split keys, for their home to merge."""

    kind = "combine"      # the name errors give it

    blob: dict
    emitted: float


@dataclass(frozen=True)
class PeerEnd:
    """Sibling ``sender`` sends no more partial aggregates."""

    kind = "peer_eos"      # the name errors give it

    sender: int


@dataclass(frozen=True)
class PeerWatermark:
    """Sibling ``sender``'s own watermark rose to ``time``: every partial aggregate it sent
    for records before it came first (a window operator with split keys, see
    docs/windows.md)."""

    kind = "peer_watermark"      # the name errors give it

    sender: int
    time: int


@dataclass(frozen=True)
class Barrier:
    """Orders nothing by itself: it returns once every control message the sender sent
    this owner before it is applied (a split key's helper flushing its partials)."""

    kind = "barrier"      # the name errors give it

    epoch: int


@dataclass(frozen=True)
class Envelope:
    """One message on a lane: ``sender`` (instance index), its incarnation ``run``, and
    its number ``seq`` on that lane."""

    sender: int
    seq: int
    msg: Any
    run: int = 0


@dataclass(frozen=True)
class ExchangeSpec:
    """How records reach a stage: ``kind`` keyed or round_robin, the key (a column name or
    a function) and the name of its column, the operator's name; ``balanced``: a balancer
    watches it (routers count records per key group); ``shuffle``: the round-robin policy;
    ``hot_keys``: counters of the heavy-hitter sketch (0: none); ``combine``: the router sums
    each batch per key (and pane, into a window) first (``streamlb._worker._combine``)."""

    kind: str
    name: str
    key: Any = None
    key_name: str = "key"
    balanced: bool = False
    shuffle: dict | None = field(default=None, hash=False)
    hot_keys: int = 0
    combine: Any = None                 # partial tables into an aggregate, a PaneCombine into a window

    @property
    def keyed(self) -> bool:
        return self.kind == "keyed"
