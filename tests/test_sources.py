"""Sources: pacing at a rate, the flush a lazy epoch asks for, and the source seam."""
import json
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd

from streamlb._sources import Split, open_reader
from streamlb._worker._sources import Source


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


# -- the source seam: one contract every reader passes -------------------------------------------

class ReaderContract:
    """Subclassed once per source: ``make(tmp_path)`` returns a reader of instance 0 (no
    split opened) and the rows it must hand out, as a DataFrame with an ``i`` column."""

    def make(self, tmp_path):
        raise NotImplementedError

    def read_all(self, reader):
        out = []
        while (b := reader.poll()) is not None:
            out.append(b)
        return out

    def test_every_row_once_and_each_split_in_order(self, tmp_path):
        reader, rows = self.make(tmp_path)
        reader.add_splits(reader.splits_at({}))
        got = self.read_all(reader)
        assert sorted(np.concatenate([b.frame["i"].to_numpy() for b in got]).tolist()) == rows["i"].tolist()
        for split in {b.split_id for b in got}:
            mine = np.concatenate([b.frame["i"].to_numpy() for b in got if b.split_id == split])
            assert (np.diff(mine) > 0).all()
        assert reader.poll() is None and reader.idle() == {s.split_id for s in reader.snapshot()}

    def test_a_saved_position_goes_on_with_exactly_the_rest(self, tmp_path):
        reader, rows = self.make(tmp_path)
        reader.add_splits(reader.splits_at({}))
        first = [reader.poll() for _ in range(2)]
        saved = reader.save(reader.snapshot())
        assert json.loads(json.dumps(saved)) == saved          # positions are JSON values
        again, _ = self.make(tmp_path)
        again.add_splits(again.splits_at(saved))
        rest = self.read_all(again)
        got = np.concatenate([b.frame["i"].to_numpy() for b in first + rest])
        assert sorted(got.tolist()) == rows["i"].tolist()

    def test_seek_and_remove(self, tmp_path):
        reader, rows = self.make(tmp_path)
        reader.add_splits(reader.splits_at({}))
        split = reader.snapshot()[0].split_id
        reader.seek(split, 3)
        frame = reader.fetch(split)
        assert frame["i"].iloc[0] == self.nth(rows, split, 3)
        (gone,) = reader.remove_splits([split])
        assert gone == Split(split, 3 + len(frame))
        assert split not in reader.offsets() and split not in {s.split_id for s in reader.snapshot()}


class TestParquetReader(ReaderContract):
    def make(self, tmp_path):
        files, frames = [], []
        for k, n in enumerate([1000, 250, 600]):       # unequal files advance in proportion
            df = pd.DataFrame({"i": np.arange(n) * 3 + k, "t": np.arange(n, dtype=float) * (k + 1)})
            files.append(str(tmp_path / f"part-{k}.parquet"))
            df.to_parquet(files[-1])
            frames.append(df)
        stage = SimpleNamespace(kind="parquet_source", assignment=[files], batch_size=100, columns=None,
                                event_time=None, file_rows={f: len(d) for f, d in zip(files, frames)},
                                source={"path": str(tmp_path)})
        self.frames = dict(zip(files, frames))
        return open_reader(stage, 0), pd.concat(frames).sort_values("i", ignore_index=True)

    def nth(self, rows, split, n):
        return self.frames[split]["i"].iloc[n]

    def test_saved_positions_name_files_relative_to_the_root(self, tmp_path):
        """Splits are the absolute paths planned; positions name them under the source's root."""
        reader, _ = self.make(tmp_path)
        splits = reader.splits_at({"files": {"part-1.parquet": 7}, "rows": 7})
        assert [s.split_id for s in splits] == reader.stage.assignment[0]
        assert [s.position for s in splits] == [0, 7, 0]
        assert reader.save(splits) == {"files": {"part-0.parquet": 0, "part-1.parquet": 7, "part-2.parquet": 0}}

    def test_files_advance_in_proportion_or_by_event_time(self, tmp_path):
        reader, _ = self.make(tmp_path)
        reader.add_splits(reader.splits_at({}))
        order = [b.split_id[-9:-8] for b in self.read_all(reader)]
        assert order[:5] == ["0", "1", "2", "0", "2"]      # the file furthest behind in proportion
        reader, _ = self.make(tmp_path)
        reader.event_time = "t"
        reader.add_splits(reader.splits_at({}))
        starts = [b.frame["t"].iloc[0] for b in self.read_all(reader)]
        assert starts == sorted(starts)


class TestIterableReader(ReaderContract):
    def make(self, tmp_path):
        items = [{"i": i} for i in range(30)] + [pd.DataFrame({"i": np.arange(30, 45)})]
        stage = SimpleNamespace(kind="iterable_source", name="from_iterable", items=items, batch_size=8,
                                event_time=None)
        return open_reader(stage, 0), pd.DataFrame({"i": np.arange(45)})

    def nth(self, rows, split, n):
        return n

    def test_saved_positions_keep_the_checkpoint_format(self, tmp_path):
        reader, _ = self.make(tmp_path)
        assert reader.splits_at({"files": {}, "rows": 12}) == [Split("items", 12)]
        assert reader.save([Split("items", 12)]) == {"rows": 12} and reader.offsets() == {}


def test_the_runner_saves_what_was_emitted_and_the_watermark_input_per_split(tmp_path):
    """Through the runner: the position of every split is what was emitted (in the
    checkpoint format), and the watermark input is the largest event time emitted of each."""
    import asyncio

    files = []
    for k in range(2):
        files.append(str(tmp_path / f"part-{k}.parquet"))
        pd.DataFrame({"t": np.arange(500, dtype=float) + 1000 * k}).to_parquet(files[-1])
    files.append(str(tmp_path / "empty.parquet"))
    pd.DataFrame({"t": np.zeros(0)}).to_parquet(files[-1])
    stage = SimpleNamespace(kind="parquet_source", name="src", assignment=[files], batch_size=128, columns=None,
                            event_time="t", file_rows={}, total_rows=1000, rate=None, time_range=None,
                            parallelism=1, source={"path": str(tmp_path)})
    out = []

    async def emit(batch, emitted):
        out.append(len(batch))

    src = Source(stage, 0, emit)
    asyncio.run(src.run(time.time(), {"files": {"part-1.parquet": 100}, "rows": 100}))
    assert sum(out) == 900
    pos = src.position()
    assert pos["files"] == {"part-0.parquet": 500, "part-1.parquet": 500, "empty.parquet": 0} and pos["rows"] == 1000
    assert src.watermark_input() == {files[0]: 499.0, files[1]: 1499.0, files[2]: -np.inf}
    assert src.offsets == {files[0]: 500, files[1]: 500, files[2]: 0}
