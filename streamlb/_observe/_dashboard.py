"""The streamlb page of the Dask dashboard (to be built)."""
from __future__ import annotations


def attach(plugin, scheduler) -> None:
    pass


def detach(plugin) -> None:
    pass
