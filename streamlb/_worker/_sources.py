"""Sources: read a stage's Parquet files (or items), pace them at ``rate``, replay event time.

Reading and slicing run in a thread one batch ahead, so Parquet decoding (which releases
the GIL) never stalls the worker's event loop, where every instance runs.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pandas as pd

from ..exceptions import PipelineError


class Source:
    """The source side of one instance. ``emit(batch, emitted)`` runs the stage's steps on a
    batch; ``offsets`` (file -> rows read) is shared with the instance's poll."""

    def __init__(self, stage, index: int, emit: Callable[[pd.DataFrame, float], Awaitable[None]]) -> None:
        self.stage, self.index, self.emit = stage, index, emit
        self.offsets: dict[str, int] = {}
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
        # what was emitted, for a replacement to go on from (see :meth:`position`)
        self.emitted: dict[str, int] = {}       # rows per file (files read in order)
        self.rows = 0                           # rows in all (iterable sources)
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

    def ask_barrier(self, cid: int, full: bool, target: str | None = None) -> None:
        """Put checkpoint ``cid``'s barrier out before the next row leaves."""
        self.barriers.append((cid, full, target))
        self.barrier_due.set()

    async def put_barriers(self) -> None:
        """Send the barriers asked for (between two batches)."""
        self.barrier_due.clear()
        while self.barriers:
            await self.put_barrier(*self.barriers.pop(0))

    async def _nap(self, delay: float, barriers: bool) -> None:
        """Sleep ``delay`` seconds, or less if a flush (or, with ``barriers``, a barrier) is asked for."""
        waits = [asyncio.ensure_future(self.flush_due.wait())]
        if barriers:
            waits.append(asyncio.ensure_future(self.barrier_due.wait()))
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def position(self) -> dict:
        """Where the stream is, once parked: a replacement started with it emits exactly
        the rows this one has not."""
        return {"files": dict(self.emitted), "rows": self.rows, "replayed_until": self.replayed_until,
                "t0": self.t0, "sent": self.sent, "epoch0": self.epoch0}

    async def run(self, epoch0: float, resume: dict | None = None) -> None:
        """Emit the stream; ``resume``: a :meth:`position` of the instance this one replaces."""
        st = self.stage
        self.epoch0 = epoch0
        per_instance = self.paced_rate()
        self.replaying = bool(st.rate and st.event_time and st.time_range and st.time_range[1] > st.time_range[0])
        resume = resume or {}
        if self.replaying:
            batches = self._replay_batches(resume.get("replayed_until"))
        else:
            batches = ((b, None, f) for b, f in self._source_batches(resume.get("files", {}), resume.get("rows", 0)))
        self.emitted = dict(resume.get("files", {}))
        self.rows = resume.get("rows", 0)
        self.replayed_until = resume.get("replayed_until")
        loop = asyncio.get_running_loop()
        reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"streamlb-read-{st.name}[{self.index}]")
        try:
            await self.emit_all(loop, reader, iter(batches), per_instance, resume.get("t0"), resume.get("sent", 0))
        finally:
            reader.shutdown(wait=False, cancel_futures=True)

    def paced_rate(self) -> float | None:
        """Records/s this instance emits at with ``rate=`` (not replaying): its share of
        ``rate`` by the rows of its files, so that the instances keep the job's rate
        together and finish together however unequal their files (an equal share would
        leave the instance with the larger files emitting alone, at half the rate, at the
        end)."""
        st = self.stage
        if not st.rate:
            return None
        mine = sum(st.file_rows.get(f, 0) for f in st.assignment[self.index]) if st.assignment else 0
        if not mine or not st.total_rows:
            return st.rate / st.parallelism
        return st.rate * mine / st.total_rows

    def _emitted(self, batch, mark) -> None:
        self.rows += len(batch)
        if isinstance(mark, str):
            self.emitted[mark] = self.emitted.get(mark, 0) + len(batch)

    async def emit_all(self, loop, reader, batches, per_instance, t0: float | None = None, sent: int = 0) -> None:
        t0 = time.time() if t0 is None else t0
        self.t0 = t0
        last_due = self.epoch0 if self.replaying else t0
        ahead = loop.run_in_executor(reader, next, batches, None)
        while (item := await ahead) is not None:
            ahead = loop.run_in_executor(reader, next, batches, None)
            batch, due, mark = item
            n = len(batch)
            if self.barriers:
                await self.put_barriers()
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
                whole = True            # nothing of this batch left yet
                while (delay := due - time.time()) > 0:
                    await self._nap(delay, whole)
                    if self.barriers and whole:     # before the batch: the position is exact
                        await self.put_barriers()
                    if not self.flush_due.is_set():
                        continue        # slept the delay out, or a barrier went
                    # an epoch switched this router, asking for a flush: the rows already
                    # due go out now, so its new routing takes effect without waiting
                    # for the batch's end (no row leaves before its time)
                    self.flush_due.clear()
                    cut = self.rows_due(batch, t0, sent, per_instance)
                    if cut:
                        whole = False
                        await self.emit(batch.iloc[:cut], time.time())
                        self._emitted(batch.iloc[:cut], mark)
                        batch, sent = batch.iloc[cut:].reset_index(drop=True), sent + cut
                        self.sent = sent
                emitted = due
            else:
                emitted = time.time()
                await asyncio.sleep(0)
            sent += len(batch)
            if len(batch):          # a flush may have sent every row already
                await self.emit(batch, emitted)
                self._emitted(batch, mark)
            self.sent = sent
            if self.replaying:
                self.replayed_until = mark

    def rows_due(self, batch, t0: float, sent: int, per_instance: float) -> int:
        """How many of ``batch``'s first rows are due by now: by their event time mapped to
        wall time when replaying, else at ``per_instance`` records/s from ``t0``."""
        now = time.time()
        if self.replaying:
            walls = self._replay_wall(_times(batch[self.stage.event_time]))
            return int(np.searchsorted(walls, now, side="right"))
        return int(min(max(np.floor((now - t0) * per_instance) - sent, 0), len(batch)))

    def _replay_wall(self, t):
        """Wall time at which event time ``t`` is replayed (``rate`` with ``event_time``)."""
        st = self.stage
        lo, hi = st.time_range
        return self.epoch0 + (t - lo) / (hi - lo) * (st.total_rows / st.rate)

    def _replay_batches(self, start: float | None = None):
        """Replay on one clock shared by every instance: the event-time span of the whole log
        maps onto the wall time it takes at ``rate``. Each step takes, from every owned file,
        the rows of the next slice of event time (about ``batch_size`` rows for this
        instance) and emits them, ordered by event time, when the slice ends. Instances
        offset their slice boundaries by ``index / parallelism`` of a slice, so batches from
        different sources reach an operator spread out, not all at once."""
        st = self.stage
        col = st.event_time
        lo, hi = st.time_range
        wall = st.total_rows / st.rate                      # seconds the whole log takes
        per_slice = st.batch_size / (st.rate / st.parallelism)
        step = (hi - lo) * per_slice / wall                 # event time per slice
        heads = {f: iter(self._file_batches(f)) for f in st.assignment[self.index]}
        bufs: dict[str, pd.DataFrame] = {}
        t = lo
        first = step * (1 + self.index) / st.parallelism     # the first slice is shorter
        if start is not None:       # a replacement: every slice before ``start`` was emitted
            _slice_until(heads, bufs, col, start)
            t = start
        while heads or bufs:
            t_end = t + (first if t == lo else step)
            parts = _slice_until(heads, bufs, col, t_end)
            if parts:
                chunk = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)
                if len(parts) > 1:
                    chunk = chunk.iloc[np.argsort(_times(chunk[col]), kind="stable")].reset_index(drop=True)
                yield chunk, self._replay_wall(t_end), t_end
            t = t_end

    def _file_batches(self, f: str):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(f)
        for rb in pf.iter_batches(batch_size=self.stage.batch_size, columns=self.stage.columns, use_threads=False):
            df = rb.to_pandas(use_threads=False)
            self.offsets[f] = self.offsets.get(f, 0) + len(df)
            yield df

    def _source_batches(self, skip: dict | None = None, skip_rows: int = 0):
        """``(batch, file)`` in the order they are emitted (``file`` None for items);
        ``skip``/``skip_rows``: rows a replaced instance already emitted, per file / in all."""
        st = self.stage
        skip = skip or {}
        if st.kind == "iterable_source":
            for df in iterable_batches(st.items, st.batch_size, st.name):
                if skip_rows >= len(df):
                    skip_rows -= len(df)
                    continue
                yield (df.iloc[skip_rows:].reset_index(drop=True) if skip_rows else df), None
                skip_rows = 0
            return
        import pyarrow.parquet as pq

        # Like a consumer of several log partitions, read all owned files at once: next from
        # the file furthest behind in proportion, so files that cover the same time span
        # advance through it together (each file is still read in order).
        # With an event-time column, the file whose next batch starts earliest goes first.
        readers, total, ahead = {}, {}, {}
        for f in st.assignment[self.index]:
            pf = pq.ParquetFile(f)
            total[f] = max(pf.metadata.num_rows, 1)
            readers[f] = _skipping(pf.iter_batches(batch_size=st.batch_size, columns=st.columns,
                                                   use_threads=False), skip.get(f, 0))
            self.offsets[f] = skip.get(f, 0)
        while readers or ahead:
            for f in [f for f in readers if f not in ahead]:
                rb = next(readers[f], None)
                if rb is None:
                    del readers[f]
                else:
                    ahead[f] = rb.to_pandas(use_threads=False)
            if not ahead:
                break
            if st.event_time:
                f = min(ahead, key=lambda name: (_as_seconds(ahead[name][st.event_time].iloc[0]), name))
            else:
                f = min(ahead, key=lambda name: (self.offsets[name] / total[name], name))
            df = ahead.pop(f)
            self.offsets[f] += len(df)
            yield df, f


def _skipping(batches, rows: int):
    """Record batches without their first ``rows`` rows."""
    for rb in batches:
        if rows >= rb.num_rows:
            rows -= rb.num_rows
            continue
        yield rb.slice(rows) if rows else rb
        rows = 0


def _slice_until(heads: dict, bufs: dict, col: str, t_end: float) -> list[pd.DataFrame]:
    """From every file (its batch iterator in ``heads``, what is left of its current batch
    in ``bufs``), the rows before event time ``t_end``; exhausted files are dropped."""
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
            times = _times(buf[col])
            cut = int(np.searchsorted(times, t_end, side="left"))
            if cut:
                parts.append(buf.iloc[:cut])
            if cut < len(buf):
                bufs[f] = buf.iloc[cut:]
                break
            bufs[f] = buf.iloc[:0]
    return parts


def _times(col: pd.Series) -> np.ndarray:
    """An event-time column as float seconds."""
    arr = col.to_numpy()
    if arr.dtype.kind == "M":
        return arr.astype("datetime64[ns]").astype(np.int64) / 1e9
    return arr.astype(np.float64)


def _as_seconds(v) -> float:
    return pd.Timestamp(v).value / 1e9 if not isinstance(v, (int, float, np.number)) else float(v)


def iterable_batches(items, batch_size: int, name: str):
    """Turn the items of ``Stream.from_iterable`` into DataFrame batches."""
    pending: list = []
    for i, item in enumerate(items):
        if isinstance(item, pd.DataFrame):
            if pending:
                yield pd.DataFrame.from_records(pending)
                pending = []
            yield item
        elif isinstance(item, dict):
            pending.append(item)
            if len(pending) >= batch_size:
                yield pd.DataFrame.from_records(pending)
                pending = []
        else:
            raise PipelineError(
                f"{name}: item {i} is a {type(item).__name__} ({item!r:.80}); items must be "
                "dicts (one record each) or pandas DataFrames (one batch each)"
            )
    if pending:
        yield pd.DataFrame.from_records(pending)
