"""Start a job from a checkpoint: check the graph matches, route, install state, rewind.

Key groups are the unit of redistribution (as in Flink): an operator restored at the
parallelism it was checkpointed at keeps its routing table; at another parallelism it takes
the initial table, and each instance reads the groups it owns from whichever files hold
them. Sources go on from the rows they had emitted at the barrier, per file, so a source
stage may also be restored with another number of instances.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..exceptions import CheckpointError
from ..routing import RoutingTable
from ._coordinator import graph_of


def check_compatible(restored: tuple[dict, str], plan, key_groups: int, path: str) -> None:
    """Refuse to restore a checkpoint into a graph it does not fit, naming the mismatch."""
    manifest = restored[0]
    old = manifest["graph"]
    new = graph_of(plan, key_groups)
    where = f"restore from {path!r}"
    if old["key_groups"] != key_groups:
        raise CheckpointError(f"{where}: the checkpoint has {old['key_groups']} key groups, this job "
                              f"{key_groups}; run with key_groups={old['key_groups']} "
                              "(they are fixed for a job's state)")
    for name, op in old["operators"].items():
        if name not in new["operators"]:
            raise CheckpointError(f"{where}: the checkpoint holds state of operator {name!r} ({op['kind']}), "
                                  f"which this graph lacks; keyed operators here: "
                                  f"{', '.join(new['operators']) or 'none'}")
        mine = new["operators"][name]
        for field in ("kind", "key", "spec"):
            if op[field] != mine[field]:
                raise CheckpointError(f"{where}: operator {name!r} has {field} {op[field]!r} in the checkpoint "
                                      f"but {mine[field]!r} in this graph")
    extra = sorted(set(new["operators"]) - set(old["operators"]))
    if extra:
        raise CheckpointError(f"{where}: operator {extra[0]!r} of this graph has no state in the checkpoint "
                              f"(it holds {', '.join(old['operators']) or 'none'}); restore into the graph "
                              "that wrote it")
    for name, src in old["sources"].items():
        if name not in new["sources"]:
            raise CheckpointError(f"{where}: the checkpoint reads source {name!r}, which this graph lacks; "
                                  f"sources here: {', '.join(new['sources'])}")
        mine = new["sources"][name]
        if sorted(src["files"]) != sorted(mine["files"]):
            gone = sorted(set(src["files"]) ^ set(mine["files"]))
            raise CheckpointError(f"{where}: source {name!r} read other files in the checkpoint: file "
                                  f"{gone[0]!r} is in one and not the other")
        if (src["kind"] == "iterable_source" or src.get("replay")) and src["parallelism"] != mine["parallelism"]:
            what = "from_iterable: its positions count rows" if src["kind"] == "iterable_source" else \
                "an event-time replay: its positions are times"
            raise CheckpointError(f"{where}: source {name!r} ran as {src['parallelism']} instances and would run "
                                  f"as {mine['parallelism']} ({what} per instance); run on as many workers")


def restored_tables(manifest: dict, stages) -> dict[int, RoutingTable]:
    """The routing table of each keyed stage: the checkpoint's at the same parallelism,
    else the initial one."""
    out = {}
    G = manifest["graph"]["key_groups"]
    for st in stages:
        op = manifest["operators"].get(st.name)
        if op is None or st.exchange != "keyed":
            continue
        if op["parallelism"] == st.parallelism:
            out[st.id] = RoutingTable(np.asarray(op["table"], np.int64), st.parallelism, int(op["epoch"]))
        else:
            out[st.id] = RoutingTable.initial(G, st.parallelism)
    return out


def install_state(job, manifest: dict, base: str) -> int:
    """Every keyed instance reads and installs the key groups its table gives it."""
    calls = []
    for st in job.plan.stages:
        op = manifest["operators"].get(st.name)
        if op is None or st.id not in job.tables:
            continue
        slim = {"files": manifest["files"], "operators": {st.name: {"groups": op["groups"]}}}
        owners = job.tables[st.id].owners
        for i in range(st.parallelism):
            groups = np.flatnonzero(owners == i).tolist()
            calls.append(job.actors[(st.id, i)].restore(base, slim, groups))
    keys = 0
    for c in calls:
        try:
            keys += c.result()
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"restoring job {job.id} from {base!r} failed: {type(exc).__name__}: {exc}") from exc
    return keys


def source_positions(manifest: dict, stages, fresh_clock: bool) -> dict:
    """``(stage id, index) -> (origin, position)`` for each source instance.

    ``fresh_clock`` (a new job): pacing starts now, and a replayed event-time log goes on
    from where it was; else (a recovery) the sources keep their clock and catch up."""
    out = {}
    now = time.time()
    for st in stages:
        if not st.is_source or st.name not in manifest["sources"]:
            continue
        old = manifest["sources"][st.name]
        emitted: dict[str, int] = {}
        for pos in old:
            for f, n in (pos.get("files") or {}).items():
                emitted[os.path.abspath(f)] = n
        same = len(old) == st.parallelism
        merged = _merged_splits(old)
        for i in range(st.parallelism):
            pos = dict(old[i]) if same else dict(merged)
            pos.pop("ended", None)          # an ended source skips every row and ends again
            pos["files"] = {f: emitted.get(os.path.abspath(f), 0) for f in st.assignment[i]} if st.files else {}
            pos.setdefault("rows", 0)
            origin = pos.get("epoch0")
            if fresh_clock or not same:
                pos.update(t0=None, sent=0, records_out=0, started_at=now)
                until = pos.get("replayed_until")
                if st.rate and st.event_time and st.time_range and until is not None:
                    lo, hi = st.time_range
                    origin = now - (until - lo) / (hi - lo) * (st.total_rows / st.rate)
                else:
                    origin = None
            pos.setdefault("records_out", 0)
            pos.setdefault("started_at", now)
            out[(st.id, i)] = (origin, pos)
    return out


def _merged_splits(old: list[dict]) -> dict:
    """The split positions of every old instance of a source that assigns its splits itself
    (Kafka partitions, files of a watched directory), merged: at another parallelism each new
    instance gets them all and takes its own (a partition or file it owns now)."""
    kafka: dict = {}
    files: dict = {}
    done: set = set()
    for pos in old:
        kafka.update(pos.get("kafka") or {})
        d = pos.get("directory") or {}
        files.update(d.get("files") or {})
        done.update(d.get("done") or ())
    out: dict = {}
    if kafka:
        out["kafka"] = kafka
    if files or done:
        out["directory"] = {"files": {f: n for f, n in files.items() if f not in done}, "done": sorted(done)}
    return out
