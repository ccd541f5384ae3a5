"""An instance's side of live reconfiguration (see :mod:`streamlb._reconfig`): being
replaced, and a user function switched at an epoch boundary.

The driver orders the calls; each call only changes this instance. Who an instance talks
to (its siblings, upstream senders, the instances its routers send to) is its wiring, on
``Instance`` itself; retiring is a step of its lifecycle, also there.
"""
from __future__ import annotations

import asyncio
import time

from ..exceptions import StreamlbError
from ._lifecycle import Lifecycle, Phase
from ._reads import Counts


class Handover:
    """Instance ``label`` handing its whole state (``store``, of ``key_groups`` groups) or its
    stream (``source``) to the instance that replaces it. ``inbox``, ``ctl`` and ``owner``
    tell whether anything is still queued or travelling; ``exchanges`` are its routers by
    target stage; ``peer(address, key)`` is the actor ``key`` at ``address``."""

    def __init__(self, label: str, life: Lifecycle, counts: Counts, *, store, key_groups: int, source, exchanges: dict,
                 inbox, ctl, owner, peer) -> None:
        self.label, self.life, self.counts = label, life, counts
        self.store, self.key_groups, self.source, self.exchanges = store, key_groups, source, exchanges
        self.inbox, self.ctl, self.owner, self.peer = inbox, ctl, owner, peer

    async def until_quiet(self, timeout: float, what: str) -> None:
        """Return once nothing is queued here, held back or on its way in."""
        deadline = time.time() + timeout
        while self.inbox or self.ctl or self.owner.held or self.owner.waiting:
            if time.time() > deadline:
                raise StreamlbError(f"instance {self.label} could not {what}: still busy after {timeout:g}s "
                                    f"({len(self.inbox)} batches, {len(self.ctl)} control messages queued)")
            await asyncio.sleep(0.005)

    async def hand_over(self, address: str, key: str, timeout: float) -> int:
        """Every router now sends to the replacement ``key`` at ``address``: once nothing is
        queued here, cut the whole state and install it there. Returns the keys moved."""
        await self.until_quiet(timeout, "hand its state over")
        n = len(self.store) if self.store is not None else 0
        blob = self.store.cut(range(self.key_groups)) if self.store is not None else None
        await self.peer(address, key).call("take_over", blob)
        return n

    def take_over(self, blob) -> None:
        """The state of the instance this one replaces."""
        if blob is not None:
            self.store.install(blob)

    async def hand_over_source(self, timeout: float) -> dict | None:
        """A source: stop between two batches, let everything emitted be applied downstream,
        and return where the stream stands (``ended``: it had ended already)."""
        src, life = self.source, self.life
        src.handing_over.clear()    # a pause's resume meanwhile does not reopen it
        deadline = time.time() + timeout
        while not src.parked.is_set():
            if life.phase is Phase.DONE:   # it ended: the replacement only keeps its figures
                return {"ended": True, "records_out": self.counts.records_out, "started_at": life.started_at,
                        "finished_at": life.finished_at, "offsets": dict(src.offsets)}
            if not life.phase.live:
                raise StreamlbError(f"source {self.label} is {life.status}; it cannot hand its stream over")
            if time.time() > deadline:
                src.handing_over.set()
                raise StreamlbError(f"source {self.label} did not reach a batch boundary within {timeout:g}s")
            await asyncio.sleep(0.002)
        for ex in self.exchanges.values():
            await ex.drain()
        return {**src.position(), "records_out": self.counts.records_out, "started_at": life.started_at}


class Updates:
    """A new user function of ``stage`` at an epoch boundary (Trisk): rows a sender sent
    after the epoch's marker wait (``hold(sender)``) until the ``aligner`` is aligned on it;
    then the function switches and ``release()`` lets them go."""

    def __init__(self, stage, store, aligner, life: Lifecycle, *, hold, release) -> None:
        self.stage, self.store, self.aligner, self.life = stage, store, aligner, life
        self.hold, self.release = hold, release
        self.pending: dict = {}     # epoch -> (path, func)
        self.done: set[int] = set()

    def prepare(self, epoch: int, path: tuple, func) -> None:
        """Switch the function at ``path`` (see :func:`streamlb._plan._update.set_function`)
        once aligned on ``epoch``."""
        if self.life.phase not in (Phase.RUNNING, Phase.READY):     # FINISHING too: its input ended
            raise StreamlbError(f"instance {self.life.label} is {self.life.status}; it cannot take an update")
        self.pending[epoch] = (path, func)
        self.aligner.when_aligned(epoch, lambda: self._switch(epoch))

    def marker(self, sender: int, epoch: int) -> None:
        """``sender``'s marker of ``epoch``: what it sends after waits if the epoch switches a function."""
        if epoch in self.pending:
            self.hold(sender)

    def _switch(self, epoch: int) -> None:
        path, func = self.pending.pop(epoch)
        self.switch_now(path, func)
        self.done.add(epoch)
        self.aligner.forget(epoch)
        self.release()

    def switch_now(self, path: tuple, func) -> None:
        """Switch now (a source: between two batches)."""
        from .._plan._update import set_function

        set_function(self.stage, path, func, self.store if path == ("stage",) else None)

    async def wait_done(self, epoch: int, wait: float) -> bool:
        deadline = time.time() + wait
        while epoch not in self.done and time.time() < deadline:
            await asyncio.sleep(0.005)
        return epoch in self.done
