"""Split epochs: spread hot keys of an aggregate over helper instances, or merge them back."""
from __future__ import annotations

import asyncio
import logging
import time

from ..exceptions import MigrationError
from ..keygroups import key_group_of
from ..routing import RoutingTable
from .._worker._commands import Prepare, SetTable
from ._control import Call, JobControl, OperatorControl
from ._protocol import abort, check_settled, forget, gather, wait_done

logger = logging.getLogger("streamlb.migration")


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
    if not op.splittable:
        raise MigrationError(
            f"operator {operator!r} is a {op.kind}: its state is not combinable, so its keys cannot be split; "
            "only the keys of an aggregate (count, sum, min, max, mean) and of a tumbling or hopping window "
            "aggregate can"
        )
    async with op.running():
        return await _split_epoch(ctl, call, op, changes, timeout)


def _new_splits(op: OperatorControl, changes: dict, groups: dict) -> tuple[dict, dict[int, set[int]]]:
    """The split keys once ``changes`` apply, and the helpers that stop helping with a key
    (they flush what they hold of it to its home) with those homes."""
    old = op.table
    n = old.parallelism
    splits = dict(old.splits)
    flush: dict[int, set[int]] = {}           # helper leaving keys -> their homes
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
    return splits, flush


async def _split_epoch(ctl: JobControl, call: Call, op: OperatorControl, changes: dict,
                       timeout: float) -> RoutingTable:
    old = op.table
    groups = {key: key_group_of(key, old.key_groups, op.name) for key in changes}
    await check_settled(op, call, groups.values())
    splits, flush = _new_splits(op, changes, groups)
    if splits == dict(old.splits):
        return old                             # nothing changes: no epoch
    new = RoutingTable(old.owners, old.parallelism, old.epoch + 1, splits=tuple(splits.items()))
    epoch = new.epoch
    t0 = time.time()
    results = await asyncio.gather(*[call(*op.owners[h], Prepare(epoch, "split", {}, {}, sorted(homes)))
                                     for h, homes in flush.items()], return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await abort(call, op, flush, epoch)
        raise MigrationError(f"prepare split epoch {epoch} of {op.name}: {type(failed[0]).__name__}: {failed[0]}")
    await gather(f"switching the routers of {op.name} to epoch {epoch}",
                 [call(*r, SetTable(ctl.target(op), new)) for r in op.routers])
    op.table = new
    # partials may still be on their way to the homes: on a timeout the keys' groups stay put
    await wait_done(call, op, sorted(flush), epoch, timeout, f"split epoch {epoch} of {op.name}",
                    sorted(set(groups.values())))
    logger.info("job %s: split epoch %d of %r: %s", ctl.job, epoch, op.name,
                {repr(k): list(h) for k, h in changes.items()})
    ctl.history.append({
        "operator": op.name, "epoch": epoch, "strategy": "split", "key_groups": [],
        "splits": [[k, list(h)] for k, h in changes.items()], "from": sorted(flush), "to": [],
        "started": t0, "completed": time.time(), "applied_while_waiting": 0, "routers_switched": t0,
        "aligned": None, "installed": None, "first_moved_record_applied": None,
    })
    await forget(ctl, call, op, epoch)
    return new
