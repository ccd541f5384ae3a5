"""streamlb's series on the scheduler's /metrics, scraped over HTTP while a job runs."""
import math
import time
import urllib.request

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import latency
from streamlb.keygroups import assign_to_key_group

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

G = 64
WINDOW = 0.5
INSTANCE = {"job", "operator", "instance", "worker"}
OPERATOR = {"job", "operator"}
COUNTERS = ("_total", "_bucket", "_count", "_sum")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """120k rows over 500 keys in two files: 4 s at the source's rate."""
    rng = np.random.default_rng(3)
    n = 120_000
    df = pd.DataFrame({"key": rng.integers(0, 500, n).astype(np.int64), "value": rng.random(n)})
    path = tmp_path_factory.mktemp("prom")
    for p in range(2):
        df.iloc[p::2].to_parquet(path / f"part-{p}.parquet", index=False)
    return str(path)


def scrape(url: str, job: str) -> dict:
    """{(sample name, frozenset of labels): value} of ``job``'s streamlb samples, and the
    label names each family's samples carry."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    samples, labels = {}, {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("streamlb_"):
            continue
        for s in fam.samples:
            if s.labels.get("job") != job:
                continue
            names = set(s.labels) - {"le"}
            assert labels.setdefault(fam.name, names) == names, fam.name
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return {"samples": samples, "labels": labels}


def per_instance(scraped: dict, name: str) -> dict:
    """{instance: value} of the ``name`` samples of operator agg."""
    out = {}
    for (n, labels), v in scraped["samples"].items():
        lab = dict(labels)
        if n == name and lab["operator"] == "agg":
            out[int(lab["instance"])] = out.get(int(lab["instance"]), 0) + v
    return out


def value(scraped: dict, name: str) -> float:
    (v,) = [v for (n, labels), v in scraped["samples"].items() if n == name and dict(labels)["operator"] == "agg"]
    return v


def check_histograms(scraped: dict) -> None:
    """Buckets cumulative, +Inf the count, the count the records applied."""
    records = per_instance(scraped, "streamlb_records_total")
    series: dict = {}
    for (n, labels), v in scraped["samples"].items():
        if n == "streamlb_latency_seconds_bucket":
            lab = dict(labels)
            series.setdefault(int(lab["instance"]), []).append((float(lab["le"]), v))
    assert set(series) == set(records)
    counts = per_instance(scraped, "streamlb_latency_seconds_count")
    for i, buckets in series.items():
        buckets.sort()
        assert len(buckets) == latency.BINS and math.isinf(buckets[-1][0])
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
        assert buckets[-1][1] == counts[i] == records[i]
    assert all(s >= 0 for s in per_instance(scraped, "streamlb_latency_seconds_sum").values())


def check_monotonic(before: dict, after: dict) -> None:
    for key, v in before["samples"].items():
        if key[0].endswith(COUNTERS):
            assert after["samples"][key] >= v, key


def windows(job) -> dict:
    """{instance: records per window, in window order} of operator agg, from Job.metrics()."""
    m = job.metrics()
    m = m[m.operator == "agg"].sort_values("window_start")
    return {int(i): g.records.to_numpy() for i, g in m.groupby("instance")}


def test_series_while_running_and_after(two_workers, data):
    port = two_workers.scheduler_info()["services"]["dashboard"]
    url = f"http://127.0.0.1:{port}/metrics"
    workers = set(two_workers.scheduler_info()["workers"])
    src = Stream.from_parquet(data, batch_size=2_000, rate=30_000)
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=2, name="agg")
    t0 = time.time()
    with streamlb.run(src, client=two_workers, key_groups=G, window=WINDOW, balancer="static") as job:
        deadline = time.time() + 20
        # the imbalance gauge appears once the plugin has closed the operator's first window
        while not {"streamlb_records", "streamlb_imbalance"} <= set((first := scrape(url, job.id))["labels"]):
            assert time.time() < deadline, "no streamlb series while the job runs"
            time.sleep(0.2)
        # a static job moves nothing by itself: one manual move and one split, counted exactly
        owners = job.routing("agg").owners
        moving = [int(g) for g in np.flatnonzero(owners == 0)[:3]]
        job.migrate("agg", moving, 1)
        key = 7
        home = int(job.routing("agg").owners[assign_to_key_group(np.array([key]), G)[0]])
        job.split("agg", key, [1 - home])
        running = scrape(url, job.id)
        per_window = windows(job)
        assert job.status == "running"

        assert running["labels"] == {
            "streamlb_records": INSTANCE, "streamlb_busy_seconds": INSTANCE, "streamlb_queued_batches": INSTANCE,
            "streamlb_latency_seconds": INSTANCE, "streamlb_imbalance": OPERATOR, "streamlb_epochs": OPERATOR,
            "streamlb_key_groups_moved": OPERATOR, "streamlb_split_keys": OPERATOR}
        assert {dict(lab)["worker"] for (n, lab) in running["samples"] if n == "streamlb_records_total"} <= workers
        records = per_instance(running, "streamlb_records_total")
        assert set(records) == {0, 1}
        for i, recs in per_window.items():
            # the scrape came first: it holds the instance's windows up to one, the metrics
            # at most the few that closed since
            prefix = np.concatenate(([0], np.cumsum(recs)))
            assert records[i] in prefix, (i, records[i], prefix)
            assert len(prefix) - 1 - list(prefix).index(records[i]) <= 3
        assert value(running, "streamlb_epochs_total") == 2          # the move's epoch and the split's
        assert value(running, "streamlb_key_groups_moved_total") == len(moving)
        assert value(running, "streamlb_split_keys") == 1
        assert value(running, "streamlb_imbalance") >= 1.0
        assert set(per_instance(running, "streamlb_queued_batches")) == {0, 1}
        check_histograms(running)
        check_monotonic(first, running)

        job.wait(timeout=60)
        total = {i: int(r.sum()) for i, r in windows(job).items()}
        deadline = time.time() + 10
        while per_instance(done := scrape(url, job.id), "streamlb_records_total") != total:
            assert time.time() < deadline, (per_instance(done, "streamlb_records_total"), total)
            time.sleep(0.2)
        assert sum(total.values()) == 120_000
        check_histograms(done)
        check_monotonic(running, done)
        busy = job.metrics().query("operator == 'agg'").groupby("instance").busy_seconds.sum()
        assert per_instance(done, "streamlb_busy_seconds_total") == pytest.approx(busy.to_dict())
    gone = scrape(url, job.id)
    assert gone["samples"] == {}, "the series of a stopped job stay"
    assert time.time() - t0 < 40


def _lots(df):
    return df.assign(value=df["value"].astype(object).where(df["value"] != -1, "lots"))


def test_dead_letters_are_counted_where_they_were_set_aside(two_workers, tmp_path):
    """Null keys are set aside at the key_by (by the source's instances), non-numbers at the
    aggregate: the counter per (operator, instance) adds up to job.dead_letters()."""
    port = two_workers.scheduler_info()["services"]["dashboard"]
    url = f"http://127.0.0.1:{port}/metrics"
    n = 20_000
    key = pd.Series([f"k{i % 300}" for i in range(n)], dtype=object)
    key[::97] = None                                     # 207 null keys
    value = pd.Series(np.arange(n) % 11)
    value[5::89] = -1                                    # made "lots" below, some of them on null keys
    for p in range(2):
        pd.DataFrame({"key": key, "value": value}).iloc[p::2].to_parquet(tmp_path / f"p{p}.parquet", index=False)
    src = Stream.from_parquet(str(tmp_path), batch_size=2_000)
    # a numeric column with odd values that are not numbers, as decoded JSON brings them (a
    # text column read from Parquet is refused at planning)
    src.map(_lots).key_by("key").aggregate({"s": ("value", "sum")}, parallelism=2, name="agg")
    with streamlb.run(src, client=two_workers, key_groups=G, window=WINDOW, balancer="static") as job:
        job.wait(timeout=60)
        dead = job.dead_letters()
        want = dead.groupby(["operator", "instance"]).size().to_dict()
        assert sum(want.values()) == int(key.isna().sum() + (key.notna() & (value == -1)).sum())
        deadline = time.time() + 10
        while True:
            got = {(dict(lab)["operator"], int(dict(lab)["instance"])): v
                   for (name, lab), v in scrape(url, job.id)["samples"].items()
                   if name == "streamlb_dead_letters_total"}
            if got == want:
                break
            assert time.time() < deadline, (got, want)
            time.sleep(0.2)
