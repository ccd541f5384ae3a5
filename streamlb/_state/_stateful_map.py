"""Stateful map state: one Python object per key, driven by a user function."""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pandas as pd

from .._functions import describe
from ..exceptions import SchemaError, UserFunctionError
from ._base import StateStore
from ._index import factorize_sized, first_rows
from ._values import KeyedValues, MemoryValues, key_array as _key_array  # noqa: F401 - other stores import it here


def _py_values(col: pd.Series) -> list:
    """Python values of a column. Microsecond (or coarser) timestamps become
    ``datetime.datetime`` through numpy, 20x cheaper than ``pd.Timestamp``."""
    arr = col.to_numpy()
    if arr.dtype.kind == "M" and np.datetime_data(arr.dtype)[0] in ("us", "ms", "s"):
        return arr.tolist()
    return col.tolist()


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
    """Per-key Python state driven by ``func(state, record) -> (state, output)``, kept in
    ``values`` (a :class:`~._values.KeyedValues`: in memory by default, or in RocksDB).

    :meth:`update` returns the function's outputs, one per row, not what it touched, so
    :meth:`frame` takes no ``touched``. Blobs are ``{"states": {key: state}, "key_groups":
    int64 array}``, the groups in the order of the states, whatever the backend.
    """

    def __init__(self, operator: str, func, key_name: str, key_groups: int,
                 values: KeyedValues | None = None) -> None:
        self.operator = operator
        self.groups = key_groups
        self.func = getattr(func, "func", func)   # unwrap UserFunction: one call less per record
        self.key_name = key_name
        self.values = MemoryValues(key_name, key_groups) if values is None else values
        self._distinct = 0                        # distinct keys of the last batch

    def close(self) -> None:
        """Give back what the values hold outside the process (a RocksDB database)."""
        self.values.close()

    def _distinct_keys(self, column: pd.Series, keys: list, groups: np.ndarray | None) -> tuple[list, list | None]:
        """The distinct keys of a batch (as Python values, like ``keys``) with their key
        groups, the group of the first row of each found vectorised rather than with a dict
        over every row (None without ``groups``: the values hash the keys they need)."""
        if groups is None:
            return list(dict.fromkeys(keys)), None
        codes, uniques = factorize_sized(column, self._distinct)
        self._distinct = len(uniques)
        first = first_rows(codes, len(uniques))
        return uniques.tolist(), np.asarray(groups)[first].tolist()

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
        func = self.func
        states = self.values.view(*self._distinct_keys(column, keys, groups))
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
        finally:
            self.values.write(states)          # the rows before a failure keep their states
        return outs

    @staticmethod
    def _blob(taken: tuple[dict, list]) -> dict:
        states, groups = taken
        return {"states": states, "key_groups": np.array(groups, np.int64)}

    def cut(self, groups) -> dict:
        """Take the state of the keys in ``groups`` out, as a picklable blob."""
        groups = [int(g) for g in groups]
        self.mark_dirty(groups)
        return self._blob(self.values.cut(groups))

    def snapshot(self, groups) -> dict:
        """The blob :meth:`cut` would give for ``groups``; the states stay (in memory shared,
        not copied: a function must return a new state rather than change the old one)."""
        return self._blob(self.values.snapshot([int(g) for g in groups]))

    def cut_keys(self, keys, groups=None) -> dict:
        """Take the state of single keys out (those held here)."""
        keys = np.asarray(keys).tolist()
        if groups is not None:
            groups = np.asarray(groups).tolist()
            self.mark_dirty(groups)
        taken = self.values.cut_keys(keys, groups)
        if groups is None:
            self.mark_dirty(taken[1])
        return self._blob(taken)

    def contains(self, keys, groups=None) -> np.ndarray:
        """Whether each key has state here."""
        return self.values.contains(np.asarray(keys).tolist(), None if groups is None else np.asarray(groups).tolist())

    def install(self, blob: dict) -> None:
        """Add the states of a blob; its keys' groups travel with it, so nothing is hashed."""
        self.mark_dirty(blob["key_groups"])
        self.values.install(blob["states"], blob["key_groups"].tolist())

    def __len__(self) -> int:
        return len(self.values)

    def keys_per_group(self, groups) -> np.ndarray:
        """Keys held here of each key group of ``groups``."""
        return self.values.keys_per_group(groups)

    def key_kind(self) -> str | None:
        """dtype kind of the keys as the key-group hash sees them (strings: ``"O"``), from
        one key: a key column holds one type."""
        return self.values.key_kind()

    def _frame(self, keys: list, states: list) -> pd.DataFrame:
        return pd.DataFrame(
            {"state": pd.Series(states, dtype=object)},
        ).set_axis(pd.Index(keys, name=self.key_name))

    def frame(self, touched: None = None) -> pd.DataFrame:
        """Each key's state, in a column ``state``; ``touched`` must be None (see the class)."""
        if touched is not None:
            raise TypeError(f"operator {self.operator!r}: a stateful map's frame takes no touched keys")
        return self._frame(*self.values.items())

    def frame_of_groups(self, groups) -> pd.DataFrame:
        """The state of key groups ``groups`` alone, as :meth:`frame` gives it."""
        states = self.values.snapshot([int(g) for g in groups])[0]
        return self._frame(list(states), list(states.values()))
