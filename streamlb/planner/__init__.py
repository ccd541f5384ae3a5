"""Cut a streamz graph into stages at exchanges; check it before anything starts."""
from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Sized

import pandas as pd
from streamz import Stream
from streamz import core as sz
from streamz import sinks as sz_sinks
from streamz import sources as sz_sources

from .. import config
from ..nodes import _join as _nj
from ..nodes import _time as _nt
from . import _join as _plan_join
from ._checks import _check_columns, _project
from ._time import event_time as _event_time
from .. import nodes
from ..nodes._base import late_records
from ..nodes import _kafka as _nodes_kafka
from ..nodes import _select as _nodes_select
from ..exceptions import InputPathError, PipelineError, SchemaError
from .._plan._step import Step, _ship
from .._plan._model import Plan, Stage
from .._sources._directory import set_expectations
from ._sink_state import warn_driver_state

__all__ = ["Plan", "Stage", "Step", "plan"]

SUPPORTED = ("from_parquet, from_iterable, from_kafka_topic, with_watermark, key_by, aggregate, stateful_map, "
             "window, apply, join, process, union, rebalance, select, map, starmap, filter, flatten, sink, "
             "sink_to_list, to_parquet, to_kafka_topic")
#: Source nodes planned by their own module: node type -> ``plan(planner, node) -> Stage``
#: (a new source registers here; its reader goes in ``streamlb._sources.READERS``).
SOURCES: dict = {_nodes_kafka.from_kafka_topic: _nodes_kafka.plan}
#: Sink nodes planned by their own module: node type -> ``plan(planner, node, stage) -> Step``.
SINKS: dict = {_nodes_kafka.to_kafka_topic: _nodes_kafka.plan_sink}


def _graph(node: Stream) -> list[Stream]:
    seen: dict[int, Stream] = {}
    todo = [node]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        todo.extend(u for u in n.upstreams if u is not None)
        todo.extend(d for d in n.downstreams if d is not None)
    return list(seen.values())


def parquet_files(path: str) -> list[str]:
    """Data files of a Parquet input path, sorted; raise InputPathError naming the path."""
    if not os.path.exists(path):
        raise InputPathError(f"input path {path!r} does not exist; give a Parquet file or a directory of them")
    if os.path.isfile(path):
        return [path]
    files = sorted(
        f for f in glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)
        if not any(part.startswith(("_", ".")) for part in os.path.relpath(f, path).split(os.sep))
    )
    if not files:
        raise InputPathError(f"input path {path!r} holds no *.parquet files")
    return files


def _time_range(files: list[str], column: str | None) -> tuple[float, float] | None:
    """(min, max) of ``column`` over all files, from Parquet statistics, as float seconds."""
    if column is None:
        return None
    import pyarrow.parquet as pq

    lo, hi = [], []
    for f in files:
        md = input_file(f).metadata
        names = md.schema.to_arrow_schema().names
        if column not in names:
            raise SchemaError(
                f"from_parquet: event_time column {column!r} is not in {f!r}; columns there: {', '.join(names)}"
            )
        i = names.index(column)
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(i).statistics
            if st is None or not st.has_min_max:
                with _reading(f):
                    t = pq.read_table(f, columns=[column]).column(0)
                import pyarrow.compute as pc

                mm = pc.min_max(t)
                lo.append(_seconds(mm["min"].as_py()))
                hi.append(_seconds(mm["max"].as_py()))
                break
            lo.append(_seconds(st.min))
            hi.append(_seconds(st.max))
    return (min(lo), max(hi)) if lo else None


def _seconds(v) -> float:
    """A timestamp or number as float seconds (numbers are taken as seconds)."""
    if hasattr(v, "timestamp"):
        return pd.Timestamp(v).value / 1e9
    return float(v)


def _row_counts(files: list[str]) -> list[int]:
    return [input_file(f).metadata.num_rows for f in files]


@contextlib.contextmanager
def _reading(path: str):
    """Turn pyarrow's error reading input file ``path`` (a bare ``ArrowInvalid`` or
    ``OSError`` that names no file) into an InputPathError naming it and what to do."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        raise InputPathError(
            f"input file {path!r} is not a readable Parquet file ({exc}); rewrite or remove it, or rename it "
            "to start with '_' or '.' to have it skipped (a file still being written should be written under "
            "such a name and renamed into place)") from exc


def input_file(path: str):
    """``pyarrow.parquet.ParquetFile(path)`` of an input file being planned; a file that
    does not open as Parquet (corrupt, cut short, not Parquet at all) raises InputPathError
    naming it."""
    import pyarrow.parquet as pq

    with _reading(path):
        return pq.ParquetFile(path)


def assign_files(files: list[str], rows: list[int], parallelism: int) -> list[list[str]]:
    """Whole files to source instances, largest first to the least loaded (LPT).

    Each instance then reads its files in name order.

    >>> assign_files(["a", "b", "c", "d"], [10, 60, 20, 30], 2)
    [['b'], ['a', 'c', 'd']]
    """
    load = [0] * parallelism
    owned: list[list[str]] = [[] for _ in range(parallelism)]
    for f, r in sorted(zip(files, rows), key=lambda fr: (-fr[1], fr[0])):
        i = min(range(parallelism), key=lambda j: (load[j], j))
        load[i] += r
        owned[i].append(f)
    return [sorted(o) for o in owned]


class _Planner:
    def __init__(self, workers: int, key_groups: int, batch_size: int, parallelism: int | None):
        self.workers = workers
        self.key_groups = key_groups
        self.batch_size = batch_size
        self.parallelism = parallelism
        self.stages: list[Stage] = []
        self.list_sinks: dict[int, list] = {}
        self.parquet_paths: list[str] = []
        self.names: set[str] = set()
        self.memo: dict[int, Stage] = {}    # node id -> its stage (reached again through a union or join)

    def default_parallelism(self, asked: int | None) -> int:
        return asked or self.parallelism or self.workers

    def new_stage(self, **kw) -> Stage:
        st = Stage(id=len(self.stages), **kw)
        self.stages.append(st)
        return st

    def unique_name(self, asked: str | None, default: str) -> str:
        if asked is not None:
            if asked in self.names:
                raise PipelineError(f"two operators are named {asked!r}; operator names must be unique in a job")
            self.names.add(asked)
            return asked
        name, i = default, 1
        while name in self.names:
            name, i = f"{default}-{i}", i + 1
        self.names.add(name)
        return name

    def source(self, n: Stream) -> None:
        if isinstance(n, nodes.from_parquet) and n.watch is not None:
            st = self.directory(n)
        elif isinstance(n, nodes.from_parquet):
            files = [os.path.abspath(f) for f in parquet_files(n.path)]    # a worker's working directory is its own
            par = min(n.parallelism or self.workers, len(files))
            rows = _row_counts(files)
            st = self.new_stage(
                name=self.unique_name(None, f"from_parquet({os.path.basename(n.path.rstrip(os.sep))})"),
                kind="parquet_source", parallelism=par, files=files, rate=n.rate,
                batch_size=n.batch_size or self.batch_size, batch_size_given=n.batch_size is not None,
                columns=n.columns,
                total_rows=sum(rows), file_rows=dict(zip(files, rows)), assignment=assign_files(files, rows, par),
                event_time=n.event_time, time_range=_time_range(files, n.event_time),
                source={"path": os.path.dirname(files[0]) if os.path.isfile(n.path) else os.path.abspath(n.path)},
            )
        elif isinstance(n, sz_sources.from_iterable):
            items = _iterable_items(n._iterable)
            n._iterable = items     # an iterator reads once, and run() plans twice (a check first)
            st = self.new_stage(
                name=self.unique_name(None, "from_iterable"), kind="iterable_source",
                parallelism=1, items=items, batch_size=self.batch_size,
                total_rows=sum(len(x) if isinstance(x, pd.DataFrame) else 1 for x in items),
            )
        elif type(n) in SOURCES:            # a source planned by its own module
            st = SOURCES[type(n)](self, n)
        else:
            raise PipelineError(
                f"node {n} has no upstream but is not a streamlb source; sources are "
                "Stream.from_parquet(...), Stream.from_iterable(...) and Stream.from_kafka_topic(...)"
            )
        st.children = self.children(n, st)

    def directory(self, n: nodes.from_parquet) -> Stage:
        """The stage of ``from_parquet(path, watch=...)``: a directory read as files appear
        in it (none need be there yet), one instance per worker unless ``parallelism=``."""
        if not os.path.isdir(n.path):
            what = "is a file" if os.path.exists(n.path) else "does not exist"
            raise InputPathError(f"from_parquet({n.path!r}, watch={n.watch!r}): {n.path!r} {what}; watch= "
                                 "watches a directory, which must exist (it may be empty)")
        return self.new_stage(
            name=self.unique_name(None, f"from_parquet({os.path.basename(n.path.rstrip(os.sep))})"),
            kind="directory_source", parallelism=n.parallelism or self.workers, rate=n.rate,
            batch_size=n.batch_size or self.batch_size, batch_size_given=n.batch_size is not None,
            columns=n.columns, event_time=n.event_time,
            source={"path": os.path.abspath(n.path), "watch": n.watch},
        )

    def children(self, n: Stream, stage: Stage) -> list[Step]:
        out: list[Step] = []
        for d in n.downstreams:
            if isinstance(d, nodes.key_by):
                self.one_upstream(d)
                out.extend(self.keyed(d, stage))
            elif isinstance(d, sz.union):
                out.extend(self.children(d, stage))
            elif isinstance(d, late_records):
                if stage.kind not in ("window", "join"):
                    raise PipelineError(f"late() of operator {stage.name!r}: only window operators "
                                        "(key_by(...).window(...).aggregate/apply) and joins have a late stream")
                stage.late.extend(self.children(d, stage))
            elif isinstance(d, _nt.with_watermark):
                out.append(self.watermark(d, stage))
            elif d is not None:
                out.append(self.step(d, stage))
        return out

    def watermark(self, n, stage: Stage) -> Step:
        """``with_watermark`` in a source's stage: the step that observes event times."""
        what = f"with_watermark({n.column!r})"
        if not stage.is_source:
            raise PipelineError(
                f"{what} is in the stage of operator {stage.name!r}; put it in a source's stage, "
                "before its first key_by or rebalance (Stream.from_parquet(...).with_watermark(...))")
        if stage.watermark is not None:
            raise PipelineError(f"{what}: source {stage.name!r} already has with_watermark"
                                f"({stage.watermark['column']!r}); a source has one event-time column")
        stage.watermark = {k: getattr(n, k) for k in ("column", "delay", "idle_timeout", "unit")}
        return Step("watermark", children=self.children(n, stage), name=n.column)

    def one_upstream(self, n: Stream) -> None:
        if len([u for u in n.upstreams if u is not None]) > 1 and not isinstance(n, (sz.union, _nj.join)):
            raise PipelineError(
                f"node {n} joins several streams; streamlb supports one upstream per node "
                f"(supported nodes: {SUPPORTED})"
            )

    def step(self, n: Stream, stage: Stage) -> Step:
        self.one_upstream(n)
        if isinstance(n, nodes.rebalance):
            if id(n) in self.memo:          # after a union: one more input
                return _plan_join.another_input(self, self.memo[id(n)], stage)
            st = self.new_stage(
                name=self.unique_name(None, "rebalance"), kind="rebalance",
                parallelism=self.default_parallelism(n.parallelism), upstream=stage.id,
                exchange="round_robin", cost=n.cost,
            )
            feature = _ship(n.feature, st.name) if callable(n.feature) else n.feature
            st.shuffle = {"policy": n.balancer, "feature": feature, "group": n.group}
            self.memo[id(n)] = st
            st.children = self.children(n, st)
            return Step("exchange", target=st.id)
        if isinstance(n, (nodes.aggregate, nodes.stateful_map, _nt.window, _nj.join, _nj.process)):
            label = f"{type(n).__name__} {n.op_name!r}" if getattr(n, "op_name", None) else type(n).__name__
            raise PipelineError(f"{label} needs a keyed input: put .key_by(column) right before it")
        if isinstance(n, _nt.apply):
            raise PipelineError("apply needs windows: put .key_by(column).window(...) before it")
        if isinstance(n, nodes.to_parquet):
            self.parquet_paths.append(n.path)
            return Step("parquet_sink", path=n.path)
        if type(n) in SINKS:
            return SINKS[type(n)](self, n, stage)
        if isinstance(n, sz_sinks.sink):
            owner = getattr(n.func, "__self__", None)
            if isinstance(owner, list) and getattr(n.func, "__name__", "") == "append":
                sid = len(self.list_sinks)
                self.list_sinks[sid] = owner
                return Step("list_sink", target=sid)
            warn_driver_state(n, n.func)
            return Step("sink", func=_ship(n.func, stage.name), args=n.args, kwargs=n.kwargs)
        if isinstance(n, sz.flatten):
            return Step("flatten", children=self.children(n, stage))
        if isinstance(n, _nodes_select.select):
            return Step("select", args=(tuple(n.columns),), children=self.children(n, stage), name=n.name)
        for cls, kind, attr in ((sz.map, "map", "func"), (sz.starmap, "starmap", "func"),
                                (sz.filter, "filter", "predicate")):
            if type(n) is cls:
                func = _ship(getattr(n, attr), stage.name)
                return Step(kind, func=func, args=tuple(n.args), kwargs=dict(n.kwargs),
                            children=self.children(n, stage), name=n.name)
        raise PipelineError(f"node {type(n).__name__} is not supported by streamlb; supported nodes: {SUPPORTED}")

    def keyed(self, kb: nodes.key_by, stage: Stage) -> list[Step]:
        """One keyed exchange per operator that reads ``kb``: each is its own stage with
        its own routing table, and the upstream router hashes the key once per operator
        (docs/user-guide.md, "One keyed stream, several operators")."""
        downs = [d for d in kb.downstreams if d is not None]
        label = f"key_by({kb.key_name!r})"
        # streamz holds a plain node (map, filter, sink) after key_by only weakly: one that nothing
        # else holds is gone by now, so "nothing" is also what a key_by(...).map(f) leaves
        valid = ("after key_by come only keyed operators: .aggregate(spec), .stateful_map(func), "
                 ".process(func), .join(other), and .window(...) followed by .aggregate, .apply or .join "
                 f"(any number of them); map, filter and the like go before key_by, e.g. .map(f).key_by("
                 f"{kb.key_name!r}), or after the keyed operator")
        if not downs:
            raise PipelineError(f"{label} is followed by no keyed operator; {valid}")
        for d in downs:
            if not isinstance(d, (nodes.aggregate, nodes.stateful_map, _nt.window, _nj.join, _nj.process)):
                raise PipelineError(f"{label} is followed by node {d}; {valid}")
        out = []
        for op in downs:
            if isinstance(op, _nt.window):
                out.extend(self.windowed(kb, op, stage))
            elif isinstance(op, _nj.join):
                out.append(_plan_join.joined(self, kb, op, stage))
            else:
                out.append(self.keyed_operator(kb, op, stage))
        return out

    def windowed(self, kb: nodes.key_by, win, stage: Stage) -> list[Step]:
        """``key_by(...).window(...)`` followed by ``aggregate`` or ``apply``: one window
        stage each."""
        downs = [d for d in win.downstreams if d is not None]
        if not downs or not all(isinstance(d, (nodes.aggregate, _nt.apply, _nj.join)) for d in downs):
            raise PipelineError(
                f"window({win.kind}) after key_by({kb.key_name!r}) must be followed by .aggregate(spec), "
                f".apply(func) or .join(other); it is followed by {', '.join(map(str, downs)) or 'nothing'}")
        return [_plan_join.joined(self, kb, op, stage) if isinstance(op, _nj.join)
                else self.keyed_operator(kb, op, stage, window=win) for op in downs]

    def keyed_operator(self, kb: nodes.key_by, op, stage: Stage, window=None) -> Step:
        """The stage of keyed operator ``op`` (after ``window``, if given) and the exchange
        into it from ``stage``."""
        if id(op) in self.memo:             # after a union: one more input
            return _plan_join.another_input(self, self.memo[id(op)], stage)
        kind = type(op).__name__
        name = self.unique_name(op.op_name, kind)
        key = _ship(kb.key, name) if callable(kb.key) else kb.key
        func = _ship(op.func, name) if kind in ("stateful_map", "apply", "process") else None
        st = self.new_stage(
            name=name, kind="window" if window is not None else kind,
            parallelism=min(self.default_parallelism(op.parallelism), self.key_groups),
            upstream=stage.id, exchange="keyed", key=key, key_name=kb.key_name,
            spec=getattr(op, "spec", {}), func=func, cost=op.cost,
            window={**window.describe(), "mode": kind} if window is not None else None,
        )
        if kind == "process":
            st.func = (func, _ship(op.on_timer, name) if op.on_timer is not None else None)
            st.process = {"batch": op.batch}
        self.memo[id(op)] = st
        st.children = self.children(op, st)
        return Step("exchange", target=st.id)


def _iterable_items(iterable) -> list:
    """The items of ``Stream.from_iterable``, read at planning and checked. An iterable that
    is not a collection (a generator, an iterator) may never end: it is read up to the
    setting ``streamlb.iterable-max-records`` records (a DataFrame item counts its rows), and
    one with more is refused rather than read for ever."""
    bound = None if isinstance(iterable, Sized) else int(config.get("iterable-max-records"))
    items, records = [], 0
    for i, item in enumerate(iterable):
        if not isinstance(item, (dict, pd.DataFrame)):
            raise PipelineError(
                f"from_iterable: item {i} is a {type(item).__name__} ({item!r:.80}); items "
                "must be dicts (one record each) or pandas DataFrames (one batch each)"
            )
        records += len(item) if isinstance(item, pd.DataFrame) else 1
        if bound is not None and records > bound:
            raise PipelineError(
                f"from_iterable: its {type(iterable).__name__} holds more than {bound:,} records "
                "(setting streamlb.iterable-max-records), and it is read whole when the job is planned, "
                "so an endless one would never start; pass a list, or read an unbounded stream with "
                "Stream.from_kafka_topic(...) or Stream.from_parquet(directory, watch=...)"
            )
        items.append(item)
    return items


def plan(node: Stream, *, workers: int, key_groups: int, batch_size: int,
         parallelism: int | None = None) -> Plan:
    """Plan the whole graph ``node`` belongs to."""
    if not isinstance(node, Stream):
        raise PipelineError(f"streamlb.run needs a streamz node, got {type(node).__name__}")
    p = _Planner(workers, key_groups, batch_size, parallelism)
    roots = [n for n in _graph(node) if not [u for u in n.upstreams if u is not None]]
    for r in sorted(roots, key=lambda r: str(r)):
        p.source(r)
    if not any(not s.is_source for s in p.stages) and not any(
        s.children for s in p.stages
    ):
        raise PipelineError("the pipeline has a source but no operator or sink after it")
    result = Plan(p.stages, p.list_sinks, p.parquet_paths)
    _plan_join.check_joins(result)
    _event_time(result)
    _check_columns(result)
    _project(result)
    set_expectations(result)
    return result
