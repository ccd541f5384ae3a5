"""Changing a running job: rescale, move an instance, update a function, move key groups,
split a hot key; and what it runs as: parallelism, routing tables, topology, the history.

:class:`Reconfiguration` checks a request against the job (its operators, its status, the
key's type) and hands it on: rescales, moves and updates to the job's
:class:`~streamlb._reconfig.Reconfigurer` (which orders the steps on the instances), moves
of key groups and splits to the coordinator of its migrations (``job._migrations``, in the
driver or the balancer plugin). :meth:`Reconfiguration.topology` describes the instances and
tables for that coordinator. It keeps the record of every reconfiguration for
:attr:`streamlb.Job.history` and logs it.
"""
from __future__ import annotations

import logging

import numpy as np

from .. import config
from ..exceptions import MigrationError, ReconfigurationError
from ..routing import RoutingTable
from ._results import keyed

__all__ = ["Reconfiguration"]

logger = logging.getLogger("streamlb.job")

_KEY_TYPES = {"i": (int,), "u": (int,), "O": (str,), "b": (bool, np.bool_)}
_KEY_TYPE_NAMES = {"i": "integers", "u": "integers", "O": "strings", "b": "booleans"}


class Reconfiguration:
    """The live changes of ``job`` and their record."""

    def __init__(self, job) -> None:
        self.job = job
        self.done: list[dict] = []      # rescales, moves, updates, autoscaling and recoveries

    def history(self) -> list[dict]:
        """See :attr:`streamlb.Job.history`."""
        moves = list(self.job._migrations.history())
        if not self.done:
            return moves
        return sorted(moves + self.done, key=lambda e: e["completed"])

    def topology(self) -> dict:
        """See :meth:`streamlb.Job.topology`."""
        job = self.job
        peer = lambda k: [job.actors[k]._address, job.actors[k].key]  # noqa: E731
        ops = {}
        for st in job.plan.stages:
            if st.id in job.tables:
                ups = [job.plan.stages[u] for u in st.inputs]
                ops[st.name] = {
                    "stage": st.id,
                    "owners": [peer((st.id, i)) for i in range(st.parallelism)],
                    "routers": [peer((up.id, i)) for up in ups for i in range(up.parallelism)],
                    "table": job.tables[st.id].owners.tolist(), "epoch": job.tables[st.id].epoch,
                    "kind": st.kind,
                    "splittable": st.splittable,
                    "merges_lazily": st.merges_lazily,
                }
        return {
            "job": job.id, "key_groups": job.key_groups,
            "sources": [peer(k) for k in job.actors if job.plan.stages[k[0]].is_source],
            "instances": [peer(k) for k in job.actors], "operators": ops,
        }

    def routing(self, operator: str) -> RoutingTable:
        """See :meth:`streamlb.Job.routing`."""
        keyed(self.job, operator, "only keyed operators have a routing table")
        return self.job._migrations.routing(operator)

    def parallelism(self, operator: str) -> int:
        """See :meth:`streamlb.Job.parallelism`."""
        return self.job.reconfig.stage(operator).parallelism

    def rescale(self, operator: str, parallelism: int, strategy: str | None, workers: list[str] | None) -> int:
        """See :meth:`streamlb.Job.rescale`."""
        self.note(self._faultless(f"rescale of {operator!r} to {parallelism}", operator,
                                  lambda: self.job.reconfig.rescale(operator, parallelism, strategy, workers)))
        return self.parallelism(operator)

    def move_instance(self, operator: str, instance: int, worker: str) -> None:
        """See :meth:`streamlb.Job.move_instance`."""
        self.note(self._faultless(f"move of {operator!r}[{instance}] to {worker}", operator,
                                  lambda: self.job.reconfig.move_instance(operator, instance, worker)))

    def update(self, operator: str, func) -> None:
        """See :meth:`streamlb.Job.update`."""
        self.note(self._faultless(f"update of {operator!r}", operator,
                                  lambda: self.job.reconfig.update(operator, func)))

    def _faultless(self, what: str, operator: str, call) -> dict:
        """Run the reconfiguration ``call``; if a fault (a lost worker, ...) met it, end with
        what happened instead of Dask's error: the job recovered from a checkpoint, which
        undid it (a :class:`ReconfigurationError` saying what is in force), or the job failed."""
        job = self.job
        recovery = job.recovery
        before = recovery.count if recovery is not None else 0
        try:
            rec = call()
        except Exception as exc:
            # a refusal (nothing was changed) is said as it is; a step that failed may be a fault's
            refused = isinstance(exc, ReconfigurationError) and exc.__cause__ is None
            if recovery is not None and (job.status == "running" and not refused or recovery.count > before):
                try:
                    recovery.handle(exc, since=before)
                except Exception:           # the job failed: said below
                    pass
            if job.status == "failed":
                raise ReconfigurationError(f"{what} did not complete: {type(exc).__name__}: {exc}; the job failed: "
                                           f"{job.error}") from exc
            if recovery is not None and recovery.count > before:
                raise ReconfigurationError(self._undone(what, operator, exc)) from exc
            if isinstance(exc, MigrationError):
                raise
            raise ReconfigurationError(f"{what} failed: {type(exc).__name__}: {exc}; {operator!r} runs "
                                       f"{self.parallelism(operator)} instances") from exc
        if recovery is not None and recovery.count > before:
            raise ReconfigurationError(self._undone(what, operator, None))
        return rec

    def _undone(self, what: str, operator: str, exc: BaseException | None) -> str:
        job = self.job
        rec = next((h for h in reversed(self.done) if h.get("kind") == "recovery"), {})
        where = sorted({w for k, w in job.workers_of.items() if job.plan.stages[k[0]].name == operator})
        cause = f"{rec.get('fault', 'a fault')} ({', '.join(rec.get('lost_workers') or rec.get('left_out') or [])})"
        start = f"checkpoint {rec['checkpoint']}" if rec.get("checkpoint") else "the beginning (no checkpoint yet)"
        return (f"{what} was undone: {cause} during it, and the job recovered from {start}; "
                f"{operator!r} runs {self.parallelism(operator)} instances now, on {', '.join(where)}"
                + ("" if exc is None else f" (the step that failed: {type(exc).__name__}: {exc})"))

    def note(self, rec: dict) -> None:
        """Keep a reconfiguration for ``history`` and log it."""
        self.done.append(rec)
        took = rec["completed"] - rec["started"]
        jid = self.job.id
        if rec["kind"] == "rescale":
            logger.info("job %s: rescaled %r %s -> %s (%s) in %.2f s", jid, rec["operator"], rec["from"],
                        rec["to"], rec["strategy"], took)
        elif rec["kind"] == "move":
            logger.info("job %s: moved %r[%s] from %s to %s in %.2f s", jid, rec["operator"], rec["instance"],
                        rec["from"], rec["to"], took)
        else:
            logger.info("job %s: updated the function of %r at epoch %s in %.2f s", jid, rec["operator"],
                        rec.get("epoch"), took)

    def migrate(self, operator: str, key_groups, to_instance: int, strategy: str | None) -> RoutingTable:
        """See :meth:`streamlb.Job.migrate`."""
        self.job.plan.stage(operator)
        groups = self.job.control.validate(operator, key_groups, to_instance)
        return self.reassign(operator, {g: int(to_instance) for g in groups}, strategy)

    def reassign(self, operator: str, assignment: dict[int, int], strategy: str | None) -> RoutingTable:
        """See :meth:`streamlb.Job.reassign`."""
        from .._migration._epochs import check_strategy

        job = self.job
        job.plan.stage(operator)
        for g, to in assignment.items():
            job.control.validate(operator, [g], to)
        strategy = check_strategy(strategy or job.migration or config.get("migration.strategy"))
        if job.status != "running":
            raise MigrationError(f"job {job.id} is {job.status}; migrations need a running job")
        return job._migrations.reassign(operator, {int(g): int(to) for g, to in assignment.items()}, strategy)

    def split(self, operator: str, key, helpers) -> RoutingTable:
        """See :meth:`streamlb.Job.split`."""
        job = self.job
        st = keyed(job, operator, "only keyed aggregate keys can be split", MigrationError)
        if job.status != "running":
            raise MigrationError(f"job {job.id} is {job.status}; splitting a key needs a running job")
        try:
            helpers = list(helpers)
        except TypeError:
            helpers = [None]
        if any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) for h in helpers):
            raise MigrationError(f"operator {operator!r}: helpers must be a list of instance numbers in "
                                 f"0..{st.parallelism - 1}, got {helpers!r}")
        helpers = [int(h) for h in helpers]
        key = key.item() if isinstance(key, np.generic) else key
        self._check_key_type(st, key)
        return job._migrations.split(operator, {key: tuple(helpers)})

    def _check_key_type(self, st, key) -> None:
        """A split key must be of the operator's key type, or no row would ever match it."""
        kind = st.key_kind          # known from the Parquet schema, else from the keys held
        if kind is None:
            actors = self.job.actors
            kinds = [f.result() for f in [actors[(st.id, i)].key_kind() for i in range(st.parallelism)]]
            kind = next((k for k in kinds if k is not None), None)
        want = _KEY_TYPES.get(kind)
        if want is None:
            return                          # nothing held yet, or a type the hash handles alike
        ok = isinstance(key, want) and not (kind in "iu" and isinstance(key, bool))
        if not ok:
            raise MigrationError(f"operator {st.name!r} keys by {_KEY_TYPE_NAMES[kind]}; key {key!r} is a "
                                 f"{type(key).__name__}, so no record would ever match it")
