"""An instance's side of the epoch protocol of live migrations (see :mod:`streamlb._migration`).

The coordinator sends an instance the typed calls of :mod:`._commands`: it switches routers
to a new table (:class:`~._commands.SetTable`), tells owners ahead what an epoch moves
(``Prepare``, ``Arm``, ``Abort``, ``Forget``), waits for it (``WaitEpoch``), pauses the
sources for the pause-and-resume baseline and checks that nothing is left in flight
(``Idle``). :class:`EpochParticipant` carries each out as one step of the instance's
:class:`~streamlb._worker._owner.OwnerSide`, of a router or of the source.
"""
from __future__ import annotations

from collections.abc import Callable

from ..exceptions import StreamlbError
from ._commands import (Abort, Arm, Command, Epochs, FetchKeys, Forget, GroupKeys, Idle, Pause, Prepare, Resume,
                        SetTable, WaitEpoch)
from ._lifecycle import Lifecycle, Phase
from ._owner import OwnerSide

# phases of an instance that takes part in nothing any more
ENDED = (Phase.DONE, Phase.FAILED, Phase.STOPPED)


class EpochParticipant:
    """What an instance does with each epoch command; held by the
    :class:`~streamlb._worker._instance.Instance`, which hands it every ``command``.

    ``owner``: the owner side; ``watermarks``: frozen while an epoch moves groups;
    ``exchanges``: the instance's routers by target stage (filled when it connects);
    ``source``: its source, if it is one; ``inbox``: its data lane; ``store``: its keyed
    state (or None); ``life``: its lifecycle (its phase, its name in errors);
    ``finishing()``: whether its input ended; ``wake``: wakes its process loop.
    """

    def __init__(self, owner: OwnerSide, watermarks, exchanges: dict, source, inbox, store, *, life: Lifecycle,
                 finishing: Callable[[], bool], wake: Callable[[], None]) -> None:
        self.owner, self.watermarks, self.exchanges, self.source = owner, watermarks, exchanges, source
        self.inbox, self.store, self.life, self.finishing, self.wake = inbox, store, life, finishing, wake

    async def handle(self, cmd: Command):
        """Carry out ``cmd``; what it answers (see each command)."""
        match cmd:
            case SetTable():
                return await self.set_table(cmd)
            case Prepare():
                return self.prepare(cmd)
            case Arm(epoch=epoch):
                self.owner.arm(epoch)
                self.wake()
            case Abort(epoch=epoch):
                self.owner.abort(epoch)
                await self.watermarks.thaw(epoch)
                self.wake()         # a finishing owner may have been waiting only for this epoch
            case Forget():
                return await self.forget(cmd)
            case WaitEpoch(epoch=epoch, wait=wait):
                await self.owner.wait_done(epoch, wait)
                return self.epochs()
            case Epochs():
                return self.epochs()
            case FetchKeys():
                await self.owner.fetch_keys(cmd.epoch, cmd.dest, cmd.keys, cmd.groups, cmd.router, cmd.request)
            case GroupKeys(groups=groups):     # on the loop, where the store changes
                return self.store.keys_per_group(groups).tolist() if self.store is not None else [0] * len(groups)
            case Pause():
                self.source.gate.clear()
            case Resume():
                self.source.gate.set()
            case Idle():
                return self.idle()
            case _:
                raise StreamlbError(f"instance {self.life.label} got an unknown command {type(cmd).__name__}")
        return None

    async def set_table(self, cmd: SetTable) -> float:
        """Router: switch to the table (markers follow); a flushing source sends what is due."""
        switched, marked = await self.exchanges[cmd.target].set_table(cmd.table, cmd.prefetch)
        if cmd.flush and marked and self.source is not None:
            self.source.flush_due.set()
        return switched

    def prepare(self, cmd: Prepare) -> None:
        """Be told ahead what the epoch moves here (see ``OwnerSide.prepare``)."""
        phase = self.life.phase
        if self.finishing() or phase in ENDED:
            state = phase.value if phase in ENDED else "finishing"
            raise StreamlbError(f"instance {self.life.label} is {state}; it cannot take part in epoch {cmd.epoch}")
        self.owner.prepare(cmd.epoch, cmd.strategy, cmd.outgoing, cmd.incoming, cmd.flush, cmd.armed)
        if cmd.outgoing or cmd.incoming:
            self.watermarks.freeze(cmd.epoch)

    async def forget(self, cmd: Forget) -> None:
        """The epoch is recorded: drop it as an owner or, with a target, as that stage's router."""
        if cmd.target is None:
            self.owner.forget(cmd.epoch)
            await self.watermarks.thaw(cmd.epoch)
        else:
            self.exchanges[cmd.target].forget(cmd.epoch)

    def epochs(self) -> dict:
        return {**self.owner.status(), "status": self.life.status, "finishing": self.finishing()}

    def idle(self) -> bool:
        """Nothing queued, held or in flight from this instance."""
        return not self.inbox and not self.owner.held and not any(x.in_flight() for x in self.exchanges.values())
