"""Decoding Kafka record values into a batch's columns (``decode="json"`` or a callable),
and which values could not be decoded (they go to dead letters)."""
from __future__ import annotations

import json
from collections.abc import Callable

import pandas as pd

from ..exceptions import PipelineError


def _json_rows(values: list) -> tuple[pd.DataFrame, list[tuple[int, str]]]:
    """JSON objects as rows, and ``(index, reason)`` of each value that is not one.

    All values are parsed as one JSON array first; one by one only when that fails, or
    does not give one object per value.

    >>> frame, bad = _json_rows([b'{"a": 1}', b'{"a": 2, "b": "x"}', b'oops', b'[1]'])
    >>> frame.to_dict("records"), [i for i, _ in bad]
    ([{'a': 1, 'b': nan}, {'a': 2, 'b': 'x'}], [2, 3])
    """
    try:
        rows = json.loads(b"[" + b",".join(values) + b"]")
        if len(rows) == len(values) and all(type(r) is dict for r in rows):
            return pd.DataFrame(rows), []
    except (ValueError, TypeError):     # TypeError: a tombstone (None) among them
        pass
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
