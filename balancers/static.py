"""``static``: never moves anything (the baseline)."""
from __future__ import annotations

from streamlb.balancer import Balancer, LoadReport, Move


class StaticBalancer(Balancer):
    """Keeps the initial routing table for the whole job.

    >>> import numpy as np
    >>> StaticBalancer().plan(LoadReport("op", np.array([0, 1]), np.array([9.0, 1.0]), 2))
    []
    """

    name = "static"

    def plan(self, report: LoadReport) -> list[Move]:
        return []
