"""Live reconfiguration of a running job: rescale an operator, move an instance, drain a
retiring worker, update a function, autoscale (see docs/reconfiguration.md).

``_live`` orders the steps from the driver; the instances' side is
``streamlb._worker._reconfig``. ``_plan`` says which key groups move; ``_update`` finds and
switches user functions.
"""
from __future__ import annotations

from ..exceptions import ReconfigurationError
from ._live import Reconfigurer
from ._plan import spread

__all__ = ["ReconfigurationError", "Reconfigurer", "spread"]
