"""Balancing under drifting Zipf, and the cost of the balancer machinery.

Imbalance (max / mean records per instance per load window) is measured by the balancer
plugin on a real job: 8 instances of a keyed count+sum on 2 worker processes, an open-loop
source, hot keys rotating every DRIFT records. The records of an instance in a window are
those routed to it (counted by the routers, by the table in force for each batch); the
tracks named ``applied`` count those the instances applied in the window instead, which
also moves with when a batch happens to be taken (a window holds only about ten batches
per instance). The floor of a window is max(1, n x share of its hottest key group): no
move of key groups can go below it.
"""
from __future__ import annotations

import os

import numpy as np

from ._common import DATA, FIRST_TABLES, _OneShot, _SpeedupOverStatic, cluster, first_table, median_rate, zipf_dataset

ROWS, KEYS, DRIFT = 3_200_000, 100_000, 800_000
RATE, WINDOW, G, N = 400_000, 0.25, 256, 8
BALANCERS = ["static", "autoflow", "greedy"]
SKEWS = [1.0, 1.2]


def _run(client, path, balancer):
    from streamz import Stream

    import streamlb

    src = Stream.from_parquet(path, batch_size=10_000, rate=RATE, event_time="event_time")
    src.key_by("key").aggregate({"n": ("value", "count"), "s": ("value", "sum")}, parallelism=N, name="agg")
    with streamlb.run(src, client=client, key_groups=G, window=WINDOW, balancer=balancer,
                      migration="fluid") as job:
        job.wait()
        windows = job.balancer_state()["operators"]["agg"]["imbalance"]
        moves = len(job.history)
    full = [w for w in windows if w["records"] > 0.8 * RATE * WINDOW]
    return {"imbalance": np.array([w["routed"] for w in full]),
            "applied": np.array([w["imbalance"] for w in full]),
            "floor": np.array([w["floor"] for w in full]),
            "start": np.array([w["window_start"] for w in full]), "moves": moves}


def _windows_to_floor(r, measure: str = "imbalance") -> float:
    """After each drift, windows until imbalance <= 1.05 x floor (worst drift)."""
    per_drift = int(DRIFT / RATE / WINDOW)
    ok = r[measure] <= 1.05 * r["floor"]
    t = (r["start"] - r["start"][0]) / WINDOW
    worst = 0
    for d in range(int(ROWS / DRIFT)):
        lo, hi = d * per_drift, (d + 1) * per_drift
        idx = np.flatnonzero((t >= lo) & (t < hi))
        hit = idx[ok[idx]] if len(idx) else idx
        worst = max(worst, (t[hit[0]] - lo + 1) if len(hit) else per_drift + 1)
    return float(worst)


class DriftingZipf(_OneShot):
    params = (SKEWS, BALANCERS)
    param_names = ["skew", "balancer"]

    def setup_cache(self):
        out = {}
        cl, client = cluster(2)
        with cl, client:
            for skew in SKEWS:
                path = zipf_dataset(ROWS, KEYS, skew, partitions=8, drift_every=DRIFT)
                for b in BALANCERS:
                    out[(skew, b)] = _run(client, path, b)
        return out

    def track_mean_imbalance(self, results, skew, balancer):
        return float(results[(skew, balancer)]["imbalance"].mean())

    track_mean_imbalance.unit = "max/mean"

    def track_mean_imbalance_over_floor(self, results, skew, balancer):
        r = results[(skew, balancer)]
        return float((r["imbalance"] / r["floor"]).mean())

    track_mean_imbalance_over_floor.unit = "x floor"

    def track_windows_to_reach_floor_after_drift(self, results, skew, balancer):
        return _windows_to_floor(results[(skew, balancer)])

    track_windows_to_reach_floor_after_drift.unit = "windows"

    def track_applied_mean_imbalance_over_floor(self, results, skew, balancer):
        r = results[(skew, balancer)]
        return float((r["applied"] / r["floor"]).mean())

    track_applied_mean_imbalance_over_floor.unit = "x floor"

    def track_applied_windows_to_reach_floor_after_drift(self, results, skew, balancer):
        return _windows_to_floor(results[(skew, balancer)], "applied")

    track_applied_windows_to_reach_floor_after_drift.unit = "windows"

    def track_migration_epochs(self, results, skew, balancer):
        return float(results[(skew, balancer)]["moves"])

    track_migration_epochs.unit = "epochs"


class PluginOverhead(_OneShot):
    """Throughput with the plugin on and ``static`` vs the same pipeline without it
    (target: ratio >= 0.95). Same data as the throughput benchmark."""

    timeout = 1200

    def setup_cache(self):
        from streamz import Stream

        path = zipf_dataset(5_000_000, 100_000, 1.2)

        def build():
            src = Stream.from_parquet(path, batch_size=131_072)
            src.key_by("key").aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="t")
            return src

        cl, client = cluster(2)
        with cl, client:
            plain, static = [], []
            for _ in range(3):          # interleaved, so drift of the machine hits both alike
                plain.append(median_rate(client, build, runs=1))
                static.append(median_rate(client, build, runs=1, balancer="static"))
        return {"plain": float(np.median(plain)), "static": float(np.median(static))}

    def track_records_per_second_without_plugin(self, r):
        return r["plain"]

    track_records_per_second_without_plugin.unit = "records/s"

    def track_records_per_second_plugin_static(self, r):
        return r["static"]

    track_records_per_second_plugin_static.unit = "records/s"

    def track_ratio_plugin_static_to_plain(self, r):
        return r["static"] / r["plain"]

    track_ratio_plugin_static_to_plain.unit = "ratio"


class CapacityBound(_SpeedupOverStatic):
    """Throughput under skew when instance capacity is the bottleneck (target: ``autoflow``
    >= 1.4 x ``static`` at skew 1.0).

    Every record costs COST seconds of service time in the keyed operator (``cost=``, which
    waits without blocking the worker), so 8 instances of 1 / COST records/s each saturate
    long before the 2 cores do: the hottest instance sets the pace, and balancing pays off
    as throughput. Closed loop (no rate limit); plans move in one epoch (``all-at-once``).
    """

    params = [BALANCERS, FIRST_TABLES]
    ROWS, COST, SKEW, GROUPS, WINDOW = 12_800_000, 1e-5, 1.0, 1024, 0.5

    def setup_cache(self):
        from streamz import Stream

        import streamlb

        path = zipf_dataset(self.ROWS, KEYS, self.SKEW, partitions=8)
        out = {}
        cl, client = cluster(2)
        with cl, client:
            for table in FIRST_TABLES:
                for b in BALANCERS:
                    src = Stream.from_parquet(path, batch_size=16_384)
                    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=N, name="agg", cost=self.COST)
                    with first_table(table), streamlb.run(src, client=client, key_groups=self.GROUPS,
                                                          window=self.WINDOW, balancer=b,
                                                          migration="all-at-once") as job:
                        job.wait()
                        out[(b, table)] = job.summary()["records_per_second"]
        return out


# -- every setting at its default ---------------------------------------------------------------
#
# The figures above come from tuned settings (WINDOW 250 ms, G 256 key groups, 10k-row
# batches, event-time replay). DefaultSettings runs what a new user runs: streamlb.run(src,
# balancer=...) with nothing else set (1 s windows, 1024 key groups, the default batch size,
# fluid migrations), 8 instances on 2 worker processes, an open-loop Parquet source at RATE
# records/s, no replay. Each stream lasts DEFAULT_SECONDS; the drifting one rotates its hot
# keys every DEFAULT_DRIFT_SECONDS of stream. The logs have 2 files (one per source
# instance: the default parallelism is one per worker), so the drift reaches the job in
# stream order.

DEFAULT_RATES = [50_000, 200_000, 1_000_000]
DEFAULT_SECONDS, DEFAULT_DRIFT_SECONDS = 20, 5
DEFAULT_CASES = {"drift-1.0": (1.0, True, "autoflow"), "zipf-1.5": (1.5, False, "hybrid")}
SPEC = {"n": ("value", "count"), "s": ("value", "sum")}


def _say(msg: str) -> None:
    import sys
    import time

    print(f"[balancing {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def default_dataset(rate: int, case: str) -> str:
    skew, drifting, _ = DEFAULT_CASES[case]
    rows = rate * DEFAULT_SECONDS
    return zipf_dataset(rows, KEYS, skew, partitions=2,
                        drift_every=rate * DEFAULT_DRIFT_SECONDS if drifting else None)


def _exact(job, path: str) -> bool:
    """The operator's final state equals pandas over the same files."""
    import pandas as pd

    from streamlb.planner import parquet_files

    df = pd.concat([pd.read_parquet(f, columns=["key", "value"]) for f in parquet_files(path)])
    want = df.groupby("key")["value"].agg(["count", "sum"]).sort_index()
    got = job.state("agg").sort_index()
    return (len(got) == len(want) and (got.index.to_numpy() == want.index.to_numpy()).all()
            and (got["n"].to_numpy() == want["count"].to_numpy()).all()
            and np.allclose(got["s"].to_numpy(), want["sum"].to_numpy(), rtol=0, atol=1e-6))


def _imbalance(job):
    """``job.imbalance("agg")``; from the plugin's state for a streamlb older than it (to
    measure a baseline commit with this benchmark)."""
    import pandas as pd

    if hasattr(job, "imbalance"):
        return job.imbalance("agg")
    frame = pd.DataFrame(job.balancer_state()["operators"]["agg"]["imbalance"]).rename(columns={"imbalance": "applied"})
    frame["window_start"] = pd.to_datetime(frame["window_start"], unit="s")
    frame["batches"] = np.nan
    return frame


def default_run(client, rate: int, case: str, balancer: str, path: str | None = None) -> dict:
    """One job at default settings; per-window imbalance from ``Job.imbalance`` (``path``:
    another log than the case's)."""
    import pandas as pd
    from streamz import Stream

    import streamlb

    path = path or default_dataset(rate, case)
    src = Stream.from_parquet(path, rate=rate)
    src.key_by("key").aggregate(SPEC, parallelism=N, name="agg")
    with streamlb.run(src, client=client, balancer=balancer) as job:
        job.wait()
        imb = _imbalance(job)
        metrics = job.metrics()
        history = [h for h in job.history if h.get("operator") == "agg"]
        exact = _exact(job, path)
        seconds = job.summary()["seconds"]
    window = float(np.median(np.diff(imb["window_start"]).astype("timedelta64[ns]").astype(np.int64))) / 1e9 \
        if len(imb) > 1 else 1.0
    full = imb[imb["records"] > 0.8 * rate * window].reset_index(drop=True)
    t = (full["window_start"] - pd.Timestamp(0)).dt.total_seconds().to_numpy()
    first_plan = min((h["completed"] for h in history), default=None)
    after = full[t >= first_plan] if first_plan is not None else full.iloc[0:0]
    # totals per instance over the windows after the third
    m = metrics[metrics["operator"] == "agg"].copy()
    starts = sorted(m["window_start"].unique())
    late = m[m["window_start"] >= starts[3]] if len(starts) > 3 else m.iloc[0:0]
    tot = late.groupby("instance")["records"].sum().reindex(range(N), fill_value=0).to_numpy(float)
    return {"rate": rate, "case": case, "balancer": balancer, "exact": exact, "seconds": seconds,
            "windows": len(full), "moves": len(history),
            "first_plan_s": None if first_plan is None or not len(t) else float(first_plan - t[0]),
            "history": [{"at": h["started"] - (t[0] if len(t) else 0), "seconds": h["completed"] - h["started"],
                         "groups": len(h.get("key_groups") or ()), "kind": h.get("kind", h.get("strategy"))}
                        for h in history],
            "applied": float(full["applied"].median()) if len(full) else float("nan"),
            "routed": float(full["routed"].median()) if len(full) else float("nan"),
            "floor": float(full["floor"].median()) if len(full) else float("nan"),
            "batches": float(full["batches"].median()) if len(full) else float("nan"),
            "applied_after_first_plan": float(after["applied"].median()) if len(after) else float("nan"),
            "applied_p90": float(full["applied"].quantile(0.9)) if len(full) else float("nan"),
            "totals": float(tot.max() / tot.mean()) if tot.sum() else float("nan"),
            "series": {"t": (t - t[0]).tolist() if len(t) else [], "applied": full["applied"].tolist(),
                       "routed": full["routed"].tolist(), "floor": full["floor"].tolist()}}


def default_measure(rates=None, cases=None, with_static: bool = True) -> list[dict]:
    rates = rates or DEFAULT_RATES
    cases = cases or list(DEFAULT_CASES)
    out = []
    for rate in rates:           # datasets first (PySpark), so no job shares the cores with it
        for case in cases:
            default_dataset(rate, case)
    cl, client = cluster(2)
    with cl, client:
        for rate in rates:
            for case in cases:
                balancers = (["static"] if with_static else []) + [DEFAULT_CASES[case][2]]
                for b in balancers:
                    r = default_run(client, rate, case, b)
                    out.append(r)
                    _say(f"{case} at {rate:,}/s, {b}: applied {r['applied']:.3f} (after the first plan "
                         f"{r['applied_after_first_plan']:.3f}), routed {r['routed']:.3f}, floor {r['floor']:.3f}, "
                         f"totals {r['totals']:.3f}, {r['batches']:.0f} batches/window, {r['moves']} moves, "
                         f"exact {r['exact']}, {r['seconds']:.1f} s")
    return out


def default_table(rows: list[dict]) -> str:
    lines = ["| case | rate | balancer | applied (median) | after first plan | routed | floor | totals | "
             "batches/window | moves | exact |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['rate']:,} | {r['balancer']} | {r['applied']:.3f} | "
                     f"{r['applied_after_first_plan']:.3f} | {r['routed']:.3f} | {r['floor']:.3f} | "
                     f"{r['totals']:.3f} | {r['batches']:.0f} | {r['moves']} | {r['exact']} |")
    return "\n".join(lines)


def default_plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    fig, axes = plt.subplots(len(cases), len(rates), figsize=(4.2 * len(rates), 3.2 * len(cases)),
                             squeeze=False, sharey=True)
    for i, case in enumerate(cases):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            for r in rows:
                if r["case"] == case and r["rate"] == rate:
                    s = r["series"]
                    ax.plot(s["t"], s["applied"], label=f"{r['balancer']} applied")
                    if r["balancer"] != "static":
                        ax.plot(s["t"], s["floor"], "k:", label="floor")
            ax.set_title(f"{case}, {rate:,} rec/s", fontsize=9)
            ax.set_ylim(0.9, 4.0)
            ax.set_xlabel("window (s)")
            if j == 0:
                ax.set_ylabel("max / mean applied")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


class DefaultSettings(_OneShot):
    """Per-window imbalance of applied records with every setting at its default (targets:
    ``drift-1.0``/``autoflow`` median <= 1.15; ``zipf-1.5``/``hybrid`` <= 1.10 per window after
    the first plan and <= 1.05 on totals), beside ``static``; at 50k, 200k and 1M records/s."""

    params = (list(DEFAULT_CASES), DEFAULT_RATES, ["static", "balanced"])
    param_names = ["case", "rate", "balancer"]
    timeout = 3600

    def setup_cache(self):
        return {(r["case"], r["rate"], "static" if r["balancer"] == "static" else "balanced"): r
                for r in default_measure()}

    def track_median_applied_imbalance(self, results, case, rate, balancer):
        return results[(case, rate, balancer)]["applied"]

    track_median_applied_imbalance.unit = "max/mean"

    def track_median_applied_imbalance_after_first_plan(self, results, case, rate, balancer):
        return results[(case, rate, balancer)]["applied_after_first_plan"]

    track_median_applied_imbalance_after_first_plan.unit = "max/mean"

    def track_totals_imbalance(self, results, case, rate, balancer):
        return results[(case, rate, balancer)]["totals"]

    track_totals_imbalance.unit = "max/mean"

    def track_median_routed_imbalance(self, results, case, rate, balancer):
        return results[(case, rate, balancer)]["routed"]

    track_median_routed_imbalance.unit = "max/mean"


if __name__ == "__main__":   # python -m benchmarks.balancing [rate ...] [--case NAME] [--no-static], from asv_bench/
    import json
    import sys

    args = sys.argv[1:]
    case_args = [args[i + 1] for i, a in enumerate(args) if a == "--case"]
    rate_args = [int(a) for i, a in enumerate(args) if a.isdigit() and (i == 0 or args[i - 1] != "--case")]
    res = default_measure(rate_args or None, case_args or None, with_static="--no-static" not in args)
    print(default_table(res))
    default_plot(res, os.path.join(DATA, "balancing-defaults.png"))
    with open(os.path.join(DATA, "balancing-defaults.json"), "w") as fh:
        json.dump(res, fh)
