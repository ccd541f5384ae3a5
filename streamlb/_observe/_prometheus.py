"""Prometheus series of the plugin's jobs on the scheduler's ``/metrics``.

distributed serves ``/metrics`` from prometheus_client's default ``REGISTRY``, so the plugin
registers one collector there when it starts and removes it when it closes. The collector
reads the plugin's jobs at each scrape: the running totals of their load reports
(:mod:`._totals`), their last window's imbalance, their routing tables and history. A job
the plugin dropped has no series. See docs/observability.md for the table of series.
"""
from __future__ import annotations

import functools
import logging
import time
import weakref

import numpy as np

from .. import latency as _latency
from .._time import MAX_TIME
from ._totals import dead_letters_of, totals_of

logger = logging.getLogger("streamlb.observe")

INSTANCE_LABELS = ["job", "operator", "instance", "worker"]
OPERATOR_LABELS = ["job", "operator"]

# seconds, for each latency bin: its upper edge (the bucket's ``le``) and the value that
# stands for the records in it in ``_sum`` (reports count records per bin, not their sum):
# the geometric middle of the bin, half the upper edge for the first, the lower edge for
# the open-ended last
_UPPER_S = _latency.EDGES_MS[1:] / 1e3
_LOWER_S = _latency.EDGES_MS[:-1] / 1e3
_MIDDLE_S = np.where(_LOWER_S > 0, np.sqrt(_LOWER_S * np.where(np.isfinite(_UPPER_S), _UPPER_S, _LOWER_S)),
                     _UPPER_S / 2)

_collectors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attach(plugin, scheduler) -> None:
    """Register a collector of ``plugin``'s jobs; nothing without prometheus_client."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    collector = _Collector(plugin)
    REGISTRY.register(collector)
    _collectors[plugin] = collector


def detach(plugin) -> None:
    collector = _collectors.pop(plugin, None)
    if collector is not None:
        from prometheus_client import REGISTRY

        REGISTRY.unregister(collector)


class _Collector:
    def __init__(self, plugin) -> None:
        self.plugin = plugin

    def describe(self) -> list:
        # the series exist only while jobs run; describing none also lets the collectors
        # of several schedulers in one process (tests) share the registry
        return []

    def collect(self):
        return families(self.plugin.jobs)


def families(jobs: dict) -> list:
    """The metric families of ``jobs`` (the plugin's job id -> job), as collected now.

    A job whose state cannot be read is left out and logged: a scrape never fails, since
    it also carries distributed's own series.
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    fam = {
        "records": CounterMetricFamily(
            "streamlb_records", "Records applied by an instance of a keyed operator.", labels=INSTANCE_LABELS),
        "busy": CounterMetricFamily(
            "streamlb_busy_seconds", "Seconds an instance spent processing records.", labels=INSTANCE_LABELS),
        "queued": GaugeMetricFamily(
            "streamlb_queued_batches", "Batches waiting at an instance at the end of the last load window.",
            labels=INSTANCE_LABELS),
        "latency": HistogramMetricFamily(
            "streamlb_latency_seconds", "Latency of the records an instance applied, from their source's emit "
            "(streamlb.latency bins; _sum from the bin middles).", labels=INSTANCE_LABELS),
        "imbalance": GaugeMetricFamily(
            "streamlb_imbalance", "Records applied by an operator's busiest instance over the mean, last window.",
            labels=OPERATOR_LABELS),
        "epochs": CounterMetricFamily(
            "streamlb_epochs", "Migration and split epochs an operator completed.", labels=OPERATOR_LABELS),
        "moved": CounterMetricFamily(
            "streamlb_key_groups_moved", "Key groups moved to another instance.", labels=OPERATOR_LABELS),
        "splits": GaugeMetricFamily(
            "streamlb_split_keys", "Keys spread over several instances now.", labels=OPERATOR_LABELS),
        "late": CounterMetricFamily(
            "streamlb_late_records", "Records too late for one of their windows (window operators).",
            labels=["job", "operator", "instance"]),
        "wm_lag": GaugeMetricFamily(
            "streamlb_watermark_lag_seconds", "Wall-clock time now minus an instance's event-time watermark, "
            "as of its last load window (event-time operators).", labels=["job", "operator", "instance"]),
        "dead": CounterMetricFamily(
            "streamlb_dead_letters", "Records set aside with a reason (bad key or value) instead of failing "
            "the job.", labels=["job", "operator", "instance"]),
    }
    for jid, j in list(jobs.items()):
        try:
            _add_job(fam, jid, j)
        except Exception:
            logger.exception("streamlb: no Prometheus series for job %s this scrape", jid)
    return list(fam.values())


def _add_job(fam: dict, jid: str, j) -> None:
    operators = dict(j.control.operators)
    totals = totals_of(j)
    if totals is not None:
        for (name, i, worker), t in list(totals.instances.items()):
            labels = [jid, name, str(i), worker]
            fam["records"].add_metric(labels, t.records)
            fam["busy"].add_metric(labels, t.busy)
            fam["latency"].add_metric(labels, _buckets(t.latency), float(t.latency @ _MIDDLE_S))
        for (name, i), (worker, queued) in list(totals.queued.items()):
            op = operators.get(name)
            if op is not None and i < op.table.parallelism:     # not an instance a rescale retired
                fam["queued"].add_metric([jid, name, str(i), worker], queued)
        for (name, i), n in dead_letters_of(totals).items():
            fam["dead"].add_metric([jid, name, str(i)], n)
        for (name, i), n in list(totals.late.items()):
            fam["late"].add_metric([jid, name, str(i)], n)
        now = time.time()
        for (name, i), wm in list(totals.watermarks.items()):
            if wm < MAX_TIME:
                fam["wm_lag"].add_metric([jid, name, str(i)], now - wm / 1e9)
    epochs = dict.fromkeys(operators, 0)
    moved = dict.fromkeys(operators, 0)
    for h in list(j.control.history):
        if "kind" not in h and h.get("operator") in epochs:    # an epoch, not a rescale or update
            epochs[h["operator"]] += 1
            moved[h["operator"]] += len(h.get("key_groups", ()))
    for name, op in operators.items():
        labels = [jid, name]
        fam["epochs"].add_metric(labels, epochs[name])
        fam["moved"].add_metric(labels, moved[name])
        fam["splits"].add_metric(labels, len(op.table.splits))
        windows = j.imbalance.get(name)
        if windows:
            fam["imbalance"].add_metric(labels, windows[-1]["imbalance"])


@functools.cache
def _le() -> tuple[str, ...]:
    from prometheus_client.utils import floatToGoString

    return tuple(floatToGoString(le) for le in _UPPER_S)


def _buckets(counts: np.ndarray) -> list[tuple[str, float]]:
    return list(zip(_le(), np.cumsum(counts).astype(float).tolist()))
