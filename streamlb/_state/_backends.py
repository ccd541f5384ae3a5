"""Choosing a state store for a stage: by its kind, in a storage backend."""
from __future__ import annotations

from ._aggregate import AggregateState
from ._base import StateStore
from ._stateful_map import StatefulMapState

# Storage backends a store can live in: memory, or RocksDB (aggregates, see ._rocks;
# stateful maps and process, on the keyed values of ._values; tumbling and hopping window
# aggregates, panes of ._rocks in ._window_panes_rocks).
BACKENDS = ("memory", "rocksdb")
ROCKSDB_KINDS = ("aggregate", "stateful_map", "process", "window")   # what the RocksDB backend holds so far
# (process(batch=True) keeps its table in memory; of windows, only aggregates of fixed
# windows: see in_rocksdb)


def kept_in_memory(stage) -> str | None:
    """What ``stage`` keeps in memory with the RocksDB backend (the kind it is, as the log
    names it), or None when RocksDB holds its state (or it holds none)."""
    kind = stage.kind
    if kind == "process" and (getattr(stage, "process", None) or {}).get("batch"):
        return "process(batch=True)"
    if kind == "window":
        from ._window_assigners import assigner_of

        mode = stage.window["mode"]
        if mode == "aggregate" and not assigner_of(stage.window).merging:
            return None
        return {"aggregate": "session window", "join": "window join"}.get(mode, f"window {mode}")
    if kind == "join":
        return kind
    return None


def state_directory(configured: str | None) -> str:
    """Where an instance's RocksDB files go: ``streamlb.state.dir``, else the Dask worker's
    local directory (else the temporary directory, outside a worker)."""
    import os
    import tempfile

    if configured:
        return os.path.expanduser(configured)
    try:
        from distributed import get_worker

        base = get_worker().local_directory
    except ValueError:          # not on a worker
        base = tempfile.gettempdir()
    return os.path.join(base, "streamlb-state")


def make_store(stage, key_groups: int, backend: str | None = None) -> StateStore | None:
    """The state store of ``stage``, or None for a stage that holds no keyed state.

    Parameters
    ----------
    stage
        Anything with the attributes ``kind``, ``name``, ``spec``, ``func`` and
        ``key_name`` (a planned stage): ``kind`` "aggregate" or "stateful_map" holds state.
    key_groups : int
        Key groups of the job.
    backend : str, optional
        One of :data:`BACKENDS`; None means the stage's own (``stage.state``, set by
        ``run(state_backend=...)``), else "memory".

    Returns
    -------
    StateStore or None

    Raises
    ------
    ValueError
        For an unknown ``backend``, listing the valid ones.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(kind="aggregate", name="agg", spec={"n": ("v", "count")},
    ...                         func=None, key_name="k")
    >>> type(make_store(stage, 16)).__name__
    'AggregateState'
    >>> make_store(SimpleNamespace(kind="map"), 16) is None
    True
    """
    state = getattr(stage, "state", None) or {}
    backend = backend or state.get("backend") or "memory"
    if backend not in BACKENDS:
        raise ValueError(f"unknown state backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend == "rocksdb" and stage.kind == "aggregate":
        from ._rocks import RocksAggregateState

        return RocksAggregateState(stage.name, stage.spec, stage.key_name, key_groups,
                                   state_directory(state.get("dir")))
    if stage.kind == "aggregate":
        return AggregateState(stage.name, stage.spec, stage.key_name, key_groups)
    if stage.kind == "stateful_map":
        values = None
        if backend == "rocksdb":
            from ._values import RocksValues

            values = RocksValues(stage.name, stage.key_name, key_groups, state_directory(state.get("dir")))
        return StatefulMapState(stage.name, stage.func, stage.key_name, key_groups, values)
    if stage.kind == "window":
        from ._window_assigners import assigner_of
        from ._windows import WindowState

        # an aggregate's windows as numpy tables: whole panes for fixed windows, one table of
        # sessions for merging ones; apply keeps per key what the window's kind keeps
        if stage.window["mode"] == "aggregate" and not assigner_of(stage.window).merging:
            if backend == "rocksdb":
                from ._window_panes_rocks import RocksPaneWindowState

                return RocksPaneWindowState(stage.name, stage.window, stage.key_name, key_groups,
                                            state_directory(state.get("dir")), spec=stage.spec)
            from ._window_panes import PaneWindowState

            return PaneWindowState(stage.name, stage.window, stage.key_name, key_groups, spec=stage.spec)
        if stage.window["mode"] == "aggregate":
            from ._window_session_table import SessionWindowState

            return SessionWindowState(stage.name, stage.window, stage.key_name, key_groups, spec=stage.spec)
        if stage.window["mode"] == "join":
            from ._window_join_panes import PaneJoinState

            return PaneJoinState(stage.name, stage.window, key_groups, stage.join)
        return WindowState(stage.name, stage.window, stage.key_name, key_groups, spec=stage.spec, func=stage.func)
    if stage.kind == "join":
        from ._joins import JoinState
        from .._functions import Where

        where = stage.join["where"]
        return JoinState(stage.name, stage.join, key_groups, where=Where(stage.name, where) if where else None)
    if stage.kind == "process":
        from ._process import ProcessState
        from ._process_table import TableState

        if stage.process.get("batch"):          # process(batch=True): a table, in memory
            return TableState(stage.name, stage.func, stage.key_name, key_groups, stage.process)
        values = None
        if backend == "rocksdb":
            from ._process import RocksEntries

            values = RocksEntries(stage.name, stage.key_name, key_groups, state_directory(state.get("dir")))
        return ProcessState(stage.name, stage.func, stage.key_name, key_groups, stage.process, values)
    return None
