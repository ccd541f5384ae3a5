"""Payloads of a window join (``key_by(...).window(...).join(other)``): each pane keeps the
batches' rows as they came, each batch from one side (its side column says which); a fired
window joins its left rows with its right rows, as ``pandas.merge`` would, and adds
``window_start`` and ``window_end``."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .._time import from_ns
from ._joins import SIDE
from ._window_payload import Rows


class JoinRows(Rows):
    def __init__(self, operator: str, join: dict) -> None:
        super().__init__(operator, None)
        self.key_names, self.suffixes = list(join["key_names"]), tuple(join["suffixes"])
        self.where = join.get("where")
        if self.where is not None:
            from .._worker._join_op import Where

            self.where = Where(operator, self.where)

    def pairs(self, payload: list) -> pd.DataFrame | None:
        """The window's pairs of rows with equal keys (the payload holds one key's rows)."""
        sides = [[f for f in payload if len(f) and f[SIDE].iat[0] == side] for side in (0, 1)]
        if not sides[0] or not sides[1]:
            return None
        left, right = (pd.concat(fs, ignore_index=True).drop(columns=[SIDE]) for fs in sides)
        lk, rk = self.key_names
        out = pd.merge(left, right, left_on=lk, right_on=rk, suffixes=self.suffixes, sort=False)
        if self.where is not None and len(out):
            out = out[self.where(out)].reset_index(drop=True)
        return out if len(out) else None

    def rows(self, fired: list, tt) -> pd.DataFrame | None:
        parts = []
        for _key, s, e, pay in fired:
            out = self.pairs(pay)
            if out is not None:
                parts.append(out.assign(window_start=from_ns(np.full(len(out), s), tt),
                                        window_end=from_ns(np.full(len(out), e), tt)))
        return pd.concat(parts, ignore_index=True) if parts else None
