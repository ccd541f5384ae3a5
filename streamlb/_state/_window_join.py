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


class JoinRows(Rows):
    def __init__(self, operator: str, join: dict) -> None:
        super().__init__(operator, None)
        self.key_names, self.suffixes = list(join["key_names"]), tuple(join["suffixes"])
        self.where = join.get("where")
        if self.where is not None:
            from .._worker._join_op import Where

            self.where = Where(operator, self.where)

    def rows(self, fired: list, tt) -> pd.DataFrame | None:
        """The pairs of every fired window, found with one merge on (key, window)."""
        sides: list[list] = [[], []]
        for w, (_key, _s, _e, pay) in enumerate(fired):
            for f in pay:
                if len(f):
                    sides[int(f[SIDE].iat[0])].append(f.assign(**{_W: w}))
        if not sides[0] or not sides[1]:
            return None
        left, right = (pd.concat(fs, ignore_index=True).drop(columns=[SIDE, KEY]) for fs in sides)
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
