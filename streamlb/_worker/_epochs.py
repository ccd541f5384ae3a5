"""An instance's RPCs in the epoch protocol of live migrations (see :mod:`streamlb._migration`).

The coordinator switches routers to a new table (:meth:`EpochParticipant.set_table`), tells
owners ahead what an epoch moves (``prepare``, ``arm``, ``abort``, ``forget``), waits for it
(``wait_epoch``), pauses the sources for the pause-and-resume baseline and checks that
nothing is left in flight (``idle``). Each call is one step of the instance's
:class:`~streamlb._worker._owner.OwnerSide` or of a router.
"""
from __future__ import annotations

from ..exceptions import StreamlbError
from ..routing import RoutingTable

# statuses of an instance that takes part in nothing any more
ENDED = ("done", "failed", "stopped")


class EpochParticipant:
    """Mixed into :class:`~streamlb._worker._instance.Instance`."""

    async def set_table(self, target: int, table: RoutingTable, prefetch: dict | None = None,
                        flush: bool = False) -> float:
        """Router: switch to ``table`` (markers follow); ``flush``: a source sends what is due."""
        switched, marked = await self.exchanges[target].set_table(table, prefetch)
        if flush and marked and self.source is not None:
            self.source.flush_due.set()
        return switched

    async def fetch_keys(self, epoch: int, dest: int, keys, groups, router: int, request: int) -> None:
        await self.owner.fetch_keys(epoch, dest, keys, groups, router, request)

    async def prepare(self, epoch: int, strategy: str, outgoing: dict[int, list[int]],
                      incoming: dict[int, int], flush: list[int] = (), armed: bool = True) -> None:
        """Be told ahead what ``epoch`` moves here (see ``OwnerSide.prepare``)."""
        if self.finishing or self.status in ENDED:
            state = self.status if self.status != "running" else "finishing"
            raise StreamlbError(f"instance {self.label} is {state}; it cannot take part in epoch {epoch}")
        self.owner.prepare(epoch, strategy, outgoing, incoming, flush, armed)
        if outgoing or incoming:
            self.watermarks.freeze(epoch)

    async def arm(self, epoch: int) -> None:
        """Every owner accepted ``epoch``: give its groups once aligned (``OwnerSide.arm``)."""
        self.owner.arm(epoch)
        self._wake.set()

    async def abort(self, epoch: int) -> None:
        """Forget epoch ``epoch`` before any router switched to it (a prepare failed)."""
        self.owner.abort(epoch)
        await self.watermarks.thaw(epoch)
        self._wake.set()        # a finishing owner may have been waiting only for this epoch

    async def forget(self, epoch: int, target: int | None = None) -> None:
        """``epoch`` is recorded: drop it as an owner or, with ``target``, as that stage's router."""
        if target is None:
            self.owner.forget(epoch)
            await self.watermarks.thaw(epoch)
        else:
            self.exchanges[target].forget(epoch)

    async def wait_epoch(self, epoch: int, wait: float) -> dict:
        """:meth:`epochs`, once ``epoch`` is done here or after ``wait`` seconds."""
        await self.owner.wait_done(epoch, wait)
        return await self.epochs()

    async def epochs(self) -> dict:
        return {**self.owner.status(), "status": self.status, "finishing": self.finishing}

    async def pause(self) -> None:      # the pause-and-resume baseline: sources hold back
        self.source.gate.clear()

    async def resume(self) -> None:
        self.source.gate.set()

    async def idle(self) -> bool:
        """Nothing queued, held or in flight from this instance."""
        return not self.inbox and not self.owner.held and not any(x.in_flight() for x in self.exchanges.values())

    def release_deferred(self) -> None:
        """Rows (and sibling messages) that waited for a marker or a checkpoint go first again;
        those of senders still held wait again, in order."""
        if self.deferred:
            self.inbox.ready.extendleft(reversed(self.deferred))
            self.deferred.clear()
        if self.ctl_deferred:
            self.ctl.ready.extendleft(reversed(self.ctl_deferred))
            self.ctl_deferred.clear()
        self._wake.set()
