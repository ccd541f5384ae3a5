"""The instance's measurements: the emulated cost server."""
import pytest


def test_emulated_cost_serves_a_queue_back_to_back_and_starts_afresh_after_idle():
    """The emulated server (``cost=``): a batch already queued when the last one was served
    starts its service at that moment, however late the event loop comes back to it, so
    a shared loop does not slow an instance below 1 / cost; one taken from an empty
    queue starts when it is taken; no batch is ever done before its service time."""
    import asyncio
    import collections
    import time
    from streamlb._worker._metrics import CostServer

    async def go():
        inst = CostServer()
        queue = collections.deque(["queued"] * 2)
        starts, ends = [], []
        for _ in range(3):
            t1 = time.perf_counter()
            starts.append(await inst.serve(0.02, t1, more=bool(queue)))
            ends.append(time.perf_counter())
            assert ends[-1] >= starts[-1] + 0.02             # never done early
            time.sleep(0.03)             # the loop is busy elsewhere before the next batch
            if queue:
                queue.popleft()
        # the second and third were queued: each began when the one before was served
        assert starts[1] == pytest.approx(starts[0] + 0.02, abs=1e-9)
        assert starts[2] == pytest.approx(starts[1] + 0.02, abs=1e-9)
        assert inst.served_until is None                    # the queue ran dry
        t1 = time.perf_counter()
        assert await inst.serve(0.02, t1, more=bool(queue)) == t1   # afresh after idle
        assert await inst.serve(0.0, t1, more=bool(queue)) == t1    # no cost, no wait

    asyncio.run(go())
