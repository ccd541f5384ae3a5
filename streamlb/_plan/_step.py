"""A ``Step`` of a planned stage (one node fused into it) and ``_ship``, the check that a
user function travels by value: what the planner and the modules that plan one kind of
node (``_plan_join``, ``_nodes_kafka``) share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._functions import UserFunction


@dataclass
class Step:
    """One node fused into a stage. ``kind`` is map, starmap, filter, flatten, sink,
    list_sink, parquet_sink or exchange; ``children`` get what it emits."""

    kind: str
    func: Any = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    target: int = -1            # exchange: downstream stage id; list_sink: sink id
    path: str = ""              # parquet_sink
    children: list = field(default_factory=list)
    name: str | None = None     # map, starmap, filter: the streamz node's name (``stream_name=``)


def _ship(func, operator: str) -> UserFunction:
    """Wrap a user function to travel by value; fail now, naming it, if it cannot."""
    uf = UserFunction(func)
    uf.payload(operator)
    return uf
