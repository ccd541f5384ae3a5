"""The plan model: a planned job's stages and what each runs, as the workers need it.

No import of streamz or of the planner: a worker process loads this, never the user API
(``streamlb.planner`` builds these objects from a streamz graph)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..exceptions import UnknownOperatorError
from ._step import Step  # noqa: F401  (Plan's stages run Steps)

KEYED_KINDS = ("aggregate", "stateful_map", "window", "join", "process")     # stage kinds that hold keyed state
#: A sender's id at a stage with several inputs: ``slot * SENDERS + instance index`` (slot 0,
#: the only one of most stages, keeps the instance index).
SENDERS = 1 << 16


@dataclass
class Stage:
    """Operators fused between two exchanges, run as ``parallelism`` instances."""

    id: int
    name: str
    kind: str                   # parquet_source, iterable_source, kafka_source, directory_source, or aggregate,
    #                             stateful_map, window, join, process, rebalance
    parallelism: int = 1
    upstream: int | None = None     # the first input (the only one, but for union and join)
    exchange: str = ""          # how records arrive: keyed or round_robin
    key: Any = None             # keyed: column name or function
    key_name: str = "key"
    spec: dict = field(default_factory=dict)      # aggregate
    func: Any = None                              # stateful_map
    files: list = field(default_factory=list)     # parquet_source
    assignment: list = field(default_factory=list)  # parquet_source: files of each instance
    items: list = field(default_factory=list)     # iterable_source
    rate: float | None = None
    batch_size: int = 65536
    batch_size_given: bool = False                  # parquet_source: from_parquet(batch_size=...)
    columns: list | None = None
    read_only: bool = False                         # parquet_source: aggregates alone read its frames
    total_rows: int = 0
    file_rows: dict = field(default_factory=dict)  # parquet_source: rows of each file
    event_time: str | None = None                   # parquet_source: column to merge files by
    time_range: tuple | None = None                 # (min, max) of event_time, float seconds
    cost: float | str | None = None                 # emulated seconds per record, or its column
    shuffle: dict | None = None                     # rebalance: policy, feature, group
    key_kind: str | None = None                     # keyed from Parquet: "i", "b" or "O" (strings)
    watermark: dict | None = None                   # a source with_watermark: column, delay, idle_timeout, unit
    window: dict | None = None                      # window: kind, size, slide, gap, lateness, mode, column, unit
    children: list = field(default_factory=list)
    late: list = field(default_factory=list)        # window, join: steps the late rows go through
    inputs: list = field(default_factory=list)      # upstream stage of each input slot (SENDERS)
    sides: list = field(default_factory=list)       # join: side (0 left, 1 right) of each input slot
    keys: list = field(default_factory=list)        # join: key of each side
    join: dict | None = None                        # join: how, between, ttl, suffixes, where, columns
    process: dict | None = None                     # process: column, unit (its timers' event time)
    source: dict | None = None                      # a source planned by its own module: its options
    state: dict | None = None                       # keyed state's backend and directory (run(state_backend=))

    def __post_init__(self) -> None:
        if self.upstream is not None and not self.inputs:
            self.inputs = [self.upstream]

    def sender(self, upstream: int, index: int) -> int:
        """The sender id here of instance ``index`` of input stage ``upstream``."""
        return self.inputs.index(upstream) * SENDERS + index

    def key_of(self, upstream: int):
        """The key the exchange from input stage ``upstream`` hashes."""
        return self.keys[self.sides[self.inputs.index(upstream)]] if self.sides else self.key

    @property
    def is_source(self) -> bool:
        return self.kind.endswith("_source")

    @property
    def splittable(self) -> bool:
        """Its hot keys can be split over helpers, partial aggregates merged at the key's
        home: an aggregate, or a tumbling or hopping window aggregate."""
        return self.kind == "aggregate" or (self.kind == "window" and self.window["mode"] == "aggregate"
                                            and self.window["kind"] != "session")

    @property
    def merges_lazily(self) -> bool:
        """A ``lazy`` move of this stage's state merges rather than pulls: an aggregate
        nothing reads per batch (no downstream step), whose counts, sums, minima and maxima
        combine, so its rows need no old state to be applied."""
        return self.kind == "aggregate" and not self.children


@dataclass
class Plan:
    stages: list[Stage]
    list_sinks: dict[int, list]     # sink id -> the user's list in the driver
    parquet_paths: list[str]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        names = [s.name for s in self.stages if not s.is_source]
        raise UnknownOperatorError(f"no operator named {name!r}; operators in this job: {', '.join(names)}")
