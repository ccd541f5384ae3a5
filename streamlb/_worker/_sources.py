"""The source side of an instance: the runtime of the source seam, the same for every source.

A source stage's reader (a :class:`~streamlb._sources.SplitReader`, by the stage's kind, see
:mod:`streamlb._sources`) opens the instance's splits and hands out batches tagged by their
split. :class:`Source` does the rest: pacing at ``rate``, event-time replay, the flush a lazy
epoch asks for, pausing and handing over between two batches, checkpoint barriers, the
position of what was *emitted* per split (not read ahead), the watermark input, and the end
of its input when the job drains (:meth:`Source.end_input`: the stream stops where it is and
ends as a bounded one ends, at once or right after a savepoint's barrier).

Reading and slicing run in a thread one batch ahead, so Parquet decoding (which releases
the GIL) never stalls the worker's event loop, where every instance runs.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import numpy as np
import pandas as pd

from .._sources import Split, SplitReader, event_times, open_reader


class _Slice(NamedTuple):
    """What an event-time replay emitted once a batch is out: every row before ``until``,
    and of each split rows up to event time ``maxima[split]``."""

    until: float
    maxima: dict


class Source:
    """The source side of one instance. ``emit(batch, emitted)`` runs the stage's steps on a
    batch; the stage's reader is opened when the stream starts (:meth:`run`)."""

    def __init__(self, stage, index: int, emit: Callable[[pd.DataFrame, float], Awaitable[None]],
                 dead=None) -> None:
        self.stage, self.index, self.emit = stage, index, emit
        self.dead = dead                        # the instance's DeadLetters: what the reader could not decode
        self.reader: SplitReader | None = None
        self.ended_offsets: dict = {}           # offsets of a source this one replaced once ended
        self.gate = asyncio.Event()             # cleared: paused (the pause-and-resume baseline)
        self.gate.set()
        self.flush_due = asyncio.Event()        # send the rows already due now
        self.replaying = False
        self.epoch0 = 0.0
        # demand, for autoscaling: records/s the stream asks for where it is now (the
        # batch's rows over the time since the previous batch was due), and how far
        # behind its schedule the source is (seconds)
        self.offered_rate: float | None = None
        self.lag = 0.0
        self.due: float | None = None           # when the batch going out (or next) was due
        # what was emitted, for a replacement to go on from (see :meth:`position`)
        self.emitted: dict = {}                 # split -> its position after the rows emitted
        self.opened: collections.deque = collections.deque()    # splits a live reader opened itself
        self.rows = 0                           # rows in all
        self.max_times: dict[str, float] = {}   # split -> largest event time emitted (watermark input)
        self.replayed_until: float | None = None    # event time every slice before was emitted
        self.t0, self.sent = 0.0, 0
        self.parked = asyncio.Event()           # waiting at a closed gate, between two batches
        self.handing_over = asyncio.Event()     # a replacement takes over: stay parked for good
        self.handing_over.set()                 # (set: not handing over)
        # checkpoint barriers to put out between two batches: (id, full); ``put_barrier(id,
        # full)`` (the instance's) records the position and sends the barrier on
        self.barriers: list[tuple] = []
        self.barrier_due = asyncio.Event()
        self.put_barrier: Callable[..., Awaitable[None]] | None = None
        self.exhausted = False                  # every row emitted (what is asked now: ended)
        self.sending = False                    # a batch is on its way out (watermarks wait)
        self.split_now = "_"                    # the split of that batch ("_": several, a replay)
        self.checkpointed: dict[int, dict] = {}     # checkpoint id -> positions at its barrier
        # the job drains (see end_input): no row goes out once ``ending``; ``end_after``: the
        # path of the savepoint whose barrier is the last thing this source sends before its end
        self.ending = False
        self.end_after: str | None = None
        self.end_due = asyncio.Event()

    def ask_barrier(self, cid: int, full: bool, target: str | None = None) -> None:
        """Put checkpoint ``cid``'s barrier out before the next row leaves."""
        self.barriers.append((cid, full, target))
        self.barrier_due.set()

    async def put_barriers(self) -> None:
        """Send the barriers asked for (between two batches); after the barrier of the
        savepoint the input ends after (:meth:`end_input`), nothing more goes out."""
        self.barrier_due.clear()
        while self.barriers:
            cid, full, target = self.barriers.pop(0)
            await self.put_barrier(cid, full, target)
            if target is not None and target == self.end_after:
                self._end_now()

    def end_input(self, after: str | None = None) -> bool:
        """Stop reading where the stream is and end it as a bounded source's ends (the job
        drains): between two batches, at once (``after`` None), or right after the barrier of
        the savepoint written to ``after`` went out, so that no row goes out between that
        barrier and the end. What was emitted is the position a savepoint or a restore holds
        (a batch read ahead is dropped, read again by a restore). False: the stream had
        already ended or been told to."""
        if self.exhausted or self.ending:
            return False
        if after is None:
            self._end_now()
        else:
            self.end_after = after
        return True

    def _end_now(self) -> None:
        self.ending = True
        self.end_due.set()          # a paced source napping until its next batch wakes

    async def _nap(self, delay: float, barriers: bool) -> None:
        """Sleep ``delay`` seconds, or less if a flush (or, with ``barriers``, a barrier) is asked for."""
        waits = [asyncio.ensure_future(self.flush_due.wait()), asyncio.ensure_future(self.end_due.wait())]
        if barriers:
            waits.append(asyncio.ensure_future(self.barrier_due.wait()))
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    @property
    def offsets(self) -> dict:
        """What ``Job.offsets()`` reports: rows read so far per file."""
        return self.reader.offsets() if self.reader is not None else dict(self.ended_offsets)

    def position(self) -> dict:
        """Where the stream is, once parked: a replacement started with it emits exactly
        the rows this one has not. The splits' positions are saved as the reader says."""
        out = {"files": {}, "rows": self.rows, "replayed_until": self.replayed_until,
               "t0": self.t0, "sent": self.sent, "epoch0": self.epoch0}
        if self.reader is not None:
            out.update(self.reader.save([Split(s, p) for s, p in self.emitted.items()]))
        return out

    def live_splits(self) -> set[str]:
        """Splits not emitted to their end (a replay counts as one split, ``"_"``)."""
        if self.exhausted:
            return set()
        if self.reader is None or self.replaying:
            return {"_"}
        ended, read = self.reader.idle(), self.reader.offsets()
        return {s for s, p in self.emitted.items() if not (s in ended and p == read.get(s))}

    async def _out(self, batch, emitted: float, mark) -> None:
        """Emit ``batch`` of split ``mark`` (a replay's slice: of several)."""
        self.sending, self.split_now = True, mark if isinstance(mark, str) else "_"
        try:
            await self.emit(batch, emitted)
        finally:
            self.sending = False

    def watermark_input(self) -> dict[str, float]:
        """The largest event time emitted of each split (-inf before its first row; every
        split is there from when it was opened); empty without an event-time column."""
        return dict(self.max_times)

    async def run(self, epoch0: float, resume: dict | None = None) -> None:
        """Emit the stream; ``resume``: a :meth:`position` of the instance this one replaces."""
        st = self.stage
        self.epoch0 = epoch0
        self.reader = open_reader(st, self.index)
        self.replaying = bool(st.rate and st.event_time and st.time_range and st.time_range[1] > st.time_range[0])
        resume = resume or {}
        loop = asyncio.get_running_loop()
        thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"streamlb-read-{st.name}[{self.index}]")
        splits = await loop.run_in_executor(thread, self.reader.splits_at, resume)     # may ask a broker
        self.emitted = {s.split_id: s.position for s in splits}
        if st.event_time:
            self.max_times = dict.fromkeys(self.emitted, -np.inf)
        if self.replaying:      # every split is read again from its start, and sliced by time
            splits = self.reader.splits_at({})
            batches = self._replay_batches([s.split_id for s in splits], resume.get("replayed_until"))
        else:
            batches = self._polled()
        self.rows = resume.get("rows", 0)
        self.replayed_until = resume.get("replayed_until")
        per_instance = self.paced_rate()
        try:
            await loop.run_in_executor(thread, self.reader.add_splits, splits)
            await self.emit_all(loop, thread, iter(batches), per_instance, resume.get("t0"), resume.get("sent", 0))
        finally:
            self._drain_dead()
            thread.submit(self.reader.close)        # after the read in flight, if any
            thread.shutdown(wait=False)

    def _polled(self):
        """``(batch, None, split)`` as the reader hands them out (a live source's empty
        batches too: nothing has come yet; barriers and pauses are taken meanwhile).

        A live reader that opens splits itself (a watched directory's new files) does so
        in a poll that hands out an empty batch: the splits it holds that were not known
        are then registered (:meth:`_register_opened`), at the positions they were opened
        at, before the batch, so before any of their rows goes out."""
        known = set(self.emitted)
        while (b := self.reader.poll()) is not None:
            if self.reader.live and not len(b.frame):
                for s, p in self.reader.offsets().items():
                    if s not in known:
                        known.add(s)
                        self.opened.append(Split(s, p))
            yield b.frame, None, b.split_id

    def _register_opened(self) -> None:
        """Splits the reader opened while running join what was emitted (at their start)
        and the watermark input (at -inf), on the event loop, as if opened at the start."""
        while self.opened:
            s = self.opened.popleft()
            self.emitted[s.split_id] = s.position
            if self.stage.event_time:
                self.max_times[s.split_id] = -np.inf

    def _fetched(self, split: str):
        """The batches of one split (an event-time replay interleaves the splits itself)."""
        while (frame := self.reader.fetch(split)) is not None:
            yield frame

    def paced_rate(self) -> float | None:
        """Records/s this instance emits at with ``rate=`` (not replaying): its share of
        ``rate`` by the rows of its splits, so that the instances keep the job's rate
        together and finish together however unequal their files (an equal share would
        leave the instance with the larger files emitting alone, at half the rate, at the
        end)."""
        st = self.stage
        if not st.rate:
            return None
        mine = self.reader.total_rows()
        if not mine or not st.total_rows:
            return st.rate / st.parallelism
        return st.rate * mine / st.total_rows

    def _emitted(self, batch, mark) -> None:
        """``batch`` is out; ``mark``: the split it came from, if one."""
        self.rows += len(batch)
        if isinstance(mark, str):
            self.emitted[mark] = self.reader.advance(self.emitted[mark], len(batch), batch)
            if self.max_times and len(batch):
                top = float(event_times(batch[self.stage.event_time]).max())
                self.max_times[mark] = max(self.max_times[mark], top)

    def _replayed(self, mark: _Slice) -> None:
        self.replayed_until = mark.until
        for split, top in mark.maxima.items():
            self.max_times[split] = max(self.max_times.get(split, -np.inf), top)

    async def emit_all(self, loop, thread, batches, per_instance, t0: float | None = None, sent: int = 0) -> None:
        """Emit ``batches``, items ``(batch, due, mark)`` read in ``thread`` one ahead: at
        ``due`` (wall time; None: at ``per_instance`` records/s from ``t0``, or at once);
        ``mark`` is the batch's split, or a replay's :class:`_Slice`."""
        t0 = time.time() if t0 is None else t0
        self.t0 = t0
        last_due = self.epoch0 if self.replaying else t0
        ahead = loop.run_in_executor(thread, next, batches, None)
        while (item := await self._next(ahead)) is not None:
            ahead = loop.run_in_executor(thread, next, batches, None)
            batch, due, mark = item
            n = len(batch)
            if self.opened:
                self._register_opened()
            if self.reader is not None and self.reader.dead_letters:
                self._drain_dead()
            if self.barriers:
                await self.put_barriers()
            if self.ending:         # drained: the batch read ahead is not emitted
                return
            if not self.gate.is_set() or not self.handing_over.is_set():
                self.parked.set()
                await self.gate.wait()                  # a pause
                await self.handing_over.wait()          # a hand-over (never reopened once done)
                self.parked.clear()
            if due is None and per_instance:
                due = t0 + (sent + n) / per_instance
            if due is not None:
                if due > last_due:
                    self.offered_rate = n / (due - last_due)
                last_due = due
                self.lag = max(time.time() - due, 0.0)
                self.due = due
                whole = True            # nothing of this batch left yet
                while (delay := due - time.time()) > 0:
                    await self._nap(delay, whole)
                    if self.barriers and whole:     # before the batch: the position is exact
                        await self.put_barriers()
                    if self.ending:     # drained while it waited: the rest of the batch stays unread
                        return
                    if not self.flush_due.is_set():
                        continue        # slept the delay out, or a barrier went
                    # an epoch switched this router, asking for a flush: the rows already
                    # due go out now, so its new routing takes effect without waiting
                    # for the batch's end (no row leaves before its time)
                    self.flush_due.clear()
                    cut = self.rows_due(batch, t0, sent, per_instance)
                    if cut:
                        whole = False
                        await self._out(batch.iloc[:cut], time.time(), mark)
                        self._emitted(batch.iloc[:cut], mark)
                        batch, sent = batch.iloc[cut:].reset_index(drop=True), sent + cut
                        self.sent = sent
                emitted = due
            else:
                emitted = time.time()
                await asyncio.sleep(0)
                if self.ending:
                    return
            sent += len(batch)
            if len(batch):          # a flush may have sent every row already
                await self._out(batch, emitted, mark)
                self._emitted(batch, mark)
            self.sent = sent
            if self.replaying:
                self._replayed(mark)

    async def _next(self, ahead):
        """The batch read ahead. A live reader that has had none for a second waits for
        data: the job does not hold the source back meanwhile, so its splits' idleness
        counts in wall time again (``due`` None; see ``Watermarks._pace``)."""
        if not ahead.done() and self.reader is not None and self.reader.live:
            await asyncio.wait({ahead}, timeout=1.0)
            if not ahead.done():
                self.due = None
        return await ahead

    def completed(self, cid: int) -> None:
        """Checkpoint ``cid`` is complete: the reader may tell the source (Kafka: commit the
        offsets to the consumer group, for monitoring). Earlier ones are dropped."""
        positions = self.checkpointed.pop(cid, None)
        for c in [c for c in self.checkpointed if c < cid]:
            del self.checkpointed[c]
        if positions and self.reader is not None:
            self.reader.commit(positions)

    def _drain_dead(self) -> None:
        """Records the reader could not decode go to the dead letters, with its reasons."""
        if self.reader is None or not self.reader.dead_letters:
            return
        got, self.reader.dead_letters = self.reader.dead_letters, []
        if self.dead is not None:
            self.dead.add(self.stage.name, pd.DataFrame([r for r, _ in got]), [why for _, why in got])

    def rows_due(self, batch, t0: float, sent: int, per_instance: float) -> int:
        """How many of ``batch``'s first rows are due by now: by their event time mapped to
        wall time when replaying, else at ``per_instance`` records/s from ``t0``."""
        now = time.time()
        if self.replaying:
            walls = self._replay_wall(event_times(batch[self.stage.event_time]))
            return int(np.searchsorted(walls, now, side="right"))
        return int(min(max(np.floor((now - t0) * per_instance) - sent, 0), len(batch)))

    def _replay_wall(self, t):
        """Wall time at which event time ``t`` is replayed (``rate`` with ``event_time``)."""
        st = self.stage
        lo, hi = st.time_range
        return self.epoch0 + (t - lo) / (hi - lo) * (st.total_rows / st.rate)

    def _replay_batches(self, splits: list[str], start: float | None = None):
        """Replay on one clock shared by every instance: the event-time span of the whole log
        maps onto the wall time it takes at ``rate``. Each step takes, from every split, the
        rows of the next slice of event time (about ``batch_size`` rows for this instance)
        and emits them, ordered by event time, when the slice ends. Instances offset their
        slice boundaries by ``index / parallelism`` of a slice, so batches from different
        sources reach an operator spread out, not all at once."""
        st = self.stage
        col = st.event_time
        lo, hi = st.time_range
        wall = st.total_rows / st.rate                      # seconds the whole log takes
        per_slice = st.batch_size / (st.rate / st.parallelism)
        step = (hi - lo) * per_slice / wall                 # event time per slice
        heads = {s: self._fetched(s) for s in splits}
        bufs: dict[str, pd.DataFrame] = {}
        t = lo
        first = step * (1 + self.index) / st.parallelism     # the first slice is shorter
        if start is not None:       # a replacement: every slice before ``start`` was emitted
            _slice_until(heads, bufs, col, start, {})
            t = start
        while heads or bufs:
            t_end = t + (first if t == lo else step)
            maxima: dict[str, float] = {}
            parts = _slice_until(heads, bufs, col, t_end, maxima)
            if parts:
                chunk = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)
                if len(parts) > 1:
                    chunk = chunk.iloc[np.argsort(event_times(chunk[col]), kind="stable")].reset_index(drop=True)
                yield chunk, self._replay_wall(t_end), _Slice(t_end, maxima)
            t = t_end


def _slice_until(heads: dict, bufs: dict, col: str, t_end: float, maxima: dict) -> list[pd.DataFrame]:
    """From every split (its batch iterator in ``heads``, what is left of its current batch
    in ``bufs``), the rows before event time ``t_end``; exhausted splits are dropped.
    ``maxima`` gets the largest event time taken of each split."""
    parts = []
    for f in list(heads) + [f for f in bufs if f not in heads]:
        while True:
            buf = bufs.get(f)
            if buf is None or not len(buf):
                nxt = next(heads[f], None) if f in heads else None
                if nxt is None:
                    heads.pop(f, None)
                    bufs.pop(f, None)
                    break
                buf = bufs[f] = nxt
            times = event_times(buf[col])
            cut = int(np.searchsorted(times, t_end, side="left"))
            if cut:
                parts.append(buf.iloc[:cut])
                maxima[f] = max(maxima.get(f, -np.inf), float(times[:cut].max()))
            if cut < len(buf):
                bufs[f] = buf.iloc[cut:]
                break
            bufs[f] = buf.iloc[:0]
    return parts
