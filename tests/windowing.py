"""Ground truth for window tests: pandas over the same records, independent of streamlb."""
from __future__ import annotations

import numpy as np
import pandas as pd

S = 1_000_000_000


def assign(frame: pd.DataFrame, kind: str, size: int = 0, slide: int = 0, gap: int = 0) -> pd.DataFrame:
    """Every (record, window) pair: the records' columns plus ``ws``, ``we`` (int ns)."""
    t = frame["event_time"].to_numpy().astype("datetime64[ns]").view(np.int64)
    if kind == "session":
        d = frame.assign(_t=t).sort_values(["key", "_t"], kind="stable")
        new = d.groupby("key")["_t"].diff().isna() | (d.groupby("key")["_t"].diff() > gap)
        d["_sid"] = new.cumsum()
        bounds = d.groupby("_sid")["_t"].agg(ws="min", last="max")
        d = d.join(bounds, on="_sid")
        return d.assign(we=d["last"] + gap).drop(columns=["_t", "_sid", "last"])
    parts = []
    for j in range(-(-size // slide)):
        start = (t // slide) * slide - j * slide
        ok = start + size > t
        parts.append(frame[ok].assign(ws=start[ok], we=start[ok] + size))
    return pd.concat(parts, ignore_index=True)


def expected(frame: pd.DataFrame, kind: str, late: pd.DataFrame | None = None, **win) -> pd.DataFrame:
    """count and sum of ``value`` per key and window, over the records not late for it."""
    rec = ["key", "value", "event_time"]
    if kind == "session":       # a late record is not applied at all: sessions of the others
        if late is not None and len(late):
            frame = _minus(frame[rec], late[rec])
        pairs = assign(frame, kind, **win)
    else:                       # a record is applied to the windows it was not late for
        pairs = assign(frame, kind, **win)
        if late is not None and len(late):
            lk = late.assign(ws=_ns(late["window_start"]), we=_ns(late["window_end"]))
            pairs = _minus(pairs[rec + ["ws", "we"]], lk[rec + ["ws", "we"]])
    out = pairs.groupby(["key", "ws", "we"])["value"].agg(n="count", total="sum").reset_index()
    return out.sort_values(["key", "ws"]).reset_index(drop=True)


def _ns(col: pd.Series) -> np.ndarray:
    return col.to_numpy().astype("datetime64[ns]").view(np.int64)


def _minus(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Multiset difference ``a - b`` (every row of ``b`` must be in ``a``)."""
    cols = list(a.columns)
    a = a.assign(_n=a.groupby(cols).cumcount())
    b = b.assign(_n=b.groupby(cols).cumcount())
    m = a.merge(b, on=cols + ["_n"], how="left", indicator=True)
    assert (b.merge(a, on=cols + ["_n"], how="left", indicator=True)["_merge"] == "both").all(), \
        "a late row is not one of the input's (record, window) pairs"
    return m[m["_merge"] == "left_only"].drop(columns=["_n", "_merge"])


def emitted(frames: list) -> pd.DataFrame:
    """The operator's output rows, as ``expected`` gives them."""
    out = pd.concat(frames, ignore_index=True)
    assert isinstance(out.index, pd.RangeIndex)
    out = out.assign(ws=_ns(out["window_start"]), we=_ns(out["window_end"]))
    return out[["key", "ws", "we", "n", "total"]].sort_values(["key", "ws"]).reset_index(drop=True)


def check(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert not got.duplicated(["key", "ws"]).any(), "a window was emitted twice"
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
