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
The RPC handlers (``streamlb_*``) are declared with ``_commands.command``, which checks every
argument before the handler runs and answers a ``CommandError`` for a command that does not fit.

State (routing tables, epochs, moves, load) is served as JSON at ``/streamlb/state.json`` on
the scheduler's HTTP server.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict, deque

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin

from .. import _observe as observe
from .. import config
from .._observe._totals import count_dead_letters, count_event_time, count_report, forget
from ..balancer import check_plan, complete_plan, get_balancer
from ..exceptions import CommandError
from . import _commands as cmd
from ._commands import Default, command
from ._control import JobControl, actor_caller, table_from_state, table_state
from ._epochs import check_strategy, migrate
from ._reports import Window, pack_trace, plan_actions, report_entry
from ._split import split

logger = logging.getLogger("streamlb.plugin")
NAME = "streamlb-balancer"


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
        self.autoscale: dict = {"decisions": [], "wanted": {}}


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
        self._call = actor_caller(scheduler.rpc, lambda address: address in scheduler.workers)
        self.balancer = config.get("balancer.name", self.balancer)
        self.migration = check_strategy(config.get("migration.strategy", self.migration))
        self.window = config.seconds("window", self.window)
        self.cooldown = config.seconds("balancer.cooldown", self.cooldown)
        self.max_groups = int(config.get("balancer.max-groups", self.max_groups))
        scheduler.handlers.update(cmd.handlers(self))      # the methods declared with @command
        scheduler.stream_handlers["streamlb-load"] = self.receive_load
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            app.add_handlers(r".*", [(r"/streamlb/state.json", _StateHandler, {"plugin": self})])
        observe.attach(self, scheduler)

    async def close(self) -> None:
        observe.detach(self)
        for job in self.jobs.values():
            for t in job.tasks:
                t.cancel()

    # -- jobs ------------------------------------------------------------------------------------
    @command("streamlb_register_job", job=cmd.new_job, topology=cmd.topology, balancer=Default(cmd.balancer),
             options=Default(cmd.options), migration=Default(cmd.strategy))
    def register_job(self, job: str, topology: dict, balancer: str, options: dict,
                     migration: str | None = None) -> dict:
        self.jobs[job] = _Job(topology, balancer, options, migration or self.migration)
        return {"balancer": self.jobs[job].balancer_name, "migration": self.jobs[job].migration,
                "window": self.window}

    @command("streamlb_unregister_job", job=cmd.job)
    def unregister_job(self, job: str) -> None:
        j = self.jobs.pop(job, None)
        if j is not None:
            forget(j)                   # its Prometheus totals
            for t in j.tasks:
                t.cancel()

    def _job(self, job: str) -> _Job:
        if job not in self.jobs:
            raise CommandError(f"streamlb: no job {job!r} is registered with the balancer plugin")
        return self.jobs[job]

    async def _migrate(self, job: _Job, operator: str, assignment: dict, strategy: str, reconfig: bool = False):
        return await migrate(job.control, self._call, operator, assignment, strategy,
                             fluid_step=config.get("migration.fluid-step"),
                             timeout=config.seconds("migration.timeout"), reconfig=reconfig)

    @command("streamlb_migrate", job=cmd.job, operator=cmd.operator, assignment=cmd.assignment,
             strategy=Default(cmd.strategy), reconfig=Default(cmd.flag, False))
    async def migrate_handler(self, job: str, operator: str, assignment: list,
                              strategy: str | None = None, reconfig: bool = False) -> dict:
        """Manual moves (``Job.migrate``/``Job.reassign``): ``assignment`` is [[group, instance]...]."""
        j = self._job(job)
        table = await self._migrate(j, operator, {g: to for g, to in assignment},
                                    check_strategy(strategy or j.migration), reconfig)
        return table_state(table)

    # -- reconfiguration (the job's driver orders it; see streamlb._reconfig) ----------------------
    @command("streamlb_hold", job=cmd.job, operators=cmd.operators)
    async def hold_handler(self, job: str, operators: list) -> None:
        await self._job(job).control.hold(operators)

    @command("streamlb_pause", job=cmd.job, operators=cmd.operators, timeout=cmd.seconds)
    async def pause_handler(self, job: str, operators: list, timeout: float) -> None:
        await self._job(job).control.pause_moves(operators, timeout)

    @command("streamlb_resume", job=cmd.job, operators=cmd.operators)
    def resume_handler(self, job: str, operators: list) -> None:
        self._job(job).control.resume_moves(operators)

    def remove_worker(self, scheduler=None, worker=None, **kwargs) -> None:
        """A worker left: migrations waiting on its actors fail now, not after the connect
        timeout (a job then recovers from its checkpoint, see streamlb._checkpoint)."""
        if worker is not None and hasattr(self, "_call"):
            self._call.lose(worker)

    @command("streamlb_release", job=cmd.job, operators=cmd.operators)
    def release_handler(self, job: str, operators: list) -> None:
        self._job(job).control.release(operators)

    @command("streamlb_topology", job=cmd.job, topology=cmd.topology)
    def topology_handler(self, job: str, topology: dict) -> dict:
        """New peers of ``job``; answers the routing table of each keyed operator."""
        j = self._job(job)
        j.control.update_topology(topology)
        for name in topology["operators"]:
            j.windows.pop(name, None)       # windows half reported by the old instances
        return {name: table_state(op.table) for name, op in j.control.operators.items()}

    @command("streamlb_autoscale", job=cmd.job, decision=cmd.decision, wanted=cmd.wanted)
    def autoscale_handler(self, job: str, decision: dict, wanted: dict) -> None:
        a = self._job(job).autoscale
        a["decisions"] = (a["decisions"] + [decision])[-100:]
        a["wanted"] = wanted

    @command("streamlb_set_table", job=cmd.job, operator=cmd.operator, table=cmd.table)
    def set_table_handler(self, job: str, operator: str, table: dict) -> dict:
        c = self._job(job).control
        c.set_table(operator, table_from_state(table, c.operator(operator).table.parallelism))
        return table

    @command("streamlb_split", job=cmd.job, operator=cmd.operator, changes=cmd.changes)
    async def split_handler(self, job: str, operator: str, changes: list) -> dict:
        """Manual splits (``Job.split``): ``changes`` is [[key, [helper...]]...]."""
        j = self._job(job)
        table = await split(j.control, self._call, operator, {k: tuple(h) for k, h in changes},
                            timeout=config.seconds("migration.timeout"))
        return table_state(table)

    @command("streamlb_routing", job=cmd.job, operator=cmd.operator)
    def routing_handler(self, job: str, operator: str) -> dict:
        return table_state(self._job(job).control.operator(operator).table)

    @command("streamlb_history", job=cmd.job)
    def history_handler(self, job: str) -> list:
        return self._job(job).control.history

    # -- load reports --------------------------------------------------------------------------------
    def receive_load(self, worker=None, **msg) -> None:
        """Stream handler: must never raise, or the worker's stream would break."""
        try:
            self._receive_load(**cmd.check_load(msg))
        except Exception as exc:
            self._refuse(msg.get("job"), f"malformed load report from {worker}: {type(exc).__name__}: {exc}")

    def _refuse(self, job: str | None, reason: str) -> None:
        entry = {"time": time.time(), "reason": reason}
        logger.warning("streamlb: %s", reason)
        known = isinstance(job, str) and job in self.jobs
        (self.jobs[job].refused if known else self.refused).append(entry)

    def _receive_load(self, job: str, operator: str, instance: int, window_start: float, kind: str = "owner",
                      records: int = 0, batches: int | None = None, busy: float = 0.0, queued: int = 0,
                      groups=None, counts=None,
                      latency_p99_ms=None, final: bool = False, hot=None, routed=None, latency_hist=None,
                      parallelism=None, dead_letters=None, late_records=0, watermark=None, **_ignored) -> None:
        j = self.jobs.get(job)
        if j is None:
            return                      # a job finished or registered elsewhere
        op = j.control.operator(operator)
        place, entry = report_entry(op, operator, kind, instance, records=records, batches=batches, busy=busy,
                                    queued=queued,
                                    groups=groups, counts=counts, latency_p99_ms=latency_p99_ms, final=final,
                                    hot=hot, routed=routed, latency_hist=latency_hist, parallelism=parallelism)
        win = j.windows[operator]       # only now: a refused report leaves no empty window behind
        win[float(window_start)][place] = entry
        count_report(j, op, place, entry)
        if kind == "owner":
            count_event_time(j, operator, int(instance), late_records, watermark)
        if dead_letters:
            count_dead_letters(j, instance, dead_letters)
        for ws in sorted(win):
            if len(win[ws]) == op.table.parallelism + len(op.routers):
                self._evaluate(j, operator, ws, win.pop(ws))
            elif ws < float(window_start) - 5 * self.window:
                win.pop(ws)             # an instance never reported that window

    def _evaluate(self, j: _Job, operator: str, window_start: float, reports: dict) -> None:
        op = j.control.operator(operator)
        w = Window(op, operator, window_start, self.window, reports)
        j.load[operator] = w.instance_load()
        j.imbalance[operator].append(w.imbalance())
        j.trace[operator].append(w.trace_row())
        if op.in_flight or op.reconfiguring or op.lock.locked() or time.time() - op.last_completed < self.cooldown:
            return
        if w.final:
            return                      # the stream is ending: nothing left to balance
        if len(j.imbalance[operator]) == 1:
            return                      # the job's first window: begun mid-window, a sample too small to plan on
        try:
            plan = complete_plan(w.report, j.balancer.plan(w.report))
            check_plan(w.report, plan)
        except Exception as exc:
            self._refuse(j.control.job, f"plan of {j.balancer_name!r} for {operator!r} refused: "
                                        f"{type(exc).__name__}: {exc}")
            return
        assignment, merges, splits = plan_actions(plan, self.max_groups)
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
                "moves": j.control.history, "refused": j.refused[-50:], "autoscale": j.autoscale,
            }
        return out

    @command("streamlb_state")
    def state_handler(self) -> dict:
        return self.state()

    @command("streamlb_trace", job=cmd.job, operator=cmd.operator)
    def trace_handler(self, job: str, operator: str) -> dict:
        """The windows kept for ``operator``, packed as .npy bytes (see ``pack_trace``)."""
        j = self._job(job)
        table = j.control.operator(operator).table          # an unknown operator is named
        return pack_trace(list(j.trace.get(operator, ())), self.window, table.key_groups, table.parallelism)


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
