"""Load reports: each instance's report checked, a window's reports merged into a
:class:`~streamlb.balancer.LoadReport`, a plan turned into actions, and the load trace kept
per window packed for the driver and unpacked there."""
from __future__ import annotations

import io

import numpy as np

from .. import latency as _latency
from ..balancer import LoadReport, Move, Split
from ..exceptions import PipelineError
from ._control import OperatorControl
from ..keygroups import key_group_of

TRACE_HOT_KEYS = 64         # hottest keys kept per window in the load trace


def report_entry(op: OperatorControl, operator: str, kind: str, instance, *, records: int, busy: float,
                 queued: int, groups, counts, latency_p99_ms, final: bool, hot, routed,
                 latency_hist, parallelism=None, batches=None) -> tuple[tuple[str, int], dict]:
    """One instance's report for a window, checked: its place in the window and what it says.

    Raises
    ------
    ValueError
        Naming the instance and operator, for a report that does not fit the operator.
    """
    if kind == "owner":
        n, instance = op.table.parallelism, int(instance)
        if not 0 <= instance < n:
            raise ValueError(f"instance {instance} outside 0..{n - 1} of {operator!r}")
        if latency_hist is not None:
            latency_hist = np.asarray(latency_hist, dtype=np.float64)
            if latency_hist.shape != (_latency.BINS,) or not (latency_hist >= 0).all():
                raise ValueError(f"latency histogram of instance {instance} of {operator!r} is not "
                                 f"{_latency.BINS} non-negative counts (streamlb.latency.EDGES_MS)")
        return ("owner", instance), {
            "records": int(records), "busy": float(busy), "queued": int(queued),
            "batches": None if batches is None else int(batches),
            "latency_p99_ms": latency_p99_ms, "latency_hist": latency_hist, "final": bool(final),
        }
    if kind == "router":
        instance = int(instance)
        return ("router", instance), _router_entry(op, operator, instance, groups, counts, final, hot, routed,
                                                   parallelism)
    raise ValueError(f"report kind {kind!r} is neither 'owner' nor 'router'")


def _router_entry(op: OperatorControl, operator: str, instance: int, groups, counts, final: bool, hot,
                  routed, parallelism=None) -> dict:
    n, m, G = op.table.parallelism, len(op.routers), op.table.key_groups
    if not 0 <= instance < m:
        raise ValueError(f"router {instance} outside 0..{m - 1} of {operator!r}")
    g = np.asarray(groups, dtype=np.int64)
    c = np.asarray(counts, dtype=np.float64)
    if g.shape != c.shape or (len(g) and (g.min() < 0 or g.max() >= G)) or (c < 0).any():
        raise ValueError(f"key-group counts from router {instance} of {operator!r} do not fit 0..{G - 1}")
    hot = _hot_entries(hot, f"router {instance} of {operator!r}")
    if routed is not None:
        routed = np.asarray(routed, dtype=np.float64)
        # a router whose table still has the instance count from before a rescale counts
        # per instance of that table: the window says nothing about the current instances
        stale = parallelism is not None and parallelism != n and routed.shape == (parallelism,)
        if not stale and (routed.shape != (n,) or (routed < 0).any()):
            raise ValueError(f"records routed by router {instance} of {operator!r} are not "
                             f"{n} non-negative counts, one per instance")
        if stale:
            routed = None
    return {"groups": g, "counts": c, "final": bool(final), "hot": hot, "routed": routed}


def _hot_entries(hot, where: str) -> list:
    """A router's ``[[key, count]...]``, checked: an integer or string key, a finite count >= 0."""
    if hot is None:
        return []
    ok = isinstance(hot, (list, tuple)) and all(
        isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[0], (int, str))
        and isinstance(e[1], (int, float)) and not isinstance(e[1], bool) and np.isfinite(e[1]) and e[1] >= 0
        for e in hot)
    if not ok:
        raise ValueError(f"hot keys from {where} must be [key, count] pairs: an integer or string key and a "
                         "finite count >= 0")
    return [(k, float(c)) for k, c in hot]


class Window:
    """Every report of one operator for one window, merged.

    ``report`` is what the balancer gets; ``final`` whether an instance saw its stream end.
    """

    def __init__(self, op: OperatorControl, operator: str, window_start: float, window: float,
                 reports: dict) -> None:
        n, G = op.table.parallelism, op.table.key_groups
        self.window_start, self.epoch = window_start, op.table.epoch
        self.owners = op.table.owners
        self.load = np.zeros(G)
        self.routed = np.zeros(n)
        hot: dict = {}
        for (kind, _), r in reports.items():
            if kind == "router":
                np.add.at(self.load, r["groups"], r["counts"])
                if r["routed"] is not None:
                    self.routed += r["routed"]
                for k, c in r["hot"]:
                    hot[k] = hot.get(k, 0.0) + c
        for k, _ in op.table.splits:
            hot.setdefault(k, 0.0)       # a split key's group must be known, hot or not
        self.hot_keys = tuple((k, key_group_of(k, G), c)
                              for k, c in sorted(hot.items(), key=lambda kc: -kc[1]))
        self.by_instance = [reports[("owner", i)] for i in range(n)]
        self.final = any(r["final"] for r in reports.values())
        recent = frozenset(g for g, e in op.moved_at.items() if e > op.table.epoch - 3)
        self.report = LoadReport(
            operator, op.table.owners, self.load, n, epoch=op.table.epoch, window_start=window_start,
            window=window, busy_seconds=[r["busy"] for r in self.by_instance],
            queued_batches=[r["queued"] for r in self.by_instance], recently_moved=recent,
            latency_hist=[r["latency_hist"] if r["latency_hist"] is not None else np.zeros(_latency.BINS)
                          for r in self.by_instance],
            hot_keys=self.hot_keys, splits=op.table.splits, splittable=op.splittable,
        )
        applied = np.array([r["records"] for r in self.by_instance], dtype=float)
        self.measured = float(applied.max() / applied.mean()) if applied.sum() > 0 else 1.0

    def instance_load(self) -> list[dict]:
        """Per instance: records applied, load, busy seconds, queued batches, p99 latency."""
        per_instance = self.report.instance_load()
        return [{"instance": i, "records": r["records"], "load": float(per_instance[i]),
                 "busy_seconds": r["busy"], "queued_batches": r["queued"], "latency_p99_ms": r["latency_p99_ms"]}
                for i, r in enumerate(self.by_instance)]

    def imbalance(self) -> dict:
        """Measured (records applied), routed and planned imbalance, with the floor that
        unsplittable keys set."""
        total = self.load.sum()
        floor = max(1.0, self.report.instances * self.load.max() / total) if total > 0 else 1.0
        batches = [r["batches"] for r in self.by_instance]
        return {
            "window_start": self.window_start, "imbalance": self.measured, "floor": floor,
            "batches": None if None in batches else min(batches),
            "routed": float(self.routed.max() / self.routed.mean()) if self.routed.sum() > 0 else 1.0,
            "planned": self.report.imbalance(), "records": float(total), "epoch": self.epoch,
        }

    def trace_row(self) -> tuple:
        # the last two, for the dashboard: latencies (all instances) and records applied per instance
        return (self.window_start, self.load.astype(np.float32), self.owners.astype(np.int32), self.measured,
                [(k, c) for k, _, c in self.hot_keys[:TRACE_HOT_KEYS]], self.report.latency_hist.sum(axis=0),
                np.array([r["records"] for r in self.by_instance], np.int64))


def plan_actions(plan: list, max_groups: int) -> tuple[dict[int, int], dict, dict]:
    """A checked plan as what to carry out: moves (at most ``max_groups`` key groups),
    keys to merge back, keys to split."""
    assignment: dict[int, int] = {}
    for mv in plan:
        for g in (mv.key_groups if isinstance(mv, Move) else ()):
            if len(assignment) < max_groups:
                assignment[g] = mv.to_instance
    merges = {sp.key: () for sp in plan if isinstance(sp, Split) and not sp.helpers}
    splits = {sp.key: sp.helpers for sp in plan if isinstance(sp, Split) and sp.helpers}
    return assignment, merges, splits


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def pack_trace(rows: list, window: float, key_groups: int, instances: int) -> dict:
    """The trace rows kept for an operator as .npy bytes: loads, owners, measured imbalance;
    and, when the routers counted them (a balancer that splits keys) and they are
    integers, each window's hottest keys and their records."""
    out = {"window": window, "instances": instances,
           "window_start": _npy(np.array([r[0] for r in rows], np.float64)),
           "loads": _npy(np.array([r[1] for r in rows], np.float32).reshape(len(rows), key_groups)),
           "owners": _npy(np.array([r[2] for r in rows], np.int32).reshape(len(rows), key_groups)),
           "measured": _npy(np.array([r[3] for r in rows], np.float64))}
    hot = [r[4] for r in rows]
    if any(hot) and all(isinstance(k, (int, np.integer)) for h in hot for k, _ in h):
        # windows padded to the same width with key -1 and no records
        width = max(len(h) for h in hot)
        keys = np.full((len(rows), width), -1, np.int64)
        counts = np.zeros((len(rows), width))
        for i, h in enumerate(hot):
            keys[i, :len(h)] = [k for k, _ in h]
            counts[i, :len(h)] = [c for _, c in h]
        out["hot_keys"], out["hot_loads"] = _npy(keys), _npy(counts)
    return out


def unpack_trace(payload: dict, job: str, operator: str):
    """The :class:`streamlb.simulator.Trace` that :func:`pack_trace` packed."""
    from ..simulator import Trace

    arr = {k: np.load(io.BytesIO(payload[k]), allow_pickle=False)
           for k in ("window_start", "loads", "owners", "measured")}
    if not len(arr["loads"]):
        raise PipelineError(f"no load window of {operator!r} has been recorded yet")
    hot = {k: np.load(io.BytesIO(payload[k]), allow_pickle=False) for k in ("hot_keys", "hot_loads") if k in payload}
    return Trace(arr["loads"], int(payload["instances"]), float(payload["window"]), owners=arr["owners"][0], **hot,
                 recorded_owners=arr["owners"], measured=arr["measured"],
                 meta={"source": "job", "job": job, "operator": operator,
                       "window_start": arr["window_start"].tolist()})
