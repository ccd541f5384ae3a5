"""Batches queued for an instance, applied as one (``streamlb._worker._coalesce``): what may
be gathered, in which order, and an aggregate fed faster than it applies, exact."""
import asyncio
import collections
import types

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlb._worker._channels import Inbox
from streamlb._worker._coalesce import MAX_ROWS, coalesce, gather
from streamlb._worker._messages import Batch, Marker, Watermark


def _batch(n: int, tag: int, schema: str = "a", emitted: float = 0.0) -> Batch:
    cols = {"k": np.full(n, tag, np.int64), "v": np.arange(n, dtype=np.float64)}
    if schema == "b":
        cols["w"] = np.zeros(n)
    return Batch(pd.DataFrame(cols), emitted, np.full(n, tag % 8, np.int64))


@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", "marker", "big"])), max_size=40))
def test_gathered_batches_keep_each_senders_order_and_stop_at_its_first_other_message(items):
    first = (0, _batch(5, -1), None)
    queue = []
    for i, (sender, what) in enumerate(items):
        msg = (Marker(i) if what == "marker" else
               _batch(MAX_ROWS if what == "big" else 5, i, "b" if what == "b" else "a"))
        queue.append((sender, msg, i))
    ready = collections.deque(queue)
    taken = gather(ready, first)
    assert taken[0] is first
    rest = list(ready)
    assert sorted(x[2] for x in taken[1:] + rest) == list(range(len(queue)))     # each once
    applied = taken[1:] + rest          # the order the instance now sees them in
    for s in (0, 1, 2):                  # every sender's messages in the order it sent them
        assert [x[2] for x in applied if x[0] == s] == [x[2] for x in queue if x[0] == s]
    for sender, msg, _ in taken[1:]:     # only plain batches like the first, within the rows
        assert isinstance(msg, Batch) and msg.frame.columns.tolist() == ["k", "v"]
    assert sum(len(m.frame) for _, m, _ in taken) <= MAX_ROWS
    # a sender's batch is gathered only if nothing of that sender before it was left behind
    for sender, _, seq in taken[1:]:
        assert all(x[2] > seq for x in rest if x[0] == sender)
    # and every small batch of the first kind whose sender left nothing behind before it is
    # gathered (all of the queue is looked at: it is shorter than the scan)
    if len(queue) <= 32:
        for sender, msg, seq in rest:
            if isinstance(msg, Batch) and len(msg.frame) == 5 and msg.frame.columns.tolist() == ["k", "v"]:
                assert any(x[0] == sender and x[2] < seq for x in rest)


def _instance(ready, *, moving=False):
    inbox = Inbox()
    inbox.ready.extend(ready)
    return types.SimpleNamespace(
        inbox=inbox, blocked=set(), ckpt=types.SimpleNamespace(blocking=False),
        owner=types.SimpleNamespace(pending_in={3: None} if moving else {}, merging={}),
        op=types.SimpleNamespace(arrive=lambda frame, sender: frame.assign(side=sender)))


def test_coalesce_makes_one_batch_whose_future_sets_every_parts():
    async def go():
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(4)]
        inst = _instance([(1, _batch(3, 1, emitted=5.0), futs[1]), (0, Watermark(7), futs[2]),
                          (0, _batch(2, 2, emitted=6.0), futs[3])])
        sender, msg, fut = coalesce(inst, 0, _batch(4, 0, emitted=9.0), futs[0])
        # sender 0's second batch stays behind its watermark; sender 1's batch comes along
        assert msg.arrived and msg.frame.k.tolist() == [0] * 4 + [1] * 3
        assert msg.frame.side.tolist() == [0] * 4 + [1] * 3          # each part marked by its sender
        assert msg.groups.tolist() == [0] * 4 + [1] * 3
        assert msg.emitted == 5.0                                    # the oldest part's
        assert [m for _, m, _ in inst.inbox.ready][0] == Watermark(7)
        assert not any(f.done() for f in futs)
        fut.set_result(None)
        await asyncio.sleep(0)
        assert futs[0].done() and futs[1].done() and not futs[2].done() and not futs[3].done()

        # a range index is numbered afresh; other labels are kept; the two kinds never mix
        b1, b2 = _batch(2, 1), _batch(3, 2)
        labelled = Batch(b2.frame.set_axis([0, 2, 5]), 1.0, b2.groups)       # as a filter leaves them
        inst = _instance([(1, Batch(b1.frame.set_axis([7, 9]), 1.0, b1.groups), None), (2, b1, None)])
        _, msg, _ = coalesce(inst, 0, labelled, None)
        assert msg.frame.index.tolist() == [0, 2, 5, 7, 9] and len(inst.inbox.ready) == 1
        inst = _instance([(1, b1, None)])
        _, msg, _ = coalesce(inst, 0, b2, None)
        assert isinstance(msg.frame.index, pd.RangeIndex) and msg.frame.index.tolist() == [0, 1, 2, 3, 4]

        # nothing is gathered while key groups move here
        inst = _instance([(1, _batch(3, 1), None)], moving=True)
        first = _batch(4, 0)
        assert coalesce(inst, 0, first, None)[1] is first
        assert len(inst.inbox.ready) == 1
    asyncio.run(go())


def test_combined_rows_an_aligning_instance_and_full_batches_go_alone():
    from streamlb._state._partials import RECORDS

    def alone(inst, first):
        got = coalesce(inst, 0, first, None)[1]
        return got is first and len(inst.inbox.ready) == 1

    combined = _batch(3, 0).frame.assign(**{RECORDS: 1.0})
    assert alone(_instance([(1, Batch(combined, 0.0, np.zeros(3, np.int64)), None)]),
                 Batch(combined, 0.0, np.zeros(3, np.int64)))        # two would hold a key twice
    aligning = _instance([(1, _batch(3, 1), None)])
    aligning.blocked.add(2)                                          # an epoch's marker came from 2
    assert alone(aligning, _batch(4, 0))
    assert alone(_instance([(1, _batch(3, 1), None)]), _batch(MAX_ROWS, 0))


@pytest.fixture(scope="module")
def unique_keys(tmp_path_factory):
    """20,000 rows with a key each (no map-side combining: every key once) in two files."""
    path = tmp_path_factory.mktemp("coalesce")
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"key": rng.permutation(20_000).astype(np.int64), "value": rng.random(20_000)})
    for i in range(2):
        df.iloc[i::2].to_parquet(path / f"part-{i}.parquet", index=False)
    return str(path), df


def test_an_aggregate_fed_faster_than_it_applies_takes_queued_batches_together_exactly(two_workers, unique_keys):
    import streamlb
    from streamz import Stream

    path, df = unique_keys
    src = Stream.from_parquet(path, batch_size=100)
    # 0.2 ms a record: slower than the source even when a loaded machine slows the source down
    src.key_by("key").aggregate({"n": ("value", "count"), "s": ("value", "sum")}, name="slow", cost=2e-4)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait(timeout=120)
        got = job.state("slow").sort_index()
        m = job.metrics()
    assert got.n.tolist() == [1] * len(df)
    want = df.set_index("key").sort_index()
    assert got.index.tolist() == want.index.tolist()
    np.testing.assert_allclose(got.s.to_numpy(), want.value.to_numpy())
    read = m[m.operator == m.operator[m.operator != "slow"].iloc[0]].batches.sum()
    applied = m[m.operator == "slow"].batches.sum()
    assert read == 200 and 0 < applied < read          # each source batch reaches the aggregate as 1-2 parts
