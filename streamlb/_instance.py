"""The operator instance: a Dask actor that runs one stage.

All data-path methods are ``async`` so they run on the worker's event loop: an instance can
call another one on the same worker without the deadlock that synchronous actor methods (one
shared thread) would give. Batches move worker to worker with ``actor_execute`` RPCs; each
channel keeps at most ``credits`` batches in flight and numbers them, and the receiver
restores per-channel FIFO order.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import time
import traceback

import numpy as np
import pandas as pd

from . import _shuffle, _state, config
from . import latency as _latency
from .hotkeys import SpaceSaving
from .exceptions import PipelineError, StreamlbError, UserFunctionError
from .keygroups import assign_to_key_group
from .nodes import describe
from .planner import Stage, Step
from .routing import RoutingTable


class _Peer:
    """Address of another instance; calls go straight to its worker."""

    def __init__(self, worker, address: str, key: str) -> None:
        self.worker, self.address, self.key = worker, address, key

    async def call(self, method: str, *args):
        from distributed.protocol import to_serialize

        if self.address == self.worker.address:
            obj = self.worker.state.actors[self.key]
            return await getattr(obj, method)(*args)
        resp = await self.worker.rpc(self.address).actor_execute(
            function=method, actor=self.key, args=[to_serialize(a) for a in args], kwargs={}
        )
        if resp["status"] != "OK":
            raise resp["exception"]
        return resp["result"]


class _Channel:
    """Sender side of one channel: sequence numbers and a credit window."""

    def __init__(self, peer: _Peer, sender: int, credits: int, owner: "Instance") -> None:
        self.peer, self.sender, self.credits, self.owner = peer, sender, credits, owner
        self.sem = asyncio.Semaphore(credits)
        self.seq = 0
        self.tasks: set = set()

    async def send(self, kind: str, emitted: float, frame, done=None) -> None:
        """Send once a credit is free; ``done(reply)`` runs when the receiver has processed it."""
        t0 = time.perf_counter()
        await self.sem.acquire()
        self.owner._blocked += time.perf_counter() - t0
        seq, self.seq = self.seq, self.seq + 1
        task = asyncio.ensure_future(self._do(seq, kind, emitted, frame, done))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _do(self, seq, kind, emitted, frame, done=None) -> None:
        try:
            reply = await self.peer.call("push", self.sender, seq, kind, emitted, frame)
            if done is not None:
                done(reply)
        except Exception as exc:  # the receiver or its worker is gone: the job cannot go on
            self.owner._fail(StreamlbError(
                f"instance {self.owner.label} could not send to {self.peer.key} on "
                f"{self.peer.address}: {type(exc).__name__}: {exc}"
            ))
        finally:
            self.sem.release()

    async def drain(self) -> None:
        for _ in range(self.credits):
            await self.sem.acquire()
        for _ in range(self.credits):
            self.sem.release()


class _Migration:
    """What one epoch moves, as seen by one owner."""

    def __init__(self, epoch: int, strategy: str) -> None:
        self.epoch = epoch
        self.strategy = strategy
        self.outgoing: dict[int, int] = {}     # key group -> new owner
        self.incoming: dict[int, int] = {}     # key group -> old owner
        self.aligned = False
        self.sent: set[int] = set()
        self.installed: set[int] = set()
        self.flush_to: set[int] = set()        # split keys leaving this helper: their homes
        self.flushed = False
        self.key_requests: list[tuple] = []    # lazy, old owner: key requests before alignment
        self.pulled = asyncio.Event()          # lazy, old owner: a key request was served
        # lazy, new owner: per (router, old owner), how many of the router's key requests
        # have been served in a row from the first (and those served out of order)
        self.served: dict[tuple[int, int], int] = {}
        self.served_early: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
        self.applied_while_waiting = 0
        self.first_applied: float | None = None      # first held row of a moved group applied
        self.aligned_at: float | None = None         # old owner: markers from every router
        self.installed_at: float | None = None       # new owner: the last incoming group installed

    def serve(self, router: int, old: int, request: int) -> None:
        """Key request ``request`` of ``router`` to ``old`` is installed here."""
        early = self.served_early[(router, old)]
        early.add(request)
        n = self.served.get((router, old), 0)
        while n + 1 in early:
            early.discard(n + 1)
            n += 1
        self.served[(router, old)] = n

    def ready(self, router: int, need: dict) -> bool:
        """Whether every key request ``router`` had sent by a batch (``need``: old owner ->
        requests) is installed: then each key of that batch has its state here, or none."""
        return all(self.served.get((router, o), 0) >= n for o, n in need.items())

    def lazy_rows(self, groups: np.ndarray, pending: dict) -> np.ndarray:
        """Rows of ``groups`` whose state this (lazy) epoch is still bringing."""
        mine = [g for g, m in pending.items() if m is self]
        return np.isin(groups, np.asarray(mine, np.int64)) if mine else np.zeros(len(groups), bool)


class _Prefetch:
    """Router side of a lazy epoch: as the rows of moving key groups leave for their new
    owners, ask the old owners for those keys' state, once per key, and number the
    requests per (old owner, new owner); each batch to a new owner carries the counts so
    far, so the new owner knows which requests cover its keys."""

    def __init__(self, epoch: int, old: dict, key_groups: int, new_owners) -> None:
        self.epoch = epoch
        self.old = np.full(key_groups, -1, np.int64)
        self.old[np.fromiter(old, np.int64, len(old))] = np.fromiter(old.values(), np.int64, len(old))
        self.new_owners = {int(o) for o in new_owners}
        self.asked = _state.KeySet()
        self.sent: dict[tuple[int, int], int] = collections.defaultdict(int)

    def tag(self, dest: int):
        """What a batch to ``dest`` needs: (epoch, old owner -> requests sent), or None."""
        if dest not in self.new_owners:
            return None
        return self.epoch, {o: n for (o, d), n in self.sent.items() if d == dest}


class _Held:
    """Rows of key groups whose state has not arrived yet, with their batch's credit and,
    for a lazy epoch, what the batch needs (epoch, router, old owner -> requests)."""

    __slots__ = ("frame", "groups", "emitted", "fut", "need")

    def __init__(self, frame, groups, emitted, fut, need=None) -> None:
        self.frame, self.groups, self.emitted, self.fut, self.need = frame, groups, emitted, fut, need


class _Window:
    def __init__(self, start: float) -> None:
        self.start = start
        self.records = 0
        self.split_records = 0      # of them, rows of split keys aggregated for their home
        self.busy = 0.0
        self.lat: list[float] = []
        self.weights: list[int] = []


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


class Instance:
    """One parallel instance of a stage."""

    def __init__(self, stage: Stage, index: int, upstream_instances: int, *, job: str,
                 key_groups: int, window: float, credits: int, lazy_step: int = 1,
                 lazy_delay: float = 0.1, lazy_asked: int = 1 << 17, lazy_pace: float = 1.0) -> None:
        self.stage = stage
        self.index = index
        self.job = job
        self.key_groups = key_groups
        self.window = window
        self.credits = credits
        self.label = f"{stage.name}[{index}]"
        self._lazy_step = lazy_step
        self._lazy_delay = lazy_delay
        self._lazy_pace = max(0.0, float(lazy_pace))
        self._lazy_asked = max(1, int(lazy_asked))
        self.upstream_instances = upstream_instances
        self.status = "created"
        self.error: BaseException | None = None
        self.started_at = self.finished_at = None
        self.records_in = 0
        self.records_out = 0
        self.offsets: dict[str, int] = {}
        self._in: dict[int, dict] = collections.defaultdict(dict)
        self._next: dict[int, int] = collections.defaultdict(int)
        self._ready: collections.deque = collections.deque()
        # emulated cost (``cost=``): when the last batch's service ends, if another waited
        self._served_until: float | None = None
        self._flush_due = asyncio.Event()   # a source: send the rows already due now
        self._ctl: collections.deque = collections.deque()     # state installs: before data, in order
        # state sent between owners: numbered per (sender, receiver), installed in that order
        self._state_seq: dict[int, int] = collections.defaultdict(int)
        self._ctl_next: dict[int, int] = collections.defaultdict(int)
        self._ctl_early: dict[int, dict] = collections.defaultdict(dict)
        self._list_out: dict[int, list] = collections.defaultdict(list)
        self._dead: list[dict] = []
        self._writers: dict[str, object] = {}
        self._written: dict[str, str] = {}
        self._blocked = 0.0
        self._rows: list[dict] = []
        self._win: _Window | None = None
        self._tasks: list = []
        # epoch protocol (see docs/migration.md)
        self._eos_from: set[int] = set()
        self._eos_sent = False
        self._eos_sent_to: set[int] = set()
        self._marks: dict[int, set[int]] = collections.defaultdict(set)
        self._migs: dict[int, _Migration] = {}
        self._pending_in: dict[int, _Migration] = {}     # key group -> migration bringing it
        # lazy into a terminal aggregate: incoming key group -> migration whose old state
        # will be merged in; its rows are applied at once meanwhile
        self._merging: dict[int, _Migration] = {}
        self._held: list[_Held] = []
        self._done_epochs: set[int] = set()
        self._done_events: dict[int, asyncio.Event] = {}     # epochs a coordinator waits for
        self._finishing = False
        self._mig_tasks: set = set()
        # split keys: partial aggregates go to the key's home; the home finishes only once
        # every sibling said it sends no more (``peer_eos``)
        self._peer_eos: set[int] = set()
        self._spread_at: dict[int, dict] = collections.defaultdict(dict)   # target -> rows per split key
        shuffle = stage.shuffle or {}
        self._sketch = _shuffle.CostSketch() if shuffle.get("policy") == "osg" else None
        self._sketch_sent: dict[int, float] = {}
        if stage.kind == "aggregate":
            self.store = _state.AggregateState(stage.name, stage.spec, stage.key_name, key_groups)
        elif stage.kind == "stateful_map":
            self.store = _state.StatefulMapState(stage.name, stage.func, stage.key_name, key_groups)
        else:
            self.store = None

    # -- wiring -------------------------------------------------------------------------
    async def connect(self, outputs: dict[int, list[tuple[str, str]]], tables: dict[int, RoutingTable],
                      exchanges: dict, siblings: list[tuple[str, str]],
                      report: bool = False) -> str:
        from distributed import get_worker

        self.worker = get_worker()
        self.siblings = [_Peer(self.worker, a, k) for a, k in siblings]
        # in a balanced job, keyed owners report their load each window and routers the
        # records they sent per key group
        self._report = report and self.store is not None
        self._route_counts: dict[int, np.ndarray] = {
            t: np.zeros(key_groups_, np.int64)
            for t, x in exchanges.items() if t in outputs and x.balanced and x.keyed
            for key_groups_ in [self.key_groups]
        }
        self._route_sent: dict[int, np.ndarray] = {}
        self._xlocks = collections.defaultdict(asyncio.Lock)
        self._prefetch: dict[int, _Prefetch | None] = {}
        self._combines = self.stage.kind == "aggregate" and len(self.siblings) > 1
        # exchange[6]: counters of the heavy-hitter sketch, for balancers that split keys
        self._hot = {t: SpaceSaving(int(x.hot_keys))
                     for t, x in exchanges.items() if t in outputs and x.hot_keys and x.keyed}
        self._gate = asyncio.Event()
        self._gate.set()
        self.outputs = {
            sid: [_Channel(_Peer(self.worker, a, k), self.index, self.credits, self) for a, k in peers]
            for sid, peers in outputs.items()
        }
        self.tables = tables
        self.exchanges = exchanges     # stage id -> ExchangeSpec
        self._shufflers = {
            t: _shuffle.ShuffleRouter(x.shuffle["policy"], len(outputs[t]), x.shuffle["feature"], x.shuffle["group"])
            for t, x in exchanges.items() if t in outputs and x.kind == "round_robin"
        }
        self._wake = asyncio.Event()
        self.status = "ready"
        return self.worker.address

    async def start(self, epoch0: float | None = None) -> None:
        self.started_at = time.time()
        self._epoch0 = epoch0 or self.started_at
        self.status = "running"
        self._win = _Window(self._window_start(self.started_at))
        self._tasks.append(asyncio.ensure_future(self._ticker()))
        body = self._run_source() if self.stage.is_source else self._process_loop()
        self._tasks.append(asyncio.ensure_future(self._guard(body)))

    async def _guard(self, coro) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.status == "failed":
            return
        self.status = "failed"
        if not isinstance(exc, StreamlbError):
            exc = StreamlbError(
                f"instance {self.label} failed: {type(exc).__name__}: {exc}\n"
                + "".join(traceback.format_exception(exc))
            )
        self.error = exc
        for t in self._tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self._abort_writers()

    # -- sources --------------------------------------------------------------------------
    async def _run_source(self) -> None:
        st = self.stage
        per_instance = st.rate / st.parallelism if st.rate else None
        replay = bool(st.rate and st.event_time and st.time_range and st.time_range[1] > st.time_range[0])
        self._replaying = replay
        if replay:
            batches = self._replay_batches()
        else:
            batches = ((b, None) for b in self._source_batches())
        # read and slice in a thread, one batch ahead: Parquet decoding (which releases the
        # GIL) then never stalls this worker's event loop, where every instance runs
        loop = asyncio.get_running_loop()
        reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"streamlb-read-{self.label}")
        try:
            await self._emit_all(loop, reader, iter(batches), per_instance)
        finally:
            reader.shutdown(wait=False, cancel_futures=True)
        await self._finish()

    async def _emit_all(self, loop, reader, batches, per_instance) -> None:
        t0 = time.time()
        sent = 0
        ahead = loop.run_in_executor(reader, next, batches, None)
        while (item := await ahead) is not None:
            ahead = loop.run_in_executor(reader, next, batches, None)
            batch, due = item
            n = len(batch)
            if not self._gate.is_set():
                await self._gate.wait()
            if due is None and per_instance:
                due = t0 + (sent + n) / per_instance
            if due is not None:
                while (delay := due - time.time()) > 0:
                    try:
                        await asyncio.wait_for(self._flush_due.wait(), delay)
                    except asyncio.TimeoutError:
                        break
                    # an epoch switched this router, asking for a flush: the rows already
                    # due go out now, so its new routing takes effect without waiting
                    # for the batch's end (no row leaves before its time)
                    self._flush_due.clear()
                    cut = self._rows_due(batch, t0, sent, per_instance)
                    if cut:
                        await self._emit(batch.iloc[:cut], time.time())
                        batch, sent = batch.iloc[cut:].reset_index(drop=True), sent + cut
                emitted = due
            else:
                emitted = time.time()
                await asyncio.sleep(0)
            sent += len(batch)
            if len(batch):          # a flush may have sent every row already
                await self._emit(batch, emitted)

    async def _emit(self, batch, emitted: float) -> None:
        n = len(batch)
        self.records_out += n
        t1 = time.perf_counter()
        self._blocked = 0.0
        await self._run_steps(self.stage.children, batch, emitted)
        self._account(n, time.perf_counter() - t1 - self._blocked, None)

    def _rows_due(self, batch, t0: float, sent: int, per_instance: float) -> int:
        """How many of ``batch``'s first rows are due by now: by their event time mapped to
        wall time when replaying, else at ``per_instance`` records/s from ``t0``."""
        now = time.time()
        st = self.stage
        if self._replaying:
            walls = self._replay_wall(_times(batch[st.event_time]))
            return int(np.searchsorted(walls, now, side="right"))
        return int(min(max(np.floor((now - t0) * per_instance) - sent, 0), len(batch)))

    def _replay_wall(self, t):
        """Wall time at which event time ``t`` is replayed (``rate`` with ``event_time``)."""
        st = self.stage
        lo, hi = st.time_range
        return self._epoch0 + (t - lo) / (hi - lo) * (st.total_rows / st.rate)

    def _replay_batches(self):
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
        while heads or bufs:
            t_end = t + (first if t == lo else step)
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
            if parts:
                chunk = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)
                if len(parts) > 1:
                    chunk = chunk.iloc[np.argsort(_times(chunk[col]), kind="stable")].reset_index(drop=True)
                yield chunk, self._replay_wall(t_end)
            t = t_end

    def _file_batches(self, f: str):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(f)
        for rb in pf.iter_batches(batch_size=self.stage.batch_size, columns=self.stage.columns, use_threads=False):
            df = rb.to_pandas(use_threads=False)
            self.offsets[f] = self.offsets.get(f, 0) + len(df)
            yield df

    def _source_batches(self):
        st = self.stage
        if st.kind == "iterable_source":
            yield from _iterable_batches(st.items, st.batch_size, st.name)
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
            readers[f] = pf.iter_batches(batch_size=st.batch_size, columns=st.columns, use_threads=False)
            self.offsets[f] = 0
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
            yield df

    # -- receivers ------------------------------------------------------------------------
    def _in_order(self, early: dict, nexts: dict, src: int, seq: int, item: tuple, out) -> None:
        """Put ``item`` (the ``seq``-th from ``src``) on ``out`` once every earlier one is."""
        early[seq] = item
        nxt = nexts[src]
        while nxt in early:
            out.append(early.pop(nxt))
            nxt += 1
        nexts[src] = nxt
        self._wake.set()

    async def push(self, sender: int, seq: int, kind: str, emitted: float, frame):
        """A batch (or marker, end of stream) from ``sender``; returns once processed, with
        this instance's cost sketches now and then (``osg``), else None."""
        fut = asyncio.get_running_loop().create_future()
        self._in_order(self._in[sender], self._next, sender, seq, (sender, kind, emitted, frame, fut), self._ready)
        await fut
        if self._sketch is not None and time.time() - self._sketch_sent.get(sender, 0.0) > 0.05:
            self._sketch_sent[sender] = time.time()
            return self._sketch.snapshot()       # osg: what records cost here, for the router
        return None

    async def _process_loop(self) -> None:
        while True:
            while not self._ready and not self._ctl:
                if self._can_finish():
                    # woken by an abort that took the last epoch this owner waited for
                    await self._finish()
                    return
                self._wake.clear()
                await self._wake.wait()
            # applying a batch rarely suspends: yield between batches, or RPC handlers (state
            # installs, key requests) and migration tasks wait until the queue runs dry
            await asyncio.sleep(0)
            sender, kind, emitted, frame, fut = (self._ctl or self._ready).popleft()
            held = False
            if kind not in ("data", "tagged", "mixed"):
                self._served_until = None       # service resumes after this, not before
            try:
                if kind == "data":
                    held = await self._apply(frame, emitted, fut)
                elif kind == "tagged":          # a batch routed in a lazy epoch
                    held = await self._apply(frame[0], emitted, fut, need=(sender, frame[1]))
                elif kind == "mixed":
                    own, partials, tag = frame
                    await self._apply_partials(partials, emitted)
                    need = (sender, tag) if tag is not None else None
                    held = await self._apply(own, emitted, fut, need=need) if len(own) else False
                elif kind == "combine":
                    await self._combine(*frame)
                elif kind == "peer_eos":
                    self._peer_eos.add(frame)
                elif kind == "marker":
                    self._marks[frame].add(sender)
                    self._check_alignment()
                elif kind == "install":
                    await self._install(*frame)
                elif kind == "install_keys":
                    await self._install_keys(*frame)
                elif kind == "eos":
                    self._eos_from.add(sender)
                    self._check_alignment()
                    if len(self._eos_from) == self.upstream_instances:
                        self._finishing = True
                        self._tell_peers_eos()
            finally:
                if not held and fut is not None and not fut.done():
                    fut.set_result(None)
            # the item's sender is released first: two owners finishing at once each wait
            # for the other to take their last message
            if self._can_finish():
                await self._finish()
                return

    async def _apply(self, frame, emitted, fut=None, groups=None, release=False, need=None) -> bool:
        """Apply a batch; rows of key groups whose state is still on its way are held back
        (with ``lazy``, only until the key requests the batch's router had sent by then are
        installed: ``need`` is (router, (epoch, old owner -> requests))). ``release``: rows
        being let out of the hold.

        Returns True when rows were held: the batch's credit returns once they are applied.
        """
        st = self.stage
        held = False
        merged_into = None
        if self._merging and len(frame) and not release:
            # the first row of a merging epoch's groups applied here is its first moved record
            firsts = [m for m in {id(m): m for m in self._merging.values()}.values() if m.first_applied is None]
            if firsts:
                if groups is None:
                    groups = assign_to_key_group(frame[st.key_name].to_numpy(), self.key_groups, name=st.key_name)
                merged_into = [m for m in firsts
                               if np.isin(groups, np.fromiter(m.incoming, np.int64, len(m.incoming))).any()]
        if self._pending_in and len(frame) and not release:
            if groups is None:
                groups = assign_to_key_group(frame[st.key_name].to_numpy(), self.key_groups, name=st.key_name)
            wait = np.isin(groups, np.fromiter(self._pending_in, np.int64, len(self._pending_in)))
            hold_need = None
            if wait.any() and need is not None:
                router, (epoch, counts) = need
                m = self._migs.get(epoch)
                if m is not None and m.strategy == "lazy":
                    if not m.ready(router, counts):
                        hold_need = (epoch, router, counts)
                    elif (lazy := wait & m.lazy_rows(groups, self._pending_in)).any():
                        wait &= ~lazy                  # their keys' state (or none) is here
                        if m.first_applied is None:
                            m.first_applied = time.time()
            if wait.any():
                self._held.append(_Held(frame[wait], groups[wait], emitted, fut, hold_need))
                frame, groups = frame[~wait], groups[~wait]
                held = True
                if not len(frame):
                    return True
        n = len(frame)
        self._blocked = 0.0
        t1 = time.perf_counter()
        if st.kind == "aggregate":
            frame, bad = self.store.clean(frame)
            if bad:
                self._dead_letter(st.name, *bad)
                groups = None                       # rows went to the dead letters
            touched = self.store.update(frame, groups)
            out = self.store.frame(touched) if st.children else None
        elif st.kind == "stateful_map":
            outs = self.store.update(frame)
            out = pd.DataFrame({st.key_name: frame[st.key_name].to_numpy(), "output": outs}) if st.children else None
        elif self._sketch is not None and n:
            await self._apply_by_feature(frame, emitted)
            self.records_in += n
            return held
        else:
            out = frame
        t1 = await self._emulate_cost(self._cost_of(frame, n), t1)
        applied = time.time()
        if out is not None:
            await self._run_steps(st.children, out, emitted)
        self.records_in += n
        if merged_into:
            for m in merged_into:       # rows of moved groups applied here, their old state to come
                m.first_applied = m.first_applied or time.time()
        if self._pending_in or self._merging:
            # records applied while this owner waits for state
            for m in {id(m): m for m in [*self._pending_in.values(), *self._merging.values()]}.values():
                m.applied_while_waiting += n
        self._account(n, time.perf_counter() - t1 - self._blocked, (applied - emitted) * 1e3)
        return held

    async def _emulate_cost(self, seconds: float, t1: float, more: bool = False) -> float:
        """Wait out a batch's emulated service time (real work done counts towards it).

        The instance is a server of fixed capacity, 1 / cost records per second: a batch
        that was already queued when the one before it was served starts its service then,
        not when the event loop gets round to it, so the lateness of a shared loop (other
        instances, routers) is not charged to this instance as service time. ``more``: the
        caller has more of the same batch to serve right after. Returns when the service
        began, from which the batch's busy time counts."""
        if seconds <= 0:
            return t1
        start = t1 if self._served_until is None else min(self._served_until, t1)
        end = start + seconds
        await asyncio.sleep(max(end - time.perf_counter(), 0.0))
        self._served_until = end if (more or self._ready) else None
        return start

    # -- split keys ------------------------------------------------------------------------------
    async def _apply_partials(self, partials: list, emitted: float) -> None:
        """Helper: aggregate the rows of split keys routed here, ``[(home, rows)...]``, and
        send each home its partial aggregate. Nothing is kept here, so the key's state
        stays whole at its home, and so does what the home emits."""
        st = self.stage
        self._blocked = 0.0
        t1 = time.perf_counter()
        n, secs = 0, 0.0
        for home, rows in partials:
            rows, bad = self.store.clean(rows)
            if bad:
                self._dead_letter(st.name, *bad)
            if len(rows):
                n += len(rows)
                secs += self._cost_of(rows, len(rows))
                self._spawn(self._send_state(home, "combine", (self.store.partial(rows), emitted)))
        t1 = await self._emulate_cost(secs, t1)
        self.records_in += n
        self._account(n, time.perf_counter() - t1 - self._blocked, (time.time() - emitted) * 1e3, split=n)

    async def _combine(self, blob: dict, emitted: float) -> None:
        """Home: merge a helper's partial aggregate and emit the keys' whole values."""
        touched = self.store.combine(blob)
        if self.stage.children:
            await self._run_steps(self.stage.children, self.store.frame(touched), emitted)

    def _tell_peers_eos(self) -> None:
        if self._combines:
            for j in range(len(self.siblings)):
                if j != self.index:     # numbered after every partial sent to j
                    self._spawn(self._send_state(j, "peer_eos", self.index))

    def _can_finish(self) -> bool:
        """End of stream from every router, no state on its way, and (split keys) no
        partial aggregate still to come from a sibling."""
        return (self._finishing and not self._pending_in and not self._merging
                and (not self._combines or len(self._peer_eos) == len(self.siblings) - 1))

    async def _flush(self, m: "_Migration", barriers: list) -> None:
        """A split key leaves this helper: once every partial sent to its home before the
        switch is merged there (installs are in order: a barrier behind them, which the
        home's loop takes as a no-op), the epoch is through here."""
        await asyncio.gather(*barriers)
        m.flushed = True
        self._maybe_done(m)

    async def _apply_by_feature(self, frame, emitted: float) -> None:
        """osg: run the stage on each feature value's rows in turn, timing each, so the
        sketches learn what a record of each value costs."""
        st = self.stage
        values = _shuffle.features(frame, st.shuffle["feature"], st.name)
        codes, uniques = pd.factorize(values, sort=False, use_na_sentinel=False)   # NaN is a value too
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(codes, minlength=len(uniques)))))
        secs = np.zeros(len(uniques))
        for u in range(len(uniques)):
            part = frame.iloc[order[bounds[u]:bounds[u + 1]]]
            t1 = time.perf_counter()
            self._blocked = 0.0
            t1 = await self._emulate_cost(self._cost_of(part, len(part)), t1, more=u + 1 < len(uniques))
            applied = time.time()
            await self._run_steps(st.children, part, emitted)
            busy = time.perf_counter() - t1 - self._blocked
            secs[u] = busy
            self._account(len(part), busy, (applied - emitted) * 1e3)
        self._sketch.add(uniques, secs, np.diff(bounds).astype(np.float64))

    def _cost_of(self, frame, n: int) -> float:
        cost = self.stage.cost
        if cost is None or not n:
            return 0.0
        if isinstance(cost, float):
            return cost * n
        try:
            return float(np.nansum(pd.to_numeric(frame[cost], errors="coerce").to_numpy(np.float64)))
        except KeyError:
            raise PipelineError(
                f"operator {self.stage.name!r}: cost column {cost!r} is not in the batch; "
                f"columns are {list(frame.columns)}"
            ) from None

    # -- epoch protocol: routers --------------------------------------------------------------
    async def set_table(self, target: int, table: RoutingTable, prefetch: dict | None = None,
                        flush: bool = False) -> float:
        """Switch to ``table`` at a batch boundary and put marker(epoch) on every channel;
        returns when the switch happened (wall clock).

        ``prefetch`` (lazy epochs): key group -> old owner. Routing rows of those groups to
        their new owners, this router also asks the old owners for their keys' state, so it
        travels while the rows do. ``flush``: the moved rows are applied on arrival (lazy by
        merging), so a source feeding this router sends the rows already due at once
        rather than at the end of its batch."""
        if prefetch is None and self._only_adds_helpers(target, table):
            # nobody waits for this epoch's marker, and a batch routes by the table it read
            # when it began: switch now, not after a batch stalled on credits
            self.tables[target] = table
            return time.time()
        async with self._xlocks[target]:
            self.tables[target] = table
            switched = time.time()
            self._prefetch[target] = _Prefetch(
                table.epoch, {int(g): int(o) for g, o in prefetch.items()}, self.key_groups,
                table.owners[np.fromiter(prefetch, np.int64, len(prefetch))].tolist()) if prefetch else None
            if target in self._eos_sent_to:
                return switched     # end of stream already told these owners: no more records
            for ch in self.outputs[target]:
                await ch.send("marker", time.time(), table.epoch)
        if flush:
            self._flush_due.set()
        return switched

    def _only_adds_helpers(self, target: int, table: RoutingTable) -> bool:
        """``table`` differs from the one in force only by new helpers of split keys: no key
        group moves and no helper stops, so no owner aligns on its marker."""
        old = self.tables.get(target)
        if old is None or not np.array_equal(old.owners, table.owners):
            return False
        now, new = old.split_map(), table.split_map()
        return all(set(h) <= set(new.get(k, ())) for k, h in now.items())

    def _prefetch_keys(self, target: int, keys, groups, dest) -> None:
        """Lazy: ask old owners for the state of moving keys as their rows leave, once per
        key (the new owner holds those rows until the requests are served)."""
        pf = self._prefetch[target]
        olds = pf.old[groups]
        moving = olds >= 0
        if not moving.any():
            return
        k, g, o, d = keys[moving], groups[moving], olds[moving], dest[moving]
        if pf.asked.n > self._lazy_asked:
            # forget the keys asked so far rather than grow (and rehash) without end:
            # asking again for a key is harmless, the old owner has nothing left to send
            pf.asked = _state.KeySet(k.dtype, 2 * self._lazy_asked)
        n_before = pf.asked.n
        slots, first = np.unique(pf.asked.slots(k, g, self.key_groups, "key"), return_index=True)
        first = first[slots >= n_before]        # keys asked for the first time, once each
        if not len(first):
            return
        k, g, o, d = k[first], g[first], o[first], d[first]
        chans = self.outputs[target]
        for src in np.unique(o).tolist():
            for to in np.unique(d[o == src]).tolist():
                sel = (o == src) & (d == to)
                pf.sent[(src, to)] += 1
                self._spawn(chans[src].peer.call("fetch_keys", pf.epoch, to, k[sel], g[sel],
                                                 self.index, pf.sent[(src, to)]))

    async def pause(self) -> None:
        self._gate.clear()

    async def resume(self) -> None:
        self._gate.set()

    def idle(self) -> bool:
        """Nothing queued, held or in flight from this instance."""
        return (not self._ready and not self._held
                and not any(ch.tasks for chans in getattr(self, "outputs", {}).values() for ch in chans))

    # -- epoch protocol: owners ----------------------------------------------------------------
    async def prepare(self, epoch: int, strategy: str, outgoing: dict[int, list[int]],
                      incoming: dict[int, int], flush: list[int] = ()) -> None:
        """Be told ahead what epoch ``epoch`` moves: ``outgoing`` new owner -> key groups,
        ``incoming`` key group -> old owner; ``flush``: homes of split keys this instance
        stops helping with."""
        if self._finishing or self.status in ("done", "failed", "stopped"):
            # the stream has ended here: state arriving later would never be applied
            state = self.status if self.status != "running" else "finishing"
            raise StreamlbError(f"instance {self.label} is {state}; it cannot take part in epoch {epoch}")
        m = self._migs.get(epoch) or _Migration(epoch, strategy)
        self._migs[epoch] = m
        m.outgoing.update({g: to for to, gs in outgoing.items() for g in gs})
        m.incoming.update(incoming)
        m.flush_to.update(int(h) for h in flush)
        waiting = self._merging if self._merges(strategy) else self._pending_in
        for g in incoming:
            waiting[g] = m
        if incoming:
            self.store.reserve(incoming)
        self._check_alignment()

    async def abort(self, epoch: int) -> None:
        """Forget epoch ``epoch`` before any router switched to it (a prepare failed)."""
        m = self._migs.pop(epoch, None)
        if m is not None:
            for g in m.incoming:
                for waiting in (self._pending_in, self._merging):
                    if waiting.get(g) is m:
                        del waiting[g]
        self._wake.set()        # a finishing owner may have been waiting only for this epoch

    def _check_alignment(self) -> None:
        for m in self._migs.values():
            if m.aligned or not (m.outgoing or m.flush_to):
                continue
            if len(self._marks[m.epoch] | self._eos_from) == self.upstream_instances:
                # no epoch-(e-1) record of the outgoing groups can arrive any more
                m.aligned = True
                m.aligned_at = time.time()
                if m.flush_to:
                    # numbered now: ahead of the end-of-stream note this very EOS may send
                    barriers = [self._send_state(h, "barrier", m.epoch) for h in sorted(m.flush_to)]
                    self._spawn(self._flush(m, barriers))
                if not m.outgoing:
                    continue
                if m.strategy == "lazy":
                    self._spawn(self._drain_lazy(m))
                else:
                    self._spawn(self._ship(m, sorted(m.outgoing)))

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(self._guard(coro))
        self._mig_tasks.add(task)
        task.add_done_callback(self._mig_tasks.discard)

    def _send_state(self, dest: int, kind: str, args):
        """Number a cut for ``dest``: cutting and numbering happen with no await between
        them, so the new owner installs cuts in the order they were made (a key pulled
        alone before the rest of its group), while sends overlap."""
        seq = self._state_seq[dest]
        self._state_seq[dest] = seq + 1
        return self.siblings[dest].call("install_state", self.index, seq, kind, args)

    async def _ship(self, m: "_Migration", groups) -> None:
        """Cut the state of ``groups`` (those not yet sent) and send it to the new owners;
        returns once installed."""
        by_dest: dict[int, list[int]] = collections.defaultdict(list)
        for g in groups:
            if g in m.outgoing and g not in m.sent:
                by_dest[m.outgoing[g]].append(g)
        sends = []
        for dest, gs in by_dest.items():
            m.sent.update(gs)
            sends.append(self._send_state(dest, "install", (m.epoch, gs, self.store.cut(gs))))
        await asyncio.gather(*sends)
        self._maybe_done(m)

    async def fetch_keys(self, epoch: int, dest: int, keys, groups, router: int, request: int) -> None:
        """Lazy: router ``router`` routes rows of ``keys`` (of ``groups``, moving to ``dest``)
        and asks for their state on ``dest``'s behalf (its ``request``-th such request)."""
        m = self._migs.get(epoch)
        if m is None:
            return
        if not m.aligned:
            m.key_requests.append((dest, router, request, keys, groups))     # served first at alignment
            return
        await self._ship_keys(m, dest, [(router, request, keys, groups)])

    async def _ship_keys(self, m: "_Migration", dest: int, requests: list) -> None:
        """Cut the state of the keys of ``requests`` (router, request, keys, groups) still
        here and send it to ``dest``, which then knows those requests served."""
        keys = np.concatenate([np.asarray(r[2]) for r in requests])
        groups = np.concatenate([np.asarray(r[3], np.int64) for r in requests])
        waiting = [g for g in m.outgoing if g not in m.sent]     # groups whose state is still here
        mine = np.isin(groups, np.asarray(waiting, np.int64))
        blob = self.store.cut_keys(keys[mine], groups[mine])
        await self._send_state(dest, "install_keys", (m.epoch, self.index, [r[:2] for r in requests], blob))
        m.pulled.set()

    def _maybe_done(self, m: "_Migration") -> None:
        # an owner may give and take key groups in the same epoch: both sides must be through
        if (len(m.sent) == len(m.outgoing) and len(m.installed) == len(m.incoming)
                and (m.flushed or not m.flush_to)):
            self._done_epochs.add(m.epoch)
            if (ev := self._done_events.get(m.epoch)) is not None:
                ev.set()

    async def _drain_lazy(self, m: "_Migration") -> None:
        """Lazy, old owner: serve the keys asked for before alignment, then move the rest
        of the groups ``lazy-step`` at a time (key requests get in between chunks). With
        no request yet, the drain waits up to ``lazy-delay`` seconds for the first one, so
        the first moved rows' keys do not queue behind whole groups; a merging epoch, which
        pulls nothing, waits that long before its first chunk, so the first moved rows are
        not applied behind whole groups' installs (or their cuts here), and after each chunk
        waits ``lazy-pace`` times as long as the chunk took."""
        requests, m.key_requests = m.key_requests, []
        by_dest: dict[int, list] = collections.defaultdict(list)
        for dest, *request in requests:
            by_dest[dest].append(request)
        await asyncio.gather(*[self._ship_keys(m, dest, rs) for dest, rs in by_dest.items()])
        if not requests and self._lazy_delay > 0:
            try:
                await asyncio.wait_for(m.pulled.wait(), self._lazy_delay)
            except asyncio.TimeoutError:
                pass
        step = max(1, int(self._lazy_step))
        rest = sorted(g for g in m.outgoing if g not in m.sent)
        merging = self._merges(m.strategy)
        for i in range(0, len(rest), step):
            await asyncio.sleep(0)          # let data and requests in between chunks
            t = time.perf_counter()
            await self._ship(m, rest[i:i + step])
            if merging and self._lazy_pace:
                # nothing waits for a merging drain: leave the loops room for the data
                await asyncio.sleep(self._lazy_pace * (time.perf_counter() - t))

    async def install_state(self, src: int, seq: int, kind: str, args) -> None:
        """State cut by owner ``src`` (its ``seq``-th cut for this owner): whole key groups
        (``install``) or, with ``lazy``, single keys this owner asked for (``install_keys``;
        keys with no state come back empty). Queued ahead of the data in ``seq`` order;
        returns once applied."""
        if self.status in ("done", "failed", "stopped"):
            # nothing reads the queue any more: say so rather than leave the sender waiting
            raise StreamlbError(f"instance {self.label} is {self.status}: it cannot take {kind!r} from "
                                f"instance {src} (message {seq})")
        fut = asyncio.get_running_loop().create_future()
        self._in_order(self._ctl_early[src], self._ctl_next, src, seq, (None, kind, 0.0, args, fut), self._ctl)
        await fut

    async def _install_keys(self, epoch: int, src: int, requests: list, blob) -> None:
        self.store.install(blob)
        m = self._migs.get(epoch)
        if m is None:
            return
        for router, request in requests:
            m.serve(router, src, request)

        def ready(h: _Held) -> np.ndarray:
            if h.need is None or h.need[0] != epoch or not m.ready(h.need[1], h.need[2]):
                return np.zeros(len(h.groups), bool)
            return m.lazy_rows(h.groups, self._pending_in)

        await self._release(m, ready)

    async def _install(self, epoch: int, groups: list[int], blob) -> None:
        self.store.install(blob)
        got = set(groups)
        for g in groups:
            self._pending_in.pop(g, None)
            self._merging.pop(g, None)
        m = self._migs[epoch]
        m.installed.update(groups)
        if len(m.installed) == len(m.incoming):
            m.installed_at = time.time()
        self._maybe_done(m)
        arrived = np.fromiter(got, np.int64, len(got))
        await self._release(m, lambda h: np.isin(h.groups, arrived))

    async def _release(self, m: "_Migration | None", which) -> None:
        """Apply the held rows ``which(held)`` selects, in arrival order (per-key order holds);
        a batch's credit returns once none of its rows is held."""
        keep = []
        for h in self._held:
            mask = which(h)
            if mask.any():
                await self._apply(h.frame[mask], h.emitted, None, h.groups[mask], release=True)
                if m is not None and m.first_applied is None:
                    m.first_applied = time.time()
                h.frame, h.groups = h.frame[~mask], h.groups[~mask]
            if len(h.frame):
                keep.append(h)
            elif h.fut is not None and not h.fut.done():
                h.fut.set_result(None)
        self._held = keep

    def forget(self, epoch: int, target: int | None = None) -> None:
        """The coordinator has recorded epoch ``epoch``: drop what was kept for it."""
        m = self._migs.get(epoch)
        if m is not None and not any(p is m for p in [*self._pending_in.values(), *self._merging.values()]):
            del self._migs[epoch]
        self._marks.pop(epoch, None)
        self._done_epochs.discard(epoch)
        self._done_events.pop(epoch, None)
        pf = self._prefetch.get(target) if target is not None else None
        if pf is not None and pf.epoch == epoch:
            self._prefetch[target] = None

    async def wait_epoch(self, epoch: int, wait: float) -> dict:
        """:meth:`epochs`, once epoch ``epoch`` is done here or after ``wait`` seconds,
        whichever comes first: the coordinator learns of completion without polling."""
        if epoch not in self._done_epochs:
            ev = self._done_events.setdefault(epoch, asyncio.Event())
            try:
                await asyncio.wait_for(ev.wait(), wait)
            except asyncio.TimeoutError:
                pass
        return self.epochs()

    def epochs(self) -> dict:
        """Epoch progress at this instance, for the coordinator."""
        return {"done": sorted(self._done_epochs), "pending_groups": len(self._pending_in),
                "held_batches": len(self._held), "status": self.status,
                "applied_while_waiting": {e: m.applied_while_waiting for e, m in self._migs.items()},
                "first_applied": {e: m.first_applied for e, m in self._migs.items()},
                "aligned_at": {e: m.aligned_at for e, m in self._migs.items()},
                "installed_at": {e: m.installed_at for e, m in self._migs.items()}}

    # -- fused steps --------------------------------------------------------------------------
    async def _run_steps(self, steps: list[Step], x, emitted: float) -> None:
        for step in steps:
            await self._run_step(step, x, emitted)

    def _call_user(self, step: Step, func, *args):
        try:
            return func(*args, *step.args, **step.kwargs)
        except Exception as exc:
            first = args[0]
            if isinstance(first, pd.DataFrame):
                rec = f"batch of {len(first)} rows starting {first.head(1).to_dict('records')}"
            else:
                rec = repr(first)[:200]
            raise UserFunctionError(
                f"operator {self.stage.name!r}: {step.kind} function {describe(func)} raised "
                f"{type(exc).__name__}: {exc} on {rec}",
                operator=self.stage.name, function=describe(func), record=rec,
            ) from exc

    async def _run_step(self, step: Step, x, emitted: float) -> None:
        k = step.kind
        if k == "map":
            await self._run_steps(step.children, self._call_user(step, step.func, x), emitted)
        elif k == "starmap":
            await self._run_steps(step.children, self._call_user(step, step.func, *x), emitted)
        elif k == "filter":
            keep = self._call_user(step, step.func, x)
            if isinstance(keep, (bool, np.bool_)):
                if keep:
                    await self._run_steps(step.children, x, emitted)
            else:
                mask = np.asarray(keep, dtype=bool)
                if mask.shape != (len(x),):
                    raise UserFunctionError(
                        f"operator {self.stage.name!r}: filter predicate {describe(step.func)} returned "
                        f"{mask.shape[0] if mask.ndim else 'a scalar'} values for a batch of {len(x)} rows; "
                        "return one bool per row or one bool for the batch",
                        operator=self.stage.name, function=describe(step.func),
                    )
                await self._run_steps(step.children, x[mask], emitted)
        elif k == "flatten":
            for item in x:
                await self._run_steps(step.children, item, emitted)
        elif k == "sink":
            self._call_user(step, step.func, x)
        elif k == "list_sink":
            self._list_out[step.target].append(x)
        elif k == "parquet_sink":
            self._write_parquet(step.path, x)
        elif k == "exchange":
            await self._exchange(step.target, x, emitted)

    async def _exchange(self, target: int, x, emitted: float) -> None:
        x_ = self.exchanges[target]
        kind, key, key_name, name = x_.kind, x_.key, x_.key_name, x_.name
        if not isinstance(x, pd.DataFrame):
            raise PipelineError(
                f"operator {name!r} receives {type(x).__name__} from {self.stage.name!r}; "
                "batches crossing an exchange must be pandas DataFrames"
            )
        chans = self.outputs[target]
        if kind == "round_robin":
            if len(x):
                router = self._shufflers[target]      # every round-robin exchange has one
                for i, piece, cost in router.route(x, name):
                    await chans[i].send("data", emitted, piece,
                                        lambda reply, i=i, cost=cost: router.done(i, cost, reply))
            return
        if not len(x):
            return
        async with self._xlocks[target]:
            await self._route_keyed(target, x, emitted, key, key_name, name, chans)

    async def _route_keyed(self, target, x, emitted, key, key_name, name, chans) -> None:
        if isinstance(key, str):
            if key not in x.columns:
                from .exceptions import SchemaError

                raise SchemaError(
                    f"operator {name!r} keys by column {key!r}, which the batch from "
                    f"{self.stage.name!r} lacks; columns: {', '.join(map(str, x.columns))}"
                )
            keys = x[key].to_numpy()
        else:
            if key_name in x.columns:
                raise PipelineError(
                    f"operator {name!r}: key_by({describe(key)}) would overwrite column "
                    f"{key_name!r}; pass key_by(func, name=...) with a new column name"
                )
            keys = np.asarray(self._call_user(Step("key_by"), key, x))
            if keys.shape != (len(x),):
                raise UserFunctionError(
                    f"operator {name!r}: key function {describe(key)} returned {keys.shape} keys "
                    f"for a batch of {len(x)} rows; return one key per row",
                    operator=name, function=describe(key),
                )
            x = x.assign(**{key_name: keys})
        bad, reasons = _bad_keys(x[key_name])
        if bad is not None:
            self._dead_letter(name, x[bad], reasons)
            x = x[~bad]
            if not len(x):
                return
            keys = x[key_name].to_numpy()
        if keys.dtype.kind == "f" and np.array_equal(keys, np.round(keys)):
            keys = keys.astype(np.int64)     # an int column that held nulls, now removed
            x = x.assign(**{key_name: keys})
        groups = assign_to_key_group(keys, self.key_groups, name=key_name)
        table = self.tables[target]
        partial = None
        if table.splits:
            dest, partial = table.spread(keys, groups, self._spread_at[target])
            if not partial.any():
                partial = None
        else:
            dest = table.route(groups)
        hot = self._hot.get(target)
        if hot is not None:
            hot.add(keys)
        pf = self._prefetch.get(target)
        if pf is not None:
            self._prefetch_keys(target, keys, groups, dest)
        if self.exchanges[target].balanced:
            # the balancer's load per key group is counted here, where groups are known
            counts = self._route_counts.get(target)
            if counts is None:
                counts = self._route_counts[target] = np.zeros(self.key_groups, np.int64)
            counts += np.bincount(groups, minlength=self.key_groups)
            # and the records sent to each instance, by the table in force for each batch
            sent = self._route_sent.get(target)
            if sent is None:
                sent = self._route_sent[target] = np.zeros(len(chans), np.int64)
            sent += np.bincount(dest, minlength=len(chans))
        if len(chans) == 1:
            await chans[0].send("data", emitted, x)
            return
        for i, ch in enumerate(chans):
            if partial is not None and (part := np.flatnonzero((dest == i) & partial)).size:
                # rows of split keys this helper aggregates for their homes
                homes = table.owners[groups[part]]
                own = x.take(np.flatnonzero((dest == i) & ~partial))
                partials = [(h, x.take(part[homes == h])) for h in np.unique(homes).tolist()]
                await ch.send("mixed", emitted, (own, partials, pf.tag(i) if pf is not None else None))
                continue
            idx = np.flatnonzero(dest == i)   # ascending: keeps the batch's order per key
            if len(idx):
                tag = pf.tag(i) if pf is not None else None
                if tag is None:
                    await ch.send("data", emitted, x.take(idx))
                else:
                    await ch.send("tagged", emitted, (x.take(idx), tag))

    def _dead_letter(self, operator: str, rows: pd.DataFrame, reasons: list[str]) -> None:
        for rec, why in zip(rows.to_dict("records"), reasons):
            self._dead.append({"operator": operator, "instance": self.index, "reason": why, "record": rec})

    # -- Parquet sink ---------------------------------------------------------------------------
    def _write_parquet(self, path: str, x) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not isinstance(x, pd.DataFrame):
            raise PipelineError(
                f"to_parquet({path!r}) in {self.stage.name!r} got {type(x).__name__}; it writes DataFrames"
            )
        table = pa.Table.from_pandas(x)
        w = self._writers.get(path)
        if w is None:
            tmp = os.path.join(path, "_temporary")
            os.makedirs(tmp, exist_ok=True)
            fn = os.path.join(tmp, f"part-{self.stage.id:03d}-{self.index:04d}.parquet")
            w = self._writers[path] = pq.ParquetWriter(fn, table.schema)
            self._written[path] = fn
        try:
            table = table.cast(w.schema)
        except (pa.ArrowInvalid, ValueError) as exc:
            raise PipelineError(
                f"to_parquet({path!r}): a batch's schema {table.schema} does not match the "
                f"first batch's {w.schema}: {exc}"
            ) from exc
        w.write_table(table)

    def _abort_writers(self) -> None:
        for path, w in self._writers.items():
            try:
                w.close()
                os.remove(self._written[path])
            except OSError:
                pass
        self._writers.clear()

    # -- end of stream ---------------------------------------------------------------------------
    async def _finish(self) -> None:
        while self._mig_tasks:
            await asyncio.gather(*list(self._mig_tasks))
        for w in self._writers.values():
            w.close()
        self._writers.clear()
        for target, chans in self.outputs.items():
            async with self._xlocks[target]:
                for ch in chans:
                    await ch.send("eos", time.time(), None)
                self._eos_sent_to.add(target)
        self._eos_sent = True
        for chans in self.outputs.values():
            for ch in chans:
                await ch.drain()
        self.finished_at = time.time()
        self._close_window(self.finished_at)
        self.status = "done"
        for t in self._tasks:
            if t is not asyncio.current_task():
                t.cancel()

    # -- metrics ---------------------------------------------------------------------------------
    def _window_start(self, t: float) -> float:
        return t - (t % self.window)

    def _account(self, n: int, busy: float, latency_ms: float | None, split: int = 0) -> None:
        now = time.time()
        if now >= self._win.start + self.window:
            self._close_window(now)
        w = self._win
        w.records += n
        w.split_records += split
        w.busy += max(busy, 0.0)
        if latency_ms is not None:
            w.lat.append(latency_ms)
            w.weights.append(n)

    def _close_window(self, now: float) -> None:
        w = self._win
        if w is None:
            return
        lat = np.asarray(w.lat)
        wt = np.asarray(w.weights)
        has = len(lat) > 0 and wt.sum() > 0
        self._rows.append({
            "operator": self.stage.name, "instance": self.index, "worker": self.worker.address,
            "window_start": pd.Timestamp(w.start, unit="s"), "records": w.records,
            "busy_seconds": w.busy, "queued_batches": len(self._ready),
            "latency_p50_ms": _weighted_quantile(lat, wt, 0.5) if has else np.nan,
            "latency_p99_ms": _weighted_quantile(lat, wt, 0.99) if has else np.nan,
            "latency_max_ms": float(lat.max()) if has else np.nan,
            "latency_mean_ms": float((lat * wt).sum() / wt.sum()) if has else np.nan,
            "split_records": w.split_records,
            "latency_hist": _latency.histogram(lat, wt),
        })
        final = self._finishing or self.finished_at is not None or self._eos_sent
        if self._report:
            row = self._rows[-1]
            self.worker.batched_stream.send({
                "op": "streamlb-load", "kind": "owner", "job": self.job, "operator": self.stage.name,
                "instance": self.index, "window_start": w.start, "window": self.window,
                "records": int(w.records), "busy": float(w.busy), "queued": len(self._ready),
                "latency_p99_ms": None if np.isnan(row["latency_p99_ms"]) else row["latency_p99_ms"],
                "latency_hist": row["latency_hist"].tolist(), "final": final,
            })
        for target, counts in self._route_counts.items():
            nz = np.flatnonzero(counts)
            sent = self._route_sent.get(target)
            self.worker.batched_stream.send({
                "op": "streamlb-load", "kind": "router", "job": self.job, "operator": self.exchanges[target].name,
                "instance": self.index, "window_start": w.start, "window": self.window,
                "groups": nz.tolist(), "counts": counts[nz].tolist(), "final": final,
                "routed": sent.tolist() if sent is not None else None,
                "hot": [[k, c] for k, c, _ in self._hot[target].top()] if target in self._hot else None,
            })
            counts[:] = 0
            if sent is not None:
                sent[:] = 0
            if target in self._hot:
                self._hot[target].clear()
        self._win = _Window(self._window_start(now)) if self.status != "done" else None

    async def _ticker(self) -> None:
        while True:
            w = self._win
            await asyncio.sleep(max(w.start + self.window - time.time(), 0.0) + 1e-3)
            if self._win is w:
                self._close_window(time.time())

    # -- driver-facing -----------------------------------------------------------------------------
    def poll(self) -> dict:
        out = {k: v for k, v in self._list_out.items() if v}
        self._list_out = collections.defaultdict(list)
        dead, self._dead = self._dead, []
        return {
            "status": self.status, "error": self.error, "lists": out,
            "records_in": self.records_in, "records_out": self.records_out,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "offsets": dict(self.offsets), "dead_letters": dead,
        }

    def metrics(self) -> list[dict]:
        return list(self._rows)

    def key_kind(self) -> str | None:
        """dtype kind of the keys held here (``i``, ``u``, ``O``...), None before any."""
        shards = getattr(self.store, "shards", ())
        kinds = [np.dtype(sh.index.dtype).kind for sh in shards if sh.index.dtype is not None]
        return kinds[0] if kinds else None

    def state_size(self) -> int:
        return len(self.store) if self.store is not None else 0

    async def group_keys(self, groups: list[int]) -> list[int]:
        """Keys held here of each of ``groups`` (on the loop, where the store changes)."""
        if self.store is None:
            return [0] * len(groups)
        return self.store.keys_per_group(groups).tolist()

    def _merges(self, strategy: str) -> bool:
        """Whether a ``strategy`` epoch moves this operator's state by merging (see
        ``Stage.merges_lazily``): a new owner applies a moved group's rows at once and merges
        the old state in when it drains; no row waits and no key is pulled."""
        return strategy == "lazy" and self.stage.merges_lazily

    def _merge_in_flight(self) -> bool:
        return bool(self._merging) or any(
            self._merges(m.strategy) and len(m.sent) < len(m.outgoing) for m in self._migs.values())

    async def state(self) -> pd.DataFrame:
        """The keyed state held here. While a merging lazy epoch moves state to or from
        this instance, a key's value is split over the old and new owner: wait until this
        instance's part of it is through (the new owner has merged all, the old owner has
        sent all), so the instances' frames together count every record once."""
        if self.store is None:
            raise PipelineError(f"{self.stage.name!r} holds no keyed state")
        deadline = time.time() + config.seconds("migration.timeout")
        while self._merge_in_flight() and self.status == "running" and time.time() < deadline:
            await asyncio.sleep(0.01)
        return self.store.frame()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.status not in ("done", "failed"):
            self.status = "stopped"
            self._abort_writers()


def _times(col: pd.Series) -> np.ndarray:
    """An event-time column as float seconds."""
    arr = col.to_numpy()
    if arr.dtype.kind == "M":
        return arr.astype("datetime64[ns]").astype(np.int64) / 1e9
    return arr.astype(np.float64)


def _as_seconds(v) -> float:
    return pd.Timestamp(v).value / 1e9 if not isinstance(v, (int, float, np.number)) else float(v)


def _bad_keys(keys: pd.Series) -> tuple[np.ndarray | None, list[str]]:
    """Rows whose key is null, or not a string in a column of strings, with the reason.

    Such records go to the dead-letter output; the rest of the batch goes on.
    """
    null = keys.isna().to_numpy()
    bad = null
    if keys.dtype == object:
        bad = null | ~np.fromiter((isinstance(k, str) for k in keys), bool, len(keys))
    if not bad.any():
        return None, []
    reasons = [
        f"key {keys.name!r} is null" if n else
        f"key {keys.name!r} is {type(k).__name__} {k!r}; this column's keys are strings"
        for k, n in zip(keys[bad], null[bad])
    ]
    return bad, reasons


def _iterable_batches(items, batch_size: int, name: str):
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
