"""What a window holds: partial aggregates (``aggregate``) or the rows themselves (``apply``).

A *payload* is what one pane or session holds for one key. :class:`Accumulators` keeps, per
input column, ``[count, sum, min, max]`` as Python numbers (pandas named aggregation's
semantics: nulls skipped, the count of non-null values), combined elementwise; ``Rows``
keeps a list of DataFrame chunks, in arrival order. Both build a batch's payloads per
``(key, bucket)`` in one vectorised pass, and turn fired windows into output columns.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .._functions import describe
from ..exceptions import SchemaError, UserFunctionError
from ._partials import whole


class Accumulators:
    """Payloads of a window ``aggregate``: ``spec`` maps output column to (input, how)."""

    def __init__(self, operator: str, spec: dict) -> None:
        self.operator, self.spec = operator, spec
        self.inputs = sorted({c for c, _ in spec.values()})
        self.dtypes: dict[str, np.dtype] = {}

    def _column(self, frame: pd.DataFrame, c: str) -> np.ndarray:
        if c not in frame.columns:
            raise SchemaError(f"operator {self.operator!r} needs column {c!r}; the batch has columns "
                              f"{', '.join(map(str, frame.columns))}")
        arr = frame[c].to_numpy()
        if arr.dtype.kind not in "iufb" and {h for cc, h in self.spec.values() if cc == c} - {"count"}:
            raise SchemaError(f"operator {self.operator!r}: column {c!r} has dtype {arr.dtype}; "
                              "sum/min/max/mean need a numeric column")
        if c not in self.dtypes and len(arr):
            self.dtypes[c] = np.dtype(np.int64) if arr.dtype.kind in "iub" else np.dtype(np.float64)
        elif arr.dtype.kind == "f" and self.dtypes.get(c, arr.dtype).kind in "iu" and not whole(arr):
            self.dtypes[c] = np.dtype(np.float64)      # held as Python numbers: nothing to convert
        return arr

    def build(self, frame: pd.DataFrame, codes: np.ndarray, n: int) -> list[list]:
        """One payload per bucket ``0..n-1`` (``codes``: each row's bucket)."""
        out = [[] for _ in range(n)]
        for c in self.inputs:
            arr = self._column(frame, c)
            numeric = arr.dtype.kind in "iufb"
            vals = arr.astype(self.dtypes.get(c, np.float64)) if numeric else None
            valid = ~pd.isna(arr) if arr.dtype.kind not in "iub" else np.ones(len(arr), bool)
            cnt = np.bincount(codes[valid], minlength=n)
            if numeric:
                v, cv = vals[valid], codes[valid]
                s = np.zeros(n, vals.dtype)
                np.add.at(s, cv, v)
                if vals.dtype.kind == "i":      # exact integer minima and maxima
                    lo = np.full(n, np.iinfo(np.int64).max)
                    hi = np.full(n, np.iinfo(np.int64).min)
                else:
                    lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
                np.minimum.at(lo, cv, v)
                np.maximum.at(hi, cv, v)
                has = cnt.tolist()
                lo = [x if k else np.inf for x, k in zip(lo.tolist(), has)]
                hi = [x if k else -np.inf for x, k in zip(hi.tolist(), has)]
                rows = zip(has, s.tolist(), lo, hi)
            else:
                rows = ((k, 0, np.inf, -np.inf) for k in cnt.tolist())
            for p, (k, sm, mn, mx) in zip(out, rows):
                p.extend((k, sm, mn, mx))
        return out

    @staticmethod
    def merge(a: list, b: list) -> list:
        """``a`` with ``b`` added in (in place, returned)."""
        for i in range(0, len(a), 4):
            a[i] += b[i]
            a[i + 1] += b[i + 1]
            if b[i + 2] < a[i + 2]:
                a[i + 2] = b[i + 2]
            if b[i + 3] > a[i + 3]:
                a[i + 3] = b[i + 3]
        return a

    @staticmethod
    def copy(a: list) -> list:
        return list(a)

    def columns(self, payloads: list[list], windows: list) -> dict:
        """Output columns of the fired windows (their payloads combined)."""
        where = {c: 4 * i for i, c in enumerate(self.inputs)}
        out = {}
        for name, (c, how) in self.spec.items():
            i = where[c]
            cnt = np.array([p[i] for p in payloads], np.int64)
            if how == "count":
                out[name] = cnt
                continue
            dt = self.dtypes.get(c, np.dtype(np.float64))
            if how == "sum":
                out[name] = np.array([p[i + 1] for p in payloads], dt)
            elif how == "mean":
                s = np.array([p[i + 1] for p in payloads], np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[name] = s / np.where(cnt == 0, np.nan, cnt)
            else:
                j = i + 2 if how == "min" else i + 3
                vals = [p[j] for p in payloads]
                if (cnt == 0).any() or dt.kind != "i":
                    out[name] = np.array([v if k else np.nan for v, k in zip(vals, cnt)], np.float64)
                else:
                    out[name] = np.array(vals, np.int64)
        return out

    def size(self, payload: list) -> int:
        return payload[0] if payload else 0


class Rows:
    """Payloads of a window ``apply``: the rows, kept until the window fires."""

    def __init__(self, operator: str, func) -> None:
        self.operator = operator
        self.func = getattr(func, "func", func)

    def build(self, frame: pd.DataFrame, codes: np.ndarray, n: int) -> list[list]:
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(codes, minlength=n))))
        return [[frame.take(order[a:b])] for a, b in zip(bounds[:-1], bounds[1:])]

    @staticmethod
    def merge(a: list, b: list) -> list:
        a.extend(b)
        return a

    @staticmethod
    def copy(a: list) -> list:
        return list(a)

    def size(self, payload: list) -> int:
        return sum(len(f) for f in payload)

    def call(self, key, start, end, payload: list) -> pd.DataFrame:
        """``func(key, window_start, window_end, rows)`` for one fired window."""
        rows = pd.concat(payload, ignore_index=True) if len(payload) > 1 else payload[0].reset_index(drop=True)
        try:
            out = self.func(key, start, end, rows)
        except Exception as exc:
            raise UserFunctionError(
                f"operator {self.operator!r}: apply function {describe(self.func)} raised {type(exc).__name__}: "
                f"{exc} on key {key!r}, window [{start}, {end}) of {len(rows)} rows",
                operator=self.operator, function=describe(self.func), record=repr(key)) from exc
        if not isinstance(out, pd.DataFrame):
            raise UserFunctionError(
                f"operator {self.operator!r}: apply function {describe(self.func)} returned {type(out).__name__} "
                f"for key {key!r}, window [{start}, {end}); it must return a pandas DataFrame",
                operator=self.operator, function=describe(self.func), record=repr(key))
        return out
