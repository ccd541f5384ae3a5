"""streamlb: stateful Streamz pipelines on Dask actors, balanced live under key skew."""
from __future__ import annotations

from . import config as _config  # noqa: F401  (installs the dask.config defaults)
from .exceptions import (
    BrokerUnreachableError,
    CheckpointError,
    CommandError,
    InputPathError,
    InstanceUnresponsiveError,
    JavaNotFoundError,
    JobFailedError,
    JobReleasedError,
    JobServiceError,
    KeyTypeError,
    MigrationError,
    PeerUnreachableError,
    PipelineError,
    ReconfigurationError,
    SchedulerUnreachableError,
    SchemaError,
    SinkWriteError,
    StateTooLargeError,
    StreamlbError,
    UnknownOperatorError,
    StreamlbWarning,
    UnpicklableFunctionError,
    UserFunctionError,
)
from .keygroups import assign_to_key_group, stable_hash
from .balancer import Balancer, LoadReport, Move
from .routing import RoutingTable
from . import latency
from ._streamz_hook import register_nodes_with_streamz

__version__ = "0.1.0"

# Submodules loaded on first use: ``import streamlb`` stays light (no PySpark, no
# matplotlib), and ``streamlb.datasets.zipf(...)`` works without importing it first.
_LAZY_MODULES = ("datasets", "simulator", "scaler", "cli", "config", "nodes", "planner", "runtime", "plugin",
                 "service")
#: The user API, loaded on first use: a worker process imports ``streamlb`` (the package of
#: every actor it runs) but never the planner, the nodes or streamz (docs/runtime.md, "Layers").
_LAZY_NAMES = {"run": "runtime", "Job": "runtime", "METRIC_COLUMNS": "runtime", "IMBALANCE_COLUMNS": "runtime",
               "BalancerPlugin": "plugin", "submit": "service", "jobs": "service", "attach": "service",
               "RemoteJob": "service"}

# The nodes register on ``streamz.Stream`` as soon as streamz is imported, before or after
# streamlb: ``import streamlb`` followed by ``Stream.from_parquet`` works as it always did,
# and a process that never imports streamz (a Dask worker) never loads them.
register_nodes_with_streamz()


def __getattr__(name: str):
    import importlib

    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "simulate":          # the function; the module is streamlb.simulator
        return importlib.import_module(f"{__name__}.simulator").simulate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_MODULES, *_LAZY_NAMES, "simulate"})


__all__ = [
    "run",
    "submit",
    "jobs",
    "attach",
    "RemoteJob",
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
    "JobServiceError",
    "MigrationError",
    "CommandError",
    "CheckpointError",
    "SinkWriteError",
    "StateTooLargeError",
    "PeerUnreachableError",
    "InstanceUnresponsiveError",
    "StreamlbWarning",
]
