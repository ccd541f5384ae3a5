"""Sources: pacing at a rate, and the flush a lazy epoch asks for."""
import time

import numpy as np
import pandas as pd


def test_a_flush_sends_the_rows_already_due_and_no_row_before_its_time():
    """A router switched by a merging lazy epoch asks its source to flush: the rows of the
    current batch already due go out at once, the rest at the batch's end; every row goes
    out once, in order, and none before its time (``rate``: row i is due at t0 + (i+1)/rate)."""
    import asyncio
    import concurrent.futures
    from types import SimpleNamespace

    from streamlb._worker._sources import Source

    rate, n = 2000.0, 200                        # two batches of 100 ms
    batches = [(pd.DataFrame({"i": np.arange(k * n, (k + 1) * n)}), None, None) for k in range(2)]
    out = []

    async def go():
        async def emit(batch, emitted):
            out.append((batch["i"].to_numpy(), emitted, time.time()))

        inst = Source(SimpleNamespace(), 0, emit)
        loop = asyncio.get_running_loop()
        reader = concurrent.futures.ThreadPoolExecutor(1)

        async def flush_later():
            await asyncio.sleep(0.15)            # half-way through the second batch
            inst.flush_due.set()

        t0 = time.time()
        flusher = asyncio.ensure_future(flush_later())
        await inst.emit_all(loop, reader, iter(batches), rate)
        await flusher
        reader.shutdown()
        return t0

    t0 = asyncio.run(go())
    rows = np.concatenate([r for r, _, _ in out])
    np.testing.assert_array_equal(rows, np.arange(2 * n))          # each row once, in order
    for r, _, sent_at in out:
        assert sent_at >= t0 + (r[-1] + 1) / rate - 1e-3            # none before its time
    sizes = [len(r) for r, _, _ in out]
    assert len(sizes) == 3 and sizes[0] == n and 0 < sizes[1] < n   # the second batch was split
