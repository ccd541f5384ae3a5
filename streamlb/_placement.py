"""Place a job's instances on workers as Dask actors, wire them together and start them.

Each function takes the stage or the instances it works on, so that instances can be added
to a running job with the same calls: create them, then wire the new ones.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable

from . import config
from ._plan._model import Stage

Key = tuple[int, int]           # (stage id, instance index)


def cluster_workers(client, timeout: float = 10.0) -> dict[str, dict]:
    """The scheduler's workers now (address -> info), asked of the scheduler itself: the
    client's ``scheduler_info()`` returns a cache that its periodic refresh replaces with
    one holding no workers, so reading it right after a fetch can find none. A scheduler
    that does not answer within ``timeout`` seconds (lost, its client reconnecting):
    :class:`~streamlb.exceptions.SchedulerUnreachableError`."""
    try:
        return client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)["workers"]
    except TimeoutError:
        from .exceptions import SchedulerUnreachableError

        raise SchedulerUnreachableError(f"the scheduler at {client.scheduler.address} did not answer within "
                                        f"{timeout:g} s (client status {client.status!r})") from None


def place(stage: Stage, indices: Iterable[int], workers: list[str]) -> dict[int, str]:
    """Worker of each instance of ``stage``: round robin from the stage's id, so that the
    first instances of consecutive stages land on different workers."""
    return {i: workers[(i + stage.id) % len(workers)] for i in indices}


def bound_actors(futures: dict, client) -> dict:
    """The actors of ``futures`` (``create_instances``' futures), each bound to ``client``.

    A Dask ``Actor`` binds itself to the *current* client where it is unpickled (the one
    of an enclosing ``with Client(...)``, else the newest), which need not be the job's: its
    calls then went through that client's scheduler. Seen: the actors of a job on a TLS
    cluster called through another, plain-TCP cluster's scheduler, which could not reach
    their workers; the call failed outside Dask's retry and waited for ever.
    """
    out = {}
    direct = config.get("direct-calls")
    created(client, futures)
    # one gather for all (each ``result()`` was a round trip of its own, through the scheduler)
    handles = client.gather(list(futures.values()), direct=True if direct else None)
    for (k, f), actor in zip(futures.items(), handles):
        if direct:      # the same handle, its calls sent directly (no second Future made)
            actor.__class__ = direct_actor_class()
        if direct or getattr(actor, "_client", client) is not client:
            actor._client = client
            actor._future = f
        out[k] = actor
    return out


def _task_states(dask_scheduler, keys) -> dict:
    """Run on the scheduler: the state of each task of ``keys`` (None: unknown)."""
    tasks = dask_scheduler.tasks
    return {k: tasks[k].state if k in tasks else None for k in keys}


def created(client, futures: dict, every: float = 0.5) -> None:
    """Wait until the actors of ``futures`` exist. An instance whose worker left before it
    was made waits for that worker for ever (its task is restricted to it: state
    ``no-worker``): raise ``ConnectionError`` naming it instead, a fault the caller (a
    recovery) answers with another attempt."""
    from distributed import wait

    pending = list(futures.values())
    while pending:
        try:
            wait(pending, timeout=every)
        except TimeoutError:
            pass
        pending = [f for f in pending if not f.done()]
        if not pending:
            return
        states = client.run_on_scheduler(_task_states, keys=[f.key for f in pending])
        stuck = sorted(k for k, s in states.items() if s == "no-worker")     # None: not there yet
        if stuck:
            raise ConnectionError(f"instance {stuck[0]} (and {len(stuck) - 1} more) cannot be created: the worker "
                                  f"it was placed on left the cluster (task state {states[stuck[0]]!r})")


@functools.cache
def direct_actor_class() -> type:
    """:class:`DirectActor`, made once (``distributed`` is imported when it is needed)."""
    from distributed.actor import Actor

    class DirectActor(Actor):
        """A Dask actor whose calls from the driver go straight to its worker, through the
        client's connection pool. Dask's own handle sends them through the scheduler
        (``Scheduler.proxy``) unless the client was made with ``direct_to_workers=True``:
        twice the hops for every poll, wiring and start, each relayed by the scheduler's
        event loop. Pickled, it is a plain ``Actor`` again."""

        @property
        def _worker_rpc(self):
            if self._worker is None and self._client is not None:
                return self._client.rpc(self._address)
            return super()._worker_rpc

    return DirectActor


def create_instances(client, job_id: str, stage: Stage, indices: Iterable[int], workers: list[str], *,
                     upstream, key_groups: int, window: float, credits: int,
                     where: dict[int, str] | None = None, run: int = 0) -> dict[Key, object]:
    """Create the actors of instances ``indices`` of ``stage``, each on its worker.

    Parameters
    ----------
    upstream : int or dict
        Instances of the upstream stage (0 for a source): the senders each instance hears;
        or their run ids by index.
    where : dict, optional
        The worker of each instance (default: :func:`place` over ``workers``).
    run : int
        The incarnation of the instances (a replacement has a higher run than its actor).

    Returns
    -------
    dict
        ``(stage id, index) -> future`` of each actor. Keep the futures: an actor referenced
        only by other actors is garbage-collected.
    """
    from ._worker._instance import Instance
    from ._worker._heap import heap_pad

    pad = heap_pad()
    return {
        (stage.id, i): client.submit(
            Instance, stage, i, upstream, job=job_id, key_groups=key_groups,
            window=window, credits=credits, lazy_step=config.get("migration.lazy-step"),
            lazy_delay=config.get("migration.lazy-delay"),
            lazy_pace=config.get("migration.lazy-pace"), lazy_keys=config.get("migration.lazy-keys"),
            lazy_asked=config.get("migration.lazy-asked-keys"), run=run, heap_pad=pad,
            actor=True, workers=[w],
            allow_other_workers=False, pure=False,
            key=f"streamlb-{job_id}-{stage.id}-{i}" + (f"-r{run}" if run else ""),
        )
        for i, w in (where if where is not None else place(stage, indices, workers)).items()
    }


def hot_keys_for(balancer: str | None, options: dict | None) -> int:
    """Counters of the routers' heavy-hitter sketches: kept only for a balancer that splits
    hot keys."""
    from .balancer import get_balancer

    if balancer is not None and getattr(get_balancer(balancer, **(options or {})), "wants_hot_keys", False):
        return int(config.get("balancer.hot-keys"))
    return 0


def combine_for(st: Stage):
    """What the routers into ``st`` sum per key before sending (``ExchangeSpec.combine``),
    unless ``exchange.combine`` is off: for a keyed aggregate without emulated cost, its
    partial tables; for a tumbling or hopping window aggregate without a late stream, a
    :class:`~streamlb._worker._combine.PaneCombine` (per key and pane)."""
    from ._state._window_assigners import assigner_of
    from ._worker._combine import PaneCombine, tables_for

    if st.exchange != "keyed" or st.cost is not None or not config.get("exchange.combine"):
        return None
    if st.kind == "aggregate":
        return tables_for(st.spec)
    if st.kind != "window" or st.join is not None or st.window["mode"] != "aggregate" or st.late:
        return None
    w, assigner = st.window, assigner_of(st.window)
    if assigner.merging:        # a row's session is known only once merged at its owner
        return None
    return PaneCombine(tables_for(st.spec), w["column"], w["unit"], assigner.pane)


def rows_only(exchanges: dict) -> dict:
    """``exchanges`` (:func:`exchange_specs`) with no combining per pane: for routers that
    start after their job's windows have fired (a restored job's, or one added live),
    whose watermark the windows may already be past (see ``Combiner.combine``)."""
    from ._worker._combine import PaneCombine

    return {k: dataclasses.replace(x, combine=None) if isinstance(x.combine, PaneCombine) else x
            for k, x in exchanges.items()}


def exchange_specs(stages: Iterable[Stage], *, balanced: bool, hot_keys: int = 0) -> dict:
    """How records reach each stage that is not a source: stage id -> ``ExchangeSpec``; for
    the right side of a join, ``(stage id, 1)`` -> the spec of its key."""
    from ._worker._messages import ExchangeSpec

    out = {}
    for st in stages:
        if st.is_source:
            continue
        out[st.id] = ExchangeSpec(st.exchange, st.name, st.key, st.key_name, balanced, st.shuffle,
                                  hot_keys if st.splittable else 0, combine_for(st))
        if st.join is not None:
            out[(st.id, 1)] = ExchangeSpec(st.exchange, st.name, st.keys[1], st.join["key_names"][1], balanced)
    return out


def senders(stage: Stage, stages: list[Stage], runs: dict | None = None, *, numbered: bool = False):
    """The senders an instance of ``stage`` hears: 0 for a source; else the count of its one
    input's instances, or (several inputs, or ``numbered``) each sender's run by its id
    (``Stage.sender``), from ``runs`` (``(stage id, index) -> run``)."""
    if not stage.inputs:
        return 0
    by_id = {s.id: s for s in stages}
    if len(stage.inputs) == 1 and not numbered and not runs:
        return by_id[stage.inputs[0]].parallelism
    return {stage.sender(u, j): (runs or {}).get((u, j), 0)
            for u in stage.inputs for j in range(by_id[u].parallelism)}


def outputs_of(stage: Stage, stages: list[Stage]) -> list[Stage]:
    """The stages ``stage`` sends to."""
    return [d for d in stages if stage.id in d.inputs]


def peers(actors: dict, stage: Stage, runs: dict | None = None) -> list[tuple]:
    """``(worker address, actor key)`` of every instance of ``stage``, by index; with
    ``runs`` (``(stage id, index) -> run``), ``(address, key, run)``."""
    out = []
    for i in range(stage.parallelism):
        a = actors[(stage.id, i)]
        out.append((a._address, a.key) if runs is None else (a._address, a.key, runs.get((stage.id, i), 0)))
    return out


def wire(actors: dict, stages: list[Stage], tables: dict, exchanges: dict, *, report: bool,
         keys: Iterable[Key] | None = None, runs: dict | None = None) -> dict[Key, str]:
    """Connect instances ``keys`` (default: every actor) to the instances of their
    downstream stages and to their siblings.

    Parameters
    ----------
    actors : dict
        ``(stage id, index) -> actor`` of the whole job.
    tables : dict
        Routing table of each keyed stage, by stage id.
    exchanges : dict
        From :func:`exchange_specs`.
    report : bool
        Whether the instances send load reports (a balanced job).

    Returns
    -------
    dict
        The worker address of each instance connected.
    """
    by_stage = {st.id: peers(actors, st) for st in stages}
    siblings = {st.id: peers(actors, st, runs or {}) for st in stages}
    by_id = {st.id: st for st in stages}
    downstream = {st.id: [d.id for d in outputs_of(st, stages)] for st in stages}
    keys = list(actors if keys is None else keys)
    calls = []
    for sid, i in keys:
        outs = {d: by_stage[d] for d in downstream[sid]}
        specs = {d: _spec_from(exchanges, by_id[d], sid) for d in outs}
        calls.append(actors[(sid, i)].connect(outs, {d: tables[d] for d in outs if d in tables},
                                              specs, siblings[sid], report,
                                              slots={d: by_id[d].inputs.index(sid) for d in outs},
                                              bases={d: _base(by_id, by_id[d], sid) for d in outs}))
    return dict(zip(keys, [c.result() for c in calls]))


def _base(by_id: dict, target: Stage, upstream: int) -> int:
    """Routers into ``target`` from the inputs before ``upstream``'s (``topology`` order)."""
    return sum(by_id[u].parallelism for u in target.inputs[:target.inputs.index(upstream)])


def _spec_from(exchanges: dict, target: Stage, upstream: int):
    """The exchange spec stage ``upstream``'s routers use into ``target`` (its side's key)."""
    if target.sides and target.sides[target.inputs.index(upstream)] == 1:
        return exchanges[(target.id, 1)]
    return exchanges[target.id]


def start(actors: dict, stages: list[Stage], resume: dict | None = None) -> None:
    """Start the instances, the sources last, with one wall-clock origin; ``resume``: the
    ``(origin, position)`` each source goes on from (a restored job)."""
    by_id = {s.id: s for s in stages}
    order = sorted(actors, key=lambda k: by_id[k[0]].is_source)
    epoch0 = time.time() + 0.05     # replaying sources share this wall-clock origin
    resume = resume or {}
    calls = []
    for k in order:
        origin, position = resume.get(k, (None, None))
        calls.append(actors[k].start(origin or epoch0, position))
    for c in calls:
        c.result()
