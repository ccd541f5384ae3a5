"""How a :class:`~streamlb.Job` reaches the coordinator of its migrations.

A job without a balancer runs the coordinator in the driver, through the client
(:class:`DriverControl`); a balanced job asks the scheduler plugin, where the coordinator
runs next to the balancer (:class:`PluginControl`). Both answer the same calls, so the job
holds one of them and never asks which.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from .. import config
from ..exceptions import PipelineError
from ..routing import RoutingTable
from ._control import JobControl, actor_caller, table_from_state, table_state
from ._epochs import migrate
from ._plugin import ensure_plugin
from ._reports import unpack_trace
from ._split import split


def _lists(x):
    """``x`` with the tuples the scheduler's messages turn lists into made lists again."""
    if isinstance(x, (list, tuple)):
        return [_lists(v) for v in x]
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    return x


class Control(ABC):
    """A job's migrations: routing tables, moves, splits and what was recorded of them.

    ``control`` is the job's :class:`JobControl` (built from its topology), by which
    arguments are checked before anything is asked.
    """

    def __init__(self, client, control: JobControl) -> None:
        self.client = client
        self.control = control

    @abstractmethod
    def routing(self, operator: str) -> RoutingTable:
        """The routing table in force for keyed ``operator``."""

    @abstractmethod
    def history(self) -> list[dict]:
        """Completed epochs, oldest first."""

    @abstractmethod
    def reassign(self, operator: str, assignment: dict[int, int], strategy: str,
                 reconfig: bool = False) -> RoutingTable:
        """Give each key group of ``assignment`` to its instance; the table once done.
        ``reconfig``: a move of a reconfiguration that holds the operator."""

    @abstractmethod
    def hold(self, operators: list[str]) -> None:
        """Reserve keyed ``operators`` for a reconfiguration (see ``JobControl.hold``)."""

    @abstractmethod
    def release(self, operators: list[str]) -> None:
        """End the reconfiguration of ``operators``."""

    @abstractmethod
    def pause_moves(self, operators: list[str], timeout: float) -> None:
        """Wait for the moves in flight on ``operators`` to end; start none until
        :meth:`resume_moves` (see ``JobControl.pause_moves``)."""

    @abstractmethod
    def resume_moves(self, operators: list[str]) -> None:
        """Moves of ``operators`` may start again."""

    def lose(self, workers: list[str]) -> None:
        """``workers`` died: a migration waiting on them fails now rather than after the
        connect timeout (the scheduler plugin learns it from the scheduler itself)."""

    @abstractmethod
    def update_topology(self, topology: dict) -> None:
        """Instances were added, moved or retired."""

    @abstractmethod
    def set_table(self, operator: str, table: RoutingTable) -> None:
        """Routers switched to ``table`` outside a migration (an update's epoch)."""

    @abstractmethod
    def split(self, operator: str, changes: dict) -> RoutingTable:
        """Split each key of ``changes`` over its helpers (none: merge it back)."""

    @abstractmethod
    def balancer_state(self) -> dict:
        """The balancer plugin's view of the job."""

    @abstractmethod
    def load_trace(self, operator: str, check: Callable[[], object]):
        """The load the balancer saw for ``operator``, once ``check()`` accepted it."""

    def close(self, timeout: float | None = None) -> None:
        """The job stops: keep what is needed to answer :meth:`history` afterwards, asking
        the coordinator for at most ``timeout`` seconds (0: it is gone, ask nothing)."""

    def snapshot(self, timeout: float) -> None:
        """The job finished: keep what :meth:`history` and :meth:`balancer_state` answer, so
        they still answer once the cluster is gone (asking at most ``timeout`` seconds)."""

    def note_autoscale(self, decision: dict, wanted: dict) -> None:
        """An autoscaling decision (shown by the plugin's state where there is one)."""


class DriverControl(Control):
    """The coordinator in the driver: moves and splits only when the job asks for them."""

    def __init__(self, client, control: JobControl) -> None:
        super().__init__(client, control)
        self._call = actor_caller(client.rpc)

    def routing(self, operator: str) -> RoutingTable:
        return self.control.operator(operator).table

    def history(self) -> list[dict]:
        return self.control.history

    def reassign(self, operator: str, assignment: dict[int, int], strategy: str,
                 reconfig: bool = False) -> RoutingTable:
        return self.client.sync(
            migrate, self.control, self._call, operator, assignment, strategy,
            fluid_step=config.get("migration.fluid-step"), timeout=config.seconds("migration.timeout"),
            reconfig=reconfig,
        )

    def hold(self, operators: list[str]) -> None:
        self.client.sync(self.control.hold, operators)

    def release(self, operators: list[str]) -> None:
        self.control.release(operators)

    def pause_moves(self, operators: list[str], timeout: float) -> None:
        self.client.sync(self.control.pause_moves, operators, timeout)

    def resume_moves(self, operators: list[str]) -> None:
        self.client.sync(self._resume, operators)

    def lose(self, workers: list[str]) -> None:
        self.client.sync(self._lose, workers)

    async def _lose(self, workers: list[str]) -> None:
        for w in workers:
            self._call.lose(w)

    async def _resume(self, operators: list[str]) -> None:     # on the loop that holds the locks
        self.control.resume_moves(operators)

    def update_topology(self, topology: dict) -> None:
        self.control.update_topology(topology)

    def set_table(self, operator: str, table: RoutingTable) -> None:
        self.control.set_table(operator, table)

    def split(self, operator: str, changes: dict) -> RoutingTable:
        return self.client.sync(split, self.control, self._call, operator, changes,
                                timeout=config.seconds("migration.timeout"))

    def balancer_state(self) -> dict:
        raise PipelineError(f"job {self.control.job} runs without a balancer; pass streamlb.run(..., balancer=...)")

    def load_trace(self, operator: str, check: Callable[[], object]):
        check()             # an operator the job does not have is named first
        raise PipelineError(f"job {self.control.job} runs without a balancer, so no load was recorded; "
                            "pass streamlb.run(..., balancer=...)")


class PluginControl(Control):
    """The coordinator in the scheduler plugin, which the job registers with (adding the
    plugin to the scheduler if it is not there)."""

    def __init__(self, client, control: JobControl, topology: dict, *, balancer: str,
                 options: dict | None = None, migration: str | None = None) -> None:
        super().__init__(client, control)
        self._history: list[dict] = []
        self._state: dict = {}
        self._closed = False
        ensure_plugin(client)
        self._ask("streamlb_register_job", topology=topology, balancer=balancer, options=options or {},
                  migration=migration)

    def _ask(self, handler: str, _timeout: float | None = None, **kwargs):
        """Call the plugin's ``handler`` for this job; ``_timeout``: seconds to wait for the
        answer before ``TimeoutError`` (None: as long as it takes)."""
        return self.client.sync(getattr(self.client.scheduler, handler), job=self.control.job,
                                callback_timeout=_timeout, **kwargs)

    def _table(self, operator: str, state: dict) -> RoutingTable:
        return table_from_state(state, self.control.operator(operator).table.parallelism)

    def routing(self, operator: str) -> RoutingTable:
        return self._table(operator, self._ask("streamlb_routing", operator=operator))

    def _reachable(self) -> bool:
        return not self._closed and self.client.status == "running"

    def history(self) -> list[dict]:
        if self._reachable():
            self._history = [_lists(e) for e in self._ask("streamlb_history")]
        return self._history

    def reassign(self, operator: str, assignment: dict[int, int], strategy: str,
                 reconfig: bool = False) -> RoutingTable:
        state = self._ask("streamlb_migrate", operator=operator,
                          assignment=[[g, to] for g, to in assignment.items()], strategy=strategy,
                          reconfig=reconfig)
        return self._table(operator, state)

    def hold(self, operators: list[str]) -> None:
        self.control.hold_sync(operators)       # the driver's copy checks the names
        try:
            self._ask("streamlb_hold", operators=operators)
        except BaseException:
            self.control.release(operators)
            raise

    def release(self, operators: list[str]) -> None:
        self.control.release(operators)
        self._ask("streamlb_release", operators=operators)

    def pause_moves(self, operators: list[str], timeout: float) -> None:
        self._ask("streamlb_pause", operators=operators, timeout=timeout)

    def resume_moves(self, operators: list[str]) -> None:
        self._ask("streamlb_resume", operators=operators)

    def update_topology(self, topology: dict) -> None:
        tables = self._ask("streamlb_topology", topology=topology)
        # this copy's tables lag the plugin's (the plugin's balancer and the rescale moved
        # groups there): take them before the owners change
        for name, t in topology["operators"].items():
            self.control.operators[name].table = table_from_state(tables[name], len(t["owners"]))
        self.control.update_topology(topology)

    def set_table(self, operator: str, table: RoutingTable) -> None:
        self.control.set_table(operator, table)
        self._ask("streamlb_set_table", operator=operator, table=table_state(table))

    def split(self, operator: str, changes: dict) -> RoutingTable:
        state = self._ask("streamlb_split", operator=operator, changes=[[k, list(h)] for k, h in changes.items()])
        return self._table(operator, state)

    def balancer_state(self) -> dict:
        if self._reachable():
            self._state = self._plugin_state(None)
        return self._state             # else as the plugin had it when the job finished or stopped

    def _plugin_state(self, timeout: float | None) -> dict:
        state = self.client.sync(self.client.scheduler.streamlb_state, callback_timeout=timeout)
        return state["jobs"].get(self.control.job, {})

    def load_trace(self, operator: str, check: Callable[[], object]):
        check()
        return unpack_trace(self._ask("streamlb_trace", operator=operator), self.control.job, operator)

    def note_autoscale(self, decision: dict, wanted: dict) -> None:
        self._ask("streamlb_autoscale", decision=decision, wanted=wanted)

    def snapshot(self, timeout: float) -> None:
        deadline = time.time() + timeout
        try:
            self._history = [_lists(e) for e in self._ask("streamlb_history", _timeout=timeout)]
            self._state = self._plugin_state(max(deadline - time.time(), 0.05))
        except Exception:       # the scheduler is gone or slow: keep what was known
            pass

    def close(self, timeout: float | None = None) -> None:
        if timeout != 0 and self._reachable():
            deadline = time.time() + (timeout or 0)
            self.snapshot(timeout)
            try:
                self._ask("streamlb_unregister_job", _timeout=None if timeout is None
                          else max(deadline - time.time(), 0.05))
            except Exception:
                pass
        self._closed = True


def open_control(client, topology: dict, *, balancer: str | None = None, options: dict | None = None,
                 migration: str | None = None) -> Control:
    """The control of a job with ``topology``: through the scheduler plugin with a
    ``balancer``, else in the driver."""
    control = JobControl(topology)
    if balancer is None:
        return DriverControl(client, control)
    return PluginControl(client, control, topology, balancer=balancer, options=options, migration=migration)
