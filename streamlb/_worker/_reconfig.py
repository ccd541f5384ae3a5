"""An instance's side of live reconfiguration (see :mod:`streamlb._reconfig`).

These RPCs change who an instance talks to and what it runs, while it runs: its siblings,
its upstream senders, the instances its routers send to; hand its whole state to a
replacement; retire; switch a user function at an epoch boundary. The driver orders the
calls; each call only changes this instance.
"""
from __future__ import annotations

import asyncio
import time

from ..exceptions import StreamlbError
from ._channels import Peer
from ._messages import PeerEnd


class Reconfigurable:
    """Mixed into :class:`~streamlb._worker._instance.Instance`."""

    # -- peers ----------------------------------------------------------------------------------
    async def set_siblings(self, siblings: list) -> None:
        """The instances of this stage, by index: ``(address, actor key[, run])``. A new or
        replaced sibling is numbered from 0 on the control lane, both ways."""
        peers = [(a, k, int(r[0]) if r else 0) for a, k, *r in siblings]
        new = []
        for j, (a, k, r) in enumerate(peers):
            old = self.siblings[j] if j < len(self.siblings) else None
            if old is None or (old.address, old.key) != (a, k):
                self.numbered.reset(j)
                self.ctl.add_sender(j, r)
                self.peer_ends.discard(j)
                new.append(j)
        for j in range(len(peers), len(self.siblings)):
            self.numbered.reset(j)
            self.ctl.remove_sender(j)
            self.peer_ends.discard(j)       # a retired sibling's end no longer counts
        self.siblings = [Peer(self.worker, a, k) for a, k, _ in peers]
        self.combines = self.stage.splittable and len(self.siblings) > 1
        if self.finishing and self.combines:
            # this one ended before it knew them: a new sibling waits for its end too
            for j in new:
                if j != self.index:
                    self.tasks.spawn(self.send_control(j, PeerEnd(self.index)))
        self._wake.set()

    async def add_sender(self, index: int, run: int = 0) -> None:
        """Upstream instance ``index`` (incarnation ``run``) sends here from now on."""
        self.inbox.add_sender(index, run)
        self.aligner.add_sender(index)

    async def remove_sender(self, index: int) -> None:
        """Upstream instance ``index`` retired; everything it sent was applied."""
        self.inbox.remove_sender(index)
        self.aligner.remove_sender(index)
        self._inputs_changed()

    async def add_peer(self, target: int, index: int, address: str, key: str) -> None:
        """A new instance ``index`` of downstream stage ``target`` (a table routes to it later)."""
        await self.exchanges[target].add_peer(index, self._channel(address, key, target))

    async def remove_peer(self, target: int, index: int) -> None:
        """Instance ``index`` of stage ``target`` retires: return once all sent to it was applied."""
        await self.exchanges[target].remove_peer(index)

    async def replace_peer(self, target: int, index: int, address: str, key: str) -> float:
        """Instance ``index`` of stage ``target`` moves to the actor ``key`` at ``address``:
        what was sent to the old actor is applied there first, then rows go to the new one.
        Returns when the switch happened."""
        await self.exchanges[target].replace_peer(index, self._channel(address, key, target))
        return time.time()

    async def mark(self, target: int, epoch: int) -> None:
        """Marker(``epoch``) to every instance of stage ``target``, between two batches."""
        await self.exchanges[target].mark(epoch)

    # -- a replacement ------------------------------------------------------------------------
    async def hand_over(self, address: str, key: str, timeout: float) -> int:
        """Every router now sends to the replacement ``key`` at ``address``: once nothing is
        queued here, cut the whole state and install it there. Returns the keys moved."""
        await self._until_quiet(timeout, "hand its state over")
        n = len(self.store) if self.store is not None else 0
        blob = self.store.cut(range(self.key_groups)) if self.store is not None else None
        await Peer(self.worker, address, key).call("take_over", blob)
        return n

    async def hand_over_source(self, timeout: float) -> dict | None:
        """A source: stop between two batches, let everything emitted be applied downstream,
        and return where the stream stands (``ended``: it had ended already)."""
        src = self.source
        src.handing_over.clear()    # a pause's resume meanwhile does not reopen it
        deadline = time.time() + timeout
        while not src.parked.is_set():
            if self.status == "done":   # it ended: the replacement only keeps its figures
                return {"ended": True, "records_out": self.records_out, "started_at": self.started_at,
                        "finished_at": self.finished_at, "offsets": dict(src.offsets)}
            if self.status != "running":
                raise StreamlbError(f"source {self.label} is {self.status}; it cannot hand its stream over")
            if time.time() > deadline:
                src.handing_over.set()
                raise StreamlbError(f"source {self.label} did not reach a batch boundary within {timeout:g}s")
            await asyncio.sleep(0.002)
        for ex in self.exchanges.values():
            await ex.drain()
        return {**src.position(), "records_out": self.records_out, "started_at": self.started_at}

    async def take_over(self, blob) -> None:
        """The state of the instance this one replaces."""
        if blob is not None:
            self.store.install(blob)

    async def retire(self, timeout: float, kafka: str = "linger") -> dict:
        """No router sends here any more: finish what is queued, flush the outputs, close
        the sinks; the last poll (with this instance's metrics rows) is returned, and under
        ``"kafka"`` the Kafka rows no checkpoint committed yet (see ``Sinks.end_kafka``)."""
        await self._until_quiet(timeout, "retire")
        await self.tasks.join_spawned()
        for ex in self.exchanges.values():
            await ex.drain()
        self.sinks.close()
        kept = self.sinks.end_kafka(kafka)
        self.finished_at = time.time()
        self.meter.close_window(self.finished_at, last=True)
        self.status = "retired"
        self.tasks.cancel()
        out = self.status_row()
        out["metrics"] = self.metrics()
        out["final"] = self.seal(-1)        # a checkpointed job commits these with its next checkpoint
        out["kafka"] = kept
        return out

    async def hand_off_kafka(self) -> dict:
        """A retired instance whose index is taken again: its Kafka rows no checkpoint
        committed, for the new instance to write (its own transactions are aborted)."""
        return self.sinks.end_kafka("hand_off")

    async def adopt_kafka(self, messages: dict) -> None:
        """Before this instance starts: write what the one it replaces handed off."""
        self.sinks.adopt_kafka(messages)

    async def commit_kafka(self) -> None:
        """The job finished: a retired instance commits what waited for a checkpoint."""
        self.sinks.commit_kafka()

    async def _until_quiet(self, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while self.inbox or self.ctl or self.owner.held or self.owner.waiting:
            if time.time() > deadline:
                raise StreamlbError(f"instance {self.label} could not {what}: still busy after {timeout:g}s "
                                    f"({len(self.inbox)} batches, {len(self.ctl)} control messages queued)")
            await asyncio.sleep(0.005)

    # -- a new function at an epoch boundary ------------------------------------------------------
    async def prepare_update(self, epoch: int, path: tuple, func) -> None:
        """Switch the function at ``path`` (see :func:`streamlb._reconfig.find_function`) once
        aligned on ``epoch``: rows a sender sent after its marker wait until then."""
        if self.finishing or self.status not in ("running", "ready"):
            raise StreamlbError(f"instance {self.label} is {self.status}; it cannot take an update")
        self.updates[epoch] = (path, func)
        self.aligner.when_aligned(epoch, lambda: self._switch_function(epoch))

    def _switch_function(self, epoch: int) -> None:
        from .._plan._update import set_function

        path, func = self.updates.pop(epoch)
        set_function(self.stage, path, func, self.store if path == ("stage",) else None)
        self.updated.add(epoch)
        self.aligner.forget(epoch)
        self.blocked.clear()
        self.release_deferred()

    async def set_function(self, path: tuple, func) -> None:
        """A source: switch now, between two batches."""
        from .._plan._update import set_function

        set_function(self.stage, path, func, self.store if path == ("stage",) else None)

    async def update_done(self, epoch: int, wait: float) -> bool:
        deadline = time.time() + wait
        while epoch not in self.updated and time.time() < deadline:
            await asyncio.sleep(0.005)
        return epoch in self.updated

    def defers(self, sender: int) -> bool:
        """Whether what ``sender`` sent waits: for an update to switch (it sent the marker),
        or for a checkpoint to be taken here (it sent the barrier)."""
        return sender in self.blocked or self.ckpt.holds(sender)
