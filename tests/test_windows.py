"""Event time, watermarks and windows, exact against pandas (docs/windows.md)."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.exceptions import PipelineError, SchemaError

from windowing import S, assign, check, emitted, expected

WINDOWS = {
    "tumbling": ({"size": "10s"}, {"size": 10 * S, "slide": 10 * S}),
    "hopping": ({"size": "10s", "slide": "2s"}, {"size": 10 * S, "slide": 2 * S}),
    "session": ({"gap": "5s"}, {"gap": 5 * S}),
}
SPEC = {"n": ("value", "count"), "total": ("value", "sum")}


def windowed(path, kind, delay="0s", parallelism=4, **source):
    src = Stream.from_parquet(path, **source).with_watermark("event_time", delay=delay)
    op = src.key_by("key").window(**WINDOWS[kind][0]).aggregate(SPEC, parallelism=parallelism, name="w")
    out, late = [], []
    op.sink(out.append)
    op.late().sink(late.append)
    return src, out, late


def late_frame(late: list) -> pd.DataFrame | None:
    return pd.concat(late, ignore_index=True) if late else None


@pytest.mark.parametrize("kind", list(WINDOWS))
def test_windows_exact_with_late_records(two_workers, disordered, disordered_frame, kind):
    src, out, late = windowed(disordered, kind, batch_size=250)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait()
        metrics = job.metrics()
    lf = late_frame(late)
    check(emitted(out), expected(disordered_frame, kind, lf, **WINDOWS[kind][1]))
    if kind != "session":       # a session that a late record would have joined just closes later
        assert lf is not None and len(lf) > 0
    if lf is not None:
        assert (lf["window_end"] <= lf["watermark"]).all()
        assert set(lf.columns) >= {"key", "value", "event_time", "window_start", "window_end", "watermark"}
        assert metrics[metrics.operator == "w"].late_records.sum() == len(lf)


def test_late_records_and_watermark_lag_on_prometheus(two_workers, disordered):
    from test_prometheus import scrape

    port = two_workers.scheduler_info()["services"]["dashboard"]
    url = f"http://127.0.0.1:{port}/metrics"
    src, out, late = windowed(disordered, "tumbling", batch_size=250, rate=30_000)
    with streamlb.run(src, client=two_workers, balancer="static", window=0.2) as job:
        time.sleep(1.0)
        running = scrape(url, job.id)["samples"]
        job.wait()
        time.sleep(0.5)         # the last load reports reach the scheduler
        done = scrape(url, job.id)["samples"]
        metrics = job.metrics()
    # while it runs: each window instance's watermark behind the wall clock (the log is
    # dated 2026-01-01); at the end of the stream the watermark is +inf and the series goes
    lags = [v for (n, lab), v in running.items() if n == "streamlb_watermark_lag_seconds"]
    assert len(lags) == 4 and all(v > 0 for v in lags)
    assert not [n for (n, lab) in done if n == "streamlb_watermark_lag_seconds"]
    late_total = sum(v for (n, lab), v in done.items() if n == "streamlb_late_records_total")
    assert late_total == metrics.late_records.sum() == sum(len(f) for f in late) > 0


@pytest.mark.parametrize("kind", list(WINDOWS))
def test_delay_covering_the_disorder_makes_nothing_late(two_workers, disordered, disordered_frame, kind):
    src, out, late = windowed(disordered, kind, delay="3s")
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait()
        marks = job.watermarks()
    assert late == []
    check(emitted(out), expected(disordered_frame, kind, **WINDOWS[kind][1]))
    assert set(marks.operator) == {"w", marks.operator[~marks.operator.eq("w")].iloc[0]}
    assert (marks.watermark == pd.Timestamp.max).all() and not marks.idle.any()


def test_apply_matches_groupby_apply(two_workers, disordered, disordered_frame):
    def summary(key, start, end, rows):
        assert (rows.key == key).all() and (rows.event_time >= start).all() and (rows.event_time < end).all()
        return pd.DataFrame({"n": [len(rows)], "top": [rows.value.max()], "values": [sorted(rows.value)]})

    src = Stream.from_parquet(disordered).with_watermark("event_time", delay="3s")
    out = []
    src.key_by("key").window(size="10s", slide="5s").apply(summary, name="ap").sink(out.append)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait()
    got = pd.concat(out, ignore_index=True)
    assert list(got.columns[:3]) == ["key", "window_start", "window_end"]
    pairs = assign(disordered_frame, "hopping", size=10 * S, slide=5 * S)
    want = pairs.groupby(["key", "ws"]).value.agg(n="count", top="max", values=lambda v: sorted(v)).reset_index()
    got = got.assign(ws=got.window_start.to_numpy().astype("datetime64[ns]").view(np.int64))
    got = got.sort_values(["key", "ws"]).reset_index(drop=True)
    assert got.key.tolist() == want.key.tolist() and got.ws.tolist() == want.ws.tolist()
    assert got.n.tolist() == want.n.tolist() and got.top.tolist() == want.top.tolist()
    assert got["values"].tolist() == want["values"].tolist()


def test_late_records_go_to_dead_letters_without_a_late_stream(two_workers, disordered, disordered_frame):
    src = Stream.from_parquet(disordered, batch_size=250).with_watermark("event_time")
    out = []
    src.key_by("key").window(size="10s").aggregate(SPEC, name="w").sink(out.append)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait()
        dead = job.dead_letters()
    assert len(dead) and (dead.reason == "late").all() and (dead.operator == "w").all()
    lf = pd.DataFrame(list(dead.record))
    check(emitted(out), expected(disordered_frame, "tumbling", lf, size=10 * S, slide=10 * S))


def test_misplaced_or_bad_event_time_fails_run(two_workers, disordered):
    def run(src):
        with streamlb.run(src, client=two_workers, balancer="static") as job:
            job.wait()

    src = Stream.from_parquet(disordered)
    src.key_by("key").aggregate(SPEC, name="a").with_watermark("event_time").sink(print)
    with pytest.raises(PipelineError, match=r"with_watermark\('event_time'\).*operator 'a'.*source's stage"):
        run(src)
    src = Stream.from_parquet(disordered)
    src.key_by("key").window(size="10s").aggregate(SPEC, name="w")
    with pytest.raises(PipelineError, match="window operator 'w' needs event time.*with_watermark"):
        run(src)
    src = Stream.from_parquet(disordered).with_watermark("when")
    src.key_by("key").window(size="10s").aggregate(SPEC)
    with pytest.raises(SchemaError, match="column 'when' is not in .*columns there: key, value, event_time"):
        run(src)
    src = Stream.from_parquet(disordered).with_watermark("value")
    src.key_by("key").window(size="10s").aggregate(SPEC)
    with pytest.raises(SchemaError, match=r"with_watermark\('value'\).*type double; event times must be timestamps"):
        run(src)
    src = Stream.from_parquet(disordered).with_watermark("key")
    src.key_by("key").window(size="10s").aggregate(SPEC)
    with pytest.raises(SchemaError, match="holds integers .*unit= one of s, ms, us, ns"):
        run(src)
    with pytest.raises(PipelineError, match="slide .* must not be longer than size"):
        Stream.from_parquet(disordered).key_by("key").window(size="2s", slide="5s")
    with pytest.raises(PipelineError, match="delay: '-1s' is not a duration >= 0"):
        Stream.from_parquet(disordered).with_watermark("event_time", delay="-1s")
    with pytest.raises(PipelineError, match="unit must be None .* one of s, ms, us, ns"):
        Stream.from_parquet(disordered).with_watermark("event_time", unit="days")


def test_a_split_idle_for_idle_timeout_holds_nothing_back():
    from streamlb._time import MAX_TIME, MIN_TIME
    from streamlb._worker._watermarks import SplitClock

    clock = SplitClock({"column": "t", "unit": "s", "delay": 2 * S, "idle_timeout": 5 * S}, "src")
    for split, t in (("a", 100), ("b", 40)):
        clock.current = split
        clock.observe(pd.DataFrame({"t": [t - 1, t]}), dead=None)
    now = clock.last["b"]
    assert clock.watermark({"a", "b", "c"}, now) == (MIN_TIME, False)     # c has not emitted yet
    assert clock.watermark({"a", "b"}, now) == (38 * S, False)           # the slowest split, minus delay
    assert clock.watermark({"a", "b"}, now + 6) == (MIN_TIME, True)      # both idle: the instance is
    clock.last["a"] = now + 6
    assert clock.watermark({"a", "b"}, now + 6) == (98 * S, False)       # b idle: a alone
    assert clock.watermark(set(), now) == (MAX_TIME, False)              # every split ended
    clock.last["a"] = clock.last["b"] = clock.started + 5
    assert clock.watermark({"a", "b", "c"}, clock.started + 5.5) == (38 * S, False)   # c silent 5 s: idle
    # unless its reader knows it has rows waiting (a Kafka partition not read up to its end)
    assert clock.watermark({"a", "b", "c"}, clock.started + 5.5, waiting={"c"}) == (MIN_TIME, False)
    assert clock.watermark({"a", "b"}, now + 6, waiting={"b"}) == (38 * S, False)


def test_a_split_is_not_idle_while_the_job_holds_its_source_back():
    """A paced source's splits idle in its pace, not in wall time: a source held back by the
    job (a batch blocked on credits while a move holds a join's rows, batches going out
    behind their pace on a loaded machine) leaves its other splits unsent meanwhile, and
    that is no idleness. Counted in wall time, a 6 s stall made them idle, the watermark
    jumped to the split sent and their next rows were late (the autoflow join test lost
    hundreds of rows so on a loaded 2-core machine)."""
    from streamlb._worker._watermarks import SplitClock

    clock = SplitClock({"column": "t", "unit": "s", "delay": 2 * S, "idle_timeout": 5 * S}, "src")
    t0 = clock.started
    for split, t, due in (("a", 100, t0), ("b", 40, t0), ("a", 101, t0 + 1)):
        clock.current = split
        clock.observe(pd.DataFrame({"t": [t - 1, t]}), dead=None)
        clock.last[split], clock.paced[split] = due, due
    # a's batch due at t0 + 1 went out 6 s late: in pace the source stands at t0 + 1
    assert clock.watermark({"a", "b"}, t0 + 7, pace=t0 + 1) == (38 * S, False)      # b is not idle
    clock.last["a"] = t0 + 7                # in wall time b was idle: the watermark jumped past it
    assert clock.watermark({"a", "b"}, t0 + 7) == (99 * S, False)
    # the source keeps its pace again: b silent 5 s of it is idle
    clock.paced["a"] = t0 + 5.5
    assert clock.watermark({"a", "b"}, t0 + 12, pace=t0 + 5.5) == (99 * S, False)


def _stamp(frame):
    import time

    return frame.assign(emitted_at=time.time())


def test_an_idle_split_does_not_stall_windows(two_workers, tmp_path):
    """Three files on two source instances: one holds 200 records over 2 s of event time,
    the others 3000 over 60 s. An instance reads its files in step (by the share read),
    so the short file emits its second half only half-way through the stream: until then
    it holds its instance's watermark back at 1 s. With idle_timeout=0.2s it is idle
    meanwhile, windows fire as the stream goes, and what it sends afterwards is late for
    the windows that fired: exactly the late output."""
    base = pd.Timestamp("2026-01-01")
    frames = []
    for i, (secs, n) in enumerate(((2, 200), (60, 3000), (60, 3000))):
        t = base + pd.to_timedelta(np.linspace(0, secs, n, endpoint=False), unit="s")
        frames.append(pd.DataFrame({"key": np.arange(n) % 7, "value": np.arange(n) % 5, "event_time": t}))
        frames[-1].to_parquet(tmp_path / f"p{i}.parquet")
    src = Stream.from_parquet(str(tmp_path), batch_size=100, rate=3_000).with_watermark(
        "event_time", idle_timeout="0.2s")
    out, late = [], []
    op = src.key_by("key").window(size="10s").aggregate(SPEC, name="w")
    op.map(_stamp).sink(out.append)
    op.late().sink(late.append)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait()
        stream = job.summary()["seconds"]       # from the first source's start to the last end
        ended = max(r["finished_at"] for r in job._results.last if r["finished_at"])
    t0 = ended - stream                         # the stream's start, not the job's deployment
    got = pd.concat(out, ignore_index=True)
    first = got[got.window_start == base].emitted_at.max()
    assert first - t0 < 0.6 * stream, ("the first window waited for the idle split", first - t0, stream)
    lf = late_frame(late)
    assert lf is not None and (lf.event_time < base + pd.Timedelta("2s")).all()
    check(emitted([got.drop(columns="emitted_at")]),
          expected(pd.concat(frames, ignore_index=True), "tumbling", lf, size=10 * S, slide=10 * S))


def test_the_dashboard_names_the_watermark_and_late_records():
    from streamlb._observe import _totals
    from streamlb._observe._dashboard_page import event_time_text

    class PluginJob:        # what the plugin keeps of a job (weakly referenced by the totals)
        pass

    job = PluginJob()
    assert event_time_text(job, "w", 2) == ""
    _totals.count_event_time(job, "w", 0, 5, pd.Timestamp("2026-01-01").value)
    _totals.count_event_time(job, "w", 1, 2, pd.Timestamp("2026-01-01 00:00:10").value)
    text = event_time_text(job, "w", 2)
    assert "watermark 2026-01-01 00:00:00 (" in text and text.endswith(", 7 late records")


@pytest.mark.parametrize("kind", ["tumbling", "hopping"])
def test_allowed_lateness_fires_again_and_the_last_row_is_exact(two_workers, disordered, disordered_frame, kind):
    """lateness=2s, no delay: a record up to 2 s past its window's end updates it and the
    window's row comes again; the last row of each key and window is exact, records later
    than that are the late output."""
    src = Stream.from_parquet(disordered, batch_size=250).with_watermark("event_time")
    op = src.key_by("key").window(**WINDOWS[kind][0], lateness="2s").aggregate(SPEC, parallelism=4, name="w")
    out, late = [], []
    op.sink(out.append)
    op.late().sink(late.append)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait()
    rows = pd.concat(out, ignore_index=True)
    last = rows.groupby(["key", "window_start"], sort=False).tail(1)
    lf = late_frame(late)
    if lf is not None:
        assert (lf["window_end"] + pd.Timedelta("2s") <= lf["watermark"]).all()
    assert len(rows) > len(last), "no window fired twice: nothing came within the lateness"
    check(emitted([last]), expected(disordered_frame, kind, lf, **WINDOWS[kind][1]))


def _crossing(frame):
    """One row per batch of file A (keys < 100): its largest event time, and when it left."""
    import time

    a = frame[frame.key < 100]
    return pd.DataFrame({"top": [a.event_time.max()], "sent_at": [time.time()]}) if len(a) else frame.iloc[:0, :0]


def _idle_run(client, root, idle_timeout):
    src = Stream.from_parquet(str(root), batch_size=100, rate=1_500)
    crossings = src.map(_crossing).sink_to_list()
    op = src.with_watermark("event_time", idle_timeout=idle_timeout).key_by("key").window(size="10s").aggregate(
        SPEC, name="w")
    out, late = [], []
    op.map(_stamp).sink(out.append)
    op.late().sink(late.append)
    with streamlb.run(src, client=client, balancer="static") as job:
        job.wait()
    cross = pd.concat([c for c in crossings if len(c)], ignore_index=True).sort_values("sent_at")
    got = pd.concat(out, ignore_index=True)
    # how long after file A's records passed each window's end the window's row came
    first = {end: cross[cross.top >= end].sent_at.min() for end in got.window_end.unique()}
    delays = got.emitted_at - got.window_end.map(first)
    return got, late_frame(late), delays


def test_an_idle_source_instance_does_not_stall_windows(two_workers, tmp_path):
    """Two files, one source instance each: A holds 3000 records over 60 s of event time;
    B, paced to finish with it, emits 100 records of the first second about a third into
    the stream and 100 of the last second at its end, nothing between. With idle_timeout
    0.2 s every window comes within idle_timeout + one load window (1 s) of A's records
    passing its end, B's early records are late, and the rest is exact; with the
    idle_timeout longer than the stream, B holds the windows back until its end."""
    base = pd.Timestamp("2026-01-01")
    a = pd.DataFrame({"key": np.arange(3000) % 7, "value": np.arange(3000) % 5,
                      "event_time": base + pd.to_timedelta(np.linspace(0, 60, 3000, endpoint=False), unit="s")})
    b = pd.DataFrame({"key": 100 + np.arange(200) % 7, "value": 1,
                      "event_time": base + pd.to_timedelta(np.r_[np.linspace(0, 1, 100, endpoint=False),
                                                                 np.linspace(59, 60, 100, endpoint=False)], unit="s")})
    a.to_parquet(tmp_path / "a.parquet")
    b.to_parquet(tmp_path / "b.parquet")
    got, lf, delays = _idle_run(two_workers, tmp_path, "0.2s")
    assert delays.max() <= 0.2 + 1.0, delays.describe()
    assert lf is not None and (lf.key >= 100).all() and (lf.event_time < base + pd.Timedelta("1s")).all()
    check(emitted([got.drop(columns="emitted_at")]),
          expected(pd.concat([a, b], ignore_index=True), "tumbling", lf, size=10 * S, slide=10 * S))
    _, lf, delays = _idle_run(two_workers, tmp_path, "30s")
    assert lf is None and delays.max() > 0.2 + 1.0      # the same stream, B never idle


def test_bad_event_times_and_values_go_to_dead_letters(two_workers):
    """A null event time, and a value that is not a number, are set aside with the reason;
    the other records are counted."""
    base = pd.Timestamp("2026-01-01")
    frame = pd.DataFrame({"key": [1, 1, 2, 2, 1], "value": [1, "x", 3, 4, 5],
                          "event_time": [base, base, pd.NaT, base + pd.Timedelta("1s"), base + pd.Timedelta("12s")]})
    src = Stream.from_iterable([frame]).with_watermark("event_time")
    out = []
    src.key_by("key").window(size="10s").aggregate(SPEC, name="w").sink(out.append)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait()
        dead = job.dead_letters()
    assert sorted(dead.reason) == ["column 'value' holds 'x', not a number", "event time 'event_time' is null"]
    got = pd.concat(out, ignore_index=True).sort_values(["key", "window_start"])
    assert got[["key", "n", "total"]].values.tolist() == [[1, 1, 1], [1, 1, 5], [2, 1, 4]]


@pytest.mark.parametrize("keys", ["int", "str"])
def test_merging_pane_partials_equals_pandas_groupby(keys):
    """A hopping window merges its panes' raw partials in numpy: the same values as pandas'
    ``groupby(level=0, sort=False)`` (keys in order of first appearance, NaN skipped, dtypes
    kept), over random panes of overlapping keys."""
    from streamlb._state._window_panes import merge_partials

    rng = np.random.default_rng(7)
    raw = {"count:v": ("v", "count"), "sum:v": ("v", "sum"), "min:v": ("v", "min"), "max:v": ("v", "max"),
           "count:w": ("w", "count"), "sum:w": ("w", "sum"), "min:w": ("w", "min")}
    for _ in range(100):
        frames = []
        for _ in range(int(rng.integers(2, 6))):
            n = int(rng.integers(0, 40))
            k = rng.choice(60, n, replace=False)
            index = pd.Index(k if keys == "int" else [f"user-{x}" for x in k], name="key")
            f = pd.DataFrame({"count:v": rng.integers(0, 5, n), "sum:v": rng.normal(size=n),
                              "min:v": rng.normal(size=n), "max:v": rng.normal(size=n),
                              "count:w": rng.integers(0, 5, n), "sum:w": rng.integers(-100, 100, n),
                              "min:w": rng.integers(-100, 100, n)}, index=index)
            for c in ("sum:v", "min:v", "max:v"):
                f.loc[rng.random(n) < 0.2, c] = np.nan
            frames.append(f)
        want = pd.concat(frames).groupby(level=0, sort=False).agg(
            {name: ("sum" if how in ("count", "sum") else how) for name, (_, how) in raw.items()})
        keys_out, merged = merge_partials([(f.index.to_numpy(), {c: f[c].to_numpy() for c in f}) for f in frames], raw)
        pd.testing.assert_frame_equal(pd.DataFrame(merged, index=pd.Index(keys_out, name="key")), want)
