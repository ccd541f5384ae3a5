"""What the coordinator knows of a job: its actors, its keyed operators and their routing tables.

``call(address, key, command)`` is how the coordinator sends an instance one of the epoch
protocol's typed commands (:mod:`streamlb._worker._commands`), wherever it runs (the driver,
through the client; the scheduler plugin, through the scheduler).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np

from ..exceptions import MigrationError
from ..routing import RoutingTable
from .._worker._channels import call_actor
from .._worker._commands import Command

Call = Callable[..., Awaitable]


def actor_caller(rpc, alive: Callable[[str], bool] | None = None) -> Call:
    """``call(address, key, command)`` (the instance's ``command`` RPC) through the
    connection pool ``rpc`` (a client's or the scheduler's). ``alive(address)``: whether that worker is still there;
    a call to one that is not fails at once (a connection would be retried for the connect
    timeout), so a migration whose actors died with their worker ends quickly."""
    pending: dict[str, set] = {}
    lost: set[str] = set()

    async def call(address: str, key: str, cmd: Command):
        if address in lost or (alive is not None and not alive(address)):
            raise MigrationError(f"worker {address} (actor {key}) is gone")
        task = asyncio.ensure_future(call_actor(rpc, address, key, "command", cmd))
        pending.setdefault(address, set()).add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if address in lost and task.cancelled():
                raise MigrationError(f"worker {address} (actor {key}) was lost during {cmd.name!r}") from None
            raise
        finally:
            pending.get(address, set()).discard(task)

    def lose(address: str) -> None:
        """Worker ``address`` died: calls to it in flight fail now (on the caller's loop)."""
        lost.add(address)
        for task in pending.pop(address, ()):
            task.cancel()

    call.lose = lose

    return call


class OperatorControl:
    """Routing state of one keyed operator."""

    def __init__(self, name: str, owners: list, routers: list, table: RoutingTable, kind: str = "aggregate",
                 merges_lazily: bool = False, splittable: bool | None = None) -> None:
        self.name = name
        self.kind = kind
        self.splittable = kind == "aggregate" if splittable is None else splittable
        self.merges_lazily = merges_lazily      # Stage.merges_lazily: lazy moves pull no key
        self.owners = [tuple(p) for p in owners]       # (address, actor key) per instance
        self.routers = [tuple(p) for p in routers]
        self.table = table
        self.in_flight = False
        self.reconfiguring = False      # held by a rescale, move or update: no balancer move
        self.last_completed = 0.0
        self.moved_at: dict[int, int] = {}             # key group -> epoch it last moved in
        self.unsettled: dict[int, tuple[list, list]] = {}   # epoch that timed out -> (groups, instances)
        self._lock: asyncio.Lock | None = None

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[OperatorControl]:
        """Hold the operator for one migration: one at a time, in flight until it ends."""
        async with self.lock:
            self.in_flight = True
            try:
                yield self
            finally:
                self.in_flight = False
                self.last_completed = time.time()


class JobControl:
    """What a coordinator needs to know about a job: its actors and routing tables."""

    def __init__(self, topology: dict) -> None:
        self.job = topology["job"]
        self.key_groups = int(topology["key_groups"])
        self.sources = [tuple(p) for p in topology["sources"]]
        self.instances = [tuple(p) for p in topology["instances"]]
        self.operators = {
            name: OperatorControl(name, op["owners"], op["routers"],
                                  RoutingTable(np.asarray(op["table"]), len(op["owners"]), int(op["epoch"])),
                                  op.get("kind", "aggregate"), bool(op.get("merges_lazily", False)),
                                  op.get("splittable"))
            for name, op in topology["operators"].items()
        }
        self.stage_ids = {name: int(op["stage"]) for name, op in topology["operators"].items()}
        self.history: list[dict] = []

    async def hold(self, names) -> None:
        """Reserve keyed operators ``names`` for a reconfiguration: wait for the migration in
        flight on each to end; the balancer leaves them alone until :meth:`release`."""
        self.hold_sync(names)
        for op in [self.operator(n) for n in names]:
            async with op.lock:
                pass

    def hold_sync(self, names) -> None:
        """:meth:`hold` where no migration runs in this copy (the plugin's copy runs them)."""
        ops = [self.operator(n) for n in names]
        busy = [op.name for op in ops if op.reconfiguring]
        if busy:
            raise MigrationError(f"operator {busy[0]!r} of job {self.job} is already being reconfigured; "
                                 "wait for that to finish")
        for op in ops:
            op.reconfiguring = True

    async def pause_moves(self, names, timeout: float) -> None:
        """Let the migration in flight on each of ``names`` end, then start no other until
        :meth:`resume_moves` (a checkpoint or a recovery runs meanwhile). Gives up, pausing
        nothing, after ``timeout`` seconds."""
        ops = [self.operator(n) for n in sorted(names)]
        got = []
        try:
            for op in ops:
                await asyncio.wait_for(op.lock.acquire(), timeout)
                got.append(op)
        except BaseException:
            for op in got:
                op.lock.release()
            raise

    def resume_moves(self, names) -> None:
        for n in names:
            op = self.operators.get(n)
            if op is not None and op.lock.locked():
                op.lock.release()

    def release(self, names) -> None:
        for n in names:
            if n in self.operators:
                self.operators[n].reconfiguring = False
                self.operators[n].last_completed = time.time()

    def update_topology(self, topology: dict) -> None:
        """Instances were added, moved or retired: new peers, same tables (their
        parallelism follows the owners); ``topology["reset"]``: take its tables too."""
        self.sources = [tuple(p) for p in topology["sources"]]
        self.instances = [tuple(p) for p in topology["instances"]]
        for name, t in topology["operators"].items():
            op = self.operators[name]
            op.owners = [tuple(p) for p in t["owners"]]
            op.routers = [tuple(p) for p in t["routers"]]
            if topology.get("reset"):       # a recovery: every instance is new, with these tables
                op.table = RoutingTable(np.asarray(t["table"]), len(op.owners), int(t["epoch"]))
                op.unsettled.clear()
                continue
            old = op.table
            op.table = RoutingTable(old.owners, len(op.owners), old.epoch, splits=old.splits)

    def set_table(self, name: str, table: RoutingTable) -> None:
        self.operator(name).table = table

    def operator(self, name: str) -> OperatorControl:
        if name not in self.operators:
            raise MigrationError(
                f"job {self.job} has no keyed operator {name!r}; keyed operators: {', '.join(self.operators)}"
            )
        return self.operators[name]

    def target(self, op: OperatorControl) -> int:
        """The stage id the routers of ``op`` know its exchange by."""
        return self.stage_ids[op.name]

    def validate(self, operator: str, key_groups, to_instance) -> list[int]:
        """Key groups to move; raise MigrationError naming what is wrong."""
        op = self.operator(operator)
        n, G = op.table.parallelism, op.table.key_groups
        if not isinstance(to_instance, (int, np.integer)) or not 0 <= to_instance < n:
            raise MigrationError(
                f"operator {operator!r} has instances 0..{n - 1}; cannot move key groups to instance {to_instance!r}"
            )
        groups = sorted({int(g) for g in key_groups})
        bad = [g for g in groups if not 0 <= g < G]
        if bad:
            raise MigrationError(f"operator {operator!r}: key group {bad[0]} is outside 0..{G - 1}")
        return groups


def table_state(table: RoutingTable) -> dict:
    """A routing table in the JSON-able form the plugin's handlers answer with."""
    return {"owners": table.owners.tolist(), "epoch": table.epoch,
            "splits": [[k, list(h)] for k, h in table.splits]}


def table_from_state(state: dict, parallelism: int) -> RoutingTable:
    """A routing table from the plugin's JSON-able form."""
    return RoutingTable(np.asarray(state["owners"]), parallelism, state["epoch"],
                        splits=tuple((k, tuple(h)) for k, h in state.get("splits", ())))
