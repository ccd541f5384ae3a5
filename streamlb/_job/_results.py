"""Reading what a job computed and measured: state, metrics, imbalance, dead letters,
offsets, the summary, the plugin's view and load traces.

:class:`Results` keeps what the instances handed the driver (the outputs of each poll,
committed through the sinks' committers, :attr:`Results.outputs`; the last poll's rows,
the metrics of instances retired or released) and asks the instances, or the coordinator
of the job's migrations, for the rest.
"""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import pandas as pd

from .. import config
from .._state._budget import DRIVER_COPIES, WORKER_COPIES, fits, free_memory
from ..exceptions import JobReleasedError, PipelineError, StateTooLargeError, StreamlbError
from .._plan._model import KEYED_KINDS, Stage
from .._sinks import Committers

logger = logging.getLogger("streamlb.job")

__all__ = ["METRIC_COLUMNS", "IMBALANCE_COLUMNS", "Results", "keyed"]

METRIC_COLUMNS = [
    "operator", "instance", "worker", "window_start", "records", "busy_seconds",
    "queued_batches", "latency_p50_ms", "latency_p99_ms", "latency_max_ms", "latency_mean_ms",
    "split_records", "latency_hist", "batches", "late_records",
]

#: Columns of :meth:`Job.imbalance`.
IMBALANCE_COLUMNS = ["window_start", "applied", "routed", "planned", "floor", "records", "batches", "epoch"]


def keyed(job, operator: str, only: str, error: type[StreamlbError] = PipelineError) -> Stage:
    """The stage of ``operator`` if it is keyed; else ``error``: "... is not keyed; <only>"."""
    st = job.plan.stage(operator)
    if st.id not in job.tables:
        raise error(f"operator {operator!r} is not keyed; {only}")
    return st


def _read_memory() -> int | None:
    """``streamlb.state.read-memory`` in bytes (None: unset)."""
    value = config.get("state.read-memory")
    if value in (None, ""):
        return None
    from dask.utils import parse_bytes

    try:
        return int(parse_bytes(value))
    except (TypeError, ValueError):
        raise PipelineError(f"setting streamlb.state.read-memory={value!r}: give a size in bytes, e.g. 512MiB or "
                            "2GB, or null for what each process has free") from None


class Results:
    """What ``job``'s instances produced and measured, and how to read it."""

    def __init__(self, job) -> None:
        self.job = job
        self.last: list[dict] = []              # the rows of the last poll
        self.dead: list[dict] = []              # dead letters
        self.retired_metrics: list[dict] = []   # load windows of instances no longer there
        # where each list sink's items of this job start: a list may hold items of before
        self.list_start = {sid: len(items) for sid, items in job.plan.list_sinks.items()}
        # the driver's side of the job's sinks: commits what the instances staged or reported
        self.outputs = Committers(job.plan, self.dead, job.id)

    def take_outputs(self, r: dict) -> None:
        """The outputs of one instance's poll answer ``r`` (list-sink items, dead letters)."""
        self.outputs.take(r)

    def absorb_retired(self, key, last: dict) -> None:
        """The last poll of a retired actor: its outputs and metrics are the job's."""
        self.take_outputs(last)
        checkpointer = self.job.checkpointer
        if last.get("final") and checkpointer is not None:
            checkpointer.stage_outputs(last["final"], label=None)
        self.retired_metrics.extend(last.get("metrics", ()))

    def _list_sink(self, sink) -> int:
        """The id of list sink ``sink``: its list, its ``sink`` node, or None for the only one."""
        sinks = self.job.plan.list_sinks
        if sink is None:
            if len(sinks) == 1:
                return next(iter(sinks))
            raise PipelineError(f"results(): the job has {len(sinks)} list sinks; pass the list that "
                                ".sink_to_list() returned (or the L of .sink(L.append))")
        target = getattr(getattr(sink, "func", None), "__self__", sink)     # a sink node: its list
        for sid, items in sinks.items():
            if items is target:
                return sid
        raise PipelineError(f"results({type(sink).__name__}): not a list sink of this job; pass the list "
                            f"that .sink_to_list() returned (or the L of .sink(L.append)): the job has "
                            f"{len(sinks)}")

    def results(self, sink=None):
        """See :meth:`streamlb.Job.results`."""
        return self._follow(self._list_sink(sink))

    def _follow(self, sid: int):
        job = self.job
        items, i = job.plan.list_sinks[sid], self.list_start[sid]
        interval = config.seconds("poll-interval")
        while True:
            running = job.status == "running"
            if running:
                try:        # wait's own polls, recoveries, commits and Ctrl-C, one interval at a time
                    job.wait(timeout=interval)
                except TimeoutError:
                    pass
            while i < len(items):
                yield items[i]
                i += 1
            if not running:
                if job.error is not None:       # failed meanwhile (wait raises it when it sees it)
                    raise job.error
                return

    def _stage_actors(self, name: str):
        job = self.job
        st = job.plan.stage(name)
        actors = [job.actors.get((st.id, i)) for i in range(st.parallelism)]     # a drain may let go meanwhile
        if None in actors or job.cluster_gone():
            raise JobReleasedError(job._release.reason(st.name))
        return st, actors

    def _keyed_state(self, operator: str):
        st, actors = self._stage_actors(operator)
        if st.kind not in KEYED_KINDS:
            raise PipelineError(f"operator {operator!r} is a {st.kind} and holds no keyed state")
        return actors

    def state(self, operator: str, key_groups=None) -> pd.DataFrame:
        """See :meth:`streamlb.Job.state`."""
        st = self.job.plan.stage(operator)
        if key_groups is not None:
            key_groups = self._key_groups(st, key_groups)
        with self._moves_paused(st):
            actors = self._keyed_state(operator)
            estimates = [f.result() for f in [a.state_estimate(key_groups) for a in actors]]
            self._refuse_too_large(st, key_groups, estimates)
            parts = [f.result() for f in [a.state(key_groups, e["bytes"]) for a, e in zip(actors, estimates)]]
        # an instance that holds no key knows no column's dtype (its empty frame is float):
        # joined in, it would turn the others' int64 sums, minima and maxima into floats
        parts = [p for p in parts if len(p)] or parts[:1]
        if st.kind == "window":       # the open windows, in the output's columns
            out = pd.concat(parts, ignore_index=True)
            return out.sort_values([st.key_name, "window_start", "window_end"], kind="stable").reset_index(drop=True)
        return pd.concat(parts).sort_index()

    def _refuse_too_large(self, st, key_groups, estimates: list[dict]) -> None:
        """Raise ``StateTooLargeError`` if the frame an instance would build does not fit in
        what its worker has free, or their join in what the driver has (``._budget``)."""
        job = self.job
        cap = _read_memory()
        if cap is not None:
            estimates = [dict(e, free=min(e["free"], cap)) for e in estimates]
        total = sum(e["bytes"] for e in estimates)
        here = free_memory() if cap is None else min(free_memory(), cap)
        if all(fits(e["bytes"], e["free"], WORKER_COPIES) for e in estimates) and fits(total, here, DRIVER_COPIES):
            return
        # a slice of key groups may all be held by one instance: what one of its groups costs
        # there bounds the slice, and the densest instance's bounds it in the driver too
        per_group = [e["bytes"] / max(e["groups"], 1) for e in estimates]
        room = [e["free"] / (WORKER_COPIES * b) for e, b in zip(estimates, per_group) if b]
        room.append(here / (DRIVER_COPIES * max(per_group)) if max(per_group) else job.key_groups)
        per_read = min(max(int(min(room) * 0.8), 1), job.key_groups)
        mib = lambda n: f"{n / 2**20:,.0f} MiB"     # noqa: E731
        worst = min(range(len(estimates)), key=lambda i: (e := estimates[i])["free"] / max(e["bytes"], 1))
        e = estimates[worst]
        if fits(e["bytes"], e["free"], WORKER_COPIES):
            where, nbytes, free = (f"the driver would join {len(estimates)} parts of about {mib(total)} in all, "
                                   f"and {DRIVER_COPIES}x that (the parts and their join)", total, here)
        else:
            where = (f"instance {st.name}[{worst}] on {job.workers_of.get((st.id, worst))} would build a frame of "
                     f"{e['rows']:,} rows, about {mib(e['bytes'])}, and {WORKER_COPIES}x that while it is built and "
                     "sent")
            nbytes, free = e["bytes"], e["free"]
        what = "all of its state" if key_groups is None else f"{len(key_groups)} key groups"
        if st.kind == "aggregate":
            how = (f"Read it a slice at a time: job.state({st.name!r}, key_groups=range(a, a + {per_read})) for a in "
                   f"range(0, {job.key_groups}, {per_read}) (job.state_size({st.name!r}) counts the keys, "
                   "reading none)")
        else:
            how = (f"A {st.kind}'s state is read whole (key_groups= reads an aggregate's): give the workers and the "
                   "driver more memory, or write what you need with a sink")
        raise StateTooLargeError(
            f"job.state({st.name!r}) refused ({what}): {where} does not fit in the {mib(free)} free there. "
            f"Nothing was read; the state is intact. {how}.",
            st.name, nbytes, free, per_read if st.kind == "aggregate" else 0)

    @contextlib.contextmanager
    def _moves_paused(self, st):
        """No key group of ``st`` starts moving while its instances are read, and a move in
        flight ends first: the instances answer at different times, so an old owner that
        answered before a move's prepare and a new owner that answered after it would both
        hold the moving groups (or, the other way round, neither would)."""
        job = self.job
        if job.status != "running" or st.id not in job.tables:
            yield
            return
        try:
            job._migrations.pause_moves([st.name], config.seconds("migration.timeout"))
        except Exception as exc:        # a move that does not end: read as the instances are
            logger.warning("job %s: reading %r while a migration in flight did not end: %s", job.id, st.name, exc)
            yield
            return
        try:
            yield
        finally:
            job._migrations.resume_moves([st.name])

    def _key_groups(self, st, key_groups) -> list[int]:
        """``key_groups`` checked: ints within the job's key groups, for an aggregate."""
        G = self.job.key_groups
        if st.kind != "aggregate":
            raise PipelineError(f"state({st.name!r}, key_groups=...): only an aggregate's state is read by key "
                                f"group; {st.name!r} is a {st.kind}")
        try:
            groups = sorted({int(g) for g in key_groups})
        except (TypeError, ValueError):
            raise PipelineError(f"state({st.name!r}, key_groups={key_groups!r}): key groups are integers in "
                                f"0..{G - 1}") from None
        bad = [g for g in groups if not 0 <= g < G]
        if bad:
            raise PipelineError(f"state({st.name!r}, key_groups=...): key group {bad[0]} is not one of the "
                                f"job's 0..{G - 1}")
        return groups

    def state_size(self, operator: str) -> dict[int, int]:
        """See :meth:`streamlb.Job.state_size`."""
        return {i: f.result() for i, f in enumerate([a.state_size() for a in self._keyed_state(operator)])}

    def metrics(self) -> pd.DataFrame:
        """See :meth:`streamlb.Job.metrics`."""
        rows = [r for f in [a.metrics() for a in list(self.job.actors.values())] for r in f.result()]
        return pd.DataFrame(self.retired_metrics + rows, columns=METRIC_COLUMNS)

    def imbalance(self, operator: str) -> pd.DataFrame:
        """See :meth:`streamlb.Job.imbalance`."""
        job = self.job
        st = keyed(job, operator, "imbalance is measured between the instances of a keyed operator")
        try:
            entries = job._migrations.balancer_state().get("operators", {}).get(operator, {}).get("imbalance")
        except PipelineError:           # no balancer: what the instances measured
            entries = None
        if entries is not None:
            frame = pd.DataFrame(entries).rename(columns={"imbalance": "applied"})
            frame = frame.reindex(columns=IMBALANCE_COLUMNS)
            frame["window_start"] = pd.to_datetime(frame["window_start"], unit="s")
            return frame.astype({"batches": "float64"}).reset_index(drop=True)
        m = self.metrics()
        m = m[m["operator"] == st.name]
        rows = []
        for ws, w in m.groupby("window_start", sort=True):
            if len(w) < st.parallelism or w["records"].sum() <= 0:
                continue
            rec = w["records"].to_numpy(float)
            rows.append({"window_start": ws, "applied": rec.max() / rec.mean(), "routed": np.nan,
                         "planned": np.nan, "floor": np.nan, "records": rec.sum(),
                         "batches": float(w["batches"].min()), "epoch": np.nan})
        return pd.DataFrame(rows, columns=IMBALANCE_COLUMNS)

    def load_trace(self, operator: str):
        """See :meth:`streamlb.Job.load_trace`."""
        job = self.job
        return job._migrations.load_trace(
            operator, check=lambda: keyed(job, operator, "only keyed operators have load traces"))

    def summary(self) -> dict:
        """See :meth:`streamlb.Job.summary`."""
        job = self.job
        rows = self.last or job._lifecycle.poll()
        src = [r for r in rows if job.plan.stages[r["key"][0]].is_source]
        records = sum(r["records_out"] for r in src)
        starts = [r["started_at"] for r in src if r["started_at"]]
        ends = [r["finished_at"] for r in rows if r["finished_at"]]
        elapsed = (max(ends) - min(starts)) if starts and ends else float("nan")
        return {"records": records, "seconds": elapsed,
                "records_per_second": records / elapsed if elapsed else float("nan"),
                "dead_letters": len(self.dead)}

    def dead_letters(self) -> pd.DataFrame:
        """See :meth:`streamlb.Job.dead_letters`."""
        job = self.job
        if job.status == "running" and job.actors:
            job._lifecycle.poll()
        return pd.DataFrame(self.dead, columns=["operator", "instance", "reason", "record"])

    def watermarks(self) -> pd.DataFrame:
        """See :meth:`streamlb.Job.watermarks`."""
        job = self.job
        rows = job._lifecycle.poll() if job.status == "running" else (self.last or [])
        out = []
        for r in rows:
            wm = r.get("watermark")
            if wm is None:
                continue
            st = job.plan.stages[r["key"][0]]
            ns = wm["watermark_ns"]
            out.append({"operator": st.name, "instance": r["key"][1],
                        "watermark": pd.NaT if ns is None else pd.Timestamp(ns, unit="ns"), "idle": wm["idle"]})
        frame = pd.DataFrame(out, columns=["operator", "instance", "watermark", "idle"])
        return frame.astype({"watermark": "datetime64[ns]", "idle": bool}).sort_values(
            ["operator", "instance"], kind="stable").reset_index(drop=True)

    def offsets(self) -> dict[str, int]:
        """See :meth:`streamlb.Job.offsets`."""
        job = self.job
        rows = job._lifecycle.poll() if job.status == "running" else self.last
        out: dict[str, int] = {}
        for r in rows:
            out.update(r["offsets"])
        return out
