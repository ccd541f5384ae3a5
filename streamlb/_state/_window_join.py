"""Payloads of a window join (``key_by(...).window(...).join(other)``): each pane keeps the
batches' rows as they came, each batch from one side (its side column says which; the key
is in a column of its own, as the sides may name theirs differently); a fired
window joins its left rows with its right rows, as ``pandas.merge`` would, and adds
``window_start`` and ``window_end``."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .._time import from_ns
from ._joins import KEY, SIDE
from ._window_payload import Rows

_W = "_streamlb_window"


class Slice:
    """Rows ``idx`` of a batch ``frame``, one side's: a pane keeps these, not a DataFrame of
    its own (building one per key and pane cost more than the join). Pickled (moved,
    checkpointed) as just its rows."""

    __slots__ = ("frame", "idx", "side")

    def __init__(self, frame: pd.DataFrame, idx: np.ndarray, side: int) -> None:
        self.frame, self.idx, self.side = frame, idx, side

    def __len__(self) -> int:
        return len(self.idx)

    def __getstate__(self):
        return {"frame": self.frame.take(self.idx).reset_index(drop=True), "idx": None, "side": self.side}

    def __setstate__(self, state) -> None:
        self.frame, self.side = state["frame"], state["side"]
        self.idx = np.arange(len(self.frame)) if state["idx"] is None else state["idx"]


class JoinRows(Rows):
    def __init__(self, operator: str, join: dict) -> None:
        super().__init__(operator, None)
        self.key_names, self.suffixes = list(join["key_names"]), tuple(join["suffixes"])
        self.where = join.get("where")
        if self.where is not None:
            from .._functions import Where

            self.where = Where(operator, self.where)

    def build(self, frame: pd.DataFrame, codes: np.ndarray, n: int) -> list[list]:
        """Per key and pane, the slice of the batch (one side's) it holds."""
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(codes, minlength=n))))
        side = int(frame[SIDE].iat[0]) if len(frame) else 0
        return [[Slice(frame, order[a:b], side)] for a, b in zip(bounds[:-1], bounds[1:])]

    def size(self, payload: list) -> int:
        return sum(len(x) for x in payload)

    def rows(self, fired: list, tt) -> pd.DataFrame | None:
        """The pairs of every fired window, found with one merge on (key, window): each
        side's rows gathered with one ``take`` per batch they came in."""
        picks: list[dict] = [{}, {}]         # side -> id(frame) -> (frame, [idx], [window])
        for w, (_key, _s, _e, pay) in enumerate(fired):
            for x in pay:
                if len(x):
                    entry = picks[x.side].setdefault(id(x.frame), (x.frame, [], []))
                    entry[1].append(x.idx)
                    entry[2].append(np.full(len(x.idx), w, np.int64))
        if not picks[0] or not picks[1]:
            return None
        left, right = (self._gather(p) for p in picks)
        lk, rk = self.key_names
        out = pd.merge(left, right, left_on=[lk, _W], right_on=[rk, _W], suffixes=self.suffixes, sort=False)
        if self.where is not None and len(out):
            out = out[self.where(out.drop(columns=[_W]))].reset_index(drop=True)
        if not len(out):
            return None
        w = out.pop(_W).to_numpy()
        starts = np.array([f[1] for f in fired], np.int64)
        ends = np.array([f[2] for f in fired], np.int64)
        return out.assign(window_start=from_ns(starts[w], tt), window_end=from_ns(ends[w], tt))

    @staticmethod
    def _gather(picks: dict) -> pd.DataFrame:
        parts = []
        for frame, idx, ws in picks.values():
            part = frame.take(np.concatenate(idx)).drop(columns=[SIDE, KEY])
            parts.append(part.assign(**{_W: np.concatenate(ws)}))
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)
