"""Replay load traces through balancers with no cluster.

A :class:`Trace` is the load of one keyed operator per load window and key group, as the
balancer plugin sees it: recorded from a real job (:meth:`streamlb.Job.load_trace`) or
generated from a key distribution (:func:`zipf_trace`). :func:`simulate` feeds it window by
window to any balancer, applies each plan from the next window on (as the plugin does once a
migration completes) and reports the imbalance of every window. A trace that also holds its
hottest keys per window (generated ones do) lets balancers that split keys (``hybrid``)
split them.

Examples
--------
>>> from streamlb.simulator import simulate, zipf_trace
>>> trace = zipf_trace(windows=40, key_groups=256, instances=8, skew=1.0, drift_every=20)
>>> out = simulate(trace, balancer="autoflow")
>>> bool(out["imbalance"].iloc[-1] < out["imbalance"].iloc[0])
True
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .balancer import Balancer, LoadReport, check_plan, complete_plan, get_balancer, splits_after
from .keygroups import assign_to_key_group

__all__ = ["Trace", "zipf_trace", "simulate", "summarize", "plot"]

HYSTERESIS_EPOCHS = 3       # as the plugin: groups moved in the last 3 epochs are "recent"


@dataclass
class Trace:
    """Load of one keyed operator per window and key group.

    Attributes
    ----------
    loads : ndarray, shape (W, G)
        Records per key group in each window.
    instances : int
        Parallelism of the operator.
    window : float
        Window length in seconds.
    owners : ndarray of int, shape (G,), optional
        Routing table at the first window (default: contiguous ranges, as a job starts).
    recorded_owners : ndarray of int, shape (W, G), optional
        The routing table in force in each window, for a trace recorded from a job.
    measured : ndarray, shape (W,), optional
        The imbalance the job measured in each window (records applied per instance).
    hot_keys, hot_loads : ndarray, shape (W, K), optional
        The K hottest keys of each window (integer keys) and their records.
    """

    loads: np.ndarray
    instances: int
    window: float = 1.0
    owners: np.ndarray | None = None
    recorded_owners: np.ndarray | None = None
    measured: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    hot_keys: np.ndarray | None = None
    hot_loads: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.loads = np.asarray(self.loads, dtype=np.float64)
        if self.loads.ndim != 2:
            raise ValueError(f"trace loads must be a (windows, key groups) array, got shape {self.loads.shape}")
        if not isinstance(self.instances, (int, np.integer)) or self.instances < 1:
            raise ValueError(f"trace instances must be a positive integer, got {self.instances!r}")
        if (self.loads < 0).any() or not np.isfinite(self.loads).all():
            raise ValueError("trace loads must be finite and >= 0")
        G = self.loads.shape[1]
        if self.owners is None:
            self.owners = (np.arange(G) * self.instances // max(G, 1)).astype(np.int64)
        self.owners = np.asarray(self.owners, dtype=np.int64)
        if self.owners.shape != (G,) or (G and (self.owners.min() < 0 or self.owners.max() >= self.instances)):
            raise ValueError(f"trace owners must give each of the {G} key groups an instance in "
                             f"0..{self.instances - 1}")
        if (self.hot_keys is None) != (self.hot_loads is None) or (
                self.hot_keys is not None and (np.shape(self.hot_keys) != np.shape(self.hot_loads)
                                               or np.shape(self.hot_keys)[0] != self.windows)):
            raise ValueError("trace hot_keys and hot_loads go together, both of shape (windows, K)")

    @property
    def windows(self) -> int:
        """Load windows in the trace (rows of ``loads``)."""
        return self.loads.shape[0]

    @property
    def key_groups(self) -> int:
        """Key groups of the traced operator (columns of ``loads``)."""
        return self.loads.shape[1]

    def save(self, path: str) -> None:
        """Write the trace as one ``.npz`` file."""
        arrays = {"loads": self.loads, "owners": self.owners}
        if self.recorded_owners is not None:
            arrays["recorded_owners"] = self.recorded_owners
        if self.measured is not None:
            arrays["measured"] = self.measured
        if self.hot_keys is not None:
            arrays["hot_keys"], arrays["hot_loads"] = self.hot_keys, self.hot_loads
        meta = {"instances": int(self.instances), "window": float(self.window), **self.meta}
        np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)

    @classmethod
    def load(cls, path: str) -> "Trace":
        """Read a trace written by :meth:`save`."""
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path!r} is not a streamlb trace (.npz written by Trace.save): {exc}") from None
        with z:
            if "loads" not in z or "meta" not in z:
                raise ValueError(f"{path!r} is not a streamlb trace: it lacks 'loads' or 'meta'")
            meta = json.loads(str(z["meta"]))
            get = (lambda k: z[k] if k in z else None)
            return cls(z["loads"], meta.pop("instances"), meta.pop("window"), get("owners"),
                       get("recorded_owners"), get("measured"), meta, get("hot_keys"), get("hot_loads"))


def zipf_trace(windows: int, key_groups: int, instances: int, *, keys: int = 100_000, skew: float = 1.2,
               records_per_window: int = 100_000, drift_every: int | None = None, window: float = 1.0,
               seed: int = 0) -> Trace:
    """A trace drawn from Zipf(``skew``) over ``keys`` keys, hot keys rotating every
    ``drift_every`` windows (as :func:`streamlb.datasets.zipf` rotates them).

    Keys map to key groups with the same hash as a job, and every window is a multinomial
    sample of ``records_per_window`` records; the 64 hottest keys' records are kept apart
    too (``hot_keys``/``hot_loads``), as the routers' heavy-hitter sketches report them.
    """
    if windows < 1 or key_groups < 1 or keys < 1 or records_per_window < 0:
        raise ValueError("zipf_trace: windows, key_groups and keys must be >= 1, records_per_window >= 0")
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, keys + 1, dtype=np.float64)
    p = ranks ** -float(skew)
    p /= p.sum()
    key_ids = np.arange(keys, dtype=np.int64)
    group_of = assign_to_key_group(key_ids, key_groups)
    K = min(64, keys)
    loads = np.empty((windows, key_groups))
    hot_keys = np.empty((windows, K), np.int64)
    hot_loads = np.empty((windows, K))
    split_rng = np.random.default_rng([seed, 1])      # the group loads draw as they always did
    period = drift_every or windows
    for start in range(0, windows, period):
        shift = (start // period) * max(keys // 7, 1)          # rotate which keys are hot
        ids = (key_ids + shift) % keys                          # the key of each rank
        share = np.bincount(group_of[ids], weights=p, minlength=key_groups)
        share = np.clip(share / share.sum(), 0, None)
        n = min(period, windows - start)
        draw = rng.multinomial(records_per_window, share, size=n).astype(np.float64)
        loads[start:start + n] = draw
        # each hot key's records out of its group's: binomial, given what hotter keys of the
        # same group took (together, exactly a multinomial over keys)
        left = draw[:, group_of[ids[:K]]].copy()
        mass = share[group_of[ids[:K]]].copy()
        for r in range(K):
            g = group_of[ids[r]]
            q = np.clip(p[r] / mass[r], 0, 1) if mass[r] > 0 else 0.0
            hot_loads[start:start + n, r] = split_rng.binomial(left[:, r].astype(np.int64), q)
            same = group_of[ids[:K]] == g
            left[:, same] -= hot_loads[start:start + n, r:r + 1]
            mass[same] -= p[r]
        hot_keys[start:start + n] = ids[:K]
    return Trace(loads, instances, window, meta={"source": "zipf", "skew": skew, "keys": keys,
                                                 "drift_every": drift_every, "seed": seed},
                 hot_keys=hot_keys, hot_loads=hot_loads)


def _floor(load: np.ndarray, n: int) -> float:
    total = load.sum()
    return max(1.0, n * load.max() / total) if total > 0 else 1.0


def simulate(trace: Trace, balancer: str | Balancer | None = "autoflow", instances: int | None = None, *,
             max_groups: int = 64, cooldown_windows: int = 0, balancer_options: dict | None = None,
             progress: bool = False) -> pd.DataFrame:
    """Replay ``trace`` through ``balancer``; one row per window.

    Each window's report goes to the balancer; its plan (at most ``max_groups`` key groups,
    as the plugin caps it) takes effect from the next window, and no plan is asked for in
    the ``cooldown_windows`` after one. ``balancer=None`` replays the routing the trace
    recorded (a recorded trace only).

    Returns a DataFrame with columns ``window, imbalance, floor, moved_groups, split_keys,
    epoch`` and, for recorded traces, ``measured``; ``attrs`` holds the balancer's name.
    ``floor`` is that of moving key groups only, max(1, n x share of the hottest group).
    """
    n = int(instances or trace.instances)
    if n != trace.instances and trace.recorded_owners is not None and balancer is None:
        raise ValueError("simulate: a recorded routing cannot be replayed on another number of instances")
    if balancer is None and trace.recorded_owners is None:
        raise ValueError("simulate: balancer=None replays recorded routing, but this trace has none; "
                         "name a balancer")
    bal = None if balancer is None else get_balancer(balancer, **(balancer_options or {}))
    G = trace.key_groups
    owners = trace.owners.copy() if n == trace.instances else (np.arange(G) * n // G).astype(np.int64)
    moved_at = np.full(G, -10**9, dtype=np.int64)
    epoch, quiet = 0, 0
    splits: dict = {}
    hot_groups = None if trace.hot_keys is None else assign_to_key_group(trace.hot_keys.ravel(), G).reshape(
        trace.hot_keys.shape)
    rows = []
    name = getattr(bal, "name", None) or (type(bal).__name__ if bal is not None else "recorded")
    it = range(trace.windows)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=f"simulate {name}", unit="window")
    for w in it:
        load = trace.loads[w]
        if bal is None:
            owners = trace.recorded_owners[w].astype(np.int64)
        hot = () if hot_groups is None else tuple(zip(trace.hot_keys[w].tolist(), hot_groups[w].tolist(),
                                                      trace.hot_loads[w].tolist()))
        report = LoadReport(
            "simulated", owners, load, n, epoch=epoch, window_start=w * trace.window, window=trace.window,
            recently_moved=frozenset(np.flatnonzero(moved_at > epoch - HYSTERESIS_EPOCHS).tolist()),
            hot_keys=hot, splits=tuple(splits.items()), splittable=True,
        )
        inst = report.instance_load()
        imb = float(inst.max() / inst.mean()) if inst.sum() > 0 else 1.0
        moved = 0
        if bal is not None and quiet == 0:
            plan = complete_plan(report, bal.plan(report))
            new = check_plan(report, plan)
            changed = np.flatnonzero(new != owners)[:max_groups]
            after = splits_after(report, plan)
            if len(changed) or after != splits:
                epoch += 1
                owners = owners.copy()
                owners[changed] = new[changed]
                moved_at[changed] = epoch
                moved = len(changed)
                splits = after
                quiet = cooldown_windows
        elif quiet:
            quiet -= 1
        rows.append({"window": w, "imbalance": imb, "floor": _floor(load, n), "moved_groups": moved,
                     "split_keys": len(splits), "epoch": epoch})
    out = pd.DataFrame(rows, columns=["window", "imbalance", "floor", "moved_groups", "split_keys", "epoch"])
    if trace.measured is not None:
        out["measured"] = trace.measured[: len(out)]
    out.attrs["balancer"] = name
    return out


def summarize(results: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per balancer: mean and max imbalance, mean imbalance over the floor, moves."""
    return pd.DataFrame([{
        "balancer": b, "mean_imbalance": r["imbalance"].mean(), "max_imbalance": r["imbalance"].max(),
        "mean_over_floor": (r["imbalance"] / r["floor"]).mean(),
        "moved_groups": int(r["moved_groups"].sum()), "epochs": int(r["epoch"].iloc[-1]) if len(r) else 0,
        "max_split_keys": int(r["split_keys"].max()) if "split_keys" in r and len(r) else 0,
    } for b, r in results.items()]).set_index("balancer")


def plot(results: dict[str, pd.DataFrame], path: str | None = None, title: str = ""):
    """Imbalance per window for each balancer, side by side on one axis: a
    :class:`matplotlib.figure.Figure`, also written as a PNG to ``path`` if given. No
    pyplot and no backend switch (matplotlib is in the ``plot`` extra)."""
    from ._plot import figure, save

    fig = figure(figsize=(10, 4.5))
    ax = fig.subplots()
    for b, r in results.items():
        ax.plot(r["window"], r["imbalance"], label=b, linewidth=1.2)
    first = next(iter(results.values()), None)
    if first is not None and len(first):
        ax.plot(first["window"], first["floor"], color="black", linestyle=":", linewidth=1,
                label="floor (hottest key group)")
    ax.set_xlabel("load window")
    ax.set_ylabel("imbalance (max / mean instance load)")
    ax.set_title(title or "simulated imbalance per window")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, path)
