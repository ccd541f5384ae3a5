"""The operator instance: a Dask actor that runs one stage.

The actor is its RPC surface and a dispatch over typed messages; the work is done by its
parts (``_channels``, ``_align``, ``_sources``, ``_steps``, ``_sinks``, ``_exchange``,
``_operators``, ``_metrics`` and the owner side of migrations). RPCs of one concern are
mixed in from the module named for it: ``_epochs`` (the epoch protocol of migrations),
``_reads`` (what the driver reads), ``_reconfig`` (live reconfiguration) and
``_checkpoint`` (checkpoints). All data-path methods are
``async`` so they run on the worker's event loop: an instance can call another one on the
same worker without the deadlock that synchronous actor methods (one shared thread) give.
"""
from __future__ import annotations

import asyncio
import collections
import time
import traceback

import pandas as pd

from ._owner import OwnerSide
from .._state._backends import make_store
from ..exceptions import StreamlbError
from .._plan._model import SENDERS, Stage
from ..routing import RoutingTable
from ._align import Aligner
from ._checkpoint import Checkpointed, CheckpointSide
from ._coalesce import coalesce
from .._state._partials import records_of
from ._channels import Inbox, Numbered, OutChannel, Peer
from ._epochs import ENDED, EpochParticipant
from ._exchange import KeyedRouter, make_exchange
from ._heap import keep_heap
from ._messages import (Barrier, Batch, Checkpoint, CheckpointPeer, EndOfStream, Envelope, Install, InstallKeys,
                        Marker, Partial, PeerEnd, PeerWatermark, Watermark)
from ._metrics import CostServer, Metrics
from ._kinds import make_operator
from ._reads import Readable
from ._reconfig import Reconfigurable
from ._sinks import Sinks
from ._sources import Source
from ._steps import DeadLetters, StepRunner
from ._tasks import Tasks
from ._watermarks import Watermarks


class Instance(EpochParticipant, Readable, Reconfigurable, Checkpointed):
    """One parallel instance of a stage.

    ``upstream_instances``: how many instances of the upstream stage send here, or their
    run ids by index (``{index: run}``) when some were replaced. ``run``: this instance's
    incarnation: a replacement of instance ``index`` has a higher run than the actor it
    replaces, so receivers refuse what the old one still sends.
    """

    def __init__(self, stage: Stage, index: int, upstream_instances, *, job: str, key_groups: int,
                 window: float, credits: int, lazy_step: int = 1, lazy_delay: float = 0.1, lazy_asked: int = 1 << 17,
                 lazy_pace: float = 1.0, lazy_keys: int = 0, run: int = 0, heap_pad: int = 0) -> None:
        self.stage, self.index, self.job, self.key_groups, self.credits = stage, index, job, key_groups, credits
        self.run, self.heap_kept = run, keep_heap(heap_pad)
        self.label = f"{stage.name}[{index}]"
        self.status = "created"
        self.error: BaseException | None = None
        self.started_at = self.finished_at = None
        self.records_in, self.records_out, self.finishing, self.eos_sent, self.closing = 0, 0, False, False, False
        self.peer_ends: set[int] = set()
        self.tasks = Tasks(self._fail)
        self._wake = asyncio.Event()
        senders = upstream_instances if isinstance(upstream_instances, dict) else dict.fromkeys(
            range(upstream_instances), 0)
        self.inbox = Inbox(strict=True)      # data lane
        for j, r in senders.items():
            self.inbox.add_sender(j, r)
        self.ctl = Inbox(strict=True)        # control lane from siblings (see connect): ahead of the data
        self.numbered = Numbered(index, run)
        self.aligner = Aligner(senders)
        self.store = make_store(stage, key_groups)
        self.dead = DeadLetters(index)
        self.sinks = Sinks(stage.name, stage.id, index, run, job=str(job), steps=stage.children)
        self.watermarks = Watermarks(self)
        self.steps = StepRunner(stage.name, self.sinks, self._exchange, self.watermarks.observe)
        self.cost = CostServer()
        self.meter = Metrics(job=job, operator=stage.name, index=index, window=window, report=False,
                             queued=lambda: len(self.inbox),
                             final=lambda: self.finishing or self.eos_sent or self.finished_at is not None,
                             dead_letters=lambda: self.dead.counts,
                             watermark=lambda: self.watermarks.reported())
        self.op = make_operator(self)
        self.owner = OwnerSide(self.store, self.aligner, index=index, merges=stage.merges_lazily,
                               send=self.send_control, apply=self._apply, spawn=self.tasks.spawn, lazy_step=lazy_step,
                               lazy_delay=lazy_delay, lazy_pace=lazy_pace, lazy_keys=lazy_keys,
                               settle=self.watermarks.settler)
        self._lazy_asked = lazy_asked
        self.source = Source(stage, index, self._emit, self.dead) if stage.is_source else None
        self.exchanges: dict = {}
        self.slots: dict[int, int] = {}
        self.siblings: list[Peer] = []
        # updates of a function (see Reconfigurable.prepare_update): epoch -> (path, func)
        self.updates, self.updated = {}, set()
        self.blocked: set[int] = set()          # senders past an update's marker
        self.deferred: collections.deque = collections.deque()
        self.ctl_deferred: collections.deque = collections.deque()   # siblings past a checkpoint
        self.combines = False
        self.ckpt = CheckpointSide(self)
        if self.source is not None:
            self.source.put_barrier = self._source_barrier

    # -- wiring and lifecycle -------------------------------------------------------------------
    async def connect(self, outputs: dict[int, list[tuple[str, str]]], tables: dict[int, RoutingTable],
                      exchanges: dict, siblings: list, report: bool = False, slots: dict | None = None,
                      bases: dict | None = None) -> str:
        """Channels to each downstream stage's instances (address, actor key) and to the
        siblings (address, actor key[, run]); ``slots``: this stage's input slot at each
        downstream stage that has several inputs (see ``Stage.sender``); ``bases``: how many
        routers its earlier inputs have (this instance's router is ``base + index`` there)."""
        from distributed import get_worker

        self.worker = get_worker()
        self.siblings = []
        await self.set_siblings(siblings)
        self.meter.report = report and self.store is not None
        self.slots = dict(slots or {})
        for target, peers in outputs.items():
            chans = {i: self._channel(a, k, target) for i, (a, k) in enumerate(peers)}
            self.exchanges[target] = make_exchange(exchanges[target], self.stage.name, chans, tables.get(target),
                                                   index=self.index, dead=self.dead, spawn=self.tasks.spawn,
                                                   lazy_asked=self._lazy_asked)
            self.exchanges[target].base = (bases or {}).get(target, 0)
        self.meter.routers = {t: x for t, x in self.exchanges.items() if isinstance(x, KeyedRouter)}
        self.status = "ready"
        return self.worker.address

    def _channel(self, address: str, key: str, target: int) -> OutChannel:
        sender = self.slots.get(target, 0) * SENDERS + self.index
        return OutChannel(Peer(self.worker, address, key), sender, self.credits, run=self.run,
                          label=self.label, on_blocked=self.meter.add_blocked, on_error=self._fail)

    async def start(self, epoch0: float | None = None, resume: dict | None = None) -> None:
        """Run; ``resume`` (a source replacing another): where that one's stream stopped."""
        self.started_at = time.time()
        self.status = "running"
        self.sinks.open_kafka()
        self.meter.start(self.worker, self.started_at)
        if resume:
            self.started_at, self.records_out = resume["started_at"], resume["records_out"]
            if resume.get("ended"):     # replaces a source that had ended: nothing to emit
                self.finished_at, self.eos_sent, self.status = resume["finished_at"], True, "done"
                self.source.ended_offsets = dict(resume["offsets"])
                return
        self.tasks.run(self.meter.ticker(), guarded=False)
        self.tasks.run(self._run_source(epoch0 or self.started_at, resume) if self.source else self._process_loop())

    def _fail(self, exc: BaseException) -> None:
        if self.status == "failed":
            return
        self.status = "failed"
        if not isinstance(exc, StreamlbError):
            exc = StreamlbError(f"instance {self.label} failed: {type(exc).__name__}: {exc}\n"
                                + "".join(traceback.format_exception(exc)))
        self.error = exc
        self.tasks.cancel()
        self.sinks.abort()

    async def stop(self) -> None:
        self.tasks.cancel()
        self.sinks.abort_kafka()        # what no checkpoint committed (of a done or retired one too)
        if self.status not in ("done", "failed", "retired"):
            self.status = "stopped"
            self.sinks.abort()

    async def _run_source(self, epoch0: float, resume: dict | None = None) -> None:
        if self.watermarks.clock is not None:
            self.tasks.run(self.watermarks.ticker())
        await self.source.run(epoch0, resume)
        self.source.exhausted = True        # barriers asked from now on: the source has ended
        if self.watermarks.clock is not None:
            await self.watermarks.source_tick()     # end of stream: +inf
        await self.source.put_barriers()
        await self._finish()

    async def _emit(self, batch: pd.DataFrame, emitted: float) -> None:
        n = len(batch)
        self.records_out += n
        t1 = time.perf_counter()
        self.meter.blocked = 0.0
        await self.steps.run(self.stage.children, batch, emitted)
        if self.watermarks.clock is not None:
            await self.watermarks.source_tick()
        self.meter.account(n, time.perf_counter() - t1 - self.meter.blocked, None)

    async def _exchange(self, target: int, x, emitted: float) -> None:
        await self.exchanges[target].send(x, emitted)

    def send_control(self, dest: int, msg):
        """Number ``msg`` for sibling ``dest`` now; the awaitable completes once applied there."""
        return self.siblings[dest].call("control", self.numbered.envelope(dest, msg))

    # -- receiving ----------------------------------------------------------------------------
    async def push(self, env: Envelope):
        """A message on the data lane; returns once processed, with this instance's cost
        sketches now and then (osg), else None."""
        await self._enqueue(self.inbox, env, "upstream sender")
        return self.op.reply(env.sender)

    async def control(self, env: Envelope) -> None:
        """A message from a sibling (state, partial aggregates, ends, barriers): applied
        ahead of the data, in the order the sibling numbered them; returns once applied."""
        if (self.status in (*ENDED, "retired") or self.closing) and isinstance(
                env.msg, (PeerEnd, CheckpointPeer, PeerWatermark)):
            return          # this one finishes (no sibling is waited for any more): nothing to apply
        if self.status in ENDED:
            # nothing reads the queue any more: say so rather than leave the sender waiting
            raise StreamlbError(f"instance {self.label} is {self.status}: it cannot take "
                                f"{env.msg.kind!r} from instance {env.sender} (message {env.seq}, run {env.run}; "
                                f"ends from siblings {sorted(self.peer_ends)} of {len(self.siblings)})")
        await self._enqueue(self.ctl, env, "sibling")

    async def _enqueue(self, inbox: Inbox, env: Envelope, what: str) -> None:
        """Queue what ``env`` carries in its sender's order; return once it was applied."""
        fut = asyncio.get_running_loop().create_future()
        if not inbox.put(env, (env.sender, env.msg, fut)):
            raise StreamlbError(f"instance {self.label} has no {what} {env.sender} (run {env.run})")
        self._wake.set()
        await fut

    async def _process_loop(self) -> None:
        while True:
            if self.ckpt.ready:
                await self.ckpt.flush()
            while not self.ctl and not self.inbox:
                if self.ckpt.ready:
                    await self.ckpt.flush()
                if self._can_finish():      # woken by an abort that took the last epoch waited for
                    return await self._finish()
                self._wake.clear()
                await self._wake.wait()
            # applying a batch rarely suspends: yield between batches, or RPC handlers (state
            # installs, key requests) and migration tasks wait until the queue runs dry
            await asyncio.sleep(0)
            if self.ctl:
                sender, msg, fut = self.ctl.popleft()
                if self.ckpt.peer_marks and self.ckpt.holds_peer(sender):    # past a checkpoint
                    self.ctl_deferred.append((sender, msg, fut))
                    continue
            else:
                sender, msg, fut = coalesce(self, *self.inbox.popleft())     # queued batches as one
                if (self.blocked or self.ckpt.blocking) and self.defers(sender):   # past a marker
                    self.deferred.append((sender, msg, fut))
                    continue
            held = False
            try:
                held = await self._dispatch(sender, msg, fut)
            finally:
                if not held and fut is not None and not fut.done():
                    fut.set_result(None)
            # the sender is released first: two owners finishing at once each wait for the
            # other to take their last message
            if self._can_finish():
                return await self._finish()

    async def _dispatch(self, sender: int, msg, fut) -> bool:
        """Apply one message; True when rows were held (the credit returns on release)."""
        if not isinstance(msg, Batch):
            self.cost.idle()
        match msg:
            case Batch():
                return await self._on_batch(sender, msg, fut)
            case Marker(epoch=epoch):
                if epoch in self.updates:       # its rows wait until every sender is past it
                    self.blocked.add(sender)
                self.aligner.marker(sender, epoch)
            case Checkpoint():
                self.ckpt.barrier(sender, msg)
            case EndOfStream():
                self.aligner.end(sender)
                await self.watermarks.inputs_changed()
                self._inputs_changed()
            case Watermark():
                await self.watermarks.on_message(sender, msg)
            case Install():
                await self.owner.install(msg)
            case InstallKeys():
                await self.owner.install_keys(msg)
            case Partial():
                await self.op.on_combine(msg)
            case PeerEnd(sender=sibling):
                self.peer_ends.add(sibling)
                self.ckpt.peers_changed()
                await self.watermarks.peers_changed()
            case PeerWatermark():
                await self.watermarks.on_peer(msg)
            case CheckpointPeer():
                self.ckpt.peer_mark(msg)
            case Barrier():     # its sender learns that every earlier message was applied
                pass
            case _:
                raise StreamlbError(f"instance {self.label} got an unknown message {type(msg).__name__}")
        return False

    def _inputs_changed(self) -> None:
        """A sender ended or was removed: once every sender has ended, finish."""
        if self.aligner.ended_all and not self.finishing:
            self.finishing = True
            if self.combines:      # numbered after every partial sent to each sibling
                for j in range(len(self.siblings)):
                    if j != self.index:
                        self.tasks.spawn(self.send_control(j, PeerEnd(self.index)))
            self._wake.set()

    async def _on_batch(self, sender: int, msg: Batch, fut) -> bool:
        frame, groups = (msg.frame if msg.arrived else self.op.arrive(msg.frame, sender)), msg.groups
        if msg.partials:
            self.records_in += await self.op.on_partials(msg.partials, msg.emitted)
            if not len(frame):
                return False
        frame, groups, held, firsts = self.owner.admit(frame, groups, msg.emitted, fut, sender, msg.need)
        if not held or len(frame):
            await self._apply(frame, groups, msg.emitted, firsts)
        return held

    async def _apply(self, frame, groups, emitted: float, firsts=None) -> None:
        await self.op.on_batch(frame, groups, emitted)
        self.records_in += records_of(frame)
        self.owner.applied(len(frame), firsts)

    def _can_finish(self) -> bool:
        """Every input ended, no state on its way, no partial aggregate still to come."""
        return (self.finishing and not self.owner.waiting and not self.owner.unarmed
                and (not self.combines or len(self.peer_ends) == len(self.siblings) - 1))

    async def _finish(self) -> None:
        self.closing = True         # the process loop is gone: the control lane is read no more
        await self.ckpt.flush()
        await self.tasks.join_spawned()
        await self.op.on_end()
        self.sinks.close()
        for ex in self.exchanges.values():
            await ex.end()
        self.eos_sent = True
        for ex in self.exchanges.values():
            await ex.drain()
        self.finished_at = time.time()
        self.meter.close_window(self.finished_at, last=True)
        self.status = "done"
        self.tasks.cancel()
        await self.ckpt.flush()     # a checkpoint that aligned meanwhile: of the final state
