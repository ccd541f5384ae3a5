"""What an instance measures: load windows, the emulated cost server, and load reports.

This is the only part of an instance that writes to the worker's batched stream (the load
reports the balancer plugin merges).
"""
from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from .. import config
from .. import latency as _latency


class _Window:
    __slots__ = ("start", "records", "batches", "split_records", "busy", "lat", "weights", "late")

    def __init__(self, start: float) -> None:
        self.start = start
        self.records = 0
        self.batches = 0            # batches (or parts of one) applied: the window's granularity
        self.split_records = 0      # of them, rows of split keys aggregated for their home
        self.busy = 0.0
        self.lat: list[float] = []
        self.weights: list[int] = []
        self.late = 0               # records too late for a window (window operators)


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


class CostServer:
    """Emulated cost (``cost=``): the instance is a server of fixed capacity, 1 / cost
    records per second.

    A batch that was already queued when the one before it was served starts its service
    then, not when the event loop gets round to it, so the lateness of a shared loop (other
    instances, routers) is not charged to this instance as service time.
    """

    def __init__(self) -> None:
        self.served_until: float | None = None     # when the last service ends, if another waited

    async def serve(self, seconds: float, t1: float, more: bool = False) -> float:
        """Wait out a batch's service time (real work done counts towards it). ``more``: a
        batch (or more of this one) waits to be served right after. Returns when the service
        began, from which the batch's busy time counts."""
        if seconds <= 0:
            return t1
        start = t1 if self.served_until is None else min(self.served_until, t1)
        end = start + seconds
        await asyncio.sleep(max(end - time.perf_counter(), 0.0))
        self.served_until = end if more else None
        return start

    def idle(self) -> None:
        """Service resumes after something that is not a batch, not before."""
        self.served_until = None


class Metrics:
    """Load windows of one instance: records, busy seconds, latency, per window.

    ``queued()`` tells how many batches wait; ``final()`` whether the instance's stream
    has ended; ``routers`` (stage id -> keyed router) are asked for what they routed in
    the window. ``report``: send load reports to the balancer plugin.
    """

    def __init__(self, *, job: str, operator: str, index: int, window: float, report: bool,
                 queued: Callable[[], int], final: Callable[[], bool],
                 dead_letters: Callable[[], dict] = dict, watermark: Callable[[], int | None] = lambda: None) -> None:
        self.job, self.operator, self.index, self.window = job, operator, index, window
        self.report = report
        self.queued, self.final = queued, final
        self.dead_letters = dead_letters      # operator -> records set aside so far (cumulative)
        self.watermark = watermark            # the instance's event-time watermark (ns), if it has one
        self.worker = None
        self.routers: dict = {}
        # the newest windows only: an unbounded job's metrics would grow for ever (1.5 KB a window)
        self.rows: collections.deque = collections.deque(maxlen=int(config.get("metrics-windows")))
        self.blocked = 0.0             # seconds spent waiting for credits inside a busy span
        self.win: _Window | None = None
        self.closed = False

    def start(self, worker, now: float) -> None:
        self.worker = worker
        self.win = _Window(self._window_start(now))

    def add_blocked(self, seconds: float) -> None:
        self.blocked += seconds

    def _window_start(self, t: float) -> float:
        return t - (t % self.window)

    def late(self, n: int) -> None:
        """``n`` records came too late for a window (window operators)."""
        now = time.time()
        if now >= self.win.start + self.window:
            self.close_window(now)
        self.win.late += n

    def account(self, n: int, busy: float, latency_ms: float | None, split: int = 0) -> None:
        now = time.time()
        if now >= self.win.start + self.window:
            self.close_window(now)
        w = self.win
        w.records += n
        w.batches += n > 0
        w.split_records += split
        w.busy += max(busy, 0.0)
        if latency_ms is not None:
            w.lat.append(latency_ms)
            w.weights.append(n)

    def close_window(self, now: float, last: bool = False) -> None:
        w = self.win
        if w is None:
            return
        lat, wt = np.asarray(w.lat), np.asarray(w.weights)
        has = len(lat) > 0 and wt.sum() > 0
        row = {
            "operator": self.operator, "instance": self.index, "worker": self.worker.address,
            "window_start": pd.Timestamp(w.start, unit="s"), "records": w.records,
            "busy_seconds": w.busy, "queued_batches": self.queued(),
            "latency_p50_ms": _weighted_quantile(lat, wt, 0.5) if has else np.nan,
            "latency_p99_ms": _weighted_quantile(lat, wt, 0.99) if has else np.nan,
            "latency_max_ms": float(lat.max()) if has else np.nan,
            "latency_mean_ms": float((lat * wt).sum() / wt.sum()) if has else np.nan,
            "split_records": w.split_records,
            "latency_hist": _latency.histogram(lat, wt),
            "batches": w.batches,
            "late_records": w.late,
        }
        self.rows.append(row)
        final = self.final()
        if self.report:
            self._send({
                "kind": "owner", "operator": self.operator, "window_start": w.start,
                "records": int(w.records), "batches": int(w.batches), "busy": float(w.busy), "queued": self.queued(),
                "latency_p99_ms": None if np.isnan(row["latency_p99_ms"]) else row["latency_p99_ms"],
                "latency_hist": row["latency_hist"].tolist(), "final": final,
                "dead_letters": self._dead(), "late_records": int(w.late), "watermark": self.watermark(),
            })
        for router in self.routers.values():
            if router.spec.balanced:
                # a router's place among all routers into the operator (inputs in order)
                self._send({"kind": "router", "operator": router.spec.name, "window_start": w.start,
                            "instance": router.base + self.index,
                            "final": final, "dead_letters": self._dead(), **router.take_window()})
        self.win = None if last else _Window(self._window_start(now))

    def _dead(self) -> dict:
        """Records this instance set aside so far, per operator named in its dead letters."""
        return {"stage": self.operator, "counts": dict(self.dead_letters())}

    def _send(self, msg: dict) -> None:
        self.worker.batched_stream.send({"op": "streamlb-load", "job": self.job, "instance": self.index,
                                         "window": self.window, **msg})

    async def ticker(self) -> None:
        """Close each window when it ends, even with no record to account."""
        while self.win is not None:
            w = self.win
            await asyncio.sleep(max(w.start + self.window - time.time(), 0.0) + 1e-3)
            if self.win is w:
                self.close_window(time.time())
