"""Steps of the epoch protocol that moves and splits share: asking many instances at once,
waiting for an epoch to complete, settling epochs that timed out, forgetting recorded ones."""
from __future__ import annotations

import asyncio
import time

from ..exceptions import MigrationError
from .._worker._commands import Abort, Epochs, Forget, Idle, WaitEpoch
from ._control import Call, JobControl, OperatorControl


async def gather(what: str, coros) -> list:
    """Every answer, or a MigrationError naming ``what`` failed."""
    try:
        return await asyncio.gather(*coros)
    except Exception as exc:
        raise MigrationError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


async def until(cond, timeout: float, what: str) -> None:
    """Return once ``await cond()`` is true; a MigrationError after ``timeout`` seconds."""
    deadline = time.time() + timeout
    delay = 0.002
    while not await cond():
        if time.time() > deadline:
            raise MigrationError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


async def epoch_status(call: Call, owners: list, epoch: int, deadline: float) -> list[dict]:
    """The owners' epoch status; each answers as soon as ``epoch`` is through there, or
    after at most 0.5 s (and never past ``deadline``), so completion needs no polling."""
    wait = max(0.0, min(0.5, deadline - time.time()))
    return await gather("epoch status", [call(*p, WaitEpoch(epoch, wait)) for p in owners])


async def wait_done(call: Call, op: OperatorControl, instances: list[int], epoch: int, timeout: float,
                    what: str, groups: list[int]) -> list[dict]:
    """Wait until each of ``instances`` (owners of ``op``) has ``epoch`` done; their status.

    Past ``timeout`` the routers have switched but state may still be travelling: the
    epoch's ``groups`` stay unsettled (no move may take them) until the instances report it
    done, and a MigrationError says what timed out.
    """
    peers = [op.owners[i] for i in instances]
    deadline = time.time() + timeout
    status: list[dict] = []

    async def done() -> bool:
        status[:] = await epoch_status(call, peers, epoch, deadline)
        gone = [i for i, s in zip(instances, status) if s["status"] in ("stopped", "failed")]
        if gone and not all(epoch in s["done"] for s in status):
            state = status[instances.index(gone[0])]["status"]
            raise MigrationError(f"{what}: instance {gone[0]} of {op.name} is {state}")
        return all(epoch in s["done"] for s in status)

    try:
        await until(done, timeout, f"{what} to complete")
    except MigrationError:
        op.unsettled[epoch] = (groups, instances)
        raise
    return status


async def check_settled(op: OperatorControl, call: Call, groups) -> None:
    """Refuse to move key groups whose state is still on its way from an epoch that timed
    out (routers switched, state not yet installed): cutting them now could leave state
    behind. Epochs the instances report done since are settled."""
    for epoch, (unsettled, involved) in list(op.unsettled.items()):
        status = await gather("epoch status", [call(*op.owners[i], Epochs()) for i in involved])
        if all(epoch in s["done"] for s in status):
            del op.unsettled[epoch]
            await asyncio.gather(*[call(*p, Forget(epoch)) for p in op.owners], return_exceptions=True)
            continue
        busy = sorted(set(unsettled) & set(groups))
        if busy:
            raise MigrationError(
                f"operator {op.name!r}: key group {busy[0]} is still moving (epoch {epoch} timed out before "
                "its state was installed); move it again once that epoch completes"
            )


async def abort(call: Call, op: OperatorControl, instances, epoch: int) -> None:
    """No router has switched: ``instances`` forget ``epoch`` and the routing stays."""
    await asyncio.gather(*[call(*op.owners[i], Abort(epoch)) for i in instances], return_exceptions=True)


async def forget(ctl: JobControl, call: Call, op: OperatorControl, epoch: int) -> None:
    """``epoch`` is recorded: the owners and routers of ``op`` may drop what they kept for it."""
    await asyncio.gather(*[call(*p, Forget(epoch)) for p in op.owners],
                         *[call(*r, Forget(epoch, ctl.target(op))) for r in op.routers],
                         return_exceptions=True)


async def all_idle(ctl: JobControl, call: Call) -> bool:
    """Whether every instance of the job has nothing queued or in flight."""
    return all(await gather("drain check", [call(*p, Idle()) for p in ctl.instances]))
