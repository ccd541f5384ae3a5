"""Keyed state stores of the two stateful operators."""
from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pandas as pd
from pandas._libs import hashtable as _ht

from .exceptions import SchemaError, UserFunctionError
from .keygroups import assign_to_key_group
from .nodes import describe


def _grow(arr: np.ndarray, n: int, fill) -> np.ndarray:
    if n <= len(arr):
        return arr
    new = np.full(max(n, 2 * len(arr), 1024), fill, dtype=arr.dtype)
    new[: len(arr)] = arr
    return new


class _KeyIndex:
    """Stable dense slots for keys, grown incrementally (one hash table per shard).

    Each batch is labelled against the table with a fresh vector for its new keys, so the
    cost is O(batch) whatever the number of keys held (pandas' Factorizer copies all its
    keys on every call).
    """

    def __init__(self, dtype=None, size: int = 1024) -> None:
        self._table = None
        self.keys: np.ndarray | None = None
        self.key_groups = np.zeros(0, dtype=np.int64)
        self.n = 0
        if dtype is not None:
            self._make(np.dtype(dtype), max(size, 1024))

    def _make(self, dtype: np.dtype, size: int) -> None:
        if dtype.kind in "iu" and dtype != np.uint64:
            self._table, self._vector, self._dtype = _ht.Int64HashTable(size), _ht.Int64Vector, np.int64
        elif dtype == np.uint64:
            self._table, self._vector, self._dtype = _ht.UInt64HashTable(size), _ht.UInt64Vector, np.uint64
        else:
            self._table, self._vector, self._dtype = _ht.PyObjectHashTable(size), _ht.ObjectVector, object
        self.keys = np.empty(0, dtype=self._dtype)

    @classmethod
    def of_unique(cls, dtype, keys: np.ndarray, key_groups: np.ndarray, size: int = 0) -> "_KeyIndex":
        """An index holding distinct ``keys`` in slots 0..len-1, in their order (its table
        sized for ``size`` keys, at least those): one pass that stores each key's position,
        no labelling, and for integer keys no GIL held."""
        index = cls(dtype, max(size, len(keys)))
        if len(keys):
            index._table.map_locations(np.require(keys, dtype=index._dtype, requirements=["C", "A"]))
        index.keys, index.key_groups, index.n = keys, key_groups, len(keys)
        return index

    @property
    def dtype(self):
        return None if self._table is None else self._dtype

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 where the key has none."""
        if self._table is None or not len(keys):
            return np.full(len(keys), -1, np.int64)
        try:
            keys = np.require(keys, dtype=self._dtype, requirements=["C", "A"])
        except (TypeError, ValueError, OverflowError):
            return np.full(len(keys), -1, np.int64)     # keys of another type are not here
        return np.asarray(self._table.lookup(keys), dtype=np.int64)

    def slots(self, keys: np.ndarray, groups: np.ndarray | None, n_groups: int, key_name: str) -> np.ndarray:
        """Slots of ``keys`` (whose key groups are ``groups``, computed for new keys if
        None), new keys appended."""
        if self._table is None:
            self._make(keys.dtype, max(1024, len(keys)))
        keys = np.require(keys, dtype=self._dtype, requirements=["C", "A"])
        old = self.n
        fresh = self._vector()
        labels = self._table.get_labels(keys, fresh, old, -1).astype(np.int64, copy=False)
        added = fresh.to_array()            # keys new in this batch, in slot order from ``old``
        if len(added):
            n = old + len(added)
            self.keys = _grow(self.keys, n, 0 if self._dtype is not object else None)
            self.key_groups = _grow(self.key_groups, n, -1)
            self.keys[old:n] = added
            if groups is None:
                self.key_groups[old:n] = assign_to_key_group(added, n_groups, name=key_name)
            else:
                new_rows = labels >= old
                self.key_groups[labels[new_rows]] = groups[new_rows]
            self.n = n
        return labels


class KeySet(_KeyIndex):
    """A set of keys with vectorised membership (``lookup(keys) >= 0``) and insertion
    (``slots``)."""


def _add_float(target: np.ndarray, labels: np.ndarray, values: np.ndarray, n: int) -> None:
    """``target[labels] += values`` with repeats summed, in order.

    A bincount over the ``n`` slots in use is cheapest while they are few against the
    batch; past that, ``ufunc.at`` (fast in numpy 2) keeps the cost O(batch), not O(state).
    """
    if n <= 8 * len(labels):
        target[:n] += np.bincount(labels, weights=values, minlength=n)
    else:
        np.add.at(target, labels, values)


# Aggregate state lives in shards, each holding a range of key groups. A shard that grows
# past SHARD_KEYS keys splits in two, so a migration cuts, compacts and installs pieces of
# bounded size, and no single step (a hash table rehash, a scan for the moving groups)
# stalls the event loop for O(all state). Small states keep one shard: no partition cost.
SHARD_KEYS = 1 << 17

# A shard is rebuilt with only its live keys once fewer than this share of its slots are
# live, so the memory of state moved away is given back while a migration still runs.
COMPACT_BELOW = 0.75

# Shards of integer keys this large split in a background thread (pandas' integer hash
# tables are built without the GIL), so the event loop never stalls for a split; smaller
# shards, and shards of string keys, split at once.
SPLIT_IN_THREAD = 1 << 14

_splitter: concurrent.futures.ThreadPoolExecutor | None = None
_splitter_lock = threading.Lock()


def _split_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _splitter
    with _splitter_lock:
        if _splitter is None:
            _splitter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="streamlb-split")
        return _splitter


def _split_at(lo: int) -> int:
    """Keys past which the shard starting at key group ``lo`` splits: SHARD_KEYS to 1.5x
    that, spread by ``lo``. Shards that a uniform key distribution fills alike would
    otherwise all reach the size together, and split (and, before that, rehash) in one
    burst of batches, each of them stalled by a split."""
    return SHARD_KEYS + int(SHARD_KEYS * ((lo * 0.6180339887498949) % 1.0)) // 2


class AggregateState:
    """count / sum / min / max / mean per key, updated with vectorised numpy.

    Keys live in shards by key group; within a shard they get dense slots. A key whose
    state moved away is dropped from its shard (the shard is compacted once a quarter of
    its slots are dead), so memory follows the keys held.
    """

    def __init__(self, operator: str, spec: dict, key_name: str, key_groups: int) -> None:
        self.operator = operator
        self.spec = spec
        self.key_name = key_name
        self.groups = key_groups
        self.inputs = sorted({c for c, _ in spec.values()})
        self.hows = {c: {h for cc, h in spec.values() if cc == c} for c in self.inputs}
        self.dtypes: dict[str, np.dtype] = {}
        self.shards = [_AggShard(self, 0, key_groups)]
        self._shard_of = np.zeros(key_groups, np.uint16)    # key group -> shard
        self._splitting: "_PendingSplit | None" = None

    # -- data -------------------------------------------------------------------------------
    def _column(self, frame: pd.DataFrame, c: str) -> np.ndarray:
        if c not in frame.columns:
            raise SchemaError(
                f"operator {self.operator!r} needs column {c!r}; the batch has columns "
                f"{', '.join(map(str, frame.columns))}"
            )
        # batches from another worker may sit unaligned in the receive buffer, which sends
        # ufunc.at down a slow path: copy those
        arr = np.require(frame[c].to_numpy(), requirements="A")
        if self.hows[c] - {"count"} and arr.dtype.kind not in "iufb":
            raise SchemaError(
                f"operator {self.operator!r}: column {c!r} has dtype {arr.dtype}; "
                f"{'/'.join(sorted(self.hows[c] - {'count'}))} need a numeric column"
            )
        return arr

    def clean(self, frame: pd.DataFrame) -> tuple[pd.DataFrame, tuple | None]:
        """Split off rows whose value in a column that must be numeric is not a number.

        Returns the clean frame and, if any, ``(bad rows, reasons)`` for the dead letters.
        """
        bad = None
        reasons: dict[int, str] = {}
        original = frame
        for c in self.inputs:
            if c not in frame.columns or not (self.hows[c] - {"count"}) or frame[c].dtype != object:
                continue
            num = pd.to_numeric(frame[c], errors="coerce")
            wrong = (num.isna() & frame[c].notna()).to_numpy()
            if wrong.any():
                for i in np.flatnonzero(wrong):
                    reasons.setdefault(int(i), f"column {c!r} holds {frame[c].iloc[i]!r}, not a number")
                bad = wrong if bad is None else bad | wrong
            frame = frame.assign(**{c: num.astype(np.float64)})
        if bad is None:
            return frame, None
        return frame[~bad], (original[bad], [reasons[i] for i in sorted(reasons)])

    def update(self, frame: pd.DataFrame, groups: np.ndarray | None = None) -> list:
        """Apply one batch; return what it touched, for :meth:`frame`."""
        cols = {c: self._column(frame, c) for c in self.inputs}
        for c, arr in cols.items():
            if c not in self.dtypes:
                self.dtypes[c] = np.dtype(np.int64) if arr.dtype.kind in "iub" else np.dtype(np.float64)
        keys = frame[self.key_name].to_numpy()
        self._adopt_split()
        if len(self.shards) > 1 and groups is None:
            groups = assign_to_key_group(keys, self.groups, name=self.key_name)
        if len(self.shards) == 1:
            sh = self.shards[0]
            touched = [(sh, sh.update(keys, groups, cols))]
        else:
            shard = self._shard_of[groups]
            order = np.argsort(shard, kind="stable")     # radix sort; per-key order kept
            bounds = np.concatenate(([0], np.cumsum(np.bincount(shard, minlength=len(self.shards))))).tolist()
            keys, groups = keys[order], groups[order]     # gathered once: each shard takes a slice
            cols = {c: arr[order] for c, arr in cols.items()}
            touched = []
            for sh, a, b in zip(self.shards, bounds, bounds[1:]):
                if a < b:
                    touched.append((sh, sh.update(keys[a:b], groups[a:b], {c: v[a:b] for c, v in cols.items()})))
        self._split_large([sh for sh, _ in touched])
        return touched

    def _split_large(self, shards) -> None:
        """Split the largest of ``shards`` past its size (:func:`_split_at`) into pieces
        of at most 3/4 SHARD_KEYS keys: in the background if it is large and keyed by
        integers (one such split at a time), else at once.

        Shards filled by the same key distribution cross the size at about the same batch;
        one split per batch spreads their cost over the next batches.
        """
        big = [sh for sh in shards if sh.index.n > _split_at(sh.lo) and sh.hi - sh.lo > 1]
        if not big:
            return
        sh = max(big, key=lambda s: s.index.n)
        if sh.index.n < SPLIT_IN_THREAD or sh.index.dtype is object:
            self._replace(sh, sh.split(_pieces(sh.live)))
        elif self._splitting is None:
            self._splitting = _PendingSplit(sh, _pieces(sh.live))

    def _replace(self, sh: "_AggShard", pieces: list) -> None:
        i = next(j for j, s in enumerate(self.shards) if s is sh)
        self.shards[i:i + 1] = pieces
        for j, s in enumerate(self.shards):
            self._shard_of[s.lo:s.hi] = j

    def _adopt_split(self) -> None:
        """Put in place the pieces of a shard split in the background, once built."""
        pending = self._splitting
        if pending is None or not pending.future.done():
            return
        self._splitting = None
        pieces = pending.adopt(self.shards)
        if pieces is not None:
            self._replace(pending.shard, pieces)

    # -- migration ---------------------------------------------------------------------------
    def cut(self, groups) -> dict:
        """Take the state of ``groups`` out: a picklable blob for :meth:`install`."""
        self._adopt_split()
        groups = np.unique(np.asarray(list(groups), np.int64))
        at = self._shard_of[groups]
        return self._blob([self.shards[s].cut(groups[at == s]) for s in np.unique(at).tolist()])

    def _blob(self, parts: list) -> dict:
        """Shards' cuts as one blob, their arrays joined where the shards hold the same
        tables: a send then carries a few large buffers, not a few per shard."""
        parts = [p for p in parts if len(p["keys"])]
        if len(parts) > 1 and all(p["tables"].keys() == parts[0]["tables"].keys() for p in parts):
            parts = [{"keys": np.concatenate([p["keys"] for p in parts]),
                      "key_groups": np.concatenate([p["key_groups"] for p in parts]),
                      "tables": {t: np.concatenate([p["tables"][t] for p in parts]) for t in parts[0]["tables"]}}]
        return {"dtypes": dict(self.dtypes), "parts": parts}

    def _by_shard(self, keys: np.ndarray, groups: np.ndarray | None):
        keys = np.asarray(keys)
        if groups is None:
            groups = assign_to_key_group(keys, self.groups, name=self.key_name)
        at = self._shard_of[groups]
        for s in np.unique(at).tolist():
            rows = np.flatnonzero(at == s)
            yield self.shards[s], rows, keys[rows]

    def cut_keys(self, keys: np.ndarray, groups: np.ndarray | None = None) -> dict:
        """Take the state of single keys out (those held here), for :meth:`install`."""
        return self._blob([sh.take(sh.held_slots(k)) for sh, _, k in self._by_shard(keys, groups)])

    def contains(self, keys: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
        """Whether each key has state here."""
        out = np.zeros(len(keys), bool)
        for sh, rows, k in self._by_shard(keys, groups):
            slots = sh.index.lookup(k)
            ok = slots >= 0
            ok[ok] = sh.present[slots[ok]]
            out[rows] = ok
        return out

    def install(self, blob: dict) -> None:
        """Merge state cut from another instance. Its keys are absent here, or (lazy by
        merging) hold what arrived since the switch: counts and sums add, minima and maxima
        take the extreme."""
        self._adopt_split()
        for c, dt in blob["dtypes"].items():
            self.dtypes.setdefault(c, dt)
        for part in blob["parts"]:
            at = self._shard_of[part["key_groups"]]
            tables = self._as_held(part["tables"])     # in this state's dtypes
            shards = list(self.shards)          # carving renumbers shards: keep these
            for s in np.unique(at).tolist():
                sh, sel = shards[s], at == s
                kg = part["key_groups"][sel]
                if sh.live:
                    sh = self._carve(sh, int(kg.min()), int(kg.max()) + 1, len(kg)) or sh
                sh._put(part["keys"][sel], kg, {k: v[sel] for k, v in tables.items()})
        self._split_large(list(self.shards))

    # -- split keys ---------------------------------------------------------------------------
    def partial(self, frame: pd.DataFrame) -> dict:
        """The aggregate of ``frame``'s rows alone, as a blob for :meth:`combine`: what a
        helper computes for the rows of a split key. Nothing is kept here."""
        tmp = AggregateState(self.operator, self.spec, self.key_name, self.groups)
        tmp.dtypes = dict(self.dtypes)
        tmp.update(frame)
        sh = tmp.shards[0]
        every = np.arange(sh.index.n)
        return {"dtypes": dict(tmp.dtypes),
                "parts": [{"keys": sh.index.keys[every], "key_groups": sh.index.key_groups[every],
                           "tables": sh._rows(every)}] if len(every) else []}

    def combine(self, blob: dict) -> list:
        """Merge partial aggregates into the state held here (counts and sums add, min and
        max take the extreme); return what it touched, for :meth:`frame`."""
        for c, dt in blob["dtypes"].items():
            self.dtypes.setdefault(c, dt)
        touched = []
        for part in blob["parts"]:
            tables = self._as_held(part["tables"])
            at = self._shard_of[part["key_groups"]]
            for s in np.unique(at).tolist():
                sel = at == s
                sh = self.shards[s]
                touched.append((sh, sh._put(part["keys"][sel], part["key_groups"][sel],
                                            {k: v[sel] for k, v in tables.items()})))
        return touched

    def _as_held(self, tables: dict) -> dict:
        """Partial tables in the dtypes held here (a helper may have seen a column as float
        where this state holds ints, as a batch with a null does); a min or max over no value
        becomes this table's identity rather than a cast infinity."""
        out = {}
        for (name, c), vals in tables.items():
            dt = self.dtypes.get(c)
            if name != "cnt" and dt is not None and vals.dtype != dt:
                if name in ("min", "max") and dt.kind in "iu":
                    empty = tables[("cnt", c)] == 0 if ("cnt", c) in tables else ~np.isfinite(vals)
                    cast = np.full(len(vals), np.iinfo(dt).max if name == "min" else np.iinfo(dt).min, dt)
                    cast[~empty] = vals[~empty].astype(dt)
                    vals = cast
                elif name != "sum" or dt.kind in "iu":
                    vals = vals.astype(dt)
            out[(name, c)] = vals
        return out

    def reserve(self, groups) -> None:
        """Make room for incoming key groups ahead of their state: a shard of their own
        where no key held here lies in their range, so installs never rehash or split the
        shards holding this instance's own keys."""
        groups = np.unique(np.asarray(list(groups), np.int64))
        if not len(groups):
            return
        at = self._shard_of[groups]
        shards = list(self.shards)
        for s in np.unique(at).tolist():
            gs = groups[at == s]
            if shards[s].live:
                self._carve(shards[s], int(gs.min()), int(gs.max()) + 1, 0)

    def _carve(self, sh: "_AggShard", lo: int, hi: int, size: int) -> "_AggShard | None":
        """Cut key groups ``lo..hi-1`` out of ``sh`` as a new, empty shard (its table sized
        for ``size`` keys), when no key held in ``sh`` lies in that range and the held keys
        all lie on one side of it; else None."""
        left, right = sh.held[:lo - sh.lo].any(), sh.held[hi - sh.lo:].any()
        if (lo == sh.lo and hi == sh.hi) or sh.held[lo - sh.lo:hi - sh.lo].any() or (left and right):
            return None
        mid = _AggShard(self, lo, hi)
        if sh.index.dtype is not None and size:
            mid.index = _KeyIndex(sh.index.dtype, 2 * size)     # else sized by its first install
        if left:
            pieces = [sh, mid, _AggShard(self, hi, sh.hi)]
            sh.hi, sh.held = lo, sh.held[:lo - sh.lo]
        else:
            pieces = [_AggShard(self, sh.lo, lo), mid, sh]
            sh.lo, sh.held = hi, sh.held[hi - sh.lo:]
        i = self.shards.index(sh)
        self.shards[i:i + 1] = [p for p in pieces if p.hi > p.lo]
        for j, p in enumerate(self.shards):
            self._shard_of[p.lo:p.hi] = j
        return mid

    # -- output ------------------------------------------------------------------------------
    def frame(self, touched: list | None = None) -> pd.DataFrame:
        """State as a DataFrame indexed by key; only the keys a batch touched if given."""
        if touched is None:
            parts = [sh.frame() for sh in self.shards if sh.index.n]
        else:
            parts = [sh.frame(pd.unique(labels)) for sh, labels in touched]
        if not parts:
            return self.shards[0].frame()
        return parts[0] if len(parts) == 1 else pd.concat(parts)

    def __len__(self) -> int:
        return sum(int(sh.live) for sh in self.shards)

    def keys_per_group(self, groups) -> np.ndarray:
        """Keys held here of each key group of ``groups`` (from the shards' live counts)."""
        counts = np.zeros(self.groups, np.int64)
        for sh in self.shards:
            counts[sh.lo:sh.hi] += sh.held
        return counts[np.asarray(groups, np.int64)]


def _pieces(live: int) -> int:
    """Pieces a shard of ``live`` keys splits into: each of at most 3/4 SHARD_KEYS keys."""
    return max(2, -(-4 * live // (3 * SHARD_KEYS)))


def _cuts(held: np.ndarray, lo: int, hi: int, parts: int) -> np.ndarray:
    """Key-group edges cutting the keys of groups ``lo..hi-1`` (``held``: keys per group)
    into ``parts`` about equal pieces."""
    cum = np.cumsum(held)
    cuts = lo + 1 + np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts)
    return np.unique(np.clip(np.concatenate(([lo], cuts, [hi])), lo, hi))


class _PendingSplit:
    """A shard split in the background: the hash tables of its pieces are built in a
    thread from a snapshot of its slots (dead ones too: a key cut away and then updated
    again comes back to life in its old slot); the shard keeps taking updates meanwhile.
    Once built, the pieces take the keys added since, and the values, on the event loop:
    a copy, no hashing of the snapshot's keys."""

    def __init__(self, sh: "_AggShard", parts: int) -> None:
        self.shard, self.index, self.lo, self.hi = sh, sh.index, sh.lo, sh.hi
        n = self.n = sh.index.n
        # the snapshot is the index's arrays as they are: slots below n never change (new
        # keys take new slots; growing an array makes a new one), so the thread reads them
        keys, kg, dtype = sh.index.keys, sh.index.key_groups, sh.index.dtype
        edges = self.edges = _cuts(sh.held, sh.lo, sh.hi, parts)
        self.slots: list = []

        def build() -> list:
            which = np.searchsorted(edges, kg[:n], side="right") - 1
            slots = [np.flatnonzero(which == i) for i in range(len(edges) - 1)]
            out = [_KeyIndex.of_unique(dtype, keys[sel], kg[sel], _split_at(int(edges[i])) + 1)
                   for i, sel in enumerate(slots)]     # the snapshot's keys are distinct
            self.slots = slots
            return out

        self.future = _split_pool().submit(build)

    def adopt(self, shards: list) -> "list[_AggShard] | None":
        """The pieces, filled; None when the shard changed shape meanwhile (compacted,
        carved, split at once, dropped): then the work is thrown away."""
        sh = self.shard
        if (not any(s is sh for s in shards) or sh.index is not self.index
                or (sh.lo, sh.hi) != (self.lo, self.hi) or self.future.exception() is not None):
            return None
        indexes = self.future.result()
        n = sh.index.n
        late = np.arange(self.n, n)                     # slots added since the snapshot
        late_kg = sh.index.key_groups[self.n:n]
        which = np.searchsorted(self.edges, late_kg, side="right") - 1
        pieces = []
        for i, (idx, sel) in enumerate(zip(indexes, self.slots)):
            extra = late[which == i]
            if len(extra):
                idx.slots(sh.index.keys[extra], late_kg[which == i], sh.o.groups, sh.o.key_name)
            src = np.concatenate([sel, extra])         # the old slot of each new slot
            piece = _AggShard(sh.o, int(self.edges[i]), int(self.edges[i + 1]))
            piece.index = idx
            piece._layout()
            piece.present[: len(src)] = sh.present[src]
            piece.held = sh.held[piece.lo - sh.lo:piece.hi - sh.lo].copy()
            for c in sh.o.dtypes:
                for name, table in sh._tables(c):
                    if c in table:
                        getattr(piece, name)[c][: len(src)] = table[c][src]
            pieces.append(piece)
        return pieces


class _AggShard:
    """The state of the keys of some key groups: a key index and one array per aggregate."""

    def __init__(self, owner: AggregateState, lo: int, hi: int) -> None:
        self.o = owner
        self.lo, self.hi = lo, hi                       # key groups lo..hi-1
        self.index = _KeyIndex()
        self.present = np.zeros(0, bool)
        self.held = np.zeros(hi - lo, np.int64)       # live keys per key group lo..hi-1
        self.cnt: dict[str, np.ndarray] = {}
        self.sum: dict[str, np.ndarray] = {}
        self.min: dict[str, np.ndarray] = {}
        self.max: dict[str, np.ndarray] = {}

    @property
    def live(self) -> int:
        return int(self.held.sum())

    def _count(self, slots: np.ndarray) -> np.ndarray:
        """Keys per key group of this shard among ``slots``."""
        return np.bincount(self.index.key_groups[slots] - self.lo, minlength=self.hi - self.lo)

    def _mark_live(self, slots: np.ndarray, old_n: int) -> None:
        """``slots`` hold state now: the new ones (from ``old_n``) and dead ones revived (a
        key cut away and given state here again)."""
        back = slots[slots < old_n]
        back = back[~self.present[back]]
        self.present[slots] = True
        if old_n < self.index.n:
            self.held += self._count(np.arange(old_n, self.index.n))
        if len(back):
            self.held += self._count(np.unique(back))

    def _identity(self, table: str, dt: np.dtype):
        if table == "min":
            return np.inf if dt.kind == "f" else np.iinfo(dt).max
        if table == "max":
            return -np.inf if dt.kind == "f" else np.iinfo(dt).min
        return 0

    def _tables(self, c: str):
        hows = self.o.hows[c]
        yield "cnt", self.cnt
        if hows & {"sum", "mean"}:
            yield "sum", self.sum
        if "min" in hows:
            yield "min", self.min
        if "max" in hows:
            yield "max", self.max

    def _layout(self) -> None:
        """Arrays for every column known to the operator, grown to the slots in use."""
        n = self.index.n
        self.present = _grow(self.present, n, False)
        for c, dt in self.o.dtypes.items():
            for name, table in self._tables(c):
                if c not in table:
                    table[c] = np.full(len(self.present), self._identity(name, dt),
                                       np.int64 if name == "cnt" else dt)
                table[c] = _grow(table[c], n, self._identity(name, dt))

    def update(self, keys: np.ndarray, groups: np.ndarray, cols: dict) -> np.ndarray:
        old_n = self.index.n
        labels = self.index.slots(keys, groups, self.o.groups, self.o.key_name)
        self._layout()
        self._mark_live(labels, old_n)
        for c, arr in cols.items():
            dt = self.o.dtypes[c]
            if arr.dtype.kind == "f":
                valid = ~np.isnan(arr)
                lab, vals = (labels, arr) if valid.all() else (labels[valid], arr[valid])
            elif arr.dtype.kind in "iub":
                lab, vals = labels, arr.astype(dt, copy=False)
            else:
                lab, vals = labels[~pd.isna(arr)], None
            np.add.at(self.cnt[c], lab, 1)
            if vals is None:
                continue
            if c in self.sum:
                if dt.kind == "f":
                    _add_float(self.sum[c], lab, vals, self.index.n)
                else:
                    np.add.at(self.sum[c], lab, vals)   # int64 stays exact
            if c in self.min:
                np.minimum.at(self.min[c], lab, vals)
            if c in self.max:
                np.maximum.at(self.max[c], lab, vals)
        return labels

    def _rows(self, sel: np.ndarray) -> dict:
        return {(name, c): table[c][sel].copy()
                for c in self.o.dtypes for name, table in self._tables(c) if c in table}

    def cut(self, groups) -> dict:
        n = self.index.n
        groups = np.asarray(groups, np.int64)
        if not self.held[groups - self.lo].any():        # nothing held for them: no scan
            return self.take(np.zeros(0, np.int64))
        moving = self.present[:n] & np.isin(self.index.key_groups[:n], groups)
        return self.take(np.flatnonzero(moving))

    def held_slots(self, keys: np.ndarray) -> np.ndarray:
        """Slots of those of ``keys`` that have state here."""
        slots = self.index.lookup(keys)
        slots = slots[slots >= 0]
        return np.unique(slots[self.present[slots]])

    def take(self, sel: np.ndarray) -> dict:
        """Cut the keys in slots ``sel`` out: their rows, as a blob part."""
        n = self.index.n
        blob = {"keys": self.index.keys[sel].copy() if n else np.empty(0, np.int64),
                "key_groups": self.index.key_groups[sel].copy(), "tables": self._rows(sel)}
        if len(sel):
            self.present[sel] = False
            self.held -= self._count(sel)
            if self.live < COMPACT_BELOW * n:
                self._compact()
            else:
                for c, dt in self.o.dtypes.items():
                    for name, table in self._tables(c):
                        table[c][sel] = self._identity(name, dt)
        return blob

    def _compact(self) -> None:
        """Rebuild the shard with only its live keys: a fresh table and arrays, in slot order."""
        n = self.index.n
        keep = np.flatnonzero(self.present[:n])
        rows = self._rows(keep)
        self.index = _KeyIndex.of_unique(self.index.dtype, self.index.keys[keep], self.index.key_groups[keep])
        self.present = np.ones(len(keep), bool)
        self.cnt, self.sum, self.min, self.max = {}, {}, {}, {}
        for (name, c), vals in rows.items():
            getattr(self, name)[c] = vals

    def _put(self, keys: np.ndarray, key_groups: np.ndarray, tables: dict) -> np.ndarray:
        old_n = self.index.n
        slots = self.index.slots(keys, key_groups, self.o.groups, self.o.key_name)
        self._layout()
        for (name, c), vals in tables.items():
            t = getattr(self, name)[c]
            if name in ("cnt", "sum"):
                t[slots] += vals
            elif name == "min":
                t[slots] = np.minimum(t[slots], vals)
            else:
                t[slots] = np.maximum(t[slots], vals)
        self._mark_live(slots, old_n)
        return slots

    def split(self, parts: int = 2) -> list["_AggShard"]:
        """Up to ``parts`` shards with about equal shares of this one's live keys, cut at
        key-group boundaries, each table sized for its split size (no rehash until its
        next split)."""
        n = self.index.n
        keep = np.flatnonzero(self.present[:n])
        kg = self.index.key_groups[keep]
        edges = _cuts(self.held, self.lo, self.hi, parts)
        rows = self._rows(keep)
        which = np.searchsorted(edges, kg, side="right") - 1
        out = []
        for i, (lo, hi) in enumerate(zip(edges[:-1].tolist(), edges[1:].tolist())):
            sel = which == i
            sh = _AggShard(self.o, lo, hi)
            sh.index = _KeyIndex.of_unique(self.index.dtype, self.index.keys[keep[sel]], kg[sel], _split_at(lo) + 1)
            sh.present = np.ones(int(sel.sum()), bool)
            sh.held = self.held[lo - self.lo:hi - self.lo].copy()
            for (name, c), vals in rows.items():
                getattr(sh, name)[c] = vals[sel]
            out.append(sh)
        return out

    def frame(self, slots: np.ndarray | None = None) -> pd.DataFrame:
        n = self.index.n
        sel = np.flatnonzero(self.present[:n]) if slots is None else slots
        keys = self.index.keys[sel] if self.index.keys is not None else np.empty(0, np.int64)
        out = {}
        for name, (c, how) in self.o.spec.items():
            if c not in self.o.dtypes or c not in self.cnt:
                out[name] = np.zeros(len(keys), np.int64 if how == "count" else np.float64)
                continue
            cnt = self.cnt[c][sel]
            if how == "count":
                out[name] = cnt
            elif how == "sum":
                out[name] = self.sum[c][sel]
            elif how == "mean":
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[name] = self.sum[c][sel] / np.where(cnt == 0, np.nan, cnt)
            else:
                v = getattr(self, how)[c][sel]
                out[name] = np.where(cnt > 0, v, np.nan) if (cnt == 0).any() else v
        return pd.DataFrame(out, index=pd.Index(keys, name=self.o.key_name))


def _py_values(col: pd.Series) -> list:
    """Python values of a column. Microsecond (or coarser) timestamps become
    ``datetime.datetime`` through numpy, 20x cheaper than ``pd.Timestamp``."""
    arr = col.to_numpy()
    if arr.dtype.kind == "M" and np.datetime_data(arr.dtype)[0] in ("us", "ms", "s"):
        return arr.tolist()
    return col.tolist()


class StatefulMapState:
    """Per-key Python state driven by ``func(state, record) -> (state, output)``."""

    def __init__(self, operator: str, func, key_name: str, key_groups: int) -> None:
        self.operator = operator
        self.groups = key_groups
        self.func = getattr(func, "func", func)   # unwrap UserFunction: one call less per record
        self.key_name = key_name
        self.states: dict = {}
        self.by_group: dict[int, set] = {}        # key group -> its keys, so a cut is O(moved)

    def _index_keys(self, keys) -> None:
        """Add keys to ``by_group`` (computing their key groups in one vectorised call)."""
        if not len(keys):
            return
        arr = np.array(keys, dtype=object if isinstance(keys[0], str) else None)
        for k, g in zip(keys, assign_to_key_group(arr, self.groups, name=self.key_name).tolist()):
            self.by_group.setdefault(g, set()).add(k)

    def update(self, frame: pd.DataFrame) -> list:
        cols = [str(c) for c in frame.columns]
        if self.key_name not in frame.columns:
            raise SchemaError(
                f"operator {self.operator!r} needs key column {self.key_name!r}; the batch has "
                f"columns {', '.join(cols)}"
            )
        keys = frame[self.key_name].tolist()
        states, func = self.states, self.func
        self._index_keys([k for k in dict.fromkeys(keys) if k not in states])
        rows = zip(*[_py_values(frame[c]) for c in frame.columns])
        outs: list = []
        append = outs.append
        i = -1
        try:
            for i, (k, row) in enumerate(zip(keys, rows)):
                st, out = func(states.get(k), dict(zip(cols, row)))
                states[k] = st
                append(out)
        except Exception as exc:
            record = frame.iloc[i].to_dict() if 0 <= i < len(frame) else None
            raise UserFunctionError(
                f"operator {self.operator!r}: function {describe(func)} raised "
                f"{type(exc).__name__}: {exc} on record {record!r}",
                operator=self.operator, function=describe(func), record=record,
            ) from exc
        return outs

    def cut(self, groups) -> dict:
        """Take the state of the keys in ``groups`` out, as a picklable blob."""
        states, out = self.states, {}
        for g in groups:
            for k in self.by_group.pop(int(g), ()):
                if k in states:
                    out[k] = states.pop(k)
        return {"states": out}

    def cut_keys(self, keys, groups=None) -> dict:
        states, out = self.states, {}
        keys = np.asarray(keys).tolist()
        if groups is None:
            groups = assign_to_key_group(np.array(keys, dtype=object if keys and isinstance(keys[0], str) else None),
                                         self.groups, name=self.key_name)
        for k, g in zip(keys, np.asarray(groups).tolist()):
            if k in states:
                out[k] = states.pop(k)
                self.by_group.get(g, set()).discard(k)
        return {"states": out}

    def contains(self, keys, groups=None) -> np.ndarray:
        states = self.states
        return np.fromiter((k in states for k in np.asarray(keys).tolist()), bool, len(keys))

    def reserve(self, groups) -> None:
        """Nothing to prepare: states live in one dict."""

    def install(self, blob: dict) -> None:
        self._index_keys([k for k in blob["states"] if k not in self.states])
        self.states.update(blob["states"])

    def __len__(self) -> int:
        return len(self.states)

    def keys_per_group(self, groups) -> np.ndarray:
        """Keys held here of each key group of ``groups``."""
        return np.array([len(self.by_group.get(int(g), ())) for g in groups], np.int64)

    def frame(self) -> pd.DataFrame:
        keys = list(self.states)
        return pd.DataFrame(
            {"state": pd.Series(list(self.states.values()), dtype=object)},
        ).set_axis(pd.Index(keys, name=self.key_name))
