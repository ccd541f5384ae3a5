"""The operator instance: a Dask actor that runs one stage.

The actor is its RPC surface, its lifecycle (:mod:`._lifecycle`: one phase, one table of
transitions) and a dispatch over typed messages; the work is done by its parts, each given
what it needs: ``_channels``, ``_align``, ``_sources``, ``_steps``, ``_sinks``, ``_exchange``,
``_operators``, ``_metrics``, the owner side of migrations, ``_siblings`` (the control lane
between the instances of a stage), ``_epochs`` (the epoch protocol's commands), ``_reads``
(what the driver reads), ``_reconfig`` (a replacement's hand-over, a function switched at
an epoch) and ``_checkpoint`` (checkpoints). An RPC of a part is a one-line delegation
here: Dask calls an actor's methods by name. All data-path methods are ``async`` so they
run on the worker's event loop: an instance can call another one on the same worker
without the deadlock that synchronous actor methods (one shared thread) give.
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
from ._checkpoint import CheckpointSide
from ._coalesce import coalesce
from .._state._partials import records_of
from ._channels import Inbox, Numbered, OutChannel, Peer
from ._commands import Command, EndInput
from ._epochs import EpochParticipant
from ._exchange import KeyedRouter, make_exchange
from ._heap import keep_heap
from ._fence import fence
from ._lifecycle import Lifecycle, Phase
from ._messages import (Barrier, Batch, Checkpoint, CheckpointPeer, EndOfStream, Envelope, Install, InstallKeys,
                        Marker, Partial, PeerEnd, PeerWatermark, Watermark)
from ._metrics import CostServer, Metrics
from ._kinds import make_operator
from ._reads import Counts, Reads
from ._reconfig import Handover, Updates
from ._siblings import Siblings
from ._sinks import Sinks
from ._sources import Source
from ._steps import StepRunner
from ._tasks import Tasks
from ._watermarks import Watermarks

# phases in which nothing reads the control lane any more
_DEAF = (Phase.CLOSING, Phase.DRAINING, Phase.DONE, Phase.FAILED, Phase.STOPPED, Phase.RETIRED)


class Instance:
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
        self.life = Lifecycle(self.label)
        self.counts = Counts()
        self.tasks = Tasks(self._fail)
        self._wake = asyncio.Event()
        senders = upstream_instances if isinstance(upstream_instances, dict) else dict.fromkeys(
            range(upstream_instances), 0)
        self.inbox = Inbox(strict=True)      # data lane
        for j, r in senders.items():
            self.inbox.add_sender(j, r)
        self.ctl = Inbox(strict=True)        # control lane from siblings (see connect): ahead of the data
        self.siblings = Siblings(index, self.ctl, Numbered(index, run), splittable=stage.splittable,
                                 spawn=self.tasks.spawn)
        self.aligner = Aligner(senders)
        self.store = make_store(stage, key_groups)
        self.sinks = Sinks(stage.name, stage.id, index, run, job=str(job), steps=[*stage.children, *stage.late])
        self.dead = self.sinks.dead
        self.watermarks = Watermarks(self)
        self.steps = StepRunner(stage.name, self.sinks, self._exchange, self.watermarks.observe)
        self.cost = CostServer()
        self.meter = Metrics(job=job, operator=stage.name, index=index, window=window, report=False,
                             queued=lambda: len(self.inbox),
                             final=lambda: (self.finishing or self.life.phase is Phase.DRAINING
                                            or self.life.finished_at is not None),
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
        # the epoch protocol's commands (see command)
        self.participant = EpochParticipant(self.owner, self.watermarks, self.exchanges, self.source, self.inbox,
                                            self.store, life=self.life, finishing=lambda: self.finishing,
                                            wake=self._wake.set)
        self.blocked: set[int] = set()          # senders past an update's marker
        self.deferred: collections.deque = collections.deque()
        self.ctl_deferred: collections.deque = collections.deque()   # siblings past a checkpoint
        self.updates = Updates(stage, self.store, self.aligner, self.life, hold=self.blocked.add,
                               release=self._updated)
        self.handover = Handover(self.label, self.life, self.counts, store=self.store, key_groups=key_groups,
                                 source=self.source, exchanges=self.exchanges, inbox=self.inbox, ctl=self.ctl,
                                 owner=self.owner, peer=self._peer)
        self.ckpt = CheckpointSide(stage, index, run, self.label, store=self.store, key_groups=key_groups,
                                   aligner=self.aligner, siblings=self.siblings, life=self.life, counts=self.counts,
                                   exchanges=self.exchanges, sinks=self.sinks, dead=self.dead, source=self.source,
                                   owner=self.owner, spawn=self.tasks.spawn, wake=self._wake.set,
                                   release=self.release_deferred)
        self.reads = Reads(stage, self.life, self.counts, store=self.store, sinks=self.sinks, dead=self.dead,
                           source=self.source, watermarks=self.watermarks, meter=self.meter, owner=self.owner)
        if self.source is not None:
            self.source.put_barrier = self.ckpt.source_barrier

    # -- the lifecycle (see _lifecycle) ---------------------------------------------------------
    @property
    def status(self) -> str:
        """created, ready, running, then done, failed, stopped or retired."""
        return self.life.status

    @property
    def finishing(self) -> bool:
        """Every input ended (a source's never do: its stream ends instead)."""
        return self.source is None and self.life.phase.inputs_ended

    async def connect(self, outputs: dict[int, list[tuple[str, str]]], tables: dict[int, RoutingTable],
                      exchanges: dict, siblings: list, report: bool = False, slots: dict | None = None,
                      bases: dict | None = None) -> str:
        """Channels to each downstream stage's instances (address, actor key) and to the
        siblings (address, actor key[, run]); ``slots``: this stage's input slot at each
        downstream stage that has several inputs (see ``Stage.sender``); ``bases``: how many
        routers its earlier inputs have (this instance's router is ``base + index`` there)."""
        from distributed import get_worker

        self.worker = get_worker()
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
        self.life.move_to(Phase.READY)
        return self.worker.address

    def _peer(self, address: str, key: str) -> Peer:
        return Peer(self.worker, address, key)

    def _channel(self, address: str, key: str, target: int) -> OutChannel:
        sender = self.slots.get(target, 0) * SENDERS + self.index
        return OutChannel(self._peer(address, key), sender, self.credits, run=self.run,
                          label=self.label, on_blocked=self.meter.add_blocked, on_error=self._fail)

    async def start(self, epoch0: float | None = None, resume: dict | None = None) -> None:
        """Run; ``resume`` (a source replacing another): where that one's stream stopped."""
        life = self.life
        life.started_at = time.time()
        life.move_to(Phase.RUNNING)
        self.sinks.open()
        self.meter.start(self.worker, life.started_at)
        if resume:
            life.started_at, self.counts.records_out = resume["started_at"], resume["records_out"]
            if resume.get("ended"):     # replaces a source that had ended: nothing to emit
                life.finished_at = resume["finished_at"]
                life.move_to(Phase.DONE)
                self.source.ended_offsets = dict(resume["offsets"])
                return
        self.tasks.run(self.meter.ticker(), guarded=False)
        self.tasks.run(fence(self, self.worker, self.stop), guarded=False)
        self.tasks.run(self._run_source(epoch0 or life.started_at, resume) if self.source else self._process_loop())
        self._inputs_changed()      # every sender was removed before it started

    def _fail(self, exc: BaseException) -> None:
        if self.life.phase in (Phase.FAILED, Phase.STOPPED):    # (a send cut short by the stop)
            return
        self.life.move_to(Phase.FAILED)
        if not isinstance(exc, StreamlbError):
            exc = StreamlbError(f"instance {self.label} failed: {type(exc).__name__}: {exc}\n"
                                + "".join(traceback.format_exception(exc)))
        self.life.error = exc
        self.ckpt.failed(exc)
        self.tasks.cancel()
        self.sinks.abort()

    async def stop(self) -> None:
        self.tasks.cancel(spawned=True)
        self.sinks.abort()        # what no checkpoint committed (of a done or retired one too)
        if self.life.may(Phase.STOPPED):
            self.life.move_to(Phase.STOPPED)
        self._hush()

    def _hush(self) -> None:
        """A stopped instance sends nothing more and keeps no sender waiting. The driver frees
        the actors of a stopped job once every instance answered ``stop``: a message still
        on its way then would reach a worker after the actor it is for was freed, which the
        worker logs as an error. So what this one has in flight that is not on the wire yet
        is given up, and what others sent it, queued or arriving, is refused at once."""
        for ex in self.exchanges.values():
            for ch in list(ex.chans.values()):
                ch.cancel()
        refused = StreamlbError(f"instance {self.label} was stopped")
        self.inbox.refuse_waiting(refused)
        self.ctl.refuse_waiting(refused)

    async def retire(self, timeout: float, outputs: str = "linger") -> dict:
        """No router sends here any more: finish what is queued, flush the outputs, close
        the sinks; the last poll (with this instance's metrics rows) is returned, and under
        ``"outputs"`` what the sinks hold that no checkpoint committed yet: ``"linger"``,
        whether any of it waits for the next checkpoint (``Sinks.linger``); ``"hand_off"``,
        what it is, for the instance that takes this index (``Sinks.hand_off``)."""
        await self.handover.until_quiet(timeout, "retire")
        await self.tasks.join_spawned()
        for ex in self.exchanges.values():
            await ex.drain()
        self.sinks.close()
        kept = self.sinks.hand_off() if outputs == "hand_off" else self.sinks.linger()
        self.life.finished_at = time.time()
        self.meter.close_window(self.life.finished_at, last=True)
        self.life.move_to(Phase.RETIRED)
        self.tasks.cancel()
        out = self.reads.status_row()
        out["metrics"] = self.reads.metrics()
        out["final"] = self.ckpt.seal(-1)     # a checkpointed job commits these with its next checkpoint
        out["outputs"] = kept
        return out

    async def _run_source(self, epoch0: float, resume: dict | None = None) -> None:
        if self.watermarks.clock is not None:
            self.tasks.run(self.watermarks.ticker())
        await self.source.run(epoch0, resume)
        self.source.exhausted = True        # barriers asked from now on: the source has ended
        if self.watermarks.clock is not None:
            await self.watermarks.source_tick()     # end of stream: +inf
        await self.source.put_barriers()
        await self._finish()

    def _inputs_changed(self) -> None:
        """A sender ended or was removed: once every sender has ended, finish."""
        if self.aligner.ended_all and self.life.phase is Phase.RUNNING and self.source is None:
            self.life.move_to(Phase.FINISHING)
            if self.siblings.combines:      # numbered after every partial sent to each sibling
                self.siblings.tell(PeerEnd(self.index))
            self._wake.set()

    def _can_finish(self) -> bool:
        """Every input ended, no state on its way, no partial aggregate still to come."""
        return (self.life.phase is Phase.FINISHING and not self.owner.waiting and not self.owner.unarmed
                and (not self.siblings.combines or self.siblings.all_ended()))

    async def _finish(self) -> None:
        self.life.move_to(Phase.CLOSING)    # the process loop is gone: the control lane is read no more
        await self.ckpt.flush()
        await self.tasks.join_spawned()
        if not self.watermarks.suspended:   # drained into a savepoint: what is open stays in it
            await self.op.on_end()
        self.sinks.close()
        for ex in self.exchanges.values():
            await ex.end()
        self.life.move_to(Phase.DRAINING)
        for ex in self.exchanges.values():
            await ex.drain()
        self.life.finished_at = time.time()
        self.meter.close_window(self.life.finished_at, last=True)
        self.life.move_to(Phase.DONE)
        self.tasks.cancel()
        await self.ckpt.flush()     # a checkpoint that aligned meanwhile: of the final state

    # -- sending --------------------------------------------------------------------------------
    async def _emit(self, batch: pd.DataFrame, emitted: float) -> None:
        n = len(batch)
        self.counts.records_out += n
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
        return self.siblings.send(dest, msg)

    # -- receiving ----------------------------------------------------------------------------
    async def push(self, env: Envelope):
        """A message on the data lane; returns once processed, with this instance's cost
        sketches now and then (osg), else None."""
        if self.life.phase is Phase.STOPPED:        # the job let it go: nothing reads the data lane any more
            # (a failed one keeps its senders waiting instead: the job fails with its error, not theirs)
            raise StreamlbError(f"instance {self.label} is stopped: it takes no more data "
                                f"(from sender {env.sender}, message {env.seq})")
        await self._enqueue(self.inbox, env, "upstream sender")
        return self.op.reply(env.sender)

    async def control(self, env: Envelope) -> None:
        """A message from a sibling (state, partial aggregates, ends, barriers): applied
        ahead of the data, in the order the sibling numbered them; returns once applied."""
        phase = self.life.phase
        if phase in _DEAF and isinstance(env.msg, (PeerEnd, CheckpointPeer, PeerWatermark)):
            return          # this one finishes (no sibling is waited for any more): nothing to apply
        if phase in (Phase.DONE, Phase.FAILED, Phase.STOPPED):
            # nothing reads the queue any more: say so rather than leave the sender waiting
            raise StreamlbError(f"instance {self.label} is {self.status}: it cannot take "
                                f"{env.msg.kind!r} from instance {env.sender} (message {env.seq}, run {env.run}; "
                                f"ends from siblings {sorted(self.siblings.ended)} of {len(self.siblings)})")
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
                self.updates.marker(sender, epoch)      # its rows wait if the epoch switches a function
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
                self.siblings.ended.add(sibling)
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

    async def _on_batch(self, sender: int, msg: Batch, fut) -> bool:
        frame, groups = (msg.frame if msg.arrived else self.op.arrive(msg.frame, sender)), msg.groups
        if msg.partials:
            self.counts.records_in += await self.op.on_partials(msg.partials, msg.emitted)
            if not len(frame):
                return False
        frame, groups, held, firsts = self.owner.admit(frame, groups, msg.emitted, fut, sender, msg.need)
        if not held or len(frame):
            await self._apply(frame, groups, msg.emitted, firsts)
        return held

    async def _apply(self, frame, groups, emitted: float, firsts=None) -> None:
        await self.op.on_batch(frame, groups, emitted)
        self.counts.records_in += records_of(frame)
        self.owner.applied(len(frame), firsts)

    def defers(self, sender: int) -> bool:
        """Whether what ``sender`` sent waits: for an update to switch (it sent the marker),
        or for a checkpoint to be taken here (it sent the barrier)."""
        return sender in self.blocked or self.ckpt.holds(sender)

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

    def _updated(self) -> None:
        """A function switched: the senders it held go on."""
        self.blocked.clear()
        self.release_deferred()

    # -- the epoch protocol (see _epochs) ---------------------------------------------------------
    async def command(self, cmd: Command):
        """A call of the epoch protocol (:mod:`._commands`), from the coordinator or a router,
        or the driver's :class:`~._commands.EndInput` to a source; answers what the command
        answers."""
        if isinstance(cmd, EndInput):       # the source's own, not the epoch protocol's
            return self._end_input(cmd)
        return await self.participant.handle(cmd)

    def _end_input(self, cmd: EndInput) -> bool:
        """The job drains: a source's stream ends where it is (see ``Source.end_input``);
        into a savepoint, event time stops here as well (``Watermarks.suspend``)."""
        if self.life.phase in (Phase.FAILED, Phase.STOPPED, Phase.RETIRED):
            return False
        if cmd.after is not None:
            self.watermarks.suspend()
        if self.source is None:
            return cmd.after is not None
        return self.source.end_input(cmd.after)

    # -- wiring, while it runs ----------------------------------------------------------------------
    async def set_siblings(self, siblings: list) -> None:
        """The instances of this stage, by index: ``(address, actor key[, run])``. A new or
        replaced sibling is numbered from 0 on the control lane, both ways."""
        self.siblings.set(self.worker, siblings, self.finishing)
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

    # -- a replacement, a new function (see _reconfig) ----------------------------------------------
    async def hand_over(self, address: str, key: str, timeout: float) -> int:
        return await self.handover.hand_over(address, key, timeout)

    async def hand_over_source(self, timeout: float) -> dict | None:
        return await self.handover.hand_over_source(timeout)

    async def take_over(self, blob) -> None:
        self.handover.take_over(blob)

    async def hand_off_outputs(self) -> dict:
        """A retired instance whose index is taken again: what its sinks hold that no
        checkpoint committed, for the new instance to write (its own is aborted)."""
        return self.sinks.hand_off()

    async def adopt_outputs(self, handed: dict) -> None:
        """Before this instance starts: write what the one it replaces handed off."""
        self.sinks.adopt(handed)

    async def commit_outputs(self) -> None:
        """The job finished: a retired instance commits what waited for a checkpoint."""
        self.sinks.commit_all()

    async def prepare_update(self, epoch: int, path: tuple, func) -> None:
        self.updates.prepare(epoch, path, func)

    async def set_function(self, path: tuple, func) -> None:
        self.updates.switch_now(path, func)

    async def update_done(self, epoch: int, wait: float) -> bool:
        return await self.updates.wait_done(epoch, wait)

    # -- checkpoints (see _checkpoint) ----------------------------------------------------------
    async def checkpointing(self, url: str, compression: str | None = None) -> None:
        self.ckpt.checkpointing(url, compression)

    async def checkpoint(self, cid: int, full: bool = False, target: str | None = None) -> None:
        self.ckpt.source_checkpoint(cid, full, target)

    async def await_checkpoint(self, cid: int, full: bool, timeout: float, target: str | None = None) -> dict:
        return await self.ckpt.acknowledgement(cid, full, timeout, target)

    async def forget_checkpoint(self, cid: int, complete: bool = True) -> None:
        """Checkpoint ``cid`` is done with (see ``CheckpointSide.forget``); returns once the
        sinks' commits are. A commit that fails fails the instance (the driver does not
        await this call: the failure reaches it as the instance's)."""
        try:
            for commit in self.ckpt.forget(cid, complete):
                await asyncio.wrap_future(commit)
        except Exception as exc:
            self._fail(exc)
            raise

    async def restore(self, base: str, manifest: dict, groups: list[int]) -> int:
        return await self.ckpt.restore(base, manifest, groups)

    async def take_final(self) -> dict | None:
        return self.ckpt.take_final()

    def checkpoint_status(self, cid: int) -> dict:
        """Where checkpoint ``cid`` stands here (what a coordinator logs when it is stuck)."""
        return {"instance": self.label, "status": self.status, **self.ckpt.status(cid),
                "queued": len(self.inbox), "deferred": len(self.deferred), "ctl_deferred": len(self.ctl_deferred),
                "phase": self.life.phase.name, "finishing": self.finishing, "can_finish": self._can_finish(),
                "spawned": [repr(t.get_coro())[:90] for t in self.tasks.spawned],
                "main": [(repr(t.get_coro())[:60], t.done()) for t in self.tasks.main],
                "owner_waiting": self.owner.waiting, "unarmed": bool(self.owner.unarmed)}

    # -- what the driver reads (see _reads) ---------------------------------------------------------
    async def settled(self, hold: float) -> str:
        """Wait up to ``hold`` seconds while the instance runs; its status then. The driver
        waiting for a job asks this between polls (outside its topology lock), so an
        instance that ends is seen at once rather than at the next poll interval."""
        return await self.life.settled(hold)

    async def poll(self) -> dict:
        """Status and figures (``Reads.status_row``), taken on the event loop: a synchronous
        actor method runs in Dask's actor thread, where taking the sinks' lists raced the
        loop appending to them (an output appended between the copy and the swap was lost)."""
        return self.reads.status_row()

    def metrics(self) -> list[dict]:
        return self.reads.metrics()

    def key_kind(self) -> str | None:
        return self.reads.key_kind()

    def state_size(self) -> int:
        return self.reads.state_size()

    async def state_estimate(self, groups: list[int] | None = None) -> dict:
        """On the event loop, as every use of the store (a RocksDB one flushes to count)."""
        return self.reads.state_estimate(groups)

    async def state(self, groups: list[int] | None = None, nbytes: int | None = None) -> pd.DataFrame:
        return await self.reads.state(groups, nbytes)
