"""Reconfigure a running job: rescale an operator, move an instance, update a function.

The driver orders every step (only a client creates actors); each step changes a few
instances through their reconfiguration RPCs (``streamlb._worker._reconfig``). While one
runs, the operators it touches are *held*: the balancer plans no move for them and a
second reconfiguration of them is refused. See docs/reconfiguration.md.

Scale out: create the new instances, wire them to their downstream stages and siblings,
tell the downstream instances and the siblings, give the upstream routers a channel to
them, start them, then move key groups onto them with the migration strategy (an ordinary
epoch: with ``lazy`` a new instance pulls a group's state when its first record arrives).
Scale in: move every key group off the last instances, let the routers drain what is in
flight to them, retire them (they flush their outputs), and forget them everywhere.
Move: a new actor on the target worker takes the instance's place at every router (after
what was sent to the old one was applied), the old one hands it its whole state and
retires, then the new one starts: only the instance's own rows wait meanwhile.
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from .. import config
from .._placement import cluster_workers
from ..exceptions import MigrationError, ReconfigurationError
from .._plan._model import Stage
from ..routing import RoutingTable
from .._worker._commands import Epochs
from ._plan import spread


def _pickles(func, operator: str) -> None:
    import cloudpickle

    try:
        cloudpickle.dumps(func)
    except Exception as exc:
        raise ReconfigurationError(f"operator {operator!r}: the new function cannot be pickled "
                                   f"({type(exc).__name__}: {exc}); it must travel to the workers") from exc


class Reconfigurer:
    """The live reconfigurations of one :class:`~streamlb.Job`."""

    def __init__(self, job) -> None:
        self.job = job
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._update_epochs: dict[int, int] = {}    # stage id -> last update epoch (unkeyed stages)

    # -- helpers ----------------------------------------------------------------------------------
    def stage(self, operator: str) -> Stage:
        """The stage of ``operator``; ReconfigurationError listing the operators if none."""
        try:
            return self.job.plan.stage(operator)
        except KeyError as exc:
            raise ReconfigurationError(exc.args[0]) from None

    def _downstream(self, st: Stage) -> list[Stage]:
        return [d for d in self.job.plan.stages if st.id in d.inputs]

    def _upstreams(self, st: Stage) -> list[Stage]:
        return [self.job.plan.stages[u] for u in st.inputs]

    def _keyed_names(self, *stages: Stage) -> list[str]:
        return [s.name for s in stages if s is not None and s.id in self.job.tables]

    @contextlib.contextmanager
    def _reserved(self, st: Stage, what: str):
        """Hold ``st`` (and the keyed stages its instances route to) for one reconfiguration."""
        job = self.job
        if job.status != "running":
            raise ReconfigurationError(f"job {job.id} is {job.status}; {what} needs a running job")
        with self._lock:
            if st.name in self._busy:
                raise ReconfigurationError(f"operator {st.name!r} of job {job.id} is already being reconfigured; "
                                           f"wait for that to finish before {what}")
            self._busy.add(st.name)
        held = self._keyed_names(st, *self._downstream(st))
        try:
            with job.topology_lock:         # no checkpoint or recovery meanwhile
                if job.status != "running":
                    raise ReconfigurationError(f"job {job.id} is {job.status}; {what} needs a running job")
                job._migrations.hold(held)
                try:
                    yield
                finally:
                    job._migrations.release(held)
        finally:
            with self._lock:
                self._busy.discard(st.name)

    def _result(self, futures) -> list:
        return [f.result() for f in futures]

    def _known_workers(self) -> list[str]:
        return sorted(cluster_workers(self.job.client))

    def _check_worker(self, w: str, operator: str) -> str:
        known = self._known_workers()
        if w not in known:
            raise ReconfigurationError(f"operator {operator!r}: no worker {w!r} in the cluster; workers: "
                                       f"{', '.join(known)}")
        return w

    def least_loaded(self, n: int, exclude=()) -> list[str]:
        """``n`` workers for new instances: each the one holding fewest of the job's
        instances (workers that joined after the start hold none)."""
        counts = {w: 0 for w in self._known_workers() if w not in exclude}
        if not counts:
            raise ReconfigurationError(f"job {self.job.id}: no worker is left to place instances on")
        for k, w in self.job.workers_of.items():
            if w in counts:
                counts[w] += 1
        out = []
        for _ in range(n):
            w = min(counts, key=lambda a: (counts[a], a))
            counts[w] += 1
            out.append(w)
        return out

    def _create(self, st: Stage, where: dict[int, str], run: int = 0) -> dict:
        from .. import _placement

        job = self.job
        senders = _placement.senders(st, job.plan.stages, job.runs, numbered=True)
        futures = _placement.create_instances(
            job.client, job.id, st, list(where), job.workers, upstream=senders, key_groups=job.key_groups,
            window=job.window, credits=job.credits, where=where, run=run)
        job._futures.update(futures)
        actors = _placement.bound_actors(futures, job.client)
        if job.checkpointer is not None:    # they stage outputs and write snapshots like the others
            self._result([a.checkpointing(job.checkpointer.url, job.checkpointer.compression) for a in actors.values()])
        return actors

    def _tables(self) -> dict:
        """The routing table in force of every keyed stage (new routers start with it)."""
        job = self.job
        return {sid: job._migrations.routing(job.plan.stages[sid].name) for sid in job.tables}

    def _wire(self, keys) -> None:
        from .. import _placement

        job = self.job      # routers started live send rows into windows as they are (rows_only)
        job.workers_of.update(_placement.wire(job.actors, job.plan.stages, self._tables(), _placement.rows_only(
            job.exchanges), report=job.balancer is not None, keys=keys, runs=job.runs))

    def _siblings(self, st: Stage, exclude=()) -> None:
        from .. import _placement

        job = self.job
        sibs = _placement.peers(job.actors, st, job.runs)
        self._result([job.actors[(st.id, i)].set_siblings(sibs)
                      for i in range(st.parallelism) if i not in exclude])

    def _on_downstream(self, st: Stage, method: str, index: int, *args) -> None:
        """``method(sender id, *args)`` on every instance of the stages ``st`` sends to,
        for its instance ``index`` (its sender id differs per input slot there)."""
        job = self.job
        self._result([getattr(job.actors[(d.id, j)], method)(d.sender(st.id, index), *args)
                      for d in self._downstream(st) for j in range(d.parallelism)])

    def _on_upstream(self, st: Stage, method: str, *args) -> list:
        job = self.job
        return self._result([getattr(job.actors[(up.id, j)], method)(st.id, *args)
                             for up in self._upstreams(st) for j in range(up.parallelism)])

    # -- rescale ----------------------------------------------------------------------------------
    def check_rescale(self, operator: str, parallelism) -> Stage:
        st = self.stage(operator)
        if st.is_source:
            raise ReconfigurationError(f"operator {operator!r} is a source; its parallelism is fixed by its "
                                       "files (rescale aggregate, stateful_map or a stage behind rebalance)")
        G = self.job.key_groups
        if isinstance(parallelism, bool) or not isinstance(parallelism, (int, np.integer)) \
                or not 1 <= parallelism <= G:
            raise ReconfigurationError(f"operator {operator!r}: parallelism must be an integer in 1..{G} "
                                       f"(the key groups), got {parallelism!r}")
        return st

    def rescale(self, operator: str, parallelism: int, strategy: str | None = None,
                workers: list[str] | None = None) -> dict:
        """See :meth:`streamlb.Job.rescale`; returns what was done."""
        from .._migration._epochs import check_strategy

        st = self.check_rescale(operator, parallelism)
        parallelism = int(parallelism)
        strategy = check_strategy(strategy or config.get("reconfiguration.strategy"))
        n = st.parallelism
        if workers is not None:
            workers = [self._check_worker(w, operator) for w in workers]
            if not workers:
                raise ReconfigurationError(f"operator {operator!r}: workers=[] leaves nowhere to place instances")
        t0 = time.time()
        self._check_running(st, "rescaled")
        with self._reserved(st, f"rescaling {operator!r}"):
            if st.id in self.job.tables:
                self._check_splits(st, range(parallelism, n))
            if parallelism > n:
                self._scale_out(st, parallelism, strategy, workers)
            elif parallelism < n:
                self._scale_in(st, parallelism, strategy)
        return {"operator": operator, "kind": "rescale", "from": n, "to": parallelism, "strategy": strategy,
                "started": t0, "completed": time.time()}

    def _check_running(self, st: Stage, what: str) -> None:
        """Refuse to reconfigure an operator whose input already ended."""
        job = self.job
        status = self._result([job.actors[(st.id, i)].command(Epochs()) for i in range(st.parallelism)])
        ended = [i for i, s in enumerate(status) if s["status"] != "running" or s["finishing"]]
        if ended:
            s = status[ended[0]]
            raise ReconfigurationError(f"operator {st.name!r} of job {job.id}: instance {ended[0]} is "
                                       f"{'finishing' if s['status'] == 'running' else s['status']} (its input "
                                       f"ended); it cannot be {what}")

    def _check_splits(self, st: Stage, leaving) -> None:
        table = self.job._migrations.routing(st.name)
        leaving = set(leaving)
        for key, helpers in table.splits:
            from ..keygroups import key_group_of

            home = int(table.owners[key_group_of(key, table.key_groups)])
            if leaving & {home, *helpers}:
                raise ReconfigurationError(
                    f"operator {st.name!r}: key {key!r} is split over instances {[home, *helpers]}; merge it back "
                    "(Job.split(..., helpers=[])) before retiring or moving any of them")

    def _scale_out(self, st: Stage, m: int, strategy: str, workers) -> None:
        job = self.job
        n = st.parallelism
        new = list(range(n, m))
        chosen = ([workers[k % len(workers)] for k in range(len(new))] if workers
                  else self.least_loaded(len(new)))
        keys = [(st.id, i) for i in new]
        run = job._release.next_run(keys)
        actors = self._create(st, dict(zip(new, chosen)), run=run)
        job.actors.update(actors)
        if run:
            job.runs.update(dict.fromkeys(keys, run))
        st.parallelism = m
        self._wire(keys)
        self._siblings(st, exclude=new)
        for i in new:
            self._on_downstream(st, "add_sender", i, run)
        for i in new:
            a = job.actors[(st.id, i)]
            self._on_upstream(st, "add_peer", i, a._address, a.key)
        for k in keys:      # an index rescaled away before, whose outputs wait: written here first
            self._result([job.actors[k].adopt_outputs(job._release.hand_off(k))])
        self._result([job.actors[k].start() for k in keys])
        job._migrations.update_topology(job.topology())
        if st.id in job.tables:
            self._spread(st, m, strategy, f"the {m - n} new instances run and hold the key groups moved so far")

    def _spread(self, st: Stage, m: int, strategy: str, after: str) -> None:
        """Move key groups so that instances ``0..m-1`` hold them evenly; if the stream
        ends meanwhile, say how far it got (``after``: what that leaves)."""
        job = self.job
        moves = spread(job._migrations.routing(st.name).owners, m)
        if not moves:
            return
        try:
            job._migrations.reassign(st.name, moves, strategy, reconfig=True)
        except MigrationError as exc:
            owners = job._migrations.routing(st.name).owners
            done = sum(int(owners[g]) == to for g, to in moves.items())
            raise ReconfigurationError(
                f"rescale of {st.name!r} to {m} stopped after {done} of {len(moves)} key group moves: {exc}; "
                f"{after}, and the job runs on exact") from exc

    def _scale_in(self, st: Stage, m: int, strategy: str) -> None:
        job = self.job
        n = st.parallelism
        gone = list(range(m, n))
        if st.id in job.tables:
            self._spread(st, m, strategy, f"instances {m}..{n - 1} stay, with the key groups not yet moved off")
        for i in gone:
            self._on_upstream(st, "remove_peer", i)
        lingering = self._retire([(st.id, i) for i in gone])
        for i in gone:
            self._on_downstream(st, "remove_sender", i)
        st.parallelism = m
        self._siblings(st)
        for i in gone:
            if (st.id, i) in lingering:
                job._release.linger((st.id, i))
            else:
                job._release.retired((st.id, i))
                self._forget((st.id, i))
        job._migrations.update_topology(job.topology())

    def _retire(self, keys) -> set:
        """Retire the instances ``keys``; those whose outputs (Kafka transactions) wait for
        the next checkpoint are returned."""
        job = self.job
        timeout = config.seconds("migration.timeout")
        waiting = set()
        for k, last in zip(keys, self._result([job.actors[k].retire(timeout) for k in keys])):
            if last.pop("outputs", None):
                waiting.add(k)
            job._absorb_retired(k, last)
        return waiting

    def _forget(self, key) -> None:
        job = self.job
        self._release(job.actors.pop(key), job._futures.pop(key, None))
        job.workers_of.pop(key, None)
        job.runs.pop(key, None)

    @staticmethod
    def _release(actor, future) -> None:
        """Stop a retired actor and drop every reference to it: the worker frees it (and
        Dask no longer counts it when retiring the worker)."""
        try:
            actor.stop().result(timeout=10)
        except Exception:
            pass
        if future is not None:
            future.release()
        if hasattr(actor, "_future"):
            actor._future = None

    # -- move an instance -------------------------------------------------------------------------
    def move_instance(self, operator: str, instance, worker: str) -> dict:
        """See :meth:`streamlb.Job.move_instance`."""
        st = self.stage(operator)
        if isinstance(instance, bool) or not isinstance(instance, (int, np.integer)) \
                or not 0 <= instance < st.parallelism:
            raise ReconfigurationError(f"operator {operator!r} has instances 0..{st.parallelism - 1}; "
                                       f"cannot move instance {instance!r}")
        self._check_worker(worker, operator)
        i = int(instance)
        t0 = time.time()
        frm = self.job.workers_of.get((st.id, i))
        if frm == worker:
            return {"operator": operator, "kind": "move", "instance": i, "from": frm, "to": worker,
                    "keys": 0, "started": t0, "completed": t0}
        if not st.is_source:            # a source that ended still moves (its figures do)
            self._check_running(st, "moved")
        if st.id in self.job.tables:    # partial aggregates in flight would miss the new actor
            self._check_splits(st, [i])
        with self._reserved(st, f"moving instance {i} of {operator!r}"):
            keys = self._replace(st, i, worker)
        return {"operator": operator, "kind": "move", "instance": i, "from": frm, "to": worker, "keys": keys,
                "started": t0, "completed": time.time()}

    def _replace(self, st: Stage, i: int, worker: str) -> int:
        job = self.job
        key = (st.id, i)
        old, old_future = job.actors[key], job._futures.get(key)
        run = job.runs.get(key, 0) + 1
        (new,) = self._create(st, {i: worker}, run=run).values()
        job.actors[key] = new
        job.runs[key] = run
        self._wire([key])
        timeout = config.seconds("migration.timeout")
        resume = None
        if st.is_source:
            # the source stops between two batches; the new one goes on from there
            resume = old.hand_over_source(timeout).result()
            moved = 0
        else:
            # every router sends to the new actor once what it sent to the old one was applied
            self._on_upstream(st, "replace_peer", i, new._address, new.key)
            self._siblings(st, exclude=[i])
            moved = old.hand_over(new._address, new.key, timeout).result()
        last = old.retire(timeout, "hand_off").result()
        new.adopt_outputs(last.pop("outputs", None) or {}).result()     # its outputs not yet committed
        job._absorb_retired(key, last)
        if not (resume and resume.get("ended")):    # an ended source's end was counted already
            self._on_downstream(st, "add_sender", i, run)
        new.start(resume.get("epoch0") if resume else None, resume).result()
        job.workers_of[key] = worker
        self._release(old, old_future)
        job._migrations.update_topology(job.topology())
        return moved

    def drain_worker(self, worker: str, exclude=()) -> list[dict]:
        """Move every instance on ``worker`` to the least-loaded other workers (not those in
        ``exclude``, retiring too). Refused, naming the job and the operators, if no
        worker would be left."""
        job = self.job
        here = sorted(k for k, w in job.workers_of.items() if w == worker)
        if not here or job.status != "running":
            return []                   # nothing of a running job lives there
        names = sorted({job.plan.stages[s].name for s, _ in here})
        left = [w for w in self._known_workers() if w != worker and w not in exclude]
        if not left:
            raise ReconfigurationError(
                f"worker {worker} holds instances of job {job.id} (operators {', '.join(names)}) and no worker "
                "would be left to move them to")
        done = []
        for sid, i in here:
            (to,) = self.least_loaded(1, exclude={worker, *exclude})
            done.append(self.move_instance(job.plan.stages[sid].name, i, to))
        return done

    # -- update a function ------------------------------------------------------------------------
    def update(self, operator: str, func) -> dict:
        """See :meth:`streamlb.Job.update`."""
        from .._plan._step import _ship
        from .._plan._update import check_function, find_function, set_function, step_at

        job = self.job
        st, path, old = find_function(job.plan, operator)
        kind = "stateful_map" if path == ("stage",) else step_at(st, path).kind
        check_function(operator, kind, func, old)
        _pickles(func, operator)
        shipped = _ship(func, st.name)
        t0 = time.time()
        with self._reserved(st, f"updating {operator!r}"):
            actors = [job.actors[(st.id, i)] for i in range(st.parallelism)]
            if st.is_source:        # the origin of the stream: between two batches
                self._result([a.set_function(path, shipped) for a in actors])
                epoch = None
            else:
                epoch = self._update_epoch(st)
                self._result([a.prepare_update(epoch, path, shipped) for a in actors])
                self._on_upstream(st, "mark", epoch)
                timeout = config.seconds("migration.timeout")
                deadline = time.time() + timeout
                while not all(self._result([a.update_done(epoch, 0.5) for a in actors])):
                    if time.time() > deadline:
                        raise ReconfigurationError(f"update of {operator!r}: epoch {epoch} not aligned "
                                                   f"after {timeout:g}s")
        set_function(st, path, shipped)     # the planner's copy: instances created later run it
        return {"operator": operator, "kind": "update", "epoch": epoch, "started": t0, "completed": time.time()}

    def _update_epoch(self, st: Stage) -> int:
        """The epoch of an update of ``st``: a keyed stage's next table epoch (routers and
        owners number every epoch of the exchange alike), else a counter of the stage."""
        job = self.job
        if st.id in job.tables:
            t = job._migrations.routing(st.name)
            nxt = RoutingTable(t.owners, t.parallelism, t.epoch + 1, splits=t.splits)
            job._migrations.set_table(st.name, nxt)
            return nxt.epoch
        e = self._update_epochs.get(st.id, 1 << 30) + 1
        self._update_epochs[st.id] = e
        return e
