"""An instance's part in checkpoints (Flink's aligned barrier snapshots).

A source, asked by the coordinator, puts a :class:`Checkpoint` barrier on every outgoing
channel between two batches and reports the position it had *emitted* (not read ahead).
Every other instance, once the barrier came from every upstream sender that has not ended
(the :class:`~streamlb._worker._align.Aligner`, epochs named ``("cp", id)``):

1. takes a copy of the state of the key groups changed since its previous snapshot (all of
   them when the barrier says ``full``), on the event loop, between two messages;
2. seals its outputs: what its sinks got since the previous barrier belongs to this
   checkpoint and is committed when it completes (two-phase commit);
3. forwards the barrier downstream and lets the senders past it go on;
4. writes the copy as a columnar file off the event loop and acknowledges.

Meanwhile rows a sender sent after its barrier wait (they belong to the next checkpoint);
rows of senders whose barrier has not come yet go on being processed. A combining
aggregate (split keys) also waits for a :class:`CheckpointPeer` from each sibling: every
partial aggregate a helper computed for rows before the barrier reached it first.
A failing write does not stop the instance: the acknowledgement carries the error.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import re
import time

import numpy as np

from ..exceptions import StreamlbError
from ._messages import Checkpoint, CheckpointPeer

_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _writer() -> concurrent.futures.ThreadPoolExecutor:
    """One thread per worker process writes snapshots (Arrow releases the GIL)."""
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="streamlb-checkpoint")
    return _pool


def file_name(operator: str, index: int, run: int, cid: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", operator)
    return f"data/{safe}/{index:04d}-r{run}-c{cid:06d}.arrow"


class CheckpointSide:
    """Checkpoints as seen by one instance ``inst``."""

    def __init__(self, inst) -> None:
        self.inst = inst
        self.url: str | None = None         # set when the job checkpoints
        self.compression: str | None = None  # of the snapshot files (streamlb.checkpoint.compression)
        self.pending: dict[int, bool] = {}   # checkpoint id -> full, expected and not yet taken
        self.targets: dict[int, str] = {}    # checkpoint id -> a savepoint's path
        self.aligned: set[int] = set()      # aligned on the data lane, maybe waiting for siblings
        self.ready: list[int] = []          # to take between two messages
        self.blocked: dict[int, set[int]] = {}     # id -> upstream senders past its barrier
        self.peer_marks: dict[int, set[int]] = {}  # id -> siblings that sent CheckpointPeer
        self.acks: dict[int, asyncio.Future] = {}
        self.taken: set[int] = set()

    # -- the data lane ------------------------------------------------------------------------
    @property
    def blocking(self) -> bool:
        return bool(self.blocked)

    def holds(self, sender: int) -> bool:
        """Whether rows from ``sender`` wait: it is past a barrier not yet taken here."""
        return any(sender in s for s in self.blocked.values())

    def expect(self, cid: int, full: bool, target: str | None = None) -> None:
        """Checkpoint ``cid`` is under way: take it once aligned (written to ``target``, a
        savepoint, or to the job's checkpoint path)."""
        if cid in self.pending or cid in self.taken:
            return
        self.pending[cid] = full
        if target:
            self.targets[cid] = target
        self.blocked.setdefault(cid, set())
        self.inst.aligner.when_aligned(("cp", cid), lambda: self._on_aligned(cid))

    def barrier(self, sender: int, msg: Checkpoint) -> None:
        """The barrier of checkpoint ``msg.id`` from upstream ``sender``."""
        if msg.id in self.taken:
            return
        self.expect(msg.id, msg.full, msg.target)
        if not self.inst.aligner.aligned(("cp", msg.id)):
            self.blocked[msg.id].add(sender)
        self.inst.aligner.marker(sender, ("cp", msg.id))

    def _on_aligned(self, cid: int) -> None:
        inst = self.inst
        self.aligned.add(cid)
        # every partial this one sent for earlier rows is numbered before the mark; one whose
        # inputs all ended sent its PeerEnd, which the siblings count as a mark already
        if inst.combines and not inst.finishing:
            for j in range(len(inst.siblings)):
                if j != inst.index:
                    inst.tasks.spawn(inst.send_control(j, CheckpointPeer(cid, inst.index)))
        self._check(cid)

    # -- siblings (split keys) -------------------------------------------------------------------
    def peer_mark(self, msg: CheckpointPeer) -> None:
        self.peer_marks.setdefault(msg.id, set()).add(msg.sender)
        self._check(msg.id)

    def peers_changed(self) -> None:
        """A sibling ended (or the siblings changed): it holds no checkpoint back."""
        for cid in list(self.aligned):
            self._check(cid)

    def holds_peer(self, sibling: int) -> bool:
        """Whether control messages from ``sibling`` wait: it passed a checkpoint not yet taken here."""
        return any(sibling in marks for cid, marks in self.peer_marks.items() if cid not in self.taken)

    def _check(self, cid: int) -> None:
        inst = self.inst
        if cid not in self.aligned or cid in self.ready or cid in self.taken:
            return
        if inst.combines:
            others = {j for j in range(len(inst.siblings)) if j != inst.index} - inst.peer_ends
            if not others <= self.peer_marks.get(cid, set()):
                return
        self.ready.append(cid)
        inst._wake.set()

    # -- taking a snapshot --------------------------------------------------------------------------
    async def flush(self) -> None:
        """Take the checkpoints that are ready (between two messages)."""
        while self.ready:
            await self._take(self.ready.pop(0))

    async def _take(self, cid: int) -> None:
        inst = self.inst
        full = self.pending.pop(cid, True)
        target = self.targets.pop(cid, None)
        self.aligned.discard(cid)
        t0 = time.time()
        store = inst.store
        blob = groups = None
        if store is not None:
            dirty = store.take_dirty()
            groups = np.arange(inst.key_groups) if full else dirty
            blob = store.snapshot(groups) if len(groups) else None
        segment = inst.seal(cid)
        for ex in inst.exchanges.values():
            await ex.checkpoint(cid, full, target)
        self.taken.add(cid)
        self.blocked.pop(cid, None)
        self.peer_marks.pop(cid, None)
        inst.aligner.forget(("cp", cid))
        inst.release_deferred()
        fut = self.future(cid)
        ack = {"operator": inst.stage.name, "instance": inst.index, "run": inst.run, "segment": segment,
               "groups": None if groups is None else groups.tolist(), "file": None, "error": None,
               "aligned_at": t0}
        if inst.owner.waiting or inst.owner.merge_in_flight():
            # only a migration that timed out leaves state travelling while a checkpoint runs:
            # this snapshot would miss it, so the checkpoint does not complete
            ack["error"] = f"instance {inst.label}: state of a migration is still on its way; checkpoint {cid} skipped"
            if blob is not None:
                store.release(blob)
            blob = None
            if store is not None:
                store.mark_dirty(None)      # the next snapshot here writes every group
        inst.tasks.spawn(self._write(cid, blob, ack, fut, target or self.url))

    async def _write(self, cid: int, blob, ack: dict, fut: asyncio.Future, url: str | None) -> None:
        inst = self.inst
        if blob is not None:
            from .._checkpoint._files import write_snapshot

            rel = file_name(inst.stage.name, inst.index, inst.run, cid)
            try:
                ack["file"] = await asyncio.get_running_loop().run_in_executor(
                    _writer(), write_snapshot, url, rel, inst.stage.kind, blob, self.compression)
            except Exception as exc:        # the job goes on; the coordinator counts it
                ack["error"] = f"instance {inst.label} could not write {rel} under {url}: " \
                               f"{type(exc).__name__}: {exc}"
            finally:
                if inst.store is not None:     # arrays it lent for the snapshot are free again
                    inst.store.release(blob)
        ack["written_at"] = time.time()
        if not fut.done():
            fut.set_result(ack)

    def future(self, cid: int) -> asyncio.Future:
        fut = self.acks.get(cid)
        if fut is None:
            fut = self.acks[cid] = asyncio.get_running_loop().create_future()
        return fut

    def resolve(self, cid: int, ack: dict) -> None:
        """A source's acknowledgement (its position, no state)."""
        self.taken.add(cid)
        fut = self.future(cid)
        if not fut.done():
            fut.set_result(ack)


class Checkpointed:
    """The checkpoint RPCs of :class:`~streamlb._worker._instance.Instance` (mixed in);
    its state is a :class:`CheckpointSide` at ``self.ckpt``."""

    async def checkpointing(self, url: str, compression: str | None = None) -> None:
        """The job checkpoints to ``url`` (snapshot files compressed as ``compression``
        says: setting ``streamlb.checkpoint.compression``): outputs are staged per
        checkpoint from now on."""
        self.ckpt.url = url
        self.ckpt.compression = compression
        self.sinks.staged = True

    def seal(self, cid: int) -> dict | None:
        """What the sinks and the dead letters got since the previous barrier: checkpoint
        ``cid``'s outputs, for the driver to commit once it completes."""
        if not self.sinks.staged:
            return None
        if cid >= 0:
            self.sinks.seal_kafka(cid)
        return {"lists": self.sinks.take_lists(), "dead": self.dead.take(),
                "files": self.sinks.seal() + self.sinks.take_closed()}

    async def _source_barrier(self, cid: int, full: bool, target: str | None = None) -> None:
        """A source between two batches: record what it emitted, then send the barrier on."""
        position = {**self.source.position(), "records_out": self.records_out, "started_at": self.started_at}
        self.source.checkpointed[cid] = dict(self.source.emitted)
        segment = self.seal(cid)
        for ex in self.exchanges.values():
            await ex.checkpoint(cid, full, target)
        self._source_ack(cid, segment, position)

    def _source_ack(self, cid: int, segment: dict | None, position: dict) -> None:
        """A source's acknowledgement of checkpoint ``cid``: its position, no state."""
        now = time.time()
        self.ckpt.resolve(cid, {"operator": self.stage.name, "instance": self.index, "run": self.run,
                                "segment": segment, "position": position, "groups": None, "file": None,
                                "error": None, "aligned_at": now, "written_at": now})

    async def checkpoint(self, cid: int, full: bool = False, target: str | None = None) -> None:
        """A source: put checkpoint ``cid``'s barrier out between the next two batches (at
        once if the source has ended: its end aligns the instances downstream)."""
        src = self.source
        if src.exhausted or self.status != "running":
            position = {**src.position(), "ended": True, "records_out": self.records_out,
                        "started_at": self.started_at, "finished_at": self.finished_at,
                        "offsets": dict(src.offsets)}
            # what its sinks got after its last barrier is this checkpoint's: restored, it
            # replays nothing
            self._source_ack(cid, self.seal(cid) if self.status not in ("failed", "stopped", "retired") else None,
                             position)
            return
        src.ask_barrier(cid, full, target)

    async def await_checkpoint(self, cid: int, full: bool, timeout: float, target: str | None = None) -> dict:
        """This instance's acknowledgement of checkpoint ``cid`` once its snapshot is
        written (an instance whose inputs all ended takes it from its final state)."""
        if self.status in ("failed", "stopped", "retired"):
            raise StreamlbError(f"instance {self.label} is {self.status}; it cannot take checkpoint {cid}")
        if self.source is None:
            self.ckpt.expect(cid, full, target)
            if self.status == "done":
                await self.ckpt.flush()
            else:
                self._wake.set()
        return await asyncio.wait_for(asyncio.shield(self.ckpt.future(cid)), timeout)

    def checkpoint_status(self, cid: int) -> dict:
        """Where checkpoint ``cid`` stands here (what a coordinator logs when it is stuck)."""
        c = self.ckpt
        key = ("cp", cid)
        return {"instance": self.label, "status": self.status, "pending": cid in c.pending,
                "aligned": cid in c.aligned, "ready": cid in c.ready, "taken": cid in c.taken,
                "barriers_from": sorted(self.aligner._marks.get(key, ())), "ended": sorted(self.aligner.ended),
                "senders": sorted(self.aligner.senders), "blocked": sorted(c.blocked.get(cid, ())),
                "peer_marks": sorted(c.peer_marks.get(cid, ())), "peer_ends": sorted(self.peer_ends),
                "queued": len(self.inbox), "deferred": len(self.deferred), "ctl_deferred": len(self.ctl_deferred),
                "barriers_asked": list(self.source.barriers) if self.source else None,
                "finishing": self.finishing, "eos_sent": self.eos_sent, "can_finish": self._can_finish(),
                "spawned": [repr(t.get_coro())[:90] for t in self.tasks.spawned],
                "main": [(repr(t.get_coro())[:60], t.done()) for t in self.tasks.main],
                "owner_waiting": self.owner.waiting, "unarmed": bool(self.owner.unarmed)}

    async def forget_checkpoint(self, cid: int, complete: bool = True) -> None:
        """The driver is done with checkpoint ``cid``: it is complete (Kafka sinks commit the
        rows before its barrier; a source tells its reader where it stood), or, not
        ``complete``, it was given up and its late outputs collected (they wait for the next
        complete one)."""
        self.ckpt.acks.pop(cid, None)
        if complete:
            self.sinks.completed(cid)
            if self.source is not None:
                self.source.completed(cid)

    async def restore(self, base: str, manifest: dict, groups: list[int]) -> int:
        """Install the state of key groups ``groups`` from a checkpoint (read off the event
        loop); returns the keys installed."""
        from .._checkpoint._files import read_groups

        blob = await asyncio.get_running_loop().run_in_executor(
            None, read_groups, base, manifest, self.stage.name, self.stage.kind, groups)
        self.store.install(blob)
        self.store.take_dirty()
        return len(self.store)

    async def take_final(self) -> dict | None:
        """A checkpointed job that finished: the outputs after the last barrier (committed
        by the driver now that every instance is done; Kafka transactions commit here)."""
        self.sinks.commit_kafka()
        return self.seal(-1)
