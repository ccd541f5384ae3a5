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

The same code runs in the driver (manual moves of a job without a balancer) and in the
scheduler plugin; ``call(address, key, method, *args)`` is how it reaches an actor.
Only one migration runs per keyed exchange at a time.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np

from . import config
from .exceptions import MigrationError
from .keygroups import assign_to_key_group
from .routing import RoutingTable

STRATEGIES = ("all-at-once", "fluid", "lazy", "pause")

Call = Callable[..., Awaitable]


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown migration strategy {strategy!r}; valid strategies are {', '.join(STRATEGIES)}")
    return strategy


async def actor_call(rpc_pool, address: str, key: str, method: str, *args):
    """Call an actor method through a connection pool (a worker's, a client's or the
    scheduler's ``rpc``)."""
    from distributed.protocol import to_serialize

    resp = await rpc_pool(address).actor_execute(
        function=method, actor=key, args=[to_serialize(a) for a in args], kwargs={})
    if resp["status"] != "OK":
        raise _unwrap(resp["exception"])
    return _unwrap(resp["result"])


def _unwrap(x):
    # the scheduler's comms leave payloads serialised; a client's already deserialise them
    from distributed.protocol import Serialized, deserialize

    return deserialize(x.header, x.frames) if isinstance(x, Serialized) else x


class OperatorControl:
    """Routing state of one keyed operator."""

    def __init__(self, name: str, owners: list, routers: list, table: RoutingTable, kind: str = "aggregate",
                 merges_lazily: bool = False) -> None:
        self.name = name
        self.kind = kind
        self.merges_lazily = merges_lazily      # Stage.merges_lazily: lazy moves pull no key
        self.owners = [tuple(p) for p in owners]       # (address, actor key) per instance
        self.routers = [tuple(p) for p in routers]
        self.table = table
        self.in_flight = False
        self.last_completed = 0.0
        self.moved_at: dict[int, int] = {}             # key group -> epoch it last moved in
        self.unsettled: dict[int, tuple[list, list]] = {}   # epoch that timed out -> (groups, instances)
        self._lock: asyncio.Lock | None = None

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


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
                                  op.get("kind", "aggregate"), bool(op.get("merges_lazily", False)))
            for name, op in topology["operators"].items()
        }
        self.stage_ids = {name: int(op["stage"]) for name, op in topology["operators"].items()}
        self.history: list[dict] = []

    def operator(self, name: str) -> OperatorControl:
        if name not in self.operators:
            raise MigrationError(
                f"job {self.job} has no keyed operator {name!r}; keyed operators: {', '.join(self.operators)}"
            )
        return self.operators[name]

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


async def migrate(ctl: JobControl, call: Call, operator: str, assignment: dict[int, int], strategy: str,
                  *, fluid_step: int, timeout: float) -> RoutingTable:
    """Move each key group of ``assignment`` to its new owner, one epoch per step."""
    check_strategy(strategy)
    op = ctl.operator(operator)
    async with op.lock:
        op.in_flight = True
        try:
            await _check_settled(op, call, assignment)
            moving = [(g, to) for g, to in sorted(assignment.items()) if op.table.owners[g] != to]
            for key, helpers in op.table.splits:
                g = key_group_of(key, op.table.key_groups)
                if g in dict(moving):
                    raise MigrationError(
                        f"operator {op.name!r}: key group {g} holds key {key!r}, split over instances "
                        f"{[int(op.table.owners[g]), *helpers]}; merge it back (Job.split(..., helpers=[])) "
                        "before moving its group"
                    )
            if strategy == "fluid":
                moving = _interleave(moving, op.table.owners)
                budget = int(config.get("migration.fluid-keys"))
                keys = await _keys_held(op, call, moving) if budget > 0 else {}   # no budget: no count
                epochs = _fluid_epochs(moving, fluid_step, keys, budget)
            else:
                epochs = [moving] if moving else []
            for part in epochs:
                await _epoch(ctl, call, op, dict(part), strategy, timeout)
        finally:
            op.in_flight = False
            op.last_completed = time.time()
    return op.table


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
    counts = await _gather("counting the keys of the moving groups",
                           [call(*op.owners[i], "group_keys", gs) for i, gs in by_owner.items()])
    return {g: int(c) for gs, cs in zip(by_owner.values(), counts) for g, c in zip(gs, cs)}


def _fluid_epochs(moving: list[tuple[int, int]], step: int, keys: dict[int, int],
                  budget: int) -> list[list[tuple[int, int]]]:
    """Cut the moves into fluid epochs: each takes at least ``step`` key groups, and more
    while the keys it moves stay within ``budget``, so small groups move together rather
    than an epoch (a few round trips) apiece."""
    epochs: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    held = 0
    for g, to in moving:
        if len(cur) >= step and held + keys.get(g, 0) > budget:
            epochs.append(cur)
            cur, held = [], 0
        cur.append((g, to))
        held += keys.get(g, 0)
    return epochs + [cur] if cur else epochs


async def _check_settled(op: OperatorControl, call: Call, assignment: dict[int, int]) -> None:
    """Refuse to move key groups whose state is still on its way from an epoch that timed
    out (routers switched, state not yet installed): cutting them now could leave state
    behind. Epochs the instances report done since are settled."""
    for epoch, (groups, involved) in list(op.unsettled.items()):
        status = await _gather("epoch status", [call(*op.owners[i], "epochs") for i in involved])
        if all(epoch in s["done"] for s in status):
            del op.unsettled[epoch]
            await asyncio.gather(*[call(*p, "forget", epoch) for p in op.owners], return_exceptions=True)
            continue
        busy = sorted(set(groups) & set(assignment))
        if busy:
            raise MigrationError(
                f"operator {op.name!r}: key group {busy[0]} is still moving (epoch {epoch} timed out before "
                "its state was installed); move it again once that epoch completes"
            )


async def _gather(what: str, coros) -> list:
    try:
        return await asyncio.gather(*coros)
    except Exception as exc:
        raise MigrationError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


async def _epoch(ctl: JobControl, call: Call, op: OperatorControl, assignment: dict[int, int],
                 strategy: str, timeout: float) -> None:
    old = op.table
    owners = old.owners.copy()
    for g, to in assignment.items():
        owners[g] = to
    new = RoutingTable(owners, old.parallelism, old.epoch + 1, splits=old.splits)
    epoch = new.epoch
    outgoing: dict[int, dict[int, list[int]]] = {}
    incoming: dict[int, dict[int, int]] = {}
    for g, to in assignment.items():
        frm = int(old.owners[g])
        outgoing.setdefault(frm, {}).setdefault(to, []).append(g)
        incoming.setdefault(to, {})[g] = frm
    peer = op.owners
    t0 = time.time()

    async def abort() -> None:
        # no router has switched: forget the epoch everywhere and keep the current routing
        await asyncio.gather(*[call(*peer[i], "abort", epoch) for i in {*incoming, *outgoing}],
                             return_exceptions=True)

    # new and old owners are told at once: nothing moves before a router switches, and an
    # owner whose routers have all ended refuses to prepare
    owners_told = [i for i in incoming] + [i for i in outgoing]
    results = await asyncio.gather(
        *[call(*peer[i], "prepare", epoch, strategy, {}, inc) for i, inc in incoming.items()],
        *[call(*peer[i], "prepare", epoch, strategy, out, {}) for i, out in outgoing.items()],
        return_exceptions=True)      # every prepare, failed or not, so none lands after the abort
    failed = [(i, r) for i, r in zip(owners_told, results) if isinstance(r, BaseException)]
    if failed:
        await abort()
        i, exc = failed[0]
        what = "new" if i in incoming else "old"
        raise MigrationError(f"prepare epoch {epoch} of {op.name} on the {what} owners failed: "
                             f"{type(exc).__name__}: {exc}") from exc
    paused = strategy == "pause"
    # lazy: routers ask the old owners for moving keys as they route their rows
    prefetch = ({g: int(old.owners[g]) for g in assignment}
                if strategy == "lazy" and not op.merges_lazily else None)
    # lazy by merging: the moved rows are applied as they come, so sources send what is due
    flush = strategy == "lazy" and op.merges_lazily
    switching = False
    try:
        if paused:
            await _gather("pausing the sources", [call(*s, "pause") for s in ctl.sources])
            await _until(lambda: _all_idle(ctl, call), timeout, f"job {ctl.job} to drain before epoch {epoch}")
        switching = True
        t_switch = time.time()
        switched = await _gather(f"switching the routers of {op.name} to epoch {epoch}",
                                 [call(*r, "set_table", _target(ctl, op), new, prefetch, flush)
                                  for r in op.routers])
        op.table = new          # the routers route by it now, whatever happens next
        involved = sorted({*incoming, *outgoing})
        status: list[dict] = []

        deadline = time.time() + timeout

        async def complete() -> bool:
            status[:] = await _epoch_status(call, [peer[i] for i in involved], epoch, deadline)
            return all(epoch in s["done"] for s in status)

        try:
            await _until(complete, timeout, f"epoch {epoch} of {op.name} to complete")
        except MigrationError:
            op.unsettled[epoch] = (sorted(assignment), involved)
            raise
    except BaseException:
        if not switching:
            await abort()
        raise
    finally:
        if paused:
            await _gather("resuming the sources", [call(*s, "resume") for s in ctl.sources])
    for g in assignment:
        op.moved_at[g] = epoch
    by_instance = dict(zip(involved, status))
    ctl.history.append({
        "operator": op.name, "epoch": epoch, "strategy": strategy,
        "key_groups": sorted(assignment), "from": sorted(outgoing), "to": sorted(incoming),
        "started": t0, "completed": time.time(),
        "applied_while_waiting": int(sum(by_instance[i]["applied_while_waiting"].get(epoch, 0) for i in incoming)),
        "switch_asked": t_switch,
        "routers_switched": max((t for t in switched if t is not None), default=t_switch),
        "aligned": max((t for i in outgoing if (t := by_instance[i]["aligned_at"].get(epoch)) is not None),
                       default=None),
        "installed": max((t for i in incoming if (t := by_instance[i]["installed_at"].get(epoch)) is not None),
                         default=None),
        "first_moved_record_applied": min(
            (t for i in incoming if (t := by_instance[i]["first_applied"].get(epoch)) is not None), default=None),
    })
    # recorded: the instances may drop what they kept for this epoch
    await asyncio.gather(*[call(*p, "forget", epoch) for p in op.owners],
                         *[call(*r, "forget", epoch, _target(ctl, op)) for r in op.routers],
                         return_exceptions=True)


def key_group_of(key, key_groups: int, operator: str = "") -> int:
    """Key group of one key; a key the hash cannot take is a MigrationError naming it."""
    try:
        return int(assign_to_key_group(np.asarray([key]), key_groups)[0])
    except Exception as exc:
        raise MigrationError(f"operator {operator!r}: key {key!r} cannot be split: {exc}") from None


async def split(ctl: JobControl, call: Call, operator: str, changes: dict, *, timeout: float) -> RoutingTable:
    """Spread each key of ``changes`` over its home and the helpers given (none: merge the
    key back onto its home), in one epoch.

    Routers switch to the new table at a batch boundary and put the epoch's marker on every
    channel. A helper that stops helping with a key finishes the epoch once it holds the
    marker from every router and every partial it sent the home is merged there; new
    helpers need nothing (they hold no state), so an epoch that only adds helpers switches
    the routers at once, with no marker. A change that changes nothing takes no epoch.
    """
    op = ctl.operator(operator)
    if op.kind != "aggregate":
        raise MigrationError(
            f"operator {operator!r} is a {op.kind}: its state is not combinable, so its keys cannot be split; "
            "only aggregate (count, sum, min, max, mean) keys can"
        )
    async with op.lock:
        op.in_flight = True
        try:
            return await _split_epoch(ctl, call, op, changes, timeout)
        finally:
            op.in_flight = False
            op.last_completed = time.time()


async def _split_epoch(ctl: JobControl, call: Call, op: OperatorControl, changes: dict, timeout: float):
    old = op.table
    n = old.parallelism
    splits = dict(old.splits)
    flush: dict[int, set[int]] = {}           # helper leaving keys -> their homes
    groups = {key: key_group_of(key, old.key_groups, op.name) for key in changes}
    await _check_settled(op, call, dict.fromkeys(groups.values()))
    for key, helpers in changes.items():
        g = groups[key]
        home = int(old.owners[g])
        helpers = tuple(int(h) for h in helpers)
        bad = [h for h in helpers if not 0 <= h < n or h == home]
        if bad or len(set(helpers)) != len(helpers):
            raise MigrationError(
                f"operator {op.name!r}: cannot split key {key!r} over helpers {list(helpers)}; helpers are distinct "
                f"instances in 0..{n - 1} other than the key's home {home} (owner of key group {g})"
            )
        for h in set(splits.get(key, ())) - set(helpers):
            flush.setdefault(h, set()).add(home)
        if helpers:
            splits[key] = helpers
        else:
            splits.pop(key, None)
    if splits == dict(old.splits):
        return old                             # nothing changes: no epoch
    new = RoutingTable(old.owners, n, old.epoch + 1, splits=tuple(splits.items()))
    epoch = new.epoch
    t0 = time.time()
    results = await asyncio.gather(*[call(*op.owners[h], "prepare", epoch, "split", {}, {}, sorted(homes))
                                     for h, homes in flush.items()], return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*[call(*op.owners[h], "abort", epoch) for h in flush], return_exceptions=True)
        raise MigrationError(f"prepare split epoch {epoch} of {op.name}: {type(failed[0]).__name__}: {failed[0]}")
    await _gather(f"switching the routers of {op.name} to epoch {epoch}",
                  [call(*r, "set_table", _target(ctl, op), new, None) for r in op.routers])
    op.table = new

    deadline = time.time() + timeout

    async def flushed() -> bool:
        status = await _epoch_status(call, [op.owners[h] for h in flush], epoch, deadline)
        return all(epoch in s["done"] for s in status)

    try:
        await _until(flushed, timeout, f"split epoch {epoch} of {op.name} to complete")
    except MigrationError:
        # partials may still be on their way to the homes: the keys' groups stay put
        op.unsettled[epoch] = (sorted(set(groups.values())), sorted(flush))
        raise
    ctl.history.append({
        "operator": op.name, "epoch": epoch, "strategy": "split", "key_groups": [],
        "splits": [[k, list(h)] for k, h in changes.items()], "from": sorted(flush), "to": [],
        "started": t0, "completed": time.time(), "applied_while_waiting": 0, "routers_switched": t0,
        "aligned": None, "installed": None, "first_moved_record_applied": None,
    })
    await asyncio.gather(*[call(*p, "forget", epoch) for p in op.owners],
                         *[call(*r, "forget", epoch, _target(ctl, op)) for r in op.routers],
                         return_exceptions=True)
    return new


def _target(ctl: JobControl, op: OperatorControl) -> int:
    return ctl.stage_ids[op.name]


async def _all_idle(ctl: JobControl, call: Call) -> bool:
    return all(await _gather("drain check", [call(*p, "idle") for p in ctl.instances]))


async def _epoch_status(call: Call, owners: list, epoch: int, deadline: float) -> list[dict]:
    """The owners' epoch status; each answers as soon as ``epoch`` is through there, or
    after at most 0.5 s (and never past ``deadline``), so completion needs no polling."""
    wait = max(0.0, min(0.5, deadline - time.time()))
    return await _gather("epoch status", [call(*p, "wait_epoch", epoch, wait) for p in owners])


async def _until(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    delay = 0.002
    while not await cond():
        if time.time() > deadline:
            raise MigrationError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
