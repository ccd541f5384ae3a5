"""Carry out moves of key groups with the epoch protocol (driver side).

For one keyed exchange with routers U (the upstream instances) and owners D:

1. the owners that give or take key groups are told ahead (``prepare``);
2. every router switches to the new table at a batch boundary and puts marker(e+1) on every
   channel after its last epoch-e batch (``set_table``);
3. an owner giving groups away keeps processing; once it holds marker(e+1) (or end of stream)
   from every router it cuts their state out and sends it to the new owner;
4. the new owner processes every other group at once and holds back rows of incoming groups
   until their state is installed, then applies them in arrival order;
5. the epoch is complete when the new owner has installed every incoming group.

Only one migration runs per exchange at a time.
"""
from __future__ import annotations

import time

import numpy as np

from . import config
from .exceptions import MigrationError, PipelineError
from .routing import RoutingTable

STRATEGIES = ("all-at-once", "fluid", "lazy", "pause")


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown migration strategy {strategy!r}; valid strategies are {', '.join(STRATEGIES)}")
    return strategy


def _results(futures, timeout: float, what: str):
    out = []
    for f in futures:
        try:
            out.append(f.result(timeout=timeout))
        except Exception as exc:
            raise MigrationError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
    return out


def migrate(job, operator: str, key_groups, to_instance: int, strategy: str | None) -> RoutingTable:
    st = job.plan.stage(operator)
    if st.id not in job.tables:
        raise PipelineError(f"operator {operator!r} is not keyed; only keyed operators can migrate state")
    strategy = check_strategy(config.get("migration.strategy", strategy))
    table: RoutingTable = job.tables[st.id]
    G, n = table.key_groups, table.parallelism
    if not isinstance(to_instance, (int, np.integer)) or not 0 <= to_instance < n:
        raise MigrationError(
            f"operator {operator!r} has instances 0..{n - 1}; cannot move key groups to instance {to_instance!r}"
        )
    groups = sorted({int(g) for g in key_groups})
    bad = [g for g in groups if not 0 <= g < G]
    if bad:
        raise MigrationError(f"operator {operator!r}: key group {bad[0]} is outside 0..{G - 1}")
    if job.status != "running":
        raise MigrationError(f"job {job.id} is {job.status}; migrations need a running job")
    moving = [g for g in groups if table.owners[g] != to_instance]
    if not moving:
        return table
    step = config.get("migration.fluid-step") if strategy == "fluid" else len(moving)
    for i in range(0, len(moving), step):
        _epoch(job, st, moving[i:i + step], int(to_instance), strategy)
    return job.tables[st.id]


def _epoch(job, st, groups: list[int], to: int, strategy: str) -> None:
    timeout = config.seconds("migration.timeout")
    old: RoutingTable = job.tables[st.id]
    owners = old.owners.copy()
    owners[groups] = to
    new = RoutingTable(owners, old.parallelism, old.epoch + 1)
    epoch = new.epoch
    outgoing: dict[int, dict[int, list[int]]] = {}
    for g in groups:
        outgoing.setdefault(int(old.owners[g]), {}).setdefault(to, []).append(g)
    incoming = {g: int(old.owners[g]) for g in groups}
    actor = lambda i: job.actors[(st.id, i)]  # noqa: E731
    t0 = time.time()
    # the new owner first, so it holds back incoming groups before any router switches
    _results([actor(to).prepare(epoch, strategy, {}, incoming)], timeout, f"prepare epoch {epoch} on {st.name}[{to}]")
    _results([actor(i).prepare(epoch, strategy, out, {}) for i, out in outgoing.items()], timeout,
             f"prepare epoch {epoch} on the old owners of {st.name}")
    sources = [a for (sid, _), a in job.actors.items() if job.plan.stages[sid].is_source]
    paused = strategy == "pause"
    try:
        if paused:
            _results([a.pause() for a in sources], timeout, "pause the sources")
            _wait(lambda: all(_results([a.idle() for a in job.actors.values()], timeout, "drain")), timeout,
                  f"job {job.id} to drain before epoch {epoch}")
        routers = [job.actors[(st.upstream, i)] for i in range(job.plan.stages[st.upstream].parallelism)]
        _results([r.set_table(st.id, new) for r in routers], timeout, f"switch routers of {st.name} to epoch {epoch}")
        involved = [to, *outgoing]
        status: list[dict] = []

        def complete() -> bool:
            status[:] = _results([actor(i).epochs() for i in involved], timeout, "epoch status")
            return all(epoch in r["done"] for r in status)

        _wait(complete, timeout, f"epoch {epoch} of {st.name} to complete")
    finally:
        if paused:
            _results([a.resume() for a in sources], timeout, "resume the sources")
    job.tables[st.id] = new
    job.history.append({
        "operator": st.name, "epoch": epoch, "strategy": strategy, "key_groups": list(groups),
        "from": sorted(outgoing), "to": to, "started": t0, "completed": time.time(),
        "applied_while_waiting": status[0]["applied_while_waiting"].get(epoch, 0),
    })


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    delay = 0.002
    while not cond():
        if time.time() > deadline:
            raise MigrationError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
