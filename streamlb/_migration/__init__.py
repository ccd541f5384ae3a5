"""Live migration: the epoch protocol's coordinator, the balancer plugin that drives it,
the control a job reaches it through, and the instances' side of the protocol.

``_control`` holds what the coordinator knows of a job; ``_epochs`` moves key groups and
``_split`` splits keys, both over the steps in ``_protocol``; ``_reports`` merges load
reports; ``_plugin`` is the scheduler plugin; ``_driver`` the job's side. ``_owner``,
``_moves`` and ``_prefetch`` are what an instance does in an epoch (see docs/migration.md
and docs/runtime.md).
"""
from __future__ import annotations

from ._control import JobControl
from ._driver import Control, open_control
from ._epochs import STRATEGIES, check_strategy
from ._plugin import NAME, BalancerPlugin, dask_setup, ensure_plugin

__all__ = ["BalancerPlugin", "Control", "JobControl", "NAME", "STRATEGIES", "check_strategy", "dask_setup",
           "ensure_plugin", "open_control"]
