"""Kafka records held by a reader (:class:`Held`), decoding their values into a batch's
columns (``decode="json"`` or a callable), and which values could not be decoded (they go
to dead letters)."""
from __future__ import annotations

import gc
import json
from contextlib import contextmanager
from collections.abc import Callable

import pandas as pd

from ..exceptions import PipelineError

try:                                # about three times the standard library's speed
    from orjson import loads as _loads
except ImportError:                 # pragma: no cover - orjson comes with the kafka extra
    _loads = json.loads


class Held:
    """One partition's records read and not handed out yet, as plain lists of their
    values, keys, timestamps (ms) and offsets: no ``Message`` objects are kept (hundreds of
    thousands of them alive make every full garbage collection of the process slow, and the
    decoding allocates enough to run many).

    >>> h = Held()
    >>> h.extend([b"a", b"b", b"c"], [None] * 3, [5, 6, 7], [10, 11, 12])
    >>> h.take(2), len(h)
    (([b'a', b'b'], [None, None], [5, 6], [10, 11]), 1)
    """

    __slots__ = ("values", "keys", "stamps", "offsets")

    def __init__(self) -> None:
        self.values: list = []
        self.keys: list = []
        self.stamps: list[int] = []
        self.offsets: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def extend(self, values: list, keys: list, stamps: list, offsets: list) -> None:
        self.values += values
        self.keys += keys
        self.stamps += stamps
        self.offsets += offsets

    def take(self, n: int) -> tuple[list, list, list, list]:
        """The first ``n`` records (values, keys, stamps, offsets), removed."""
        out = (self.values[:n], self.keys[:n], self.stamps[:n], self.offsets[:n])
        del self.values[:n], self.keys[:n], self.stamps[:n], self.offsets[:n]
        return out


@contextmanager
def no_collection():
    """No garbage collection meanwhile: a batch read and parsed makes objects by the
    thousand (messages, an object per row and field) that stay alive until the batch is
    built, and the collections they would set off scan every object of the worker process:
    that doubled the cost of reading JSON. What runs meanwhile makes no reference cycles;
    collection resumes after (other threads' allocations are only collected later)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _json_rows(values: list) -> tuple[pd.DataFrame | dict, list[tuple[int, str]]]:
    """JSON objects as rows, and ``(index, reason)`` of each value that is not one. The rows
    come as a dict of columns (lists, for ``pandas.DataFrame``) when every object has the
    same fields, else as a DataFrame: the columns pandas makes of the objects either way.

    All values are parsed as one JSON array first (with orjson when it is installed); one
    by one (the standard library's parser, which also takes ``NaN`` and integers of any
    size) only when that fails, or does not give one object per value.

    >>> frame, bad = _json_rows([b'{"a": 1}', b'{"a": 2, "b": "x"}', b'oops', b'[1]'])
    >>> frame.to_dict("records"), [i for i, _ in bad]
    ([{'a': 1, 'b': nan}, {'a': 2, 'b': 'x'}], [2, 3])
    >>> _json_rows([b'{"a": 1, "b": null}', b'{"b": 2.5, "a": 3}'])
    ({'a': [1, 3], 'b': [None, 2.5]}, [])
    """
    with no_collection():
        try:
            rows = _loads(b"[" + b",".join(values) + b"]")
        except (ValueError, TypeError):     # TypeError: a tombstone (None) among them
            rows = None
        if rows is not None and len(rows) == len(values) and all(type(r) is dict for r in rows):
            fields = rows[0].keys() if rows else {}.keys()
            if all(r.keys() == fields for r in rows):
                return {k: [r[k] for r in rows] for k in fields}, []
            return pd.DataFrame(rows), []
    rows, bad = [], []
    for i, v in enumerate(values):
        try:
            row = json.loads(v) if v is not None else None
        except ValueError as e:
            bad.append((i, f"not JSON: {e}"))
            continue
        if type(row) is not dict:
            bad.append((i, f"not a JSON object: {type(row).__name__}" if v is not None else "no value (tombstone)"))
            continue
        rows.append(row)
    return pd.DataFrame(rows), bad


def _decoded(decode: Callable, values: list) -> tuple[pd.DataFrame, list[tuple[int, str]]]:
    """``decode(values)``; if it raises, value by value, to find the ones it cannot take."""
    name = getattr(decode, "__qualname__", repr(decode))
    try:
        return _checked(decode, name, values), []
    except PipelineError:
        raise
    except Exception:
        pass
    frames, bad = [], []
    for i, v in enumerate(values):
        try:
            frames.append(_checked(decode, name, [v]))
        except PipelineError:
            raise
        except Exception as e:
            bad.append((i, f"decode function {name} raised {type(e).__name__}: {e}"))
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), bad


def _checked(decode: Callable, name: str, values: list) -> pd.DataFrame:
    frame = decode(values)
    if not isinstance(frame, pd.DataFrame) or len(frame) != len(values):
        got = f"{len(frame)} rows" if isinstance(frame, pd.DataFrame) else type(frame).__name__
        raise PipelineError(f"Kafka source decode function {name} must return a DataFrame of one row per "
                            f"value: got {got} for {len(values)} values")
    return frame
