"""Keyed state stores of the two stateful operators."""
from __future__ import annotations

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
    """Stable dense slots for keys, grown incrementally (one hash table for the lifetime).

    Each batch is labelled against the table with a fresh vector for its new keys, so the
    cost is O(batch) whatever the number of keys held (pandas' Factorizer copies all its
    keys on every call).
    """

    def __init__(self, key_groups: int, key_name: str) -> None:
        self.groups = key_groups
        self.key_name = key_name
        self._table = None
        self.keys: np.ndarray | None = None
        self.key_groups = np.zeros(0, dtype=np.int64)
        self.n = 0

    def slots(self, keys: np.ndarray) -> np.ndarray:
        if self._table is None:
            if keys.dtype.kind in "iu" and keys.dtype != np.uint64:
                self._table, self._vector, self._dtype = _ht.Int64HashTable(1024), _ht.Int64Vector, np.int64
            elif keys.dtype == np.uint64:
                self._table, self._vector, self._dtype = _ht.UInt64HashTable(1024), _ht.UInt64Vector, np.uint64
            else:
                self._table, self._vector, self._dtype = _ht.PyObjectHashTable(1024), _ht.ObjectVector, object
            self.keys = np.empty(0, dtype=self._dtype)
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
            self.key_groups[old:n] = assign_to_key_group(added, self.groups, name=self.key_name)
            self.n = n
        return labels


def _add_float(target: np.ndarray, labels: np.ndarray, values: np.ndarray, n: int) -> None:
    """``target[labels] += values`` with repeats summed, in O(len(labels)).

    Float ``ufunc.at`` runs ~30x slower than ``bincount`` on skewed labels, and a bincount
    over all ``n`` slots costs O(state) per batch; so count over the batch's own slots.
    """
    if n <= 4 * len(labels):
        target[:n] += np.bincount(labels, weights=values, minlength=n)
        return
    local, slots = pd.factorize(labels, sort=False)
    target[slots] += np.bincount(local, weights=values, minlength=len(slots))


class AggregateState:
    """count / sum / min / max / mean per key, updated with vectorised numpy.

    Keys get dense slots for the operator's lifetime; a key whose state moved away keeps its
    slot, reset to the identity of every aggregate and marked absent, so moving it back
    reuses it.
    """

    def __init__(self, operator: str, spec: dict, key_name: str, key_groups: int) -> None:
        self.operator = operator
        self.spec = spec
        self.key_name = key_name
        self.index = _KeyIndex(key_groups, key_name)
        self.present = np.zeros(0, bool)
        self.inputs = sorted({c for c, _ in spec.values()})
        self.hows = {c: {h for cc, h in spec.values() if cc == c} for c in self.inputs}
        self.cnt: dict[str, np.ndarray] = {}
        self.sum: dict[str, np.ndarray] = {}
        self.min: dict[str, np.ndarray] = {}
        self.max: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, np.dtype] = {}

    # -- layout ------------------------------------------------------------------------------
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

    def _identity(self, table: str, dt: np.dtype):
        if table == "min":
            return np.inf if dt.kind == "f" else np.iinfo(dt).max
        if table == "max":
            return -np.inf if dt.kind == "f" else np.iinfo(dt).min
        return 0

    def _tables(self, c: str):
        yield "cnt", self.cnt
        if self.hows[c] & {"sum", "mean"}:
            yield "sum", self.sum
        if "min" in self.hows[c]:
            yield "min", self.min
        if "max" in self.hows[c]:
            yield "max", self.max

    def _init(self, c: str, kind: str) -> None:
        dt = np.dtype(np.int64) if kind in "iub" else np.dtype(np.float64)
        self.dtypes[c] = dt
        for name, table in self._tables(c):
            table[c] = np.zeros(0, np.int64 if name == "cnt" else dt)

    def _grow_all(self) -> None:
        n = self.index.n
        self.present = _grow(self.present, n, False)
        for c, dt in self.dtypes.items():
            for name, table in self._tables(c):
                table[c] = _grow(table[c], n, self._identity(name, dt))

    # -- data -------------------------------------------------------------------------------
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

    def update(self, frame: pd.DataFrame) -> np.ndarray:
        """Apply one batch; return the slots it touched (labels per row)."""
        cols = {c: self._column(frame, c) for c in self.inputs}
        for c, arr in cols.items():
            if c not in self.dtypes:
                self._init(c, arr.dtype.kind)
        labels = self.index.slots(frame[self.key_name].to_numpy())
        n = self.index.n
        self._grow_all()
        self.present[labels] = True
        for c, arr in cols.items():
            dt = self.dtypes[c]
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
                    _add_float(self.sum[c], lab, vals, n)
                else:
                    np.add.at(self.sum[c], lab, vals)   # int64 stays exact
            if c in self.min:
                np.minimum.at(self.min[c], lab, vals)
            if c in self.max:
                np.maximum.at(self.max[c], lab, vals)
        return labels

    # -- migration ---------------------------------------------------------------------------
    def cut(self, groups) -> dict:
        """Take the state of ``groups`` out: a picklable blob for :meth:`install`."""
        n = self.index.n
        sel = np.flatnonzero(self.present[:n] & np.isin(self.index.key_groups[:n], np.asarray(list(groups))))
        blob = {"keys": self.index.keys[sel].copy() if n else np.empty(0, np.int64),
                "dtypes": dict(self.dtypes), "tables": {}}
        for c, dt in self.dtypes.items():
            for name, table in self._tables(c):
                blob["tables"][(name, c)] = table[c][sel].copy()
                table[c][sel] = self._identity(name, dt)
        self.present[sel] = False
        return blob

    def install(self, blob: dict) -> None:
        """Merge state cut from another instance (its keys are absent here)."""
        if not len(blob["keys"]):
            return
        for c, dt in blob["dtypes"].items():
            if c not in self.dtypes:
                self._init(c, dt.kind)
        slots = self.index.slots(blob["keys"])
        self._grow_all()
        for (name, c), vals in blob["tables"].items():
            t = getattr(self, name)[c]
            if name in ("cnt", "sum"):
                t[slots] += vals
            elif name == "min":
                t[slots] = np.minimum(t[slots], vals)
            else:
                t[slots] = np.maximum(t[slots], vals)
        self.present[slots] = True

    # -- output ------------------------------------------------------------------------------
    def frame(self, slots: np.ndarray | None = None) -> pd.DataFrame:
        """State as a DataFrame indexed by key; only ``slots`` if given."""
        n = self.index.n
        sel = np.flatnonzero(self.present[:n]) if slots is None else slots
        keys = self.index.keys[sel] if self.index.keys is not None else np.empty(0, np.int64)
        out = {}
        for name, (c, how) in self.spec.items():
            if c not in self.dtypes:
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
        return pd.DataFrame(out, index=pd.Index(keys, name=self.key_name))


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

    def update(self, frame: pd.DataFrame) -> list:
        cols = [str(c) for c in frame.columns]
        if self.key_name not in frame.columns:
            raise SchemaError(
                f"operator {self.operator!r} needs key column {self.key_name!r}; the batch has "
                f"columns {', '.join(cols)}"
            )
        keys = frame[self.key_name].tolist()
        rows = zip(*[_py_values(frame[c]) for c in frame.columns])
        states, func = self.states, self.func
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
        if not self.states:
            return {"states": {}}
        keys = list(self.states)
        kg = assign_to_key_group(np.array(keys, dtype=object if isinstance(keys[0], str) else None),
                                 self.groups, name=self.key_name)
        moving = np.isin(kg, np.asarray(list(groups)))
        out = {}
        for k, m in zip(keys, moving):
            if m:
                out[k] = self.states.pop(k)
        return {"states": out}

    def install(self, blob: dict) -> None:
        self.states.update(blob["states"])

    def frame(self) -> pd.DataFrame:
        keys = list(self.states)
        return pd.DataFrame(
            {"state": pd.Series(list(self.states.values()), dtype=object)},
        ).set_axis(pd.Index(keys, name=self.key_name))
