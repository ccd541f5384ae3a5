"""Owner side of the epoch protocol: prepare, align, cut and ship, install, hold and release,
lazy serving and draining (see docs/migration.md).

An owner giving key groups away keeps processing; once aligned on the epoch (marker or end
of stream from every router) it cuts their state and sends it to the new owner. A new owner
applies every other group at once and holds back the rows of incoming groups until their
state is installed (with ``lazy``, only until the keys its routers asked for are), then
applies them in arrival order. With lazy *by merging* nothing is held: the moved groups'
rows are applied at once and the old state is merged in as it drains.
"""
from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable

import numpy as np

from ._messages import Barrier, Install, InstallKeys, LazyNeed
from ._heap import give_back
from ._moves import EpochMove, Held, budget_chunks, mark_first, unique


class OwnerSide:
    """The epochs one owner takes part in.

    ``send(dest, msg)`` numbers a control message for sibling ``dest`` at once and returns
    an awaitable that completes when it was applied there; ``apply(frame, groups,
    emitted)`` applies released rows; ``spawn(coro)`` runs a task the instance waits for
    before it finishes. ``merges``: lazy moves of this operator merge (``Stage.merges_lazily``).
    ``settle()``: an operator on event time fires what moved-in groups owe and waits until it
    is applied downstream (see :meth:`_settled`).
    """

    def __init__(self, store, aligner, *, index: int, merges: bool, send: Callable[[int, object], Awaitable],
                 apply: Callable[..., Awaitable], spawn: Callable, lazy_step: int, lazy_delay: float,
                 lazy_pace: float, lazy_keys: int = 0, settle: Callable[[], Awaitable] | None = None) -> None:
        self.store, self.aligner, self.index = store, aligner, index
        self.settle = settle
        self.merges_lazily = merges
        self.send, self.apply, self.spawn = send, apply, spawn
        self.lazy_step, self.lazy_delay, self.lazy_pace = lazy_step, lazy_delay, max(0.0, float(lazy_pace))
        self.lazy_keys = int(lazy_keys or 0)
        self.moves: dict[int, EpochMove] = {}
        self.pending_in: dict[int, EpochMove] = {}     # key group -> the move bringing its state
        # lazy by merging: incoming key group -> the move whose old state will be merged in;
        # its rows are applied at once meanwhile
        self.merging: dict[int, EpochMove] = {}
        self.held: list[Held] = []
        self.done: set[int] = set()
        self._done_events: dict[int, asyncio.Event] = {}

    def merges(self, strategy: str) -> bool:
        """Whether a ``strategy`` epoch moves this operator's state by merging."""
        return strategy == "lazy" and self.merges_lazily

    @property
    def waiting(self) -> bool:
        """State is still on its way here."""
        return bool(self.pending_in or self.merging)

    def merge_in_flight(self) -> bool:
        return bool(self.merging) or any(
            self.merges(m.strategy) and len(m.sent) < len(m.outgoing) for m in self.moves.values())

    async def merged(self, timeout: float, running) -> None:
        """Return once no merging lazy move is half done here (or after ``timeout``, or once
        ``running()`` is False): until then a key's value is split over two owners."""
        deadline = time.time() + timeout
        while self.merge_in_flight() and running() and time.time() < deadline:
            await asyncio.sleep(0.01)

    # -- prepare ------------------------------------------------------------------------------
    def prepare(self, epoch: int, strategy: str, outgoing: dict[int, list[int]], incoming: dict[int, int],
                flush=(), armed: bool = True) -> None:
        """``armed=False``: give the outgoing groups only once :meth:`arm` is called too. An
        old owner whose routers have all ended is aligned at once; unarmed, it waits until
        the coordinator knows every new owner accepted the epoch (a new owner that had
        ended could not take the state)."""
        m = self.moves.get(epoch) or EpochMove(epoch, strategy)
        self.moves[epoch] = m
        if outgoing and not armed:
            m.armed = False
        m.outgoing.update({g: to for to, gs in outgoing.items() for g in gs})
        m.incoming.update(incoming)
        m.flush_to.update(int(h) for h in flush)
        waiting = self.merging if self.merges(strategy) else self.pending_in
        for g in incoming:
            waiting[g] = m
        if incoming:
            self.store.reserve(incoming)
        self.store.hold(epoch, [*m.outgoing, *m.incoming])
        if (m.outgoing or m.flush_to) and not m.watching:
            m.watching = True
            self.aligner.when_aligned(epoch, lambda: self._on_aligned(m))

    def abort(self, epoch: int) -> None:
        self.store.unhold(epoch)
        m = self.moves.pop(epoch, None)
        if m is not None:
            for g in m.incoming:
                for waiting in (self.pending_in, self.merging):
                    if waiting.get(g) is m:
                        del waiting[g]
        self.aligner.forget(epoch)

    def arm(self, epoch: int) -> None:
        """Every owner of ``epoch`` accepted it: the outgoing groups may go once aligned."""
        m = self.moves.get(epoch)
        if m is None or m.armed:
            return
        m.armed = True
        if m.aligned:
            self._give(m)

    @property
    def unarmed(self) -> bool:
        """An epoch this owner gives groups in waits to be armed (or aborted)."""
        return any(not m.armed for m in self.moves.values())

    def _on_aligned(self, m: EpochMove) -> None:
        """No record of an older epoch for the outgoing groups can arrive any more."""
        if m.aligned or self.moves.get(m.epoch) is not m:
            return
        m.aligned = True
        m.aligned_at = time.time()
        if m.armed:
            self._give(m)

    def _give(self, m: EpochMove) -> None:
        """Aligned and armed: flush split keys' partials, ship or drain the outgoing groups."""
        if m.flush_to:
            # numbered now: ahead of the end-of-stream note this very end may send
            barriers = [self.send(h, Barrier(m.epoch)) for h in sorted(m.flush_to)]
            self.spawn(self._flush(m, barriers))
        if m.outgoing:
            self.spawn(self._drain_lazy(m) if m.strategy == "lazy" else self._ship(m, sorted(m.outgoing)))

    async def _flush(self, m: EpochMove, barriers: list) -> None:
        """A split key leaves this helper: once every partial sent to its home before the
        switch is merged there (installs are in order, and the barrier is behind them),
        the epoch is through here."""
        await asyncio.gather(*barriers)
        m.flushed = True
        self._maybe_done(m)

    # -- old owner: cut and ship ----------------------------------------------------------------
    async def _ship(self, m: EpochMove, groups) -> None:
        """Cut the state of ``groups`` (those not yet sent) and send it to the new owners;
        returns once installed. Cutting and numbering happen with no await between them,
        so the new owner installs cuts in the order they were made."""
        by_dest: dict[int, list[int]] = collections.defaultdict(list)
        for g in groups:
            if g in m.outgoing and g not in m.sent:
                by_dest[m.outgoing[g]].append(g)
        sends = []
        for dest, gs in by_dest.items():
            m.sent.update(gs)
            sends.append(self.send(dest, Install(m.epoch, gs, self.store.cut(gs))))
        await asyncio.gather(*sends)
        self._maybe_done(m)

    async def fetch_keys(self, epoch: int, dest: int, keys, groups, router: int, request: int) -> None:
        """Lazy: ``router`` routes rows of ``keys`` to ``dest`` and asks for their state on
        its behalf (its ``request``-th such request); served first at alignment."""
        m = self.moves.get(epoch)
        if m is None:
            return
        if not m.aligned:
            m.key_requests.append((dest, router, request, keys, groups))
            return
        await self._ship_keys(m, dest, [(router, request, keys, groups)])

    async def _ship_keys(self, m: EpochMove, dest: int, requests: list) -> None:
        keys = np.concatenate([np.asarray(r[2]) for r in requests])
        groups = np.concatenate([np.asarray(r[3], np.int64) for r in requests])
        waiting = [g for g in m.outgoing if g not in m.sent]     # groups whose state is still here
        mine = np.isin(groups, np.asarray(waiting, np.int64))
        blob = self.store.cut_keys(keys[mine], groups[mine])
        await self.send(dest, InstallKeys(m.epoch, self.index, [r[:2] for r in requests], blob))
        m.pulled.set()

    async def _drain_lazy(self, m: EpochMove) -> None:
        """Lazy, old owner: serve the keys asked for before alignment, then move the rest
        of the groups in chunks of at least ``lazy-step`` groups, more while their keys add
        up to at most ``lazy-keys`` (key requests get in between chunks). With
        no request yet, wait up to ``lazy-delay`` for the first one, so the first moved
        rows' keys do not queue behind whole groups; a merging epoch, which pulls nothing,
        waits that long before its first chunk, and after each chunk rests ``lazy-pace``
        times as long as the chunk took (nothing waits for it: the loops get room)."""
        requests, m.key_requests = m.key_requests, []
        by_dest: dict[int, list] = collections.defaultdict(list)
        for dest, *request in requests:
            by_dest[dest].append(request)
        await asyncio.gather(*[self._ship_keys(m, dest, rs) for dest, rs in by_dest.items()])
        if not requests and self.lazy_delay > 0:
            try:
                await asyncio.wait_for(m.pulled.wait(), self.lazy_delay)
            except asyncio.TimeoutError:
                pass
        rest = sorted(g for g in m.outgoing if g not in m.sent)
        merging = self.merges(m.strategy)
        for chunk in self._lazy_chunks(rest):
            await asyncio.sleep(0)
            t = time.perf_counter()
            await self._ship(m, chunk)
            if merging and self.lazy_pace:
                await asyncio.sleep(self.lazy_pace * (time.perf_counter() - t))

    def _lazy_chunks(self, groups: list[int]) -> list[list[int]]:
        """The lazy drain's chunks of ``groups`` (see :meth:`_drain_lazy`)."""
        if self.lazy_keys <= 0 or len(groups) <= self.lazy_step:     # nothing to count
            return budget_chunks(groups, self.lazy_step, None, 0)
        held = dict(zip(groups, self.store.keys_per_group(groups).tolist()))
        return budget_chunks(groups, self.lazy_step, held.__getitem__, self.lazy_keys)

    # -- new owner: hold, install, release ------------------------------------------------------
    def admit(self, frame, groups, emitted: float, fut, router: int, need: LazyNeed | None):
        """Split a batch's rows into those applied now and those held until their state is
        here. Returns (frame, groups, held, merging moves this batch is the first record of)."""
        firsts = None
        if self.merging and len(frame):
            new = [m for m in unique(self.merging.values()) if m.first_applied is None]
            firsts = [m for m in new if np.isin(groups, np.fromiter(m.incoming, np.int64, len(m.incoming))).any()]
        if not self.pending_in or not len(frame):
            return frame, groups, False, firsts
        wait = np.isin(groups, np.fromiter(self.pending_in, np.int64, len(self.pending_in)))
        hold_need = None
        if wait.any() and need is not None:
            m = self.moves.get(need.epoch)
            if m is not None and m.strategy == "lazy":
                if not m.ready(router, need.requests):
                    hold_need = (need.epoch, router, need.requests)
                elif (lazy := wait & m.lazy_rows(groups, self.pending_in)).any():
                    wait &= ~lazy                  # their keys' state (or none) is here
                    if m.first_applied is None:
                        m.first_applied = time.time()
        if not wait.any():
            return frame, groups, False, firsts
        self.held.append(Held(frame[wait], groups[wait], emitted, fut, hold_need))
        return frame[~wait], groups[~wait], True, firsts

    def applied(self, n: int, firsts) -> None:
        """``n`` rows were applied; ``firsts``: merging moves whose first record they held."""
        if firsts:
            mark_first(firsts)
        if self.pending_in or self.merging:
            for m in unique([*self.pending_in.values(), *self.merging.values()]):
                m.applied_while_waiting += n

    async def install(self, msg: Install) -> None:
        self.store.install(msg.blob)
        for g in msg.groups:
            self.pending_in.pop(g, None)
            self.merging.pop(g, None)
        m = self.moves[msg.epoch]
        m.installed.update(msg.groups)
        if len(m.installed) == len(m.incoming):
            m.installed_at = time.time()
        arrived = np.asarray(msg.groups, np.int64)
        # the rows held back go first, judged by the watermark the groups had while moving
        # (a store lets go of that once the move is done: a window store at its next batch)
        await self._release(m, lambda h: np.isin(h.groups, arrived))
        self._maybe_done(m)

    async def install_keys(self, msg: InstallKeys) -> None:
        self.store.install(msg.blob)
        m = self.moves.get(msg.epoch)
        if m is None:
            return
        for router, request in msg.requests:
            m.serve(router, msg.src, request)

        def ready(h: Held) -> np.ndarray:
            if h.need is None or h.need[0] != msg.epoch or not m.ready(h.need[1], h.need[2]):
                return np.zeros(len(h.groups), bool)
            return m.lazy_rows(h.groups, self.pending_in)

        await self._release(m, ready)

    async def _release(self, m: EpochMove, which) -> None:
        """Apply the held rows ``which(held)`` selects, in arrival order (per-key order
        holds); a batch's credit returns once none of its rows is held."""
        keep = []
        for h in self.held:
            mask = which(h)
            if mask.any():
                await self.apply(h.frame[mask], h.groups[mask], h.emitted)
                if m.first_applied is None:
                    m.first_applied = time.time()
                h.frame, h.groups = h.frame[~mask], h.groups[~mask]
            if len(h.frame):
                keep.append(h)
            elif h.fut is not None and not h.fut.done():
                h.fut.set_result(None)
        self.held = keep

    # -- completion -----------------------------------------------------------------------------
    def _maybe_done(self, m: EpochMove) -> None:
        if m.done:
            if m.incoming and self.settle is not None:
                if not m.settling:
                    m.settling = True
                    self.spawn(self._settled(m))
                return
            self._record_done(m)

    async def _settled(self, m: EpochMove) -> None:
        """New owner: the moved groups go by the watermark again, and what they owe (windows,
        timers whose time passed while they moved) goes out and is applied downstream before
        the move counts as done here. Only then does the coordinator let the old owners'
        frozen watermarks go, so what these groups emit is not late where it lands: this
        owner may have forwarded a watermark past it before the groups came."""
        self.store.unhold(m.epoch)
        await self.settle()
        self._record_done(m)

    def _record_done(self, m: EpochMove) -> None:
        self.store.unhold(m.epoch)
        give_back()
        self.done.add(m.epoch)
        if (ev := self._done_events.get(m.epoch)) is not None:
            ev.set()

    def forget(self, epoch: int) -> None:
        """The coordinator has recorded ``epoch``: drop what was kept for it."""
        self.store.unhold(epoch)
        m = self.moves.get(epoch)
        if m is not None and not any(p is m for p in [*self.pending_in.values(), *self.merging.values()]):
            del self.moves[epoch]
        self.aligner.forget(epoch)
        self.done.discard(epoch)
        self._done_events.pop(epoch, None)

    async def wait_done(self, epoch: int, wait: float) -> None:
        """Return once ``epoch`` is done here, or after ``wait`` seconds."""
        if epoch not in self.done:
            ev = self._done_events.setdefault(epoch, asyncio.Event())
            try:
                await asyncio.wait_for(ev.wait(), wait)
            except asyncio.TimeoutError:
                pass

    def status(self) -> dict:
        per = {e: m.status() for e, m in self.moves.items()}
        return {"done": sorted(self.done), "pending_groups": len(self.pending_in), "held_batches": len(self.held),
                **{k: {e: s[k] for e, s in per.items()}
                   for k in ("applied_while_waiting", "first_applied", "aligned_at", "installed_at")}}
