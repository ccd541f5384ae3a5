"""Channels without a cluster: per-sender FIFO restored from sequence numbers, credits,
senders and peers added and removed while running, stale incarnations refused."""
import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlb._worker._channels import Inbox, Numbered, OutChannel
from streamlb._worker._messages import Batch, Envelope, Marker
from streamlb.exceptions import StreamlbError


@given(st.data())
def test_an_inbox_restores_each_senders_order_whatever_the_arrival_order(data):
    counts = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=4))
    envs = [Envelope(s, q, (s, q)) for s, n in enumerate(counts) for q in range(n)]
    arrival = data.draw(st.permutations(envs))
    box = Inbox(range(len(counts)), strict=True)
    for env in arrival:
        assert box.put(env, env.msg)
    out = [box.popleft() for _ in range(len(box))]
    assert sorted(out) == sorted(e.msg for e in envs)          # each once
    for s in range(len(counts)):
        assert [q for ss, q in out if ss == s] == list(range(counts[s]))


def test_senders_can_be_added_and_removed_and_stale_runs_are_refused():
    box = Inbox([0], strict=True)
    assert not box.put(Envelope(1, 0, "x"), "x")               # not a sender (yet)
    box.add_sender(1, run=7)
    assert not box.put(Envelope(1, 0, "old", run=6), "old")    # an incarnation that is gone
    assert box.put(Envelope(1, 1, "b", run=7), "b")            # early: waits for seq 0
    assert not box
    assert box.put(Envelope(1, 0, "a", run=7), "a")
    assert [box.popleft(), box.popleft()] == ["a", "b"]
    assert box.put(Envelope(0, 1, "later"), "later")           # held for seq 0 ...
    box.remove_sender(0)                                       # ... which never comes
    assert not box.put(Envelope(0, 0, "first"), "first")
    assert not box
    assert Inbox().put(Envelope(5, 0, "any"), "any")           # not strict: any sender


def test_numbered_counts_per_receiver():
    n = Numbered(sender=3, run=2)
    seqs = [(d, n.envelope(d, Marker(1)).seq) for d in (0, 1, 0, 0, 1)]
    assert seqs == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1)]
    assert n.envelope(0, Marker(1)) == Envelope(3, 3, Marker(1), 2)


class _Peer:
    """Answers each push once the test releases it."""

    key, address = "peer-key", "tcp://peer:1"

    def __init__(self):
        self.got, self.gate, self.fail = [], asyncio.Event(), False

    async def call(self, method, env):
        self.got.append((method, env))
        await self.gate.wait()
        if self.fail:
            raise OSError("connection reset")
        return env.seq


def test_a_channel_keeps_at_most_credits_in_flight_numbers_them_and_reports_failures():
    async def go():
        peer = _Peer()
        blocked, errors, replies = [], [], []
        ch = OutChannel(peer, sender=2, credits=2, label="agg[2]", on_blocked=blocked.append,
                        on_error=errors.append)
        await ch.send(Batch(None, 0.0), replies.append)
        await ch.send(Marker(1), replies.append)
        third = asyncio.ensure_future(ch.send(Marker(2)))
        await asyncio.sleep(0.01)
        assert len(peer.got) == 2 and not third.done()        # the third waits for a credit
        peer.gate.set()
        await third
        await ch.drain()
        assert [e.seq for _, e in peer.got] == [0, 1, 2] and {m for m, _ in peer.got} == {"push"}
        assert all(e.sender == 2 for _, e in peer.got) and sorted(replies) == [0, 1]
        assert len(blocked) == 3 and blocked[2] > 0.005
        peer.fail = True
        await ch.send(Marker(3))
        await ch.drain()
        assert len(errors) == 1 and isinstance(errors[0], StreamlbError)
        assert "agg[2] could not send to peer-key on tcp://peer:1: OSError" in str(errors[0])

    asyncio.run(go())


@pytest.mark.parametrize("cls", [Batch, Marker])
def test_messages_are_frozen(cls):
    msg = cls(None, 0.0) if cls is Batch else cls(1)
    with pytest.raises(AttributeError):
        msg.emitted = 1.0


def test_a_stopped_instance_leaves_nothing_on_its_way_and_keeps_no_sender_waiting():
    """What a stop does to the channels (``Instance._hush``): a send not yet answered is given
    up, and every message queued at the receiver, in order or early, is refused at once."""
    async def go():
        peer = _Peer()
        ch = OutChannel(peer, sender=0, credits=2, label="src[0]")
        await ch.send(Marker(1))
        await asyncio.sleep(0.01)
        assert len(ch.tasks) == 1               # held by the peer
        ch.cancel()
        await asyncio.sleep(0.01)
        assert not ch.tasks
        await asyncio.wait_for(ch.drain(), 1)   # its credit is back

        box = Inbox([0, 1], strict=True)
        loop = asyncio.get_running_loop()
        waiting = [loop.create_future() for _ in range(3)]
        assert box.put(Envelope(0, 0, "a"), (0, "a", waiting[0]))
        assert box.put(Envelope(1, 2, "c"), (1, "c", waiting[1]))      # early: 0 and 1 not here yet
        assert box.put(Envelope(1, 0, "b"), (1, "b", waiting[2]))
        box.refuse_waiting(StreamlbError("instance agg[0] was stopped"))
        assert not box and all(f.done() for f in waiting)
        for f in waiting:
            with pytest.raises(StreamlbError, match="was stopped"):
                f.result()

    asyncio.run(go())
