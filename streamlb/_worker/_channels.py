"""Peers and channels: how instances reach each other.

:func:`call_actor` is the one place that calls an actor method over the network
(``actor_execute``); a :class:`Peer` calls an instance on its own worker directly.
An :class:`OutChannel` numbers what it sends and keeps at most ``credits`` messages in
flight (the backpressure); an :class:`Inbox` puts what arrives back in each sender's order
and drops what an incarnation it no longer knows sent.
"""
from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from ..exceptions import PeerUnreachableError, StreamlbError
from ._messages import Envelope


async def call_actor(rpc, address: str, key: str, method: str, *args) -> Any:
    """Call method ``method`` of actor ``key`` on the worker at ``address`` through the
    connection pool ``rpc`` (a worker's, a client's or the scheduler's)."""
    from distributed.protocol import to_serialize

    resp = await rpc(address).actor_execute(
        function=method, actor=key, args=[to_serialize(a) for a in args], kwargs={})
    if resp["status"] != "OK":
        raise _unwrap(resp["exception"])
    return _unwrap(resp["result"])


def _unwrap(x):
    # the scheduler's comms leave payloads serialised; a client's or worker's deserialise them
    from distributed.protocol import Serialized, deserialize

    return deserialize(x.header, x.frames) if isinstance(x, Serialized) else x


class Peer:
    """Another instance: ``(address, actor key)``, reached from ``worker``."""

    __slots__ = ("worker", "address", "key")

    def __init__(self, worker, address: str, key: str) -> None:
        self.worker, self.address, self.key = worker, address, key

    async def call(self, method: str, *args) -> Any:
        if self.address == self.worker.address:
            return await getattr(self.worker.state.actors[self.key], method)(*args)
        return await call_actor(self.worker.rpc, self.address, self.key, method, *args)


def _send_error(label: str, peer: Peer, exc: BaseException) -> StreamlbError:
    """What a failed send says: the network did not deliver (a timeout, a refused or closed
    connection: :class:`PeerUnreachableError`, a fault the job recovers from), or the
    receiver refused the message (anything else)."""
    from distributed.comm.core import CommClosedError

    text = f"instance {label} could not send to {peer.key} on {peer.address}: {type(exc).__name__}: {exc}"
    if isinstance(exc, (OSError, CommClosedError, asyncio.TimeoutError)):
        return PeerUnreachableError(text, label, peer.key, peer.address)
    return StreamlbError(text)


class OutChannel:
    """Sender side of one channel: sequence numbers and a credit window.

    ``on_blocked(seconds)`` is told how long a send waited for a credit (not busy time);
    ``on_error(exc)`` that a send failed (the receiver or its worker is gone), naming the
    sending instance ``label`` and the receiver.
    """

    def __init__(self, peer: Peer, sender: int, credits: int, *, run: int = 0, label: str = "",
                 on_blocked: Callable[[float], None] = lambda s: None,
                 on_error: Callable[[BaseException], None] = lambda e: None) -> None:
        self.peer, self.sender, self.credits, self.run, self.label = peer, sender, credits, run, label
        self.on_blocked, self.on_error = on_blocked, on_error
        self.sem = asyncio.Semaphore(credits)
        self.seq = 0
        self.tasks: set = set()

    async def send(self, msg, done: Callable[[Any], None] | None = None) -> None:
        """Send once a credit is free; ``done(reply)`` runs when the receiver processed it."""
        t0 = time.perf_counter()
        await self.sem.acquire()
        self.on_blocked(time.perf_counter() - t0)
        seq, self.seq = self.seq, self.seq + 1
        task = asyncio.ensure_future(self._do(Envelope(self.sender, seq, msg, self.run), done))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _do(self, env: Envelope, done) -> None:
        try:
            reply = await self.peer.call("push", env)
            if done is not None:
                done(reply)
        except Exception as exc:
            self.on_error(_send_error(self.label, self.peer, exc))
        finally:
            self.sem.release()

    def cancel(self) -> None:
        """Give up what is in flight (its sender stopped): a message not yet on the wire
        never goes out."""
        for t in list(self.tasks):
            t.cancel()

    async def drain(self) -> None:
        """Return once nothing sent on this channel is in flight."""
        for _ in range(self.credits):
            await self.sem.acquire()
        for _ in range(self.credits):
            self.sem.release()


class Numbered:
    """Sender side of a lane with no credit window (owner to owner): numbers messages per
    receiver, so the receiver applies them in the order they were numbered."""

    def __init__(self, sender: int, run: int = 0) -> None:
        self.sender, self.run = sender, run
        self._seq: dict[int, int] = collections.defaultdict(int)

    def reset(self, dest: int) -> None:
        """``dest`` is a new actor: number from 0 again."""
        self._seq.pop(dest, None)

    def envelope(self, dest: int, msg) -> Envelope:
        seq = self._seq[dest]
        self._seq[dest] = seq + 1
        return Envelope(self.sender, seq, msg, self.run)


class Inbox:
    """Receiver side of one lane: per-sender FIFO order restored from sequence numbers.

    Senders may be added and removed while the job runs; an envelope from a sender not
    registered, or from another incarnation (``run``) of it, is refused.
    """

    def __init__(self, senders=(), *, strict: bool = False) -> None:
        self.strict = strict            # refuse unknown senders (else any sender is accepted)
        self._early: dict[int, dict[int, Any]] = collections.defaultdict(dict)
        self._next: dict[int, int] = collections.defaultdict(int)
        self._runs: dict[int, int] = {}
        self.ready: collections.deque = collections.deque()
        for s in senders:
            self.add_sender(s)

    def add_sender(self, sender: int, run: int = 0) -> None:
        self._runs[sender] = run
        self._early.pop(sender, None)
        self._next.pop(sender, None)

    def remove_sender(self, sender: int) -> None:
        """Forget ``sender``: what it sent and what it still sends is dropped."""
        self._runs.pop(sender, None)
        self._early.pop(sender, None)
        self._next.pop(sender, None)

    def accepts(self, env: Envelope) -> bool:
        run = self._runs.get(env.sender)
        return run == env.run if run is not None else not self.strict

    def put(self, env: Envelope, item) -> bool:
        """Queue ``item`` (what ``env`` carried) once every earlier one from its sender is
        queued; False (nothing queued) if the sender is not accepted."""
        if not self.accepts(env):
            return False
        early = self._early[env.sender]
        early[env.seq] = item
        nxt = self._next[env.sender]
        while nxt in early:
            self.ready.append(early.pop(nxt))
            nxt += 1
        self._next[env.sender] = nxt
        return True

    def refuse_waiting(self, exc: BaseException) -> None:
        """Nothing will apply what is queued (its receiver stopped): each sender waiting for
        its message to be applied gets ``exc`` at once."""
        items = list(self.ready) + [item for early in self._early.values() for item in early.values()]
        self.ready.clear()
        self._early.clear()
        for _sender, _msg, fut in items:
            if not fut.done():
                fut.set_exception(exc)

    def __len__(self) -> int:
        return len(self.ready)

    def __bool__(self) -> bool:
        return bool(self.ready)

    def popleft(self):
        return self.ready.popleft()
