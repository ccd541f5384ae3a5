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
            blob = None
            if store is not None:
                store.mark_dirty(None)      # the next snapshot here writes every group
        inst.tasks.spawn(self._write(cid, blob, ack, fut, target or self.url))

    async def _write(self, cid: int, blob, ack: dict, fut: asyncio.Future, url: str | None) -> None:
        inst = self.inst
        if blob is not None:
            from .._checkpoint._storage import write_snapshot

            rel = file_name(inst.stage.name, inst.index, inst.run, cid)
            try:
                ack["file"] = await asyncio.get_running_loop().run_in_executor(
                    _writer(), write_snapshot, url, rel, inst.stage.kind, blob)
            except Exception as exc:        # the job goes on; the coordinator counts it
                ack["error"] = f"instance {inst.label} could not write {rel} under {url}: " \
                               f"{type(exc).__name__}: {exc}"
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
