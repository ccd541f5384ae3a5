"""Watermarks of one instance: made by a source's splits, combined over input channels,
fired into the operator and forwarded, in order with the data.

A source instance whose stage has ``with_watermark`` keeps, per split, the largest event
time it emitted (:class:`SplitClock`); its watermark is the minimum over its unfinished,
non-idle splits, minus ``delay``. Any other instance's watermark is the minimum over its
live (not ended), non-idle senders (Flink's and Spark's rule); an instance whose senders
are all idle is idle itself. Watermarks only rise. Each rise is given to the operator
first (windows fire) and then sent on every output channel as a
:class:`~._messages.Watermark`, behind the batches already sent.
"""
from __future__ import annotations

import asyncio
import time

import pandas as pd

from .._time import MAX_TIME, MIN_TIME, nulls, to_ns
from ._messages import PeerWatermark, Watermark


class SplitClock:
    """Event times emitted per split of one source instance (``spec``: the stage's
    ``watermark``: column, delay, idle_timeout, unit)."""

    def __init__(self, spec: dict, operator: str) -> None:
        self.column, self.unit = spec["column"], spec["unit"]
        self.delay, self.idle_timeout = spec["delay"], spec["idle_timeout"] / 1e9
        self.what = f"with_watermark({self.column!r}) of source {operator!r}"
        self.top: dict[str, int] = {}           # split -> largest event time emitted
        self.last: dict[str, float] = {}        # split -> when it last emitted (processing time)
        self.current = "_"                      # the split of the batch being emitted
        self.started = time.time()              # a split that never emitted is idle from then
        # a paced source: where it stands in its pace (the wall time, or the time its batch
        # going out was due, if earlier) when each split last emitted. Idleness counts in
        # pace: time the job holds the source back (a batch blocked on credits while a move
        # holds a join's rows, a loaded machine) is no idleness of the splits not sent
        # meanwhile; counted in wall time it made them idle, the watermark jumped to the
        # split sent and their next rows were late
        self.paced: dict[str, float] = {}

    def observe(self, frame: pd.DataFrame, dead) -> pd.DataFrame:
        """The watermark step: note the batch's event times; rows without one go to the
        dead letters (``dead(rows, reasons)``)."""
        if self.column not in frame.columns:
            from ..exceptions import SchemaError

            raise SchemaError(f"{self.what}: column {self.column!r} is not in the batch; columns: "
                              f"{', '.join(map(str, frame.columns))}")
        col = frame[self.column]
        bad = nulls(col)
        if bad is not None:
            dead(frame[bad], [f"event time {self.column!r} is null"] * int(bad.sum()))
            frame = frame[~bad]
            col = frame[self.column]
        if len(frame):
            arr = None if isinstance(col.dtype, pd.DatetimeTZDtype) else col.to_numpy()
            # the batch's largest time, converted alone (not the whole column)
            top = int(to_ns(arr.max(keepdims=True) if arr is not None and arr.dtype.kind in "Miu" else col,
                            self.unit, self.what).max())
            s = self.current
            self.top[s] = max(self.top.get(s, MIN_TIME), top)
        self.last[self.current] = time.time()
        return frame

    def quiet(self, split: str, now: float, pace: float | None = None) -> float:
        """Seconds ``split`` has emitted nothing: of wall time, or of the source's ``pace``
        (where it stands in it now; see ``paced``)."""
        if pace is None:
            return now - self.last.get(split, self.started)
        return pace - self.paced.get(split, self.last.get(split, self.started))

    def watermark(self, live: set[str], now: float, may_idle: bool = True,
                  waiting=frozenset(), pace: float | None = None) -> tuple[int, bool]:
        """``(watermark, idle)`` over the splits in ``live`` (unfinished). A split that has
        emitted nothing for ``idle_timeout`` (since the source started, if it never has) is
        idle and left out; unless not ``may_idle``: a source read as fast as the job takes
        it has rows ready in every unfinished split, and one that is slow to emit is held
        back by the job, not idle (its rows would be late once it emits again); nor is a
        split in ``waiting``, whose reader knows it has rows not handed out yet (a Kafka
        partition behind its broker's high watermark). ``waiting`` is a set, or a function
        giving it, called only when some split would go idle (not once per batch)."""
        stale = {s for s in live if may_idle and self.quiet(s, now, pace) > self.idle_timeout}
        if stale and callable(waiting):
            waiting = waiting()
        active = [s for s in live if s not in stale or s in waiting]
        if not live:
            return MAX_TIME, False
        if not active:
            return MIN_TIME, True
        low = min(self.top.get(s, MIN_TIME) for s in active)
        return (low - self.delay if low > MIN_TIME + self.delay else MIN_TIME), False


class Watermarks:
    """The watermark side of instance ``inst``."""

    def __init__(self, inst) -> None:
        self.inst = inst
        st = inst.stage
        self.clock = SplitClock(st.watermark, st.name) if st.is_source and st.watermark else None
        self.per_sender: dict[int, int] = {}
        self.idle_senders: set[int] = set()
        self.own = MIN_TIME                     # the minimum over this instance's inputs
        self.peers: dict[int, int] = {}         # sibling -> its own watermark (split keys)
        self.told = None                        # the last window-end step told the siblings
        self._telling: set = set()
        self.current = MIN_TIME                 # what fired here and was forwarded
        self.idle = False
        self.sent: tuple | None = None
        self.lock = asyncio.Lock()
        self.active = self.clock is not None    # any watermark seen or made here
        self.suspended = False                  # the job drains into a savepoint: event time stops here
        # migrations this instance takes part in: epoch -> (the watermark forwarded when it
        # began, when); nothing higher is forwarded until the epoch is recorded everywhere
        self.frozen: dict[int, tuple[int, float]] = {}

    # -- a source -------------------------------------------------------------------------------
    def observe(self, frame):
        self.clock.current = self.inst.source.split_now
        out = self.clock.observe(frame, lambda rows, why: self.inst.dead.add(self.inst.stage.name, rows, why))
        self.clock.paced[self.clock.current] = self._pace(time.time())
        return out

    def _pace(self, now: float) -> float:
        """Where the source stands in its pace: the wall time, or when the batch going out
        was due if that is earlier (the job holds the source back)."""
        due = self.inst.source.due
        return now if due is None else min(now, due)

    async def source_tick(self) -> None:
        """After a batch, or now and then: the source's watermark."""
        src = self.inst.source
        now = time.time()
        live = src.reader is not None and src.reader.live      # a source that waits for data
        wm, idle = self.clock.watermark(src.live_splits(), now, may_idle=bool(self.inst.stage.rate) or live,
                                        waiting=src.reader.waiting if live else frozenset(), pace=self._pace(now))
        await self._advance(wm, idle, now)

    async def ticker(self) -> None:
        """A source's idleness shows even when it emits nothing (counted from now: the
        source starts)."""
        self.clock.started = time.time()
        every = min(max(self.clock.idle_timeout / 4, 0.05), 1.0)
        while True:
            await asyncio.sleep(every)
            if not self.inst.source.sending:
                await self.source_tick()

    # -- any other instance ---------------------------------------------------------------------
    async def on_message(self, sender: int, msg: Watermark) -> None:
        self.active = True
        if msg.idle:
            self.idle_senders.add(sender)
        else:
            self.idle_senders.discard(sender)
            self.per_sender[sender] = max(self.per_sender.get(sender, MIN_TIME), msg.time)
        await self.inputs_changed(msg.made_at or None)

    async def inputs_changed(self, made_at: float | None = None) -> None:
        """A sender's watermark rose (made at ``made_at``), or it ended, was added or removed."""
        if not self.active:
            return
        al = self.inst.aligner
        # a sender at +inf has ended its stream (its end follows): like an ended one it
        # holds nothing back, and it does not carry idle senders to +inf with it
        live = [s for s in al.senders - al.ended if self.per_sender.get(s, MIN_TIME) < MAX_TIME]
        made_at = made_at or time.time()
        if not live:
            return await self._advance(MAX_TIME, False, made_at)
        active = [s for s in live if s not in self.idle_senders]
        if not active:
            return await self._advance(MIN_TIME, True, made_at)
        await self._advance(min(self.per_sender.get(s, MIN_TIME) for s in active), False, made_at)

    # -- split keys: a home waits for its helpers ------------------------------------------------
    def _gated(self) -> bool:
        return self.inst.siblings.combines and self.inst.stage.kind == "window"

    def _tell_peers(self) -> None:
        """Siblings that may be homes of keys this one helps with learn its own watermark
        each time it passes a window end (the only moments a home fires), behind the
        partial aggregates already sent them."""
        w = self.inst.stage.window
        step = MAX_TIME if self.own == MAX_TIME else (self.own - w["size"]) // w["slide"]
        if step == self.told:
            return
        self.told = step
        inst = self.inst
        for j in range(len(inst.siblings)):
            if j != inst.index:
                # numbered now, behind the partials sent; not waited for at the end (a
                # sibling that retires or finishes meanwhile takes it no more)
                msg = PeerWatermark(inst.index, int(self.own))
                task = asyncio.ensure_future(self._quietly(inst.send_control(j, msg)))
                self._telling.add(task)
                task.add_done_callback(self._telling.discard)

    @staticmethod
    async def _quietly(send) -> None:
        try:
            await send
        except Exception:       # the sibling is gone: it fires nothing any more
            pass

    def _effective(self) -> int:
        """What may fire here: the own watermark, or, with siblings that may help with
        split keys, the least of it and theirs (an ended sibling holds nothing back)."""
        if not self._gated():
            return self.own
        inst = self.inst
        peers = [self.peers.get(j, MIN_TIME) for j in range(len(inst.siblings))
                 if j != inst.index and j not in inst.siblings.ended]
        return min([self.own, *peers])

    async def on_peer(self, msg: PeerWatermark) -> None:
        self.peers[msg.sender] = max(self.peers.get(msg.sender, MIN_TIME), msg.time)
        await self._advance(MIN_TIME, self.idle, time.time())

    async def peers_changed(self) -> None:
        if self._gated() or self.peers:
            await self._advance(MIN_TIME, self.idle, time.time())

    # -- both -----------------------------------------------------------------------------------
    async def _advance(self, wm: int, idle: bool, made_at: float, refire: bool = False) -> None:
        """``refire``: give the operator the watermark again even if it did not rise (a
        store that held moving groups back fires them by it now)."""
        async with self.lock:
            if self.suspended:
                return
            if wm > self.own:
                self.own = wm
                if self._gated():
                    self._tell_peers()
            eff = self._effective()
            if eff > self.current or (refire and self.current > MIN_TIME):
                self.current = max(eff, self.current)
                await self.inst.op.on_watermark(self.current, made_at)
            self.idle = idle
            fwd = self._forwarded()
            state = (fwd, idle)
            if state != self.sent and (fwd > MIN_TIME or idle):
                self.sent = state
                msg = Watermark(int(fwd), idle, made_at)
                for ex in list(self.inst.exchanges.values()):
                    await ex.watermark(msg)

    def suspend(self) -> None:
        """The job drains into a savepoint (``Job.drain``): from now on nothing fires here on
        event time and no watermark is forwarded, so what is open (windows, timers, join
        rows) stays in the state the savepoint takes, for the job restored from it to fire."""
        self.suspended = True

    # -- migrations: what moves is emitted before the watermark passes it ----------------------
    def freeze(self, epoch: int) -> None:
        """A move of ``epoch`` involves this instance. Until it is recorded everywhere
        (:meth:`thaw`), the watermark forwarded stays where it is: an old owner has not fired
        the moving groups' windows or timers past it, and the new owner fires them, and applies
        the rows it held back, only once their state is in; forwarding past them would make
        what they emit late downstream (a window after a window, a process after a join)."""
        self.frozen.setdefault(epoch, (self.sent[0] if self.sent else MIN_TIME, time.time()))

    async def thaw(self, epoch: int) -> None:
        if self.frozen.pop(epoch, None) is not None:
            # the moved groups go by the watermark again: what they fire now (windows,
            # timers, join rows past any match) goes out before the watermark passes it
            await self._advance(MIN_TIME, self.idle, time.time(), refire=True)

    @property
    def settler(self):
        """:meth:`settle` for an operator whose moved-in groups can owe output on event time
        (windows, joins, process timers); None for the others, whose moves are done at once."""
        return self.settle if self.inst.stage.kind in ("window", "join", "process") else None

    async def settle(self) -> None:
        """Groups moved in are through: with event time in play, give the operator the
        watermark again (what they owe fires; the watermark forwarded stays frozen) and wait
        until what went out is applied downstream."""
        if not self.active:
            return
        await self._advance(MIN_TIME, self.idle, time.time(), refire=True)
        for ex in list(self.inst.exchanges.values()):
            await ex.drain()

    def _forwarded(self) -> int:
        if not self.frozen:
            return self.current
        from .. import config

        limit = config.seconds("migration.timeout")
        now = time.time()
        for e in [e for e, (_, t) in self.frozen.items() if now - t > limit]:
            del self.frozen[e]          # the epoch was never recorded (it failed): let go
        return min([self.current, *(w for w, _ in self.frozen.values())])

    def reported(self) -> int | None:
        """The watermark a load report carries (None: none yet)."""
        return None if not self.active or self.current == MIN_TIME else int(self.current)

    def status(self) -> dict | None:
        """What ``Job.watermarks()`` reports of this instance (None: no event time here):
        the watermark in ns (None before the first; int64's largest at end of stream)."""
        if not self.active:
            return None
        return {"watermark_ns": None if self.current == MIN_TIME else int(self.current), "idle": self.idle}
