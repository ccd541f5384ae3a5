"""Carry out moves of key groups with the epoch protocol.

For one keyed exchange with routers U (the upstream instances) and owners D:

1. the owners that give or take key groups are told ahead (``prepare``), all at once;
2. every router switches to the new table at a batch boundary and puts marker(e+1) on every
   channel after its last epoch-e batch (``set_table``);
3. an owner giving groups away keeps processing; once it holds marker(e+1) (or end of stream)
   from every router it cuts their state out and sends it to the new owner;
4. the new owner processes every other group at once and holds back rows of incoming groups
   until their state is installed, then applies them in arrival order;
5. the epoch is complete when every involved owner says so.

Only one migration runs per keyed exchange at a time.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from .. import config
from ..exceptions import MigrationError
from ..routing import RoutingTable
from ._control import Call, JobControl, OperatorControl
from ._protocol import abort, all_idle, check_settled, forget, gather, until, wait_done
from .._worker._commands import Arm, GroupKeys, Pause, Prepare, Resume, SetTable
from .._worker._moves import budget_chunks
from ..keygroups import key_group_of

logger = logging.getLogger("streamlb.migration")

STRATEGIES = ("all-at-once", "fluid", "lazy", "pause", "batched")


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown migration strategy {strategy!r}; valid strategies are {', '.join(STRATEGIES)}")
    return strategy


async def migrate(ctl: JobControl, call: Call, operator: str, assignment: dict[int, int], strategy: str,
                  *, fluid_step: int, timeout: float, reconfig: bool = False) -> RoutingTable:
    """Move each key group of ``assignment`` to its new owner, one epoch per step.
    ``reconfig``: the move of a reconfiguration that holds the operator."""
    check_strategy(strategy)
    op = ctl.operator(operator)
    if op.reconfiguring and not reconfig:
        raise MigrationError(f"operator {operator!r} of job {ctl.job} is being reconfigured (rescale, move or "
                             "update); move key groups once that finished")
    async with op.running():
        await check_settled(op, call, assignment)
        moving = [(g, to) for g, to in sorted(assignment.items()) if op.table.owners[g] != to]
        _check_unsplit(op, moving)
        for part in await _steps(op, call, moving, strategy, fluid_step):
            await _epoch(ctl, call, op, dict(part), strategy, timeout)
    return op.table


def _check_unsplit(op: OperatorControl, moving: list[tuple[int, int]]) -> None:
    """A group holding a split key stays where it is until the key is merged back."""
    for key, helpers in op.table.splits:
        g = key_group_of(key, op.table.key_groups)
        if g in dict(moving):
            raise MigrationError(
                f"operator {op.name!r}: key group {g} holds key {key!r}, split over instances "
                f"{[int(op.table.owners[g]), *helpers]}; merge it back (Job.split(..., helpers=[])) "
                "before moving its group"
            )


async def _steps(op: OperatorControl, call: Call, moving: list[tuple[int, int]], strategy: str,
                 fluid_step: int) -> list[list[tuple[int, int]]]:
    """The moves of each epoch: all in one, fluid steps, or Megaphone's matching rounds."""
    if strategy == "batched":
        return matching_rounds(moving, op.table.owners)
    if strategy != "fluid":
        return [moving] if moving else []
    moving = _interleave(moving, op.table.owners)
    budget = int(config.get("migration.fluid-keys"))
    keys = await _keys_held(op, call, moving) if budget > 0 else {}   # no budget: no count
    return _fluid_epochs(moving, fluid_step, keys, budget)


def matching_rounds(moving: list[tuple[int, int]], owners) -> list[list[tuple[int, int]]]:
    """Megaphone's ``batched`` migration: rounds (one epoch each) in which every instance
    gives at most one key group and takes at most one, so no instance serialises, ships or
    installs more than one group's state at a time; greedily, in order.

    >>> matching_rounds([(0, 1), (1, 1), (2, 0), (3, 2)], [0, 0, 1, 1])
    [[(0, 1), (2, 0)], [(1, 1), (3, 2)]]
    """
    rounds: list[list[tuple[int, int]]] = []
    left = list(moving)
    while left:
        gives, takes, now, later = set(), set(), [], []
        for g, to in left:
            src = int(owners[g])
            if src in gives or to in takes:
                later.append((g, to))
            else:
                gives.add(src)
                takes.add(to)
                now.append((g, to))
        rounds.append(now)
        left = later
    return rounds


def _interleave(moving: list[tuple[int, int]], owners) -> list[tuple[int, int]]:
    """The moves in turn by (from, to) pair, so every fluid step gives and takes on each
    instance alike: an instance frees the state it gives while it installs what it takes,
    rather than taking all of one direction first and holding both for a while."""
    pairs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for g, to in moving:
        pairs.setdefault((int(owners[g]), to), []).append((g, to))
    queues = list(pairs.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


async def _keys_held(op: OperatorControl, call: Call, moving: list[tuple[int, int]]) -> dict[int, int]:
    """Keys each moving group holds now, asked of its owner."""
    by_owner: dict[int, list[int]] = {}
    for g, _ in moving:
        by_owner.setdefault(int(op.table.owners[g]), []).append(g)
    counts = await gather("counting the keys of the moving groups",
                          [call(*op.owners[i], GroupKeys(gs)) for i, gs in by_owner.items()])
    return {g: int(c) for gs, cs in zip(by_owner.values(), counts) for g, c in zip(gs, cs)}


def _fluid_epochs(moving: list[tuple[int, int]], step: int, keys: dict[int, int],
                  budget: int) -> list[list[tuple[int, int]]]:
    """Cut the moves into fluid epochs: each takes at least ``step`` key groups, and more
    while the keys it moves stay within ``budget``, so small groups move together rather
    than an epoch (a few round trips) apiece."""
    return budget_chunks(moving, step, lambda move: keys.get(move[0], 0), budget)


@dataclass
class _Epoch:
    """One epoch of a plan: the table it switches to, and who gives and takes which groups."""

    op: OperatorControl
    strategy: str
    assignment: dict[int, int]
    old: RoutingTable
    new: RoutingTable
    outgoing: dict[int, dict[int, list[int]]]       # old owner -> new owner -> groups
    incoming: dict[int, dict[int, int]]             # new owner -> group -> old owner
    started: float
    switch_asked: float = 0.0
    switched: list = field(default_factory=list)    # when each router switched, if it knows

    @property
    def epoch(self) -> int:
        return self.new.epoch

    @property
    def involved(self) -> list[int]:
        return sorted({*self.incoming, *self.outgoing})


def _plan_epoch(op: OperatorControl, assignment: dict[int, int], strategy: str) -> _Epoch:
    old = op.table
    owners = old.owners.copy()
    for g, to in assignment.items():
        owners[g] = to
    new = RoutingTable(owners, old.parallelism, old.epoch + 1, splits=old.splits)
    outgoing: dict[int, dict[int, list[int]]] = {}
    incoming: dict[int, dict[int, int]] = {}
    for g, to in assignment.items():
        frm = int(old.owners[g])
        outgoing.setdefault(frm, {}).setdefault(to, []).append(g)
        incoming.setdefault(to, {})[g] = frm
    return _Epoch(op, strategy, assignment, old, new, outgoing, incoming, time.time())


async def _epoch(ctl: JobControl, call: Call, op: OperatorControl, assignment: dict[int, int],
                 strategy: str, timeout: float) -> None:
    e = _plan_epoch(op, assignment, strategy)
    await _prepare(call, e)
    paused = strategy == "pause"
    switching = False
    try:
        if paused:
            await gather("pausing the sources", [call(*s, Pause()) for s in ctl.sources])
            await until(lambda: all_idle(ctl, call), timeout, f"job {ctl.job} to drain before epoch {e.epoch}")
        switching = True
        await _switch(ctl, call, e)
        status = await wait_done(call, op, e.involved, e.epoch, timeout, f"epoch {e.epoch} of {op.name}",
                                 sorted(assignment))
    except BaseException:
        if not switching:
            await abort(call, op, e.involved, e.epoch)
        raise
    finally:
        if paused:
            await gather("resuming the sources", [call(*s, Resume()) for s in ctl.sources])
    _record(ctl, e, status)
    await forget(ctl, call, op, e.epoch)


async def _prepare(call: Call, e: _Epoch) -> None:
    """Tell the new and old owners at once: nothing moves before a router switches, and an
    owner whose routers have all ended refuses to prepare. The old owners are prepared
    unarmed: one whose routers have all ended is aligned at once, and must not give its
    groups before every new owner accepted (:func:`_switch` arms them). On any refusal the
    epoch is forgotten everywhere and the routing stays."""
    peer = e.op.owners
    told = [*e.incoming, *e.outgoing]
    results = await asyncio.gather(
        *[call(*peer[i], Prepare(e.epoch, e.strategy, {}, inc)) for i, inc in e.incoming.items()],
        *[call(*peer[i], Prepare(e.epoch, e.strategy, out, {}, armed=False)) for i, out in e.outgoing.items()],
        return_exceptions=True)      # every prepare, failed or not, so none lands after the abort
    failed = [(i, r) for i, r in zip(told, results) if isinstance(r, BaseException)]
    if failed:
        await abort(call, e.op, e.involved, e.epoch)
        i, exc = failed[0]
        what = "new" if i in e.incoming else "old"
        raise MigrationError(f"prepare epoch {e.epoch} of {e.op.name} on the {what} owners failed: "
                             f"{type(exc).__name__}: {exc}") from exc


async def _switch(ctl: JobControl, call: Call, e: _Epoch) -> None:
    """Switch every router to the new table; from then on it is the operator's table,
    whatever happens next."""
    op = e.op
    # lazy: routers ask the old owners for moving keys as they route their rows
    prefetch = ({g: int(e.old.owners[g]) for g in e.assignment}
                if e.strategy == "lazy" and not op.merges_lazily else None)
    # lazy by merging: the moved rows are applied as they come, so sources send what is due
    flush = e.strategy == "lazy" and op.merges_lazily
    e.switch_asked = time.time()
    answers = await gather(f"switching the routers of {op.name} to epoch {e.epoch}",
                           [*[call(*r, SetTable(ctl.target(op), e.new, prefetch, flush)) for r in op.routers],
                            *[call(*op.owners[i], Arm(e.epoch)) for i in e.outgoing]])
    e.switched = answers[:len(op.routers)]
    op.table = e.new


def _record(ctl: JobControl, e: _Epoch, status: list[dict]) -> None:
    """Add the completed epoch to the job's history, with when each phase ended."""
    logger.info("job %s: epoch %d of %r (%s) moved %d key groups from %s to %s in %.3f s", ctl.job, e.epoch,
                e.op.name, e.strategy, len(e.assignment), sorted(e.outgoing), sorted(e.incoming),
                time.time() - e.started)
    for g in e.assignment:
        e.op.moved_at[g] = e.epoch
    by_instance = dict(zip(e.involved, status))

    def times(instances, name: str) -> list[float]:
        return [t for i in instances if (t := by_instance[i][name].get(e.epoch)) is not None]

    ctl.history.append({
        "operator": e.op.name, "epoch": e.epoch, "strategy": e.strategy,
        "key_groups": sorted(e.assignment), "from": sorted(e.outgoing), "to": sorted(e.incoming),
        "started": e.started, "completed": time.time(),
        "applied_while_waiting": int(sum(by_instance[i]["applied_while_waiting"].get(e.epoch, 0)
                                         for i in e.incoming)),
        "switch_asked": e.switch_asked,
        "routers_switched": max((t for t in e.switched if t is not None), default=e.switch_asked),
        "aligned": max(times(e.outgoing, "aligned_at"), default=None),
        "installed": max(times(e.incoming, "installed_at"), default=None),
        "first_moved_record_applied": min(times(e.incoming, "first_applied"), default=None),
    })
