"""Tumbling and hopping window aggregates with their panes in RocksDB
(``state_backend="rocksdb"``): the store against the memory one and pandas, and on a
LocalCluster of 2 worker processes (a migration, savepoints across backends, a SIGKILLed
worker with checkpoints)."""
from __future__ import annotations

import itertools
import os
import time

import dask
import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.keygroups import assign_to_key_group
from streamlb._state import _rocks, _window_panes_rocks
from streamlb._state._window_panes import PaneWindowState
from streamlb._state._window_panes_rocks import RocksPaneWindowState, Spilled
from test_checkpoint import _kill_one, _wait_for_a_checkpoint_with_keys, cluster3  # noqa: F401 - a fixture
from windowing import S, emitted, expected

G, KEYS = 32, 3_000
SPEC = {"n": ("value", "count"), "total": ("value", "sum"), "top": ("value", "max")}
WINDOWS = {"tumbling": dict(size=4 * S, slide=4 * S), "hopping": dict(size=6 * S, slide=2 * S)}


def records(n, seed=3, disorder=2 * S):
    """Keys over 40 s of event time, each row up to ``disorder`` behind the stream's order."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, 40 * S, n)) - rng.integers(0, disorder, n)
    return pd.DataFrame({"key": rng.integers(0, KEYS, n), "value": rng.integers(0, 100, n),
                         "event_time": pd.to_datetime(np.maximum(t, 0))})


def window_of(kind, lateness=0):
    return {"mode": "aggregate", "kind": kind, "lateness": lateness, "gap": 0, **WINDOWS[kind]}


def drive(stores, frame, batch=700, delay=S, cut_at=None, move=None, lag=False):
    """Every store gets the same batches and watermarks (``delay`` behind the largest time);
    returns each store's output frames and late rows. ``move(stores)`` runs after batch
    ``cut_at``. ``lag``: a firing's first frame is read at once, the rest after the next
    batch went in (the store settles it first)."""
    outs = [[] for _ in stores]
    lates = [[] for _ in stores]
    waiting = [None for _ in stores]
    top = 0
    for i, a in enumerate(range(0, len(frame), batch)):
        part = frame.iloc[a:a + batch]
        times = part["event_time"].to_numpy().view(np.int64)
        top = max(top, int(times.max()))
        for j, (st, out, late) in enumerate(zip(stores, outs, lates)):
            lt = st.update(part, None, times)
            if lt is not None and len(lt):
                late.append(lt)
            if waiting[j] is not None:
                out.extend(waiting[j])
            pieces = iter(st.pieces(st.advance(top - delay)))
            out.extend(itertools.islice(pieces, 1) if lag else pieces)
            waiting[j] = pieces if lag else None
        if i == cut_at:
            move(stores)
    for st, out, rest in zip(stores, outs, waiting):
        out.extend(rest or [])
        out.extend(st.pieces(st.advance(np.iinfo(np.int64).max)))
    return outs, lates


def last_rows(frames):
    """Each window's last output row per key (a window that fired again replaces it)."""
    got = pd.concat(frames, ignore_index=True).assign(ws=lambda d: d["window_start"].astype("int64"),
                                                      we=lambda d: d["window_end"].astype("int64"))
    return got.drop_duplicates(["key", "ws"], keep="last")[["key", "ws", "we", "n", "total"]] \
        .sort_values(["key", "ws"]).reset_index(drop=True)


@pytest.fixture
def stores(tmp_path, monkeypatch):
    """Stores of either backend; the RocksDB ones' panes go to the database past 256 keys
    (by default a pane stays in the store's buffer up to 65536: the LocalCluster tests
    below)."""
    monkeypatch.setattr(_rocks, "BUFFER_KEYS", 256)
    made = []

    def make(kind, lateness=0, backend="rocksdb"):
        w = window_of(kind, lateness)
        st = (RocksPaneWindowState("w", w, "key", G, str(tmp_path), spec=SPEC) if backend == "rocksdb"
              else PaneWindowState("w", w, "key", G, spec=SPEC))
        made.append(st)
        return st
    yield make
    for st in made:
        if hasattr(st, "close"):
            st.close()
    assert not [p for p in os.listdir(tmp_path) if "fired" in p], "a fired window's frames were left on disk"


@pytest.mark.parametrize("lag", [False, True], ids=["read-at-once", "read-after-the-next-batch"])
@pytest.mark.parametrize("kind", ["tumbling", "hopping"])
def test_the_store_fires_what_memory_fires_in_pieces(stores, kind, lag, monkeypatch):
    """The same batches into both stores: the same rows per window, exact against pandas;
    a window of more keys than a piece is emitted as several frames, each of its own key
    groups (no key twice in a window), also when the next batch comes before they are all
    read."""
    monkeypatch.setattr(_window_panes_rocks, "PIECE_ROWS", 400)
    frame = records(30_000)
    mem, rocks = stores(kind, backend="memory"), stores(kind)
    (m_out, r_out), (m_late, r_late) = drive([mem, rocks], frame, lag=lag)
    assert len(r_out) > 2 * len(m_out), (len(r_out), len(m_out))
    late = pd.concat(r_late, ignore_index=True)
    pd.testing.assert_frame_equal(late, pd.concat(m_late, ignore_index=True))
    got = emitted(r_out)
    assert not got.duplicated(["key", "ws"]).any(), "a window was emitted twice"
    want = expected(frame, kind, late, **WINDOWS[kind])
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    pd.testing.assert_frame_equal(got, emitted(m_out))
    top = pd.concat(r_out).assign(ws=lambda d: d["window_start"].astype("int64")).set_index(["key", "ws"])["top"]
    assert top.sort_index().tolist() == pd.concat(m_out).assign(
        ws=lambda d: d["window_start"].astype("int64")).set_index(["key", "ws"])["top"].sort_index().tolist()
    assert len(rocks.panes) <= 3 and len(rocks) == 0


@pytest.mark.parametrize("kind", ["tumbling", "hopping"])
def test_the_windows_of_one_watermark_go_on_as_one_frame(stores, kind):
    """A watermark that fires several small windows gives them as one frame, as the memory
    store does (its rows in another order; a frame per window cost the steps after the
    operator a call each)."""
    frame = records(5_000)
    mem, rocks = stores(kind, backend="memory"), stores(kind)
    times = frame["event_time"].to_numpy().view(np.int64)
    for st in (mem, rocks):
        st.update(frame, None, times)
    got = [list(st.pieces(st.advance(30 * S))) for st in (mem, rocks)]
    assert len(got[0]) == len(got[1]) == 1
    assert got[1][0]["window_end"].nunique() > 1
    pd.testing.assert_frame_equal(emitted(got[1]), emitted(got[0]))      # rows in another order


@pytest.mark.parametrize("kind", ["tumbling", "hopping"])
def test_late_rows_within_lateness_fire_again(stores, kind):
    """With allowed lateness, rows after a window fired make it fire again for their keys;
    the last row of each window is exact against pandas, as the memory store's."""
    frame = records(20_000, disorder=5 * S)
    mem, rocks = stores(kind, lateness=3 * S, backend="memory"), stores(kind, lateness=3 * S)
    (m_out, r_out), (m_late, r_late) = drive([mem, rocks], frame)
    late = pd.concat(r_late, ignore_index=True) if r_late else None
    assert sum(len(f) for f in r_out) > len(expected(frame, kind, late, **WINDOWS[kind]))   # some fired again
    want = expected(frame, kind, late, **WINDOWS[kind])
    pd.testing.assert_frame_equal(last_rows(r_out), want, check_dtype=False)
    pd.testing.assert_frame_equal(last_rows(r_out), last_rows(m_out))


@pytest.mark.parametrize("direction", ["memory->rocksdb", "rocksdb->memory"])
def test_cut_and_install_between_backends(stores, direction):
    """Half the key groups are cut from one backend's store mid-stream and installed into
    the other's (the blobs are one format); the two stores' outputs together are exact."""
    kind = "hopping"
    frame = records(20_000)
    src_backend, dst_backend = direction.split("->")
    a, b = stores(kind, backend=src_backend), stores(kind, backend=dst_backend)
    mine = np.arange(G) < G // 2

    class Half:
        """One of the two stores, fed only the rows of its key groups."""

        def __init__(self, st, own):
            self.st, self.own = st, own

        def update(self, part, groups, times):
            g = assign_to_key_group(part["key"].to_numpy(), G, name="key")
            sel = self.own[g]
            return self.st.update(part[sel], None, times[sel]) if sel.any() else None

        def advance(self, wm):
            return self.st.advance(wm)

        def pieces(self, fired):
            return self.st.pieces(fired)

    left, right = Half(a, np.ones(G, bool)), Half(b, np.zeros(G, bool))

    def move(_):
        groups = np.flatnonzero(mine)
        snap = a.snapshot(groups)
        blob = a.cut(groups)
        assert blob["states"].keys() == snap["states"].keys()
        b.install(blob)
        left.own, right.own = ~mine, mine.copy()
    (a_out, b_out), (a_late, b_late) = drive([left, right], frame, cut_at=12, move=move)
    late = pd.concat(a_late + b_late, ignore_index=True) if a_late + b_late else None
    got = emitted(a_out + b_out)
    want = expected(frame, kind, late, **WINDOWS[kind])
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_a_pane_closes_as_its_range(stores, tmp_path):
    """Expired panes leave nothing in the database: one database per instance, not per
    pane, and an empty one at the end."""
    rocks = stores("hopping")
    drive([rocks], records(10_000))
    assert not rocks.panes and len(os.listdir(tmp_path)) == 1
    assert next(iter(rocks.db.keys()), None) is None


def test_spilled_frames_are_read_once():
    frame = pd.DataFrame({"a": [1, 2]})
    sp = Spilled(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"spill-{os.getpid()}"))
    sp.add(frame)
    sp.add(frame)
    assert [len(f) for f in sp.frames()] == [2, 2] and not os.path.exists(sp.directory)


# -- on a LocalCluster -------------------------------------------------------------------------------
ROWS = 120_000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rwin-data")
    frame = records(ROWS, seed=5)
    for i, part in enumerate(np.array_split(np.arange(ROWS), 3)):
        frame.iloc[part].to_parquet(root / f"part-{i}.parquet")
    return str(root), frame


def build(path, parallelism, rate=None):
    """A hopping window aggregate; ``outs`` takes its windows and its late rows."""
    src = Stream.from_parquet(path, batch_size=4_000, rate=rate).with_watermark("event_time", delay="2s")
    op = src.key_by("key").window(size="6s", slide="2s").aggregate(
        {"n": ("value", "count"), "total": ("value", "sum")}, name="win", parallelism=parallelism)
    outs = op.sink_to_list()
    op.late().sink(outs.append)
    return src, outs


def check(outs, frame):
    late = [f for f in outs if "watermark" in f.columns]
    late = pd.concat(late, ignore_index=True) if late else None
    got = emitted([f for f in outs if "watermark" not in f.columns])
    assert not got.duplicated(["key", "ws"]).any(), "a window was emitted twice"
    pd.testing.assert_frame_equal(got, expected(frame, "hopping", late, size=6 * S, slide=2 * S), check_dtype=False)


@pytest.mark.parametrize("strategy", ["all-at-once", "lazy"])
def test_a_hopping_window_on_rocksdb_is_exact_across_a_migration(two_workers, data, tmp_path, strategy):
    """The panes live in one database per instance; key groups move while the stream runs,
    and every window is emitted once, exact against pandas."""
    path, frame = data
    src, outs = build(path, 3, rate=30_000)
    with dask.config.set({"streamlb.state.dir": str(tmp_path)}), \
            streamlb.run(src, client=two_workers, key_groups=G, state_backend="rocksdb") as job:
        time.sleep(0.5)
        job.migrate("win", range(0, 8), 2, strategy=strategy)
        assert job.summary()["records"] < len(frame), "the stream ended before the move"
        dbs = os.listdir(tmp_path)
        job.wait(timeout=120)
        assert len(dbs) == 3 and all(d.startswith("win-") for d in dbs), dbs
        assert "migration" in {h.get("kind", "migration") for h in job.history}
    check(outs, frame)


@pytest.mark.parametrize("first, second", [("memory", "rocksdb"), ("rocksdb", "memory")])
def test_a_window_savepoint_restores_across_state_backends(two_workers, data, tmp_path, first, second):
    """Drained with a savepoint on one backend, restored on the other at another
    parallelism: the two runs' windows together are each emitted once, exact."""
    path, frame = data
    src, outs1 = build(path, 2, rate=20_000)
    with streamlb.run(src, client=two_workers, key_groups=G, state_backend=first) as job:
        deadline = time.time() + 30
        while job.summary()["records"] < ROWS // 2 and time.time() < deadline:
            time.sleep(0.05)
        sp = job.drain(savepoint=str(tmp_path / "sp"), timeout=60)
    restored, outs2 = build(path, 3)
    with streamlb.run(restored, client=two_workers, key_groups=G, state_backend=second, restore=sp) as job:
        job.wait(timeout=120)
        assert 0 < job.summary()["records"] < len(frame)   # only what came after the savepoint
    print(f"frames before the savepoint: {len(outs1)}, after: {len(outs2)}")
    assert outs1 and outs2, "every window fired in one of the two runs"
    check(outs1 + outs2, frame)


@pytest.mark.cluster
def test_sigkill_with_window_panes_in_rocksdb_is_recovered_exactly_once(cluster3, data, tmp_path):  # noqa: F811
    """A worker holding window instances is SIGKILLed after a checkpoint with keys; the panes
    come back from it on the workers left and every window is emitted exactly once."""
    path, frame = data
    cluster3.wait_for_workers(3, timeout=60)
    src, outs = build(path, 3, rate=30_000)
    with dask.config.set({"streamlb.state.dir": str(tmp_path / "db")}):
        job = streamlb.run(src, client=cluster3, key_groups=G, state_backend="rocksdb",
                           checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3)
    try:
        _wait_for_a_checkpoint_with_keys(job)
        victim = _kill_one(cluster3, job)
        job.wait(timeout=180)
        recoveries = [h for h in job.history if h.get("kind") == "recovery"]
        assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]
    finally:
        job.stop()
    check(outs, frame)


def test_make_store_and_the_log_say_which_windows_rocksdb_holds(tmp_path):
    """Fixed windows' aggregates go to RocksDB; sessions, apply and window joins stay in
    memory, and ``kept_in_memory`` (what run() logs) names them."""
    from types import SimpleNamespace

    from streamlb._state._backends import kept_in_memory, make_store

    def stage(kind="hopping", mode="aggregate"):
        w = {**window_of("hopping" if kind == "session" else kind), "kind": kind, "mode": mode, "gap": S}
        return SimpleNamespace(kind="window", name="w", window=w, key_name="key", spec=SPEC, func=None,
                               join=None, state={"backend": "rocksdb", "dir": str(tmp_path)})
    st = make_store(stage(), G)
    assert type(st).__name__ == "RocksPaneWindowState" and kept_in_memory(stage()) is None
    st.close()
    assert kept_in_memory(stage("tumbling")) is None
    assert kept_in_memory(stage("session")) == "session window"
    assert kept_in_memory(stage(mode="apply")) == "window apply"
    assert kept_in_memory(stage(mode="join")) == "window join"
    assert type(make_store(stage("session"), G)).__name__ == "SessionWindowState"
