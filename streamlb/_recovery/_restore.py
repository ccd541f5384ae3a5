"""Start a job from a checkpoint: check the graph matches, route, commit what it sealed,
install state, rewind.

Key groups are the unit of redistribution (as in Flink): an operator restored at the
parallelism it was checkpointed at keeps its routing table; at another parallelism it takes
the initial table, and each instance reads the groups it owns from whichever files hold
them. Sources go on from the rows they had emitted at the barrier, per file, so a source
stage may also be restored with another number of instances.

Before any instance starts, the outputs the checkpoint sealed that its job did not commit
(its driver died between the manifest and the commit, or a worker before its Kafka
transaction committed) are committed, and what that job staged after it is dropped
(:func:`resume_outputs`): with the records replayed after the checkpoint, each output is
there once.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from .._sources._parquet import file_key
from ..exceptions import CheckpointError
from ..routing import RoutingTable
from ._coordinator import graph_of

logger = logging.getLogger("streamlb.checkpoint")


def check_compatible(restored: tuple[dict, str], plan, key_groups: int, path: str, resumed: bool = False) -> None:
    """Refuse to restore a checkpoint into a graph it does not fit, naming the mismatch
    (``resumed``: the checkpoint is the latest of the ``checkpoint=`` directory ``path``,
    which a run resumes from unless told otherwise; the error then says what to do)."""
    if not resumed:
        _check(restored[0], plan, key_groups, f"restore from {path!r}")
        return
    try:
        _check(restored[0], plan, key_groups, f"checkpoint={path!r} holds checkpoint {restored[0].get('id')}")
    except CheckpointError as exc:
        raise CheckpointError(
            f"{exc}. A run on a checkpoint directory that holds a complete checkpoint resumes from its latest one, "
            "and this graph does not fit it: give a new checkpoint directory (or empty this one) to start from "
            "scratch, or restore= a checkpoint or savepoint that fits") from None


def _check(manifest: dict, plan, key_groups: int, where: str) -> None:
    """Raise a CheckpointError, starting with ``where``, at the first thing in which the
    graph of ``plan`` does not fit the checkpoint of ``manifest``."""
    old = manifest["graph"]
    new = graph_of(plan, key_groups)
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
    pairs = paired_sources(old["sources"], new["sources"], where)
    for name, was in pairs.items():
        src, mine = old["sources"][was], new["sources"][name]
        saved = manifest["sources"].get(was) or []
        if src["kind"] == "parquet_source":
            _check_files(where, name, src, mine)
        elif src["kind"] == "directory_source":
            _check_directory(where, name, src, mine, saved)
        elif src["kind"] == "kafka_source":
            _check_topic(where, name, mine, saved)
        if (src["kind"] == "iterable_source" or src.get("replay")) and src["parallelism"] != mine["parallelism"]:
            what = "from_iterable: its positions count rows" if src["kind"] == "iterable_source" else \
                "an event-time replay: its positions are times"
            raise CheckpointError(f"{where}: source {name!r} ran as {src['parallelism']} instances and would run "
                                  f"as {mine['parallelism']} ({what} per instance); run on as many workers")


def paired_sources(old: dict, new: dict, where: str) -> dict[str, str]:
    """``{source of the graph: source of the checkpoint it goes on from}``. Sources pair by
    name; a checkpoint's source whose name the graph lacks pairs with the graph's one
    unpaired source of its kind, if each side has only one (a source's name comes from its
    directory or topic, which may change)."""
    pairs = {n: n for n in old if n in new}
    left = [n for n in new if n not in old]
    for n, src in old.items():
        if n in new:
            continue
        kind = src["kind"]
        same = [m for m in left if new[m]["kind"] == kind]
        if len(same) != 1 or sum(old[o]["kind"] == kind for o in old if o not in new) != 1:
            raise CheckpointError(f"{where}: the checkpoint reads source {n!r}, which this graph lacks; "
                                  f"sources here: {', '.join(new)}")
        pairs[same[0]] = n
        left.remove(same[0])
    return pairs


def _few(names) -> str:
    names = sorted(names)
    return ", ".join(map(repr, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _no_match(where: str, name: str, stored, was: str | None, here: str, what: str = "file",
              hint: str | None = None) -> CheckpointError:
    """The error of a restore whose positions of source ``name`` match nothing of it."""
    hint = hint or ("restore into a source over what the checkpoint read (files are named relative to the "
                    "source's directory, which may move), or start without restore=")
    return CheckpointError(
        f"{where}: the positions of source {name!r} name {_few(stored)}{f' (under {was!r})' if was else ''}, "
        f"which match no {what} of the source here, {here!r}; {hint}")


def _absolute(root: str, name: str) -> str:
    return os.path.join(root, *name.split("/"))


def _check_files(where: str, name: str, src: dict, mine: dict) -> None:
    """The checkpoint's files of a Parquet source against the graph's: they must all be
    there; files the checkpoint did not read are read from their start, but for an
    event-time replay (its positions are times over every file) and a checkpoint that
    named its files by absolute path (written before sources had a root)."""
    if "root" in src:
        stored, here = set(src["files"]), set(mine["files"])
    else:
        stored, here = set(src["files"]), {_absolute(mine["root"], f) for f in mine["files"]}
    if stored and not stored & here:
        old_format = "this checkpoint, of an earlier version, names its files by absolute path: restore it " \
            "into the same files at the same place"
        raise _no_match(where, name, stored, src.get("root"), mine["root"],
                        hint=None if "root" in src else old_format)
    missing = sorted(stored - here)
    if missing:
        raise CheckpointError(f"{where}: source {name!r} read {missing[0]!r} in the checkpoint, which is not among "
                              f"its files here ({mine['root']!r}); restore over the files the checkpoint read")
    extra = sorted(here - stored)
    if extra and (src.get("replay") or "root" not in src):
        why = "an event-time replay's positions are times over all its files" if src.get("replay") else \
            "the checkpoint names its files by absolute path"
        raise CheckpointError(f"{where}: source {name!r} reads {extra[0]!r}, which the checkpoint did not ({why}); "
                              "restore over the same files")
    if extra:
        logger.info("%s: source %r reads %d file(s) the checkpoint did not, from their start: %s",
                    where, name, len(extra), _few(extra))


def _check_directory(where: str, name: str, src: dict, mine: dict, saved: list[dict]) -> None:
    """A watched directory that is not the one checkpointed must hold some file its
    positions name (files read already may have been cleaned up from the same directory)."""
    stored = set()
    for pos in saved:
        d = pos.get("directory") or {}
        stored.update(d.get("files") or {}, d.get("done") or ())
    if not stored or src.get("root") in (None, mine["root"]):
        return
    if not any(os.path.exists(_absolute(mine["root"], f)) for f in stored):
        raise _no_match(where, name, stored, src["root"], mine["root"])


def _check_topic(where: str, name: str, mine: dict, saved: list[dict]) -> None:
    """Kafka positions (``"<topic>:<partition>"``) must name partitions of the topic read."""
    stored = {p for pos in saved for p in (pos.get("kafka") or {})}
    if stored and not any(p.rpartition(":")[0] == mine["topic"] for p in stored):
        raise _no_match(where, name, stored, None, f"topic {mine['topic']}", what="partition")


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


def resume_outputs(job, manifest: dict, base: str) -> None:
    """Commit what checkpoint ``manifest`` (files under ``base``) sealed and its job left
    uncommitted, through the job's committers; drop what that job staged after it. A
    savepoint, or a checkpoint written before manifests recorded outputs, records none:
    nothing is done."""
    outputs = manifest.get("outputs")
    if outputs is None or manifest.get("kind", "checkpoint") != "checkpoint":
        return
    from .._checkpoint._paths import resolve

    fs, root = resolve(base)
    try:
        job._results.outputs.resume(outputs, lambda rel: fs.open(f"{root}/{rel}", "rb"))
    except Exception as exc:
        raise CheckpointError(f"resuming checkpoint {manifest.get('id')} in {base!r}: the outputs it sealed could "
                              f"not be committed: {type(exc).__name__}: {exc}") from exc


def install_state(job, manifest: dict, base: str) -> int:
    """Every keyed instance reads and installs the key groups its table gives it, once
    the outputs the checkpoint sealed are committed (:func:`resume_outputs`)."""
    resume_outputs(job, manifest, base)
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
    was = paired_sources(manifest["graph"]["sources"], {st.name: {"kind": st.kind} for st in stages if st.is_source},
                         "restore")
    for st in stages:
        if not st.is_source or was.get(st.name) not in manifest["sources"]:
            continue
        old = manifest["sources"][was[st.name]]
        keys = _file_keys(manifest["graph"]["sources"][was[st.name]], st)
        emitted = {keys(f): n for pos in old for f, n in (pos.get("files") or {}).items()}
        same = len(old) == st.parallelism
        merged = _merged_splits(old)
        for i in range(st.parallelism):
            pos = dict(old[i]) if same else dict(merged)
            pos.pop("ended", None)          # an ended source skips every row and ends again
            if st.files:
                root = st.source["path"]
                pos["files"] = {file_key(root, f): emitted.get(file_key(root, f), 0) for f in st.assignment[i]}
            else:
                pos["files"] = {}
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


def _file_keys(saved: dict, st):
    """How the files the positions of a checkpoint's source name are named here (by
    :func:`file_key`). A checkpoint written before sources had a root named each file as
    its source was given, relative to that driver's working directory: the manifest's
    graph holds its absolute path, which ends with that name."""
    if "root" in saved or not st.files:
        return lambda name: name
    absolute = saved["files"]

    def key(name: str) -> str:
        tail = os.sep + os.path.normpath(name)
        found = [f for f in absolute if f == name or f.endswith(tail)]
        return file_key(st.source["path"], min(found, key=len)) if found else name
    return key


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
