"""``BalancerPlugin``: the scheduler plugin that measures load and moves key groups.

Register it with ``client.register_plugin(BalancerPlugin(...))``, or at scheduler start with
``dask scheduler --preload streamlb.plugin`` (settings then come from dask config
``streamlb.*``). ``streamlb.run(..., balancer="autoflow")`` registers it if it is not there
yet. Each job registers its own balancer and migration strategy, so jobs on one cluster can
differ.

Every keyed operator instance of a balanced job sends one load report per window over the
worker's batched stream (op ``streamlb-load``): records, busy seconds, queued batches,
latency and record counts per key group. When every instance of an operator has reported a
window, the plugin merges them into a :class:`~streamlb.balancer.LoadReport`, asks the job's
balancer for a plan and carries it out with the job's migration strategy — one migration in
flight per keyed exchange, after a cool-down, at most ``max_groups`` key groups per epoch.
A plan or report that does not fit is refused, recorded, and the job keeps its routing.

State (routing tables, epochs, moves, load) is served as JSON at ``/streamlb/state.json`` on
the scheduler's HTTP server.
"""
from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections import defaultdict, deque

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin

from . import config
from . import latency as _latency
from ._coordinator import JobControl, actor_call, check_strategy, key_group_of, migrate, split
from .balancer import LoadReport, Move, Split, check_plan, complete_plan, get_balancer

__all__ = ["BalancerPlugin", "dask_setup"]

logger = logging.getLogger("streamlb.plugin")
NAME = "streamlb-balancer"
TRACE_HOT_KEYS = 64         # hottest keys kept per window in the load trace


class _Job:
    def __init__(self, topology: dict, balancer: str, options: dict, migration: str) -> None:
        self.control = JobControl(topology)
        self.balancer_name = balancer
        self.balancer = get_balancer(balancer, **(options or {}))
        self.migration = check_strategy(migration)
        self.windows: dict[str, dict[float, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
        self.load: dict[str, list] = {}          # operator -> last merged window, per instance
        self.imbalance: dict[str, list] = defaultdict(list)
        self.trace: dict[str, deque] = defaultdict(lambda: deque(maxlen=int(config.get("balancer.trace-windows"))))
        self.refused: list[dict] = []
        self.tasks: set = set()


class BalancerPlugin(SchedulerPlugin):
    """Scheduler plugin: load reports in, plans out, migrations carried out.

    Parameters
    ----------
    balancer : str, optional
        Default balancer for jobs that do not name one (setting ``streamlb.balancer.name``).
    migration : str, optional
        Default strategy (setting ``streamlb.migration.strategy``).
    window : str or float, optional
        Load window (setting ``streamlb.window``); instances report at this period.
    cooldown : str or float, optional
        Seconds after a migration before the next plan for the same operator
        (setting ``streamlb.balancer.cooldown``).
    max_groups : int, optional
        Cap on key groups per epoch (setting ``streamlb.balancer.max-groups``).
    """

    name = NAME

    def __init__(self, balancer=None, migration=None, window=None, cooldown=None, max_groups=None) -> None:
        self.balancer = balancer
        self.migration = migration
        self.window = window
        self.cooldown = cooldown
        self.max_groups = max_groups
        self.jobs: dict[str, _Job] = {}
        self.refused: list[dict] = []

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self.balancer = config.get("balancer.name", self.balancer)
        self.migration = check_strategy(config.get("migration.strategy", self.migration))
        self.window = config.seconds("window", self.window)
        self.cooldown = config.seconds("balancer.cooldown", self.cooldown)
        self.max_groups = int(config.get("balancer.max-groups", self.max_groups))
        scheduler.handlers.update({
            "streamlb_register_job": self.register_job,
            "streamlb_unregister_job": self.unregister_job,
            "streamlb_migrate": self.migrate_handler,
            "streamlb_split": self.split_handler,
            "streamlb_routing": self.routing_handler,
            "streamlb_history": self.history_handler,
            "streamlb_state": self.state_handler,
            "streamlb_trace": self.trace_handler,
        })
        scheduler.stream_handlers["streamlb-load"] = self.receive_load
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            app.add_handlers(r".*", [(r"/streamlb/state.json", _StateHandler, {"plugin": self})])

    async def close(self) -> None:
        for job in self.jobs.values():
            for t in job.tasks:
                t.cancel()

    # -- jobs ------------------------------------------------------------------------------------
    def register_job(self, job: str, topology: dict, balancer: str | None = None,
                     options: dict | None = None, migration: str | None = None) -> dict:
        self.jobs[job] = _Job(topology, balancer or self.balancer, options or {}, migration or self.migration)
        return {"balancer": self.jobs[job].balancer_name, "migration": self.jobs[job].migration,
                "window": self.window}

    def unregister_job(self, job: str) -> None:
        j = self.jobs.pop(job, None)
        if j is not None:
            for t in j.tasks:
                t.cancel()

    def _job(self, job: str) -> _Job:
        if job not in self.jobs:
            raise KeyError(f"streamlb: no job {job!r} is registered with the balancer plugin")
        return self.jobs[job]

    async def _call(self, address, key, method, *args):
        return await actor_call(self.scheduler.rpc, address, key, method, *args)

    async def _migrate(self, job: _Job, operator: str, assignment: dict, strategy: str):
        return await migrate(job.control, self._call, operator, assignment, strategy,
                             fluid_step=config.get("migration.fluid-step"),
                             timeout=config.seconds("migration.timeout"))

    async def migrate_handler(self, job: str, operator: str, assignment: list,
                              strategy: str | None = None) -> dict:
        """Manual moves (``Job.migrate``/``Job.reassign``): ``assignment`` is [[group, instance]...]."""
        j = self._job(job)
        for g, to in assignment:
            j.control.validate(operator, [g], to)
        table = await self._migrate(j, operator, {int(g): int(to) for g, to in assignment},
                                    check_strategy(strategy or j.migration))
        return _table_state(table)

    async def split_handler(self, job: str, operator: str, changes: list) -> dict:
        """Manual splits (``Job.split``): ``changes`` is [[key, [helper...]]...]."""
        j = self._job(job)
        table = await split(j.control, self._call, operator, {k: tuple(h) for k, h in changes},
                            timeout=config.seconds("migration.timeout"))
        return _table_state(table)

    def routing_handler(self, job: str, operator: str) -> dict:
        return _table_state(self._job(job).control.operator(operator).table)

    def history_handler(self, job: str) -> list:
        return self._job(job).control.history

    # -- load reports --------------------------------------------------------------------------------
    def receive_load(self, worker=None, **msg) -> None:
        """Stream handler: must never raise, or the worker's stream would break."""
        try:
            self._receive_load(**msg)
        except Exception as exc:
            self._refuse(msg.get("job"), f"malformed load report from {worker}: {type(exc).__name__}: {exc}")

    def _refuse(self, job: str | None, reason: str) -> None:
        entry = {"time": time.time(), "reason": reason}
        logger.warning("streamlb: %s", reason)
        known = isinstance(job, str) and job in self.jobs
        (self.jobs[job].refused if known else self.refused).append(entry)

    def _receive_load(self, job: str, operator: str, instance: int, window_start: float, kind: str = "owner",
                      records: int = 0, busy: float = 0.0, queued: int = 0, groups=None, counts=None,
                      latency_p99_ms=None, final: bool = False, hot=None, routed=None, latency_hist=None,
                      **_ignored) -> None:
        j = self.jobs.get(job)
        if j is None:
            return                      # a job finished or registered elsewhere
        op = j.control.operator(operator)
        n, m, G = op.table.parallelism, len(op.routers), op.table.key_groups
        win = j.windows[operator]
        slot = win[float(window_start)]
        if kind == "owner":
            if not 0 <= int(instance) < n:
                raise ValueError(f"instance {instance} outside 0..{n - 1} of {operator!r}")
            if latency_hist is not None:
                latency_hist = np.asarray(latency_hist, dtype=np.float64)
                if latency_hist.shape != (_latency.BINS,) or not (latency_hist >= 0).all():
                    raise ValueError(f"latency histogram of instance {instance} of {operator!r} is not "
                                     f"{_latency.BINS} non-negative counts (streamlb.latency.EDGES_MS)")
            slot[("owner", int(instance))] = {
                "records": int(records), "busy": float(busy), "queued": int(queued),
                "latency_p99_ms": latency_p99_ms, "latency_hist": latency_hist, "final": bool(final),
            }
        elif kind == "router":
            if not 0 <= int(instance) < m:
                raise ValueError(f"router {instance} outside 0..{m - 1} of {operator!r}")
            g = np.asarray(groups, dtype=np.int64)
            c = np.asarray(counts, dtype=np.float64)
            if g.shape != c.shape or (len(g) and (g.min() < 0 or g.max() >= G)) or (c < 0).any():
                raise ValueError(f"key-group counts from router {instance} of {operator!r} do not fit 0..{G - 1}")
            hot = _hot_entries(hot, f"router {instance} of {operator!r}")
            if routed is not None:
                routed = np.asarray(routed, dtype=np.float64)
                if routed.shape != (n,) or (routed < 0).any():
                    raise ValueError(f"records routed by router {instance} of {operator!r} are not "
                                     f"{n} non-negative counts, one per instance")
            slot[("router", int(instance))] = {"groups": g, "counts": c, "final": bool(final), "hot": hot,
                                               "routed": routed}
        else:
            raise ValueError(f"report kind {kind!r} is neither 'owner' nor 'router'")
        for ws in sorted(win):
            if len(win[ws]) == n + m:
                self._evaluate(j, operator, ws, win.pop(ws))
            elif ws < float(window_start) - 5 * self.window:
                win.pop(ws)             # an instance never reported that window

    def _evaluate(self, j: _Job, operator: str, window_start: float, reports: dict) -> None:
        op = j.control.operator(operator)
        n, G = op.table.parallelism, op.table.key_groups
        load = np.zeros(G)
        routed = np.zeros(n)
        hot: dict = {}
        for (kind, _), r in reports.items():
            if kind == "router":
                np.add.at(load, r["groups"], r["counts"])
                if r["routed"] is not None:
                    routed += r["routed"]
                for k, c in r["hot"]:
                    hot[k] = hot.get(k, 0.0) + c
        for k, _ in op.table.splits:
            hot.setdefault(k, 0.0)       # a split key's group must be known, hot or not
        hot_keys = tuple((k, key_group_of(k, G), c)
                         for k, c in sorted(hot.items(), key=lambda kc: -kc[1]))
        reports = {**{i: r for (kind, i), r in reports.items() if kind == "owner"},
                   "final": any(r["final"] for r in reports.values())}
        recent = frozenset(g for g, e in op.moved_at.items() if e > op.table.epoch - 3)
        report = LoadReport(
            operator, op.table.owners, load, n, epoch=op.table.epoch, window_start=window_start,
            window=self.window, busy_seconds=[reports[i]["busy"] for i in range(n)],
            queued_batches=[reports[i]["queued"] for i in range(n)], recently_moved=recent,
            latency_hist=[reports[i]["latency_hist"] if reports[i]["latency_hist"] is not None
                          else np.zeros(_latency.BINS) for i in range(n)],
            hot_keys=hot_keys, splits=op.table.splits, splittable=op.kind == "aggregate",
        )
        per_instance = report.instance_load()
        j.load[operator] = [{"instance": i, "records": reports[i]["records"], "load": float(per_instance[i]),
                             "busy_seconds": reports[i]["busy"], "queued_batches": reports[i]["queued"],
                             "latency_p99_ms": reports[i]["latency_p99_ms"]} for i in range(n)]
        total = load.sum()
        floor = max(1.0, n * load.max() / total) if total > 0 else 1.0
        applied = np.array([reports[i]["records"] for i in range(n)], dtype=float)
        measured = float(applied.max() / applied.mean()) if applied.sum() > 0 else 1.0
        j.imbalance[operator].append({
            "window_start": window_start, "imbalance": measured, "floor": floor,
            "routed": float(routed.max() / routed.mean()) if routed.sum() > 0 else 1.0,
            "planned": report.imbalance(), "records": float(total), "epoch": op.table.epoch,
        })
        j.trace[operator].append((window_start, load.astype(np.float32), op.table.owners.astype(np.int32), measured,
                                  [(k, c) for k, _, c in hot_keys[:TRACE_HOT_KEYS]]))
        if op.in_flight or time.time() - op.last_completed < self.cooldown:
            return
        if reports["final"]:
            return                      # the stream is ending: nothing left to balance
        try:
            plan = complete_plan(report, j.balancer.plan(report))
            check_plan(report, plan)
        except Exception as exc:
            self._refuse(j.control.job, f"plan of {j.balancer_name!r} for {operator!r} refused: "
                                        f"{type(exc).__name__}: {exc}")
            return
        assignment: dict[int, int] = {}
        for mv in plan:
            for g in (mv.key_groups if isinstance(mv, Move) else ()):
                if len(assignment) < self.max_groups:
                    assignment[g] = mv.to_instance
        merges = {sp.key: () for sp in plan if isinstance(sp, Split) and not sp.helpers}
        splits = {sp.key: sp.helpers for sp in plan if isinstance(sp, Split) and sp.helpers}
        if assignment or merges or splits:
            op.in_flight = True          # claimed now: the next window must not plan again
            task = asyncio.ensure_future(self._run_plan(j, operator, assignment, merges, splits))
            j.tasks.add(task)
            task.add_done_callback(j.tasks.discard)

    async def _run_plan(self, j: _Job, operator: str, assignment: dict, merges: dict | None = None,
                        splits: dict | None = None) -> None:
        """Merges back, splits, then moves (a split spreads a hot key at once; the groups
        of split keys do not move)."""
        op = j.control.operator(operator)
        timeout = config.seconds("migration.timeout")
        try:
            if merges:
                await split(j.control, self._call, operator, merges, timeout=timeout)
            if splits:
                await split(j.control, self._call, operator, splits, timeout=timeout)
            if assignment:
                await self._migrate(j, operator, assignment, j.migration)
        except Exception as exc:
            self._refuse(j.control.job, f"migration of {operator!r} failed: {type(exc).__name__}: {exc}")
        finally:
            if not op.lock.locked():
                op.in_flight = False    # whatever failed, the operator can be planned again

    # -- state ------------------------------------------------------------------------------------
    def state(self) -> dict:
        """Routing tables, epochs, moves and per-instance load of every job, JSON-able."""
        out = {"balancer": self.balancer, "migration": self.migration, "window": self.window,
               "refused": self.refused[-50:], "jobs": {}}
        for jid, j in self.jobs.items():
            out["jobs"][jid] = {
                "balancer": j.balancer_name, "migration": j.migration,
                "operators": {
                    name: {"epoch": op.table.epoch, "owners": op.table.owners.tolist(),
                           "splits": [[k, list(h)] for k, h in op.table.splits],
                           "in_flight": op.in_flight, "load": j.load.get(name, []),
                           "imbalance": j.imbalance.get(name, [])[-1000:]}
                    for name, op in j.control.operators.items()
                },
                "moves": j.control.history, "refused": j.refused[-50:],
            }
        return out

    def state_handler(self) -> dict:
        return self.state()

    def trace_handler(self, job: str, operator: str) -> dict:
        """The windows kept for ``operator`` as .npy bytes: loads, owners, measured imbalance;
        and, when the routers counted them (a balancer that splits keys) and they are
        integers, each window's hottest keys and their records."""
        j = self._job(job)
        j.control.operator(operator)            # an unknown operator is named
        rows = list(j.trace.get(operator, ()))
        G, n = j.control.operator(operator).table.key_groups, j.control.operator(operator).table.parallelism

        def npy(a) -> bytes:
            buf = io.BytesIO()
            np.save(buf, a, allow_pickle=False)
            return buf.getvalue()

        out = {"window": self.window, "instances": n,
               "window_start": npy(np.array([r[0] for r in rows], np.float64)),
               "loads": npy(np.array([r[1] for r in rows], np.float32).reshape(len(rows), G)),
               "owners": npy(np.array([r[2] for r in rows], np.int32).reshape(len(rows), G)),
               "measured": npy(np.array([r[3] for r in rows], np.float64))}
        hot = [r[4] for r in rows]
        if any(hot) and all(isinstance(k, (int, np.integer)) for h in hot for k, _ in h):
            # windows padded to the same width with key -1 and no records
            width = max(len(h) for h in hot)
            keys = np.full((len(rows), width), -1, np.int64)
            counts = np.zeros((len(rows), width))
            for i, h in enumerate(hot):
                keys[i, :len(h)] = [k for k, _ in h]
                counts[i, :len(h)] = [c for _, c in h]
            out["hot_keys"], out["hot_loads"] = npy(keys), npy(counts)
        return out


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


def _table_state(table) -> dict:
    return {"owners": table.owners.tolist(), "epoch": table.epoch,
            "splits": [[k, list(h)] for k, h in table.splits]}


try:
    from tornado.web import RequestHandler

    class _StateHandler(RequestHandler):
        def initialize(self, plugin: BalancerPlugin) -> None:
            self.plugin = plugin

        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(self.plugin.state(), default=_jsonable))
except ImportError:  # pragma: no cover - tornado ships with distributed
    pass


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def dask_setup(scheduler) -> None:
    """Preload hook: ``dask scheduler --preload streamlb.plugin``."""
    scheduler.add_plugin(BalancerPlugin(), name=NAME)


def ensure_plugin(client) -> bool:
    """Register a BalancerPlugin on the client's scheduler unless one is there; True if added."""
    present = client.run_on_scheduler(lambda dask_scheduler: NAME in dask_scheduler.plugins)
    if not present:
        client.register_plugin(BalancerPlugin())
    return not present
