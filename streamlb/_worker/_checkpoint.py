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
from ._lifecycle import Lifecycle, Phase
from ._messages import Checkpoint, CheckpointPeer
from ._reads import Counts

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
    """Checkpoints as seen by instance ``index`` (incarnation ``run``, named ``label``) of
    ``stage``: its ``store`` of ``key_groups`` groups, the ``aligner`` of its inputs, its
    ``siblings`` (split keys), ``life``, ``counts``, routers (``exchanges``), ``sinks``,
    ``dead`` letters, ``source`` and ``owner`` side. ``spawn`` runs a task of the instance,
    ``wake()`` wakes its process loop, ``release()`` lets what waited for a barrier go."""

    def __init__(self, stage, index: int, run: int, label: str, *, store, key_groups: int, aligner, siblings,
                 life: Lifecycle, counts: Counts, exchanges: dict, sinks, dead, source, owner, spawn, wake,
                 release) -> None:
        self.stage, self.index, self.run, self.label = stage, index, run, label
        self.store, self.key_groups, self.aligner, self.siblings = store, key_groups, aligner, siblings
        self.life, self.counts, self.exchanges = life, counts, exchanges
        self.sinks, self.dead, self.source, self.owner = sinks, dead, source, owner
        self.spawn, self.wake, self.release = spawn, wake, release
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

    def checkpointing(self, url: str, compression: str | None = None) -> None:
        """The job checkpoints to ``url`` (snapshot files compressed as ``compression``
        says: setting ``streamlb.checkpoint.compression``): outputs are staged per
        checkpoint from now on."""
        self.url = url
        self.compression = compression
        self.sinks.staged = True

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
        self.aligner.when_aligned(("cp", cid), lambda: self._on_aligned(cid))

    def barrier(self, sender: int, msg: Checkpoint) -> None:
        """The barrier of checkpoint ``msg.id`` from upstream ``sender``."""
        if msg.id in self.taken:
            return
        self.expect(msg.id, msg.full, msg.target)
        if not self.aligner.aligned(("cp", msg.id)):
            self.blocked[msg.id].add(sender)
        self.aligner.marker(sender, ("cp", msg.id))

    def _on_aligned(self, cid: int) -> None:
        self.aligned.add(cid)
        # every partial this one sent for earlier rows is numbered before the mark; one whose
        # inputs all ended sent its PeerEnd, which the siblings count as a mark already
        if self.siblings.combines and not self.life.phase.inputs_ended:
            self.siblings.tell(CheckpointPeer(cid, self.index))
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
        if cid not in self.aligned or cid in self.ready or cid in self.taken:
            return
        if self.siblings.combines and not self.siblings.still_running() <= self.peer_marks.get(cid, set()):
            return
        self.ready.append(cid)
        self.wake()

    # -- taking a snapshot --------------------------------------------------------------------------
    async def flush(self) -> None:
        """Take the checkpoints that are ready (between two messages)."""
        while self.ready:
            await self._take(self.ready.pop(0))

    async def _take(self, cid: int) -> None:
        full = self.pending.pop(cid, True)
        target = self.targets.pop(cid, None)
        self.aligned.discard(cid)
        t0 = time.time()
        store = self.store
        blob = groups = None
        if store is not None:
            dirty = store.take_dirty()
            groups = np.arange(self.key_groups) if full else dirty
            blob = store.snapshot(groups) if len(groups) else None
        segment = self.seal(cid)
        for ex in self.exchanges.values():
            await ex.checkpoint(cid, full, target)
        self.taken.add(cid)
        self.blocked.pop(cid, None)
        self.peer_marks.pop(cid, None)
        self.aligner.forget(("cp", cid))
        self.release()
        fut = self.future(cid)
        ack = {"operator": self.stage.name, "instance": self.index, "run": self.run, "segment": segment,
               "groups": None if groups is None else groups.tolist(), "file": None, "error": None,
               "aligned_at": t0}
        if self.owner.waiting or self.owner.merge_in_flight():
            # only a migration that timed out leaves state travelling while a checkpoint runs:
            # this snapshot would miss it, so the checkpoint does not complete
            ack["error"] = f"instance {self.label}: state of a migration is still on its way; checkpoint {cid} skipped"
            if blob is not None:
                store.release(blob)
            blob = None
            if store is not None:
                store.mark_dirty(None)      # the next snapshot here writes every group
        self.spawn(self._write(cid, blob, ack, fut, target or self.url))

    async def _write(self, cid: int, blob, ack: dict, fut: asyncio.Future, url: str | None) -> None:
        if blob is not None:
            from .._checkpoint._files import write_snapshot

            rel = file_name(self.stage.name, self.index, self.run, cid)
            try:
                ack["file"] = await asyncio.get_running_loop().run_in_executor(
                    _writer(), write_snapshot, url, rel, self.stage.kind, blob, self.compression)
            except Exception as exc:        # the job goes on; the coordinator counts it
                ack["error"] = f"instance {self.label} could not write {rel} under {url}: " \
                               f"{type(exc).__name__}: {exc}"
            finally:
                if self.store is not None:     # arrays it lent for the snapshot are free again
                    self.store.release(blob)
        ack["written_at"] = time.time()
        if not fut.done():
            fut.set_result(ack)

    def future(self, cid: int) -> asyncio.Future:
        fut = self.acks.get(cid)
        if fut is None:
            fut = self.acks[cid] = asyncio.get_running_loop().create_future()
        return fut

    def failed(self, exc: BaseException) -> None:
        """The instance failed: every acknowledgement the driver awaits says so at once (its
        checkpoints can no longer complete), rather than after the checkpoint's timeout."""
        why = f"instance {self.label} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        for fut in self.acks.values():
            if not fut.done():
                fut.set_result({"operator": self.stage.name, "instance": self.index, "run": self.run,
                                "segment": None, "groups": None, "file": None, "failed": True, "error": why})

    def resolve(self, cid: int, ack: dict) -> None:
        """A source's acknowledgement (its position, no state)."""
        self.taken.add(cid)
        fut = self.future(cid)
        if not fut.done():
            fut.set_result(ack)

    # -- outputs --------------------------------------------------------------------------------
    def seal(self, cid: int) -> dict | None:
        """What the sinks and the dead letters got since the previous barrier: checkpoint
        ``cid``'s outputs (-1: those after the last barrier), for the driver to commit once
        it completes (see :meth:`streamlb._worker._sinks.Sinks.seal`)."""
        if not self.sinks.staged:
            return None
        return self.sinks.seal(cid)

    def take_final(self) -> dict | None:
        """A checkpointed job that finished: the outputs after the last barrier (committed
        by the driver now that every instance is done; what a writer holds commits here)."""
        self.sinks.commit_all()
        return self.seal(-1)

    def forget(self, cid: int, complete: bool = True) -> list:
        """The driver is done with checkpoint ``cid``: it is complete (the sinks' writers
        commit what they hold for it; a source tells its reader where it stood), or, not
        ``complete``, it was given up and its late outputs collected (they wait for the next
        complete one). Returns the futures of the sinks' commits still under way."""
        self.acks.pop(cid, None)
        commits = []
        if complete:
            commits = self.sinks.completed(cid)
            if self.source is not None:
                self.source.completed(cid)
        return commits

    # -- a source ---------------------------------------------------------------------------------
    async def source_barrier(self, cid: int, full: bool, target: str | None = None) -> None:
        """A source between two batches: record what it emitted, then send the barrier on."""
        position = {**self.source.position(), "records_out": self.counts.records_out,
                    "started_at": self.life.started_at}
        self.source.checkpointed[cid] = dict(self.source.emitted)
        segment = self.seal(cid)
        for ex in self.exchanges.values():
            await ex.checkpoint(cid, full, target)
        self._source_ack(cid, segment, position)

    def _source_ack(self, cid: int, segment: dict | None, position: dict) -> None:
        """A source's acknowledgement of checkpoint ``cid``: its position, no state."""
        now = time.time()
        self.resolve(cid, {"operator": self.stage.name, "instance": self.index, "run": self.run,
                           "segment": segment, "position": position, "groups": None, "file": None,
                           "error": None, "aligned_at": now, "written_at": now})

    def source_checkpoint(self, cid: int, full: bool = False, target: str | None = None) -> None:
        """A source: put checkpoint ``cid``'s barrier out between the next two batches (at
        once if the source has ended: its end aligns the instances downstream)."""
        src, life = self.source, self.life
        if src.exhausted or not life.phase.live:
            position = {**src.position(), "ended": True, "records_out": self.counts.records_out,
                        "started_at": life.started_at, "finished_at": life.finished_at,
                        "offsets": dict(src.offsets)}
            # what its sinks got after its last barrier is this checkpoint's: restored, it
            # replays nothing
            stopped = life.phase in (Phase.FAILED, Phase.STOPPED, Phase.RETIRED)
            self._source_ack(cid, None if stopped else self.seal(cid), position)
            return
        src.ask_barrier(cid, full, target)

    # -- the driver's calls -----------------------------------------------------------------------
    async def acknowledgement(self, cid: int, full: bool, timeout: float, target: str | None = None) -> dict:
        """This instance's acknowledgement of checkpoint ``cid`` once its snapshot is
        written (an instance whose inputs all ended takes it from its final state)."""
        life = self.life
        if life.phase in (Phase.FAILED, Phase.STOPPED, Phase.RETIRED):
            raise StreamlbError(f"instance {self.label} is {life.status}; it cannot take checkpoint {cid}")
        if self.source is None:
            self.expect(cid, full, target)
            if life.phase is Phase.DONE:
                await self.flush()
            else:
                self.wake()
        return await asyncio.wait_for(asyncio.shield(self.future(cid)), timeout)

    def status(self, cid: int) -> dict:
        """Where checkpoint ``cid`` stands here."""
        key = ("cp", cid)
        return {"pending": cid in self.pending, "aligned": cid in self.aligned, "ready": cid in self.ready,
                "taken": cid in self.taken, "barriers_from": sorted(self.aligner._marks.get(key, ())),
                "ended": sorted(self.aligner.ended), "senders": sorted(self.aligner.senders),
                "blocked": sorted(self.blocked.get(cid, ())), "peer_marks": sorted(self.peer_marks.get(cid, ())),
                "peer_ends": sorted(self.siblings.ended),
                "barriers_asked": list(self.source.barriers) if self.source else None}

    async def restore(self, base: str, manifest: dict, groups: list[int]) -> int:
        """Install the state of key groups ``groups`` from a checkpoint (read off the event
        loop); returns the keys installed."""
        from .._checkpoint._files import read_groups

        blob = await asyncio.get_running_loop().run_in_executor(
            None, read_groups, base, manifest, self.stage.name, self.stage.kind, groups)
        self.store.install(blob)
        self.store.take_dirty()
        return len(self.store)
