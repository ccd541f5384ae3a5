"""Routers: how a stage's output reaches the instances of the next stage.

A :class:`KeyedRouter` hashes each record's key once (its key group travels with the batch,
so nothing downstream hashes it again), routes by the table in force, spreads split keys
over their helpers, counts what it routed for the balancer, keeps the heavy-hitter sketch,
and during a lazy epoch asks old owners for moving keys. A :class:`ShuffleExchange` sends
whole batches round robin, to the shortest queue, or by estimated cost (osg).
"""
from __future__ import annotations

import asyncio
import numbers
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from .. import _shuffle
from .._functions import describe
from ._prefetch import Prefetch
from ..exceptions import PipelineError, SchemaError, UserFunctionError
from ..hotkeys import SpaceSaving
from ..keygroups import assign_to_key_group
from .._plan._step import Step
from ..routing import RoutingTable
from ._channels import OutChannel
from .._state._partials import RECORDS
from ._combine import Combiner
from ._commands import FetchKeys
from ._messages import Batch, Checkpoint, EndOfStream, ExchangeSpec, Marker, Watermark
from .._sinks import DeadLetters
from ._steps import call_user


def _frame_of(x, spec: ExchangeSpec, upstream: str) -> pd.DataFrame:
    if not isinstance(x, pd.DataFrame):
        raise PipelineError(
            f"operator {spec.name!r} receives {type(x).__name__} from {upstream!r}; "
            "batches crossing an exchange must be pandas DataFrames"
        )
    return x


class _Exchange:
    """Channels to the instances of one downstream stage (instance index -> channel);
    instances may be added and removed while the job runs."""

    def __init__(self, spec: ExchangeSpec, upstream: str, chans: dict[int, OutChannel]) -> None:
        self.spec, self.upstream, self.chans = spec, upstream, chans
        self.base = 0       # routers into the same stage from its earlier inputs (load reports)
        self.lock = asyncio.Lock()          # a batch, a marker or the end goes out whole
        self.ended = False
        self.last_watermark: Watermark | None = None   # a new channel starts at it

    async def add_peer(self, index: int, chan: OutChannel) -> None:
        """A new instance ``index`` (after the end of stream, it is told at once)."""
        async with self.lock:
            self.chans[index] = chan
            self.resized()
            await self._catch_up(chan)

    async def _catch_up(self, chan: OutChannel) -> None:
        """A new channel starts at this sender's watermark (or its end of stream)."""
        if self.ended:
            await chan.send(EndOfStream())
        elif self.last_watermark is not None:
            await chan.send(self.last_watermark)

    async def remove_peer(self, index: int) -> None:
        """Stop sending to instance ``index``; return once nothing is in flight to it."""
        async with self.lock:
            ch = self.chans.pop(index, None)
            self.resized()
        if ch is not None:
            await ch.drain()

    async def replace_peer(self, index: int, chan: OutChannel) -> None:
        """Instance ``index`` moves to another actor: once everything sent to the old one
        was applied, send to ``chan`` (nothing else goes out meanwhile)."""
        async with self.lock:
            old = self.chans[index]
            await old.drain()
            self.chans[index] = chan
            await self._catch_up(chan)

    async def mark(self, epoch: int) -> None:
        """Marker(``epoch``) on every channel, between two batches."""
        async with self.lock:
            if not self.ended:
                for ch in self.chans.values():
                    await ch.send(Marker(epoch))

    async def checkpoint(self, cid: int, full: bool, target: str | None = None) -> None:
        """The barrier of checkpoint ``cid`` on every channel, between two batches."""
        async with self.lock:
            if not self.ended:
                for ch in self.chans.values():
                    await ch.send(Checkpoint(cid, full, target))

    async def watermark(self, wm: Watermark) -> None:
        """Watermark ``wm`` on every channel, between two batches."""
        async with self.lock:
            self.last_watermark = wm
            if not self.ended:
                for ch in self.chans.values():
                    await ch.send(wm)

    def resized(self) -> None:
        """The set of instances changed."""

    async def end(self) -> None:
        """End of stream on every channel."""
        async with self.lock:
            for ch in self.chans.values():
                await ch.send(EndOfStream())
            self.ended = True

    async def drain(self) -> None:
        for ch in list(self.chans.values()):     # instances may be added meanwhile
            await ch.drain()

    def in_flight(self) -> bool:
        return any(ch.tasks for ch in list(self.chans.values()))


class ShuffleExchange(_Exchange):
    """Round robin, jsq or osg (see :mod:`streamlb._shuffle`)."""

    def __init__(self, spec: ExchangeSpec, upstream: str, chans: dict[int, OutChannel]) -> None:
        super().__init__(spec, upstream, chans)
        sh = spec.shuffle
        self.router = _shuffle.ShuffleRouter(sh["policy"], len(chans), sh["feature"], sh["group"])
        self.order = sorted(chans)

    def resized(self) -> None:
        # the router counts instances 0..n-1; while several retire one by one, the channels
        # left may skip an index (2 gone, 3 and 4 not yet): the router's i-th is the i-th left
        self.order = sorted(self.chans)
        self.router.resize(len(self.chans))

    async def send(self, x, emitted: float) -> None:
        x = _frame_of(x, self.spec, self.upstream)
        if not len(x):
            return
        router = self.router
        async with self.lock:           # instances may be added or retired between batches
            order = self.order
            for i, piece, cost in router.route(x, self.spec.name):
                await self.chans[order[i]].send(Batch(piece, emitted),
                                                lambda reply, i=i, cost=cost: router.done(i, cost, reply))


class KeyedRouter(_Exchange):
    """The keyed exchange into one stage, as seen by one router instance."""

    def __init__(self, spec: ExchangeSpec, upstream: str, chans: dict[int, OutChannel], table: RoutingTable,
                 *, index: int, dead: DeadLetters, spawn: Callable, lazy_asked: int) -> None:
        super().__init__(spec, upstream, chans)
        self.index = index                             # this router's instance number
        self.table = table
        self.key_groups = table.key_groups
        # groups travel with every batch: in the smallest dtype that holds them
        self.group_dtype = np.min_scalar_type(self.key_groups - 1) if self.key_groups <= 1 << 16 else np.int64
        self.dead, self.spawn, self.lazy_asked = dead, spawn, lazy_asked
        self.prefetch: Prefetch | None = None
        self.spread_at: dict = {}                      # rows sent per split key and instance
        self.hot = SpaceSaving(spec.hot_keys) if spec.hot_keys else None
        self.combiner = Combiner.of(spec.key_name, spec.combine)
        self.key_kind: str | None = None               # the operator's keys (see key_kind_of), once seen
        self.floor_lost = False                        # into a window: see watermark()
        self.counts = np.zeros(self.key_groups, np.int64) if spec.balanced else None
        self.routed: np.ndarray | None = None          # records sent per instance, once any

    # -- the epoch protocol, router side ------------------------------------------------------
    async def set_table(self, table: RoutingTable, prefetch: dict | None) -> tuple[float, bool]:
        """Switch to ``table`` at a batch boundary and put marker(epoch) on every channel;
        returns when the switch happened and whether markers went out. ``prefetch`` (lazy
        epochs): key group -> old owner."""
        if prefetch is None and self._only_adds_helpers(table):
            # nobody waits for this epoch's marker, and a batch routes by the table it read
            # when it began: switch now, not after a batch stalled on credits
            self.table = table
            return time.time(), False
        async with self.lock:
            self.table = table
            switched = time.time()
            self.prefetch = Prefetch(
                table.epoch, {int(g): int(o) for g, o in prefetch.items()}, self.key_groups,
                table.owners[np.fromiter(prefetch, np.int64, len(prefetch))].tolist(),
                self.lazy_asked) if prefetch else None
            marked = not self.ended     # after the end of stream no record follows anyway
            if marked:
                for ch in self.chans.values():
                    await ch.send(Marker(table.epoch))
        return switched, marked

    def _only_adds_helpers(self, table: RoutingTable) -> bool:
        """``table`` differs from the one in force only by new helpers of split keys: no key
        group moves and no helper stops, so no owner aligns on its marker."""
        old = self.table
        if not np.array_equal(old.owners, table.owners):
            return False
        now, new = old.split_map(), table.split_map()
        return all(set(h) <= set(new.get(k, ())) for k, h in now.items())

    async def watermark(self, wm: Watermark) -> None:
        """As for any exchange; into a window, ``wm`` is the floor of the batches that
        follow (see ``Combiner.combine``). An idle watermark lets the owners go past this
        router's: no floor from then on."""
        await super().watermark(wm)
        self.floor_lost = self.floor_lost or wm.idle

    @property
    def floor(self) -> int | None:
        """The watermark sent last, unless there is none or an idle one went out."""
        wm = self.last_watermark
        return None if wm is None or self.floor_lost else int(wm.time)

    def forget(self, epoch: int) -> None:
        if self.prefetch is not None and self.prefetch.epoch == epoch:
            self.prefetch = None

    # -- data ---------------------------------------------------------------------------------
    async def send(self, x, emitted: float) -> None:
        x = _frame_of(x, self.spec, self.upstream)
        if not len(x):
            return
        async with self.lock:
            x, keys = self._keys(x)
            if len(x):
                await self._route(x, keys, emitted)

    def _keys(self, x: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        """The batch with its key column (bad keys sent to the dead letters) and the keys."""
        spec = self.spec
        key, key_name = spec.key, spec.key_name
        if isinstance(key, str):
            if key not in x.columns:
                raise SchemaError(
                    f"operator {spec.name!r} keys by column {key!r}, which the batch from "
                    f"{self.upstream!r} lacks; columns: {', '.join(map(str, x.columns))}"
                )
            keys = x[key].to_numpy()
        else:
            if key_name in x.columns:
                raise PipelineError(
                    f"operator {spec.name!r}: key_by({describe(key)}) would overwrite column "
                    f"{key_name!r}; pass key_by(func, name=...) with a new column name"
                )
            keys = np.asarray(call_user(self.upstream, Step("key_by"), key, x))
            if keys.shape != (len(x),):
                raise UserFunctionError(
                    f"operator {spec.name!r}: key function {describe(key)} returned {keys.shape} keys "
                    f"for a batch of {len(x)} rows; return one key per row",
                    operator=spec.name, function=describe(key),
                )
            x = x.assign(**{key_name: keys})
        if self.key_kind is None:
            self.key_kind = key_kind_of(x[key_name])
        bad, reasons = bad_keys(x[key_name], self.key_kind)
        if bad is not None:
            self.dead.add(spec.name, x[bad], reasons)
            x = x[~bad]
            keys = x[key_name].to_numpy()
        if keys.dtype == object and self.key_kind in ("i", "b"):
            # Python ints or bools left in an object column: hashed as the operator's others
            keys = keys.astype(np.int64 if self.key_kind == "i" else bool)
            x = x.assign(**{key_name: keys})
        if keys.dtype.kind == "f" and np.array_equal(keys, np.round(keys)):
            keys = keys.astype(np.int64)     # an int column that held nulls, now removed
            x = x.assign(**{key_name: keys})
        return x, keys

    async def _route(self, x: pd.DataFrame, keys: np.ndarray, emitted: float) -> None:
        table = self.table
        weights = None                      # records per row, of a combined batch
        if self.hot is not None:
            self.hot.add(keys)
        if self.combiner is not None and not table.splits and self.prefetch is None:
            c = self.combiner.combine(x, keys, self.floor)
            if c is not None:
                x, keys, weights = c, c[self.spec.key_name].to_numpy(), c[RECORDS].to_numpy()
        groups = assign_to_key_group(keys, self.key_groups, name=self.spec.key_name, dtype=self.group_dtype)
        partial = None
        if table.splits:
            dest, partial = table.spread(keys, groups, self.spread_at)
            if not partial.any():
                partial = None
        else:
            dest = table.route(groups)
        pf = self.prefetch
        if pf is not None:
            for src, to, k, g, request in pf.requests(keys, groups, dest):
                # the owners know this router by its sender id there (input slot and index),
                # as its batches' ``need`` is judged: two inputs' routers must not share one
                ch = self.chans[src]
                self.spawn(ch.peer.call("command", FetchKeys(pf.epoch, to, k, g, ch.sender, request)))
        if self.counts is not None:
            # the balancer's load per key group is counted here, where groups are known, and
            # the records sent to each instance by the table in force for each batch
            self.counts += np.bincount(groups, weights, minlength=self.key_groups).astype(np.int64, copy=False)
            self.routed = _add(self.routed, np.bincount(dest, weights, minlength=self.table.parallelism)
                               .astype(np.int64, copy=False))
        if len(self.chans) == 1:             # every row goes to the one instance
            (ch,) = self.chans.values()
            await ch.send(Batch(x, emitted, groups))
            return
        for i, ch in self.chans.items():
            need = pf.need(i) if pf is not None else None
            if partial is not None and (part := np.flatnonzero((dest == i) & partial)).size:
                # rows of split keys this helper aggregates for their homes
                homes = table.owners[groups[part]]
                own = np.flatnonzero((dest == i) & ~partial)
                partials = tuple((h, x.take(p), groups[p]) for h in np.unique(homes).tolist()
                                 for p in [part[homes == h]])
                await ch.send(Batch(x.take(own), emitted, groups[own], need, partials))
                continue
            idx = np.flatnonzero(dest == i)   # ascending: keeps the batch's order per key
            if len(idx):
                await ch.send(Batch(x.take(idx), emitted, groups[idx], need))

    def take_window(self) -> dict:
        """What was routed since the last window, for the load report; counting restarts."""
        nz = np.flatnonzero(self.counts)
        out = {"groups": nz.tolist(), "counts": self.counts[nz].tolist(),
               "routed": self.routed.tolist() if self.routed is not None else None,
               # instances the counts are for (a window across a rescale counts for the larger table)
               "parallelism": len(self.routed) if self.routed is not None else self.table.parallelism,
               "hot": [[k, c] for k, c, _ in self.hot.top()] if self.hot is not None else None}
        self.counts[:] = 0
        if self.routed is not None:
            self.routed[:] = 0
        if self.hot is not None:
            self.hot.clear()
        return out


def _add(total: np.ndarray | None, counts: np.ndarray) -> np.ndarray:
    """``total + counts``, the shorter padded with zeros (instances may come and go)."""
    if total is None:
        return counts
    if len(total) == len(counts):
        total += counts
        return total
    n = max(len(total), len(counts))
    return np.pad(total, (0, n - len(total))) + np.pad(counts, (0, n - len(counts)))


def make_exchange(spec: ExchangeSpec, upstream: str, chans: dict[int, OutChannel], table: RoutingTable | None,
                  **router) -> _Exchange:
    """The exchange ``spec`` describes, from stage ``upstream`` over ``chans``; a keyed one
    routes by ``table`` and takes the keyword arguments of :class:`KeyedRouter`."""
    if spec.keyed:
        return KeyedRouter(spec, upstream, chans, table, **router)
    return ShuffleExchange(spec, upstream, chans)


#: What each kind of key is called in a dead letter's reason.
KEY_KINDS = {"i": "integers", "b": "booleans", "O": "strings"}


def _kind_of(k) -> str | None:
    """The kind of one key value: ``"O"`` (str), ``"b"`` (bool), ``"i"`` (an integer that
    int64 holds) or None (anything else)."""
    if isinstance(k, str):
        return "O"
    if isinstance(k, (bool, np.bool_)):
        return "b"
    if isinstance(k, numbers.Integral) and -2**63 <= k < 2**63:
        return "i"
    return None


def key_kind_of(keys: pd.Series) -> str | None:
    """The kind of key an operator takes, from the first batch its router sees: integers
    (``"i"``, also a float column of whole numbers and nulls), booleans (``"b"``) or
    strings (``"O"``) as the column's dtype says; for an object column, the kind most of
    its keys are. None while no key says (nulls only) or for a type no key may have
    (the hash then refuses the column with :class:`~streamlb.exceptions.KeyTypeError`).

    >>> key_kind_of(pd.Series([1, 2, "x", 3], dtype=object))
    'i'
    >>> key_kind_of(pd.Series(["a", None]))
    'O'
    """
    kind = keys.dtype.kind
    if kind in "iu":
        return "i"
    if kind == "b":
        return "b"
    if kind == "f":
        vals = keys.dropna().to_numpy()
        return "i" if len(vals) and np.array_equal(vals, np.round(vals)) else None
    if keys.dtype != object:
        return "O" if pd.api.types.is_string_dtype(keys.dtype) else None
    votes = pd.Series([_kind_of(k) for k in keys.dropna()], dtype=object).value_counts()
    return votes.index[0] if len(votes) else None


def bad_keys(keys: pd.Series, kind: str | None) -> tuple[np.ndarray | None, list[str]]:
    """Rows whose key is null, or not of the operator's ``kind`` (see :func:`key_kind_of`),
    with the reason naming the column, the key and the kind expected.

    Such records go to the dead-letter output; the rest of the batch goes on.

    >>> bad_keys(pd.Series([1, "x", None], dtype=object, name="customer"), "i")[1]
    ["key 'customer' is str 'x'; this column's keys are integers", "key 'customer' is null"]
    """
    null = keys.isna().to_numpy()
    bad = null
    if kind is not None:
        if keys.dtype == object and kind == "O":        # the common case, kept a bare isinstance
            fits = np.fromiter((isinstance(k, str) for k in keys), bool, len(keys))
        elif keys.dtype == object:
            fits = np.fromiter((_kind_of(k) == kind for k in keys), bool, len(keys))
        else:
            fits = np.full(len(keys), key_kind_of(keys) in (kind, None))
        bad = null | ~fits
    if not bad.any():
        return None, []
    reasons = [
        f"key {keys.name!r} is null" if n else
        f"key {keys.name!r} is {type(k).__name__} {k!r}; this column's keys are {KEY_KINDS[kind]}"
        for k, n in zip(keys[bad].tolist(), null[bad])
    ]
    return bad, reasons
