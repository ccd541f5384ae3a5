"""Keyed state stores of the stateful operators, behind one interface.

:class:`StateStore` is the contract; :class:`AggregateState` and :class:`StatefulMapState`
implement it in memory; ``_backends.make_store`` picks the store of a stage (imported from
its module: the operators it builds stores for import this package). :class:`KeySet` is
the stores' key index, for callers that track sets of keys.
"""
from __future__ import annotations

from ._aggregate import AggregateState
from ._base import StateStore
from ._index import KeySet
from ._stateful_map import StatefulMapState

__all__ = ["StateStore", "AggregateState", "StatefulMapState", "KeySet"]
