"""Running totals of the load reports the balancer plugin receives, per job.

A load report says what an instance did in one window; a Prometheus counter must say what
it did since it started. The plugin adds each owner report here as it arrives
(:func:`count_report`), and drops a job's totals when the job unregisters (:func:`forget`).
Totals are kept per (operator, instance, worker): an instance that moves to another worker
starts new series there, so every series only ever grows.
"""
from __future__ import annotations

import logging
import weakref

import numpy as np

from .. import latency as _latency

logger = logging.getLogger("streamlb.observe")


class InstanceTotals:
    """What one instance of an operator did on one worker, summed over its windows."""

    __slots__ = ("records", "busy", "latency")

    def __init__(self) -> None:
        self.records = 0
        self.busy = 0.0
        self.latency = np.zeros(_latency.BINS, dtype=np.int64)   # records per latency bin


class JobTotals:
    """Totals of one job: ``instances`` (operator, instance, worker) -> :class:`InstanceTotals`,
    ``queued`` (operator, instance) -> (worker, batches waiting at the end of the last window)."""

    def __init__(self) -> None:
        self.instances: dict[tuple[str, int, str], InstanceTotals] = {}
        self.queued: dict[tuple[str, int], tuple[str, int]] = {}
        # (stage of the reporting instance, instance, operator its dead letters name) ->
        # records set aside: reports carry running counts, so the largest seen is the total
        # (they may arrive out of order, from an instance's owner and router reports alike)
        self.dead_letters: dict[tuple[str, int, str], int] = {}
        # window operators: (operator, instance) -> records too late for a window, and the
        # instance's watermark (int64 ns) at the end of its last load window
        self.late: dict[tuple[str, int], int] = {}
        self.watermarks: dict[tuple[str, int], int] = {}

    def add(self, op, place: tuple[str, int], entry: dict) -> None:
        """Add one checked report (``report_entry``'s place and entry) of keyed operator ``op``."""
        kind, i = place
        if kind != "owner":
            return                      # routers count key groups, not what an instance did
        worker = str(op.owners[i][0])
        t = self.instances.setdefault((op.name, i, worker), InstanceTotals())
        # a counter never goes down, whatever a malformed report says
        t.records += max(int(entry["records"]), 0)
        if entry["busy"] > 0:
            t.busy += entry["busy"]
        if entry["latency_hist"] is not None:
            t.latency += np.rint(entry["latency_hist"]).astype(np.int64)
        self.queued[(op.name, i)] = (worker, max(int(entry["queued"]), 0))


# keyed by the plugin's job object, weakly: a plugin closed with jobs still registered
# leaves nothing behind
_JOBS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _totals_for(job) -> JobTotals:
    """The totals of ``job``, made at its first report."""
    totals = _JOBS.get(job)
    if totals is None:
        totals = _JOBS[job] = JobTotals()
    return totals


def count_report(job, op, place: tuple[str, int], entry: dict) -> None:
    """Add a report of ``job`` (the plugin's job object) to its totals. Never raises: the
    plugin calls it on its way to merging the report for the balancer."""
    try:
        totals = _totals_for(job)
        totals.add(op, place, entry)
    except Exception:
        logger.exception("streamlb: a load report of %s left out of the Prometheus totals", op.name)


def count_dead_letters(job, instance: int, dead: dict) -> None:
    """Note the running dead-letter counts an instance of ``job`` reported: ``{"stage": its
    stage, "counts": {operator: records}}``. Never raises."""
    try:
        totals = _totals_for(job)
        for operator, n in dead["counts"].items():
            key = (str(dead["stage"]), int(instance), str(operator))
            totals.dead_letters[key] = max(totals.dead_letters.get(key, 0), int(n))
    except Exception:
        logger.exception("streamlb: a dead-letter count of instance %s left out of the Prometheus totals", instance)


def count_event_time(job, operator: str, instance: int, late: int, watermark: int | None) -> None:
    """Note an owner's late records of one window and its watermark. Never raises."""
    try:
        if not late and watermark is None:
            return
        totals = _totals_for(job)
        key = (operator, instance)
        if late:
            totals.late[key] = totals.late.get(key, 0) + int(late)
        if watermark is not None:
            totals.watermarks[key] = max(totals.watermarks.get(key, watermark), int(watermark))
    except Exception:
        logger.exception("streamlb: event-time figures of %s[%s] left out of the Prometheus totals", operator, instance)


def dead_letters_of(totals: JobTotals) -> dict[tuple[str, int], int]:
    """Records set aside per (operator, instance), as ``Job.dead_letters()`` groups them:
    a bad key is set aside by an upstream instance under the keyed operator's name."""
    out: dict[tuple[str, int], int] = {}
    for (_, i, operator), n in list(totals.dead_letters.items()):
        out[(operator, i)] = out.get((operator, i), 0) + n
    return out


def totals_of(job) -> JobTotals | None:
    """The totals of ``job``, None before its first report."""
    return _JOBS.get(job)


def forget(job) -> None:
    """The job stopped: its totals go (and so do its series)."""
    _JOBS.pop(job, None)
