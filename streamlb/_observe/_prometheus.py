"""Prometheus series of the plugin's jobs on the scheduler's ``/metrics`` (to be built)."""
from __future__ import annotations


def attach(plugin, scheduler) -> None:
    pass


def detach(plugin) -> None:
    pass
