"""Stateful map state: one Python object per key, driven by a user function."""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pandas as pd

from .._functions import describe
from ..exceptions import SchemaError, UserFunctionError
from ..keygroups import assign_to_key_group
from ._base import StateStore
from ._index import factorize_sized, first_rows


def _py_values(col: pd.Series) -> list:
    """Python values of a column. Microsecond (or coarser) timestamps become
    ``datetime.datetime`` through numpy, 20x cheaper than ``pd.Timestamp``."""
    arr = col.to_numpy()
    if arr.dtype.kind == "M" and np.datetime_data(arr.dtype)[0] in ("us", "ms", "s"):
        return arr.tolist()
    return col.tolist()


def _key_array(keys: list) -> np.ndarray:
    """Python keys as the array the key-group hash takes (strings as objects, not numpy's
    fixed-width unicode)."""
    return np.array(keys, dtype=object if keys and isinstance(keys[0], str) else None)


class RowFailed(Exception):
    """The function raised on a record (``args[0]``; the cause is the function's error)."""


@functools.lru_cache(maxsize=128)
def record_loop(columns: tuple, key_at: int | None, outputs: bool = True) -> Callable:
    """The loop applying a batch, compiled for these column names:
    ``loop(func, states, append, keys, *values)`` calls ``func(state, record)`` per row
    with the record as a dict display (about 3x cheaper per row than
    ``dict(zip(columns, row))``, and no call per row to build it), keeps the new state and,
    with ``outputs``, appends the output. ``key_at``: the column whose values are the keys
    (``keys`` is then ignored), or None to take them from ``keys``. A function that raises
    raises :class:`RowFailed` with the record it was given. The names enter the source only
    as string literals."""
    vs = [f"v{i}" for i in range(len(columns))]
    record = "{" + ", ".join(f"{c!r}: {v}" for c, v in zip(columns, vs)) + "}"
    k = vs[key_at] if key_at is not None else "k"
    heads = ", ".join(vs if key_at is not None else ["k", *vs])
    cs = [f"c{i}" for i in range(len(columns))]          # the columns' lists of values
    zipped = ", ".join(cs if key_at is not None else ["keys", *cs])
    src = (f"def loop(func, states, append, keys, {', '.join(cs)}):\n"
           "    get = states.get\n"
           "    try:\n"
           f"        for {heads}, in zip({zipped}):\n"
           f"            st, out = func(get({k}), {record})\n"
           f"            states[{k}] = st\n"
           + ("            append(out)\n" if outputs else "") +
           "    except Exception as exc:\n"
           f"        raise RowFailed({record}) from exc\n")
    scope: dict = {"RowFailed": RowFailed}
    exec(compile(src, "<streamlb stateful_map loop>", "exec"), scope)     # noqa: S102 - names made here
    return scope["loop"]


class StatefulMapState(StateStore):
    """Per-key Python state driven by ``func(state, record) -> (state, output)``.

    :meth:`update` returns the function's outputs, one per row, not what it touched, so
    :meth:`frame` takes no ``touched``. Blobs are ``{"states": {key: state}, "key_groups":
    int64 array}``, the groups in the order of the states.
    """

    def __init__(self, operator: str, func, key_name: str, key_groups: int) -> None:
        self.operator = operator
        self.groups = key_groups
        self.func = getattr(func, "func", func)   # unwrap UserFunction: one call less per record
        self.key_name = key_name
        self.states: dict = {}
        self.by_group: dict[int, set] = {}        # key group -> its keys, so a cut is O(moved)
        self._distinct = 0                        # distinct keys of the last batch

    def _index_keys(self, groups: dict) -> None:
        """Add keys to ``by_group`` (``groups``: key -> its key group)."""
        by_group = self.by_group
        for k, g in groups.items():
            by_group.setdefault(g, set()).add(k)

    def _new_keys(self, column: pd.Series, keys: list, groups: np.ndarray | None) -> dict:
        """The keys of a batch without state here, with their key groups (hashed, in one
        vectorised call, only when the caller passed none)."""
        states = self.states
        if groups is None:
            new = [k for k in dict.fromkeys(keys) if k not in states]
            if not new:
                return {}
            return dict(zip(new, assign_to_key_group(_key_array(new), self.groups, name=self.key_name).tolist()))
        # the batch's distinct keys (as Python values, like ``keys``) with the group of the
        # first row of each, found vectorised rather than with a dict over every row
        codes, uniques = factorize_sized(column, self._distinct)
        self._distinct = len(uniques)
        first = first_rows(codes, len(uniques))
        return {k: g for k, g in zip(uniques.tolist(), np.asarray(groups)[first].tolist()) if k not in states}

    def update(self, frame: pd.DataFrame, groups: np.ndarray | None = None, outputs: bool = True) -> list | None:
        """Apply one batch, row by row in order; return the function's output for each row
        (None without ``outputs``: nothing downstream reads them)."""
        cols = [str(c) for c in frame.columns]
        if self.key_name not in frame.columns:
            raise SchemaError(
                f"operator {self.operator!r} needs key column {self.key_name!r}; the batch has "
                f"columns {', '.join(cols)}"
            )
        column = frame[self.key_name]
        values = [_py_values(frame[c]) for c in frame.columns]
        at = frame.columns.get_loc(self.key_name)
        at = at if isinstance(at, int) else None        # (a name given twice: a mask)
        keys = values[at] if at is not None else column.tolist()
        states, func = self.states, self.func
        self._index_keys(self._new_keys(column, keys, groups))
        self.mark_dirty(groups)
        outs: list | None = [] if outputs else None
        try:
            record_loop(tuple(cols), at, outputs)(func, states, outs.append if outputs else None, keys, *values)
        except RowFailed as failed:
            exc, record = failed.__cause__, failed.args[0]
            raise UserFunctionError(
                f"operator {self.operator!r}: function {describe(func)} raised "
                f"{type(exc).__name__}: {exc} on record {record!r}",
                operator=self.operator, function=describe(func), record=record,
            ) from exc
        return outs

    def _held(self, groups: list) -> list:
        """``(key, key group)`` of each key with state here in ``groups``."""
        states = self.states
        return [(k, g) for g in dict.fromkeys(groups) for k in self.by_group.get(g, ()) if k in states]

    @staticmethod
    def _blob(states: dict, groups: list) -> dict:
        return {"states": states, "key_groups": np.array(groups, np.int64)}

    def cut(self, groups) -> dict:
        """Take the state of the keys in ``groups`` out, as a picklable blob."""
        groups = [int(g) for g in groups]
        self.mark_dirty(groups)
        held = self._held(groups)
        for g in groups:
            self.by_group.pop(g, None)
        states = self.states
        return self._blob({k: states.pop(k) for k, _ in held}, [g for _, g in held])

    def snapshot(self, groups) -> dict:
        """The blob :meth:`cut` would give for ``groups``; the states stay (shared, not
        copied: a function must return a new state rather than change the old one)."""
        held = self._held([int(g) for g in groups])
        return self._blob({k: self.states[k] for k, _ in held}, [g for _, g in held])

    def cut_keys(self, keys, groups=None) -> dict:
        """Take the state of single keys out (those held here)."""
        states, out, out_groups = self.states, {}, []
        keys = np.asarray(keys).tolist()
        if groups is None:
            groups = assign_to_key_group(_key_array(keys), self.groups, name=self.key_name) if keys else []
        self.mark_dirty(groups)
        for k, g in zip(keys, np.asarray(groups).tolist()):
            if k in states:
                out[k] = states.pop(k)
                out_groups.append(g)
                self.by_group.get(g, set()).discard(k)
        return self._blob(out, out_groups)

    def contains(self, keys, groups=None) -> np.ndarray:
        """Whether each key has state here (a dict lookup: ``groups`` are not needed)."""
        states = self.states
        return np.fromiter((k in states for k in np.asarray(keys).tolist()), bool, len(keys))

    def install(self, blob: dict) -> None:
        """Add the states of a blob; its keys' groups travel with it, so nothing is hashed."""
        states = self.states
        self.mark_dirty(blob["key_groups"])
        self._index_keys({k: g for k, g in zip(blob["states"], blob["key_groups"].tolist()) if k not in states})
        states.update(blob["states"])

    def __len__(self) -> int:
        return len(self.states)

    def keys_per_group(self, groups) -> np.ndarray:
        """Keys held here of each key group of ``groups``."""
        return np.array([len(self.by_group.get(int(g), ())) for g in groups], np.int64)

    def key_kind(self) -> str | None:
        """dtype kind of the keys as the key-group hash sees them (strings: ``"O"``), from
        one key: a key column holds one type."""
        if not self.states:
            return None
        return _key_array([next(iter(self.states))]).dtype.kind

    def frame(self, touched: None = None) -> pd.DataFrame:
        """Each key's state, in a column ``state``; ``touched`` must be None (see the class)."""
        if touched is not None:
            raise TypeError(f"operator {self.operator!r}: a stateful map's frame takes no touched keys")
        keys = list(self.states)
        return pd.DataFrame(
            {"state": pd.Series(list(self.states.values()), dtype=object)},
        ).set_axis(pd.Index(keys, name=self.key_name))
