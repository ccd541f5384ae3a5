"""Autoscaling: measure each autoscaled operator's rates, ask the scaler, rescale.

Once a window, :class:`Autoscaler` (a thread of the job's driver: only a client creates
actors) builds the report a :class:`~streamlb.scaler.Scaler` takes from the instances'
metrics rows and the sources' progress, and carries the plan out with ``Job.rescale``.
Every decision is recorded in ``Job.history`` (``kind`` ``autoscale``) and, for a balanced
job, in the plugin's ``balancer_state()``. A decision the cluster has no room for (an
existing cluster whose workers already hold ``scaler.instances-per-thread`` instances per
thread) is recorded as *wanted*, not carried out, so a cluster manager can act on it.
"""
from __future__ import annotations

import logging
import math
import threading
import time

import pandas as pd

from .. import config
from .._placement import cluster_workers
from ..scaler import true_rate

logger = logging.getLogger("streamlb.autoscale")


class Autoscaler:
    """Runs ``scaler`` over the operators ``ranges`` (name -> (min, max)) of ``job``."""

    def __init__(self, job, scaler, ranges: dict[str, tuple[int, int]], *, window: float) -> None:
        self.job, self.scaler, self.ranges, self.window = job, scaler, ranges, window
        self.changed: dict[str, float] = {}
        self.decisions: list[dict] = []
        self.wanted: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"streamlb-autoscale-{job.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.window):
            if self.job.status != "running":
                return
            try:
                self.step()
            except Exception as exc:        # the job runs on; the failure is recorded
                if self.job.status == "running":
                    logger.warning("streamlb autoscaler: %s: %s", type(exc).__name__, exc)
                    self._record({"operator": None, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"})

    # -- one decision ----------------------------------------------------------------------------
    def report(self, now: float | None = None) -> dict:
        """The scaler's report from the last complete window of each autoscaled operator."""
        job = self.job
        now = time.time() if now is None else now
        m = job.metrics()
        srcs = [r for r in (job._last or []) if job.plan.stages[r["key"][0]].is_source and r["status"] == "running"]
        # what the sources are asked for (open-loop, paced sources report it), and the
        # records they are behind their schedule by
        offered = (sum(r["offered_rate"] for r in srcs)
                   if srcs and all(r.get("offered_rate") for r in srcs) else None)
        behind = sum((r.get("offered_rate") or 0.0) * r.get("lag", 0.0) for r in srcs)
        ops = {}
        for name, (lo, hi) in self.ranges.items():
            st = job.plan.stage(name)
            rows = m[m.operator == name]
            ops[name] = {"parallelism": st.parallelism, "min": lo, "max": hi,
                         **self._rates(rows, offered, behind),
                         "since_change": now - self.changed.get(name, -math.inf)}
        return {"time": now, "operators": ops}

    def _rates(self, rows: pd.DataFrame, offered: float | None, behind: float) -> dict:
        """true_rate, input_rate and backlog of one operator from its metrics rows and the
        sources' demand (``offered`` records/s, ``behind`` records late)."""
        if rows.empty:
            return {"true_rate": None, "input_rate": None, "backlog": 0.0}
        last = rows.window_start.max()
        # the last window may still be filling: take the one before it when there is one
        starts = sorted(rows.window_start.unique())
        recent = rows[rows.window_start == (starts[-2] if len(starts) > 1 else last)]
        per = [true_rate(r, b) for r, b in zip(recent.records, recent.busy_seconds)]
        per = [p for p in per if p]
        rate = sum(per) / len(per) if per else None
        processed = float(recent.records.sum()) / self.window
        # a queued batch holds about a source batch's share of one instance
        bs = max((s.batch_size for s in self.job.plan.stages if s.is_source), default=1)
        queued = float(recent.queued_batches.sum()) * bs / max(len(recent), 1)
        if offered:
            return {"true_rate": rate, "input_rate": float(offered), "backlog": behind + queued}
        # sources read as fast as they can: the demand is what gets through
        return {"true_rate": rate, "input_rate": processed, "backlog": queued}

    def step(self) -> list[dict]:
        """One decision: report, plan, rescale (or record as wanted)."""
        rep = self.report()
        plan = self.scaler.plan(rep)
        out = []
        for name, p in plan.items():
            op = rep["operators"][name]
            entry = {"operator": name, "from": op["parallelism"], "to": int(p), "input_rate": op["input_rate"],
                     "true_rate": op["true_rate"], "backlog": op["backlog"]}
            if not self._room(int(p) - op["parallelism"]):
                self.wanted[name] = int(p)
                entry["status"] = "wanted"
            else:
                try:
                    self.job.rescale(name, int(p))
                except Exception as exc:    # recorded under the operator's name; the job runs on
                    if self.job.status != "running":
                        raise
                    logger.warning("streamlb autoscaler: rescaling %r: %s: %s", name, type(exc).__name__, exc)
                    entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
                    out.append(self._record(entry))
                    continue
                self.changed[name] = time.time()
                self.wanted.pop(name, None)
                entry["status"] = "done"
            out.append(self._record(entry))
        return out

    def _room(self, more: int) -> bool:
        """An embedded cluster always makes room; an existing one while its workers hold
        fewer than ``scaler.instances-per-thread`` instances per thread."""
        job = self.job
        if more <= 0 or job._owns_client:
            return True
        per = config.get("scaler.instances-per-thread")
        if not per:
            return True
        threads = sum(w.get("nthreads", 1) for w in cluster_workers(job.client).values())
        return len(job.actors) + more <= per * threads

    def _record(self, entry: dict) -> dict:
        t = time.time()
        entry = {"kind": "autoscale", "scaler": self.scaler.name, "strategy": "autoscale", "started": t,
                 "completed": t, **entry}
        self.decisions.append(entry)
        logger.info("job %s: autoscaler %s decided %s", self.job.id, self.scaler.name,
                    {k: v for k, v in entry.items() if k not in ("kind", "scaler", "strategy", "started", "completed")})
        self.job._reconfigs.append(entry)
        self.job._migrations.note_autoscale(entry, dict(self.wanted))
        return entry
