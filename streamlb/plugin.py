"""``BalancerPlugin``: the scheduler plugin that measures load and moves key groups.

Register it with ``client.register_plugin(BalancerPlugin(...))``, or at scheduler start with
``dask scheduler --preload streamlb.plugin`` (``dask_setup`` below adds it, with settings
from dask config ``streamlb.*``). The plugin lives in ``streamlb._migration._plugin``.
"""
from __future__ import annotations

from ._migration._plugin import NAME, BalancerPlugin, _Job, dask_setup, ensure_plugin  # noqa: F401

__all__ = ["BalancerPlugin", "dask_setup"]
