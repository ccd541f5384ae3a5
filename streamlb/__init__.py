"""streamlb: stateful Streamz pipelines on Dask actors, balanced live under key skew."""
from __future__ import annotations

from . import config as _config  # noqa: F401  (installs the dask.config defaults)
from . import nodes as _nodes  # noqa: F401  (registers the nodes on streamz.Stream)
from .exceptions import (
    BrokerUnreachableError,
    CheckpointError,
    CommandError,
    InputPathError,
    JavaNotFoundError,
    JobFailedError,
    JobReleasedError,
    KeyTypeError,
    MigrationError,
    PipelineError,
    ReconfigurationError,
    SchedulerUnreachableError,
    SchemaError,
    StreamlbError,
    UnknownOperatorError,
    StreamlbWarning,
    UnpicklableFunctionError,
    UserFunctionError,
)
from .keygroups import assign_to_key_group, stable_hash
from .balancer import Balancer, LoadReport, Move
from .plugin import BalancerPlugin
from .routing import RoutingTable
from .runtime import IMBALANCE_COLUMNS, METRIC_COLUMNS, Job, run
from . import latency

__version__ = "0.1.0"

# Submodules loaded on first use: ``import streamlb`` stays light (no PySpark, no
# matplotlib), and ``streamlb.datasets.zipf(...)`` works without importing it first.
_LAZY_MODULES = ("datasets", "simulator", "scaler", "cli", "config")


def __getattr__(name: str):
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "simulate":          # the function; the module is streamlb.simulator
        return importlib.import_module(f"{__name__}.simulator").simulate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_MODULES, "simulate"})


__all__ = [
    "run",
    "simulate",
    "Job",
    "METRIC_COLUMNS",
    "IMBALANCE_COLUMNS",
    "latency",
    "RoutingTable",
    "BalancerPlugin",
    "Balancer",
    "LoadReport",
    "Move",
    "assign_to_key_group",
    "stable_hash",
    "StreamlbError",
    "PipelineError",
    "ReconfigurationError",
    "SchemaError",
    "UnknownOperatorError",
    "KeyTypeError",
    "UnpicklableFunctionError",
    "InputPathError",
    "SchedulerUnreachableError",
    "BrokerUnreachableError",
    "JavaNotFoundError",
    "UserFunctionError",
    "JobFailedError",
    "JobReleasedError",
    "MigrationError",
    "CommandError",
    "CheckpointError",
    "StreamlbWarning",
]
