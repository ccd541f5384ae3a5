"""The balancer interface: a pure function from a load report to a plan.

A balancer never touches actors or the scheduler: it sees a :class:`LoadReport` and returns
a list of :class:`Move`. The plugin, not the policy, enforces one migration in flight per
exchange, a cool-down and a cap on key groups per epoch. Policies are found by name in the
entry-point group ``streamlb.balancers``; the built-ins in ``balancers/`` are registered there
exactly as a third party registers its own.

Examples
--------
>>> import numpy as np
>>> report = LoadReport(operator="totals", owners=np.array([0, 0, 1, 1]),
...                     group_load=np.array([50.0, 30.0, 10.0, 10.0]), instances=2)
>>> report.instance_load().tolist()
[80.0, 20.0]
>>> apply_plan(report.owners, [Move((1,), 0, 1)]).tolist()
[0, 1, 1, 1]

A key that alone outweighs an instance's share can only be split: its records then spread
over its home (the owner of its key group) and helpers, each keeping a partial aggregate.

>>> hot = LoadReport(operator="totals", owners=np.array([0, 0, 1, 1]),
...                  group_load=np.array([90.0, 0.0, 10.0, 0.0]), instances=2,
...                  hot_keys=(("k", 0, 80.0),), splits=(("k", (1,)),), splittable=True)
>>> hot.instance_load().tolist()
[50.0, 50.0]
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np

from ._registry import build, registered

__all__ = ["Balancer", "LoadReport", "Move", "Split", "apply_plan", "get_balancer", "available_balancers",
           "check_plan", "complete_plan", "splits_after"]

GROUP = "streamlb.balancers"


@dataclass(frozen=True)
class Move:
    """Move ``key_groups`` from ``from_instance`` to ``to_instance``.

    Parameters
    ----------
    key_groups : tuple of int
        The key groups to move, all owned by ``from_instance``.
    from_instance, to_instance : int
        The current and the new owner.
    """

    key_groups: tuple[int, ...]
    from_instance: int
    to_instance: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_groups", tuple(int(g) for g in self.key_groups))


@dataclass(frozen=True)
class Split:
    """Spread the records of hot ``key`` over its home instance (the owner of its key
    group) and ``helpers``; with no helpers, merge the key back onto its home.

    Only combinable state can be split (``aggregate``: count, sum, min, max, mean); a
    report says so in ``splittable``.
    """

    key: object
    helpers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        key = self.key.item() if isinstance(self.key, np.generic) else self.key
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "helpers", tuple(int(h) for h in self.helpers))


@dataclass(frozen=True)
class LoadReport:
    """Load of one keyed operator over one load window.

    Attributes
    ----------
    operator : str
        The operator's name.
    owners : ndarray of int, shape (G,)
        The routing table in force: key group -> instance.
    group_load : ndarray of float, shape (G,)
        Records per key group in the window (the load measure).
    instances : int
        Parallelism n; valid instances are 0..n-1.
    epoch : int
        Epoch of ``owners``.
    window_start, window : float
        Start (epoch seconds) and length (seconds) of the window.
    busy_seconds, queued_batches : ndarray, shape (n,)
        Per instance, as measured (zeros where unknown).
    latency_hist : ndarray, shape (n, streamlb.latency.BINS)
        Per instance, records applied in the window per latency bin
        (``streamlb.latency.EDGES_MS``; zeros where unknown). ``streamlb.latency.quantile``
        turns a row, or a sum of rows, into a percentile.
    recently_moved : frozenset of int
        Key groups moved in the last few epochs, for hysteresis.
    hot_keys : tuple of (key, key group, load)
        The heaviest keys in the window, by decreasing load (counted by the routers in
        bounded memory; empty unless the balancer sets ``wants_hot_keys``).
    splits : tuple of (key, helpers)
        Keys split now, each with the instances helping its home.
    splittable : bool
        Whether the operator's state is combinable, so that keys may be split.
    """

    operator: str
    owners: np.ndarray
    group_load: np.ndarray
    instances: int
    epoch: int = 0
    window_start: float = 0.0
    window: float = 1.0
    busy_seconds: np.ndarray = field(default=None)
    queued_batches: np.ndarray = field(default=None)
    recently_moved: frozenset = frozenset()
    hot_keys: tuple = ()
    splits: tuple = ()
    splittable: bool = False
    latency_hist: np.ndarray = field(default=None)

    def __post_init__(self) -> None:
        owners = np.asarray(self.owners, dtype=np.int64)
        load = np.asarray(self.group_load, dtype=np.float64)
        if owners.ndim != 1 or load.shape != owners.shape:
            raise ValueError(
                f"load report for {self.operator!r}: owners and group_load must be 1-D of the same "
                f"length (one entry per key group), got shapes {owners.shape} and {load.shape}"
            )
        if not isinstance(self.instances, (int, np.integer)) or self.instances < 1:
            raise ValueError(f"load report for {self.operator!r}: instances must be >= 1, got {self.instances!r}")
        if len(owners) and (owners.min() < 0 or owners.max() >= self.instances):
            raise ValueError(
                f"load report for {self.operator!r}: owners name instance {int(owners.max())}; "
                f"valid instances are 0..{self.instances - 1}"
            )
        if (load < 0).any() or not np.isfinite(load).all():
            raise ValueError(f"load report for {self.operator!r}: group_load must be finite and >= 0")
        for name, arr in (("owners", owners), ("group_load", load)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        for name in ("busy_seconds", "queued_batches"):
            v = getattr(self, name)
            v = np.zeros(self.instances) if v is None else np.asarray(v, dtype=np.float64)
            v.setflags(write=False)
            object.__setattr__(self, name, v)
        from .latency import BINS

        hist = (np.zeros((self.instances, BINS)) if self.latency_hist is None
                else np.asarray(self.latency_hist, dtype=np.float64))
        if hist.shape != (self.instances, BINS) or not (hist >= 0).all():
            raise ValueError(f"load report for {self.operator!r}: latency_hist must be {self.instances} rows of "
                             f"{BINS} non-negative counts (streamlb.latency.EDGES_MS), got shape {hist.shape}")
        hist.setflags(write=False)
        object.__setattr__(self, "latency_hist", hist)
        object.__setattr__(self, "recently_moved", frozenset(int(g) for g in self.recently_moved))
        hot = []
        for item in self.hot_keys:
            key, g, load_ = item
            if not 0 <= int(g) < len(owners) or not float(load_) >= 0:
                raise ValueError(f"load report for {self.operator!r}: hot key {key!r} has key group {g!r} "
                                 f"(valid 0..{len(owners) - 1}) and load {load_!r} (must be >= 0)")
            hot.append((key.item() if isinstance(key, np.generic) else key, int(g), float(load_)))
        object.__setattr__(self, "hot_keys", tuple(hot))
        object.__setattr__(self, "splits", tuple((k, tuple(int(h) for h in hs)) for k, hs in self.splits))

    @property
    def key_groups(self) -> int:
        """The number of key groups G."""
        return len(self.owners)

    def instance_load(self, owners: np.ndarray | None = None, splits: dict | None = None) -> np.ndarray:
        """Load per instance: the sum of its key groups' load, a split key's load shared
        equally by its home and helpers (with ``owners``/``splits`` instead of the
        report's own, to weigh a plan)."""
        owners = self.owners if owners is None else owners
        splits = dict(self.splits) if splits is None else splits
        load = np.bincount(owners, weights=self.group_load, minlength=self.instances)
        if splits:
            hot = {k: (g, w) for k, g, w in self.hot_keys}
            for key, helpers in splits.items():
                if key in hot and helpers:
                    g, w = hot[key]
                    share = w / (1 + len(helpers))
                    load[owners[g]] -= w - share
                    load[list(helpers)] += share
        return load

    def hot_group(self, key) -> int | None:
        """Key group of a key in ``hot_keys``, else None."""
        return next((g for k, g, _ in self.hot_keys if k == key), None)

    def imbalance(self) -> float:
        """max / mean instance load (1.0 is perfect; 1.0 when there is no load)."""
        load = self.instance_load()
        return float(load.max() / load.mean()) if load.sum() > 0 else 1.0


class Balancer(abc.ABC):
    """A load-balancing policy: one pure, deterministic method.

    Subclass it, implement :meth:`plan` and register the class in the entry-point group
    ``streamlb.balancers`` (see docs/writing-a-balancer.md).

    Attributes
    ----------
    name : str
        The name the policy is registered under in ``streamlb.balancers``.
    wants_hot_keys : bool
        Set it to True on the class to receive ``hot_keys`` in reports (the routers then
        count the heaviest keys); False if absent.
    """

    name: str = ""

    @abc.abstractmethod
    def plan(self, report: LoadReport) -> list[Move]:
        """The moves to make now; ``[]`` for none.

        Parameters
        ----------
        report : LoadReport
            The load of one keyed operator over the last window.

        Returns
        -------
        list of Move and Split
            Carried out in one epoch; the same report must always give the same plan.
        """


def apply_plan(owners: np.ndarray, plan: list) -> np.ndarray:
    """The routing table after the moves of ``plan`` (splits do not change ownership).

    Parameters
    ----------
    owners : ndarray of int, shape (G,)
        Key group -> instance before the plan.
    plan : list of Move and Split

    Returns
    -------
    ndarray of int, shape (G,)
        A new array; ``owners`` is left as it was.

    Raises
    ------
    ValueError
        For a move of a key group outside ``0..G-1`` or not owned by its ``from_instance``.
    """
    out = np.array(owners, dtype=np.int64, copy=True)
    for mv in plan:
        if isinstance(mv, Split):
            continue
        if not isinstance(mv, Move):
            raise ValueError(f"a plan holds Move and Split items, not {type(mv).__name__} {mv!r}")
        for g in mv.key_groups:
            if not 0 <= g < len(out):
                raise ValueError(f"move {mv}: key group {g} is outside 0..{len(out) - 1}")
            if out[g] != mv.from_instance:
                raise ValueError(f"move {mv}: key group {g} is on instance {out[g]}, not {mv.from_instance}")
            out[g] = mv.to_instance
    return out


def check_plan(report: LoadReport, plan: list) -> np.ndarray:
    """Validate ``plan`` against ``report``; return the new owners.

    A plan is carried out in this order: merges back (``Split`` with no helpers), splits,
    then moves. So a key group may move only if no key of it is split once the plan is
    carried out, and a split's helpers must differ from its key's home.

    Raises
    ------
    ValueError
        Naming the operator and the move or split that breaks a rule.
    """
    for mv in plan:
        if isinstance(mv, Move):
            for inst in (mv.from_instance, mv.to_instance):
                if not 0 <= inst < report.instances:
                    raise ValueError(f"move {mv} names instance {inst}; {report.operator!r} has instances "
                                     f"0..{report.instances - 1}")
    owners = apply_plan(report.owners, plan)
    splits = [sp for sp in plan if isinstance(sp, Split)]
    named = [sp.key for sp in splits]
    twice = next((k for k in named if named.count(k) > 1), None)
    if twice is not None:
        raise ValueError(f"plan for {report.operator!r} names key {twice!r} in two splits; give each key one")
    for key in splits_after(report, plan):
        g = report.hot_group(key)
        if g is not None and owners[g] != report.owners[g]:
            raise ValueError(f"key group {g} of {report.operator!r} holds split key {key!r}: merge the key "
                             "back before moving its group")
    if splits and not report.splittable:
        raise ValueError(f"{report.operator!r} keeps state that is not combinable (stateful_map); its keys "
                         f"cannot be split ({splits[0]})")
    for sp in splits:
        if not sp.helpers:
            continue
        g = report.hot_group(sp.key)
        if g is None:
            raise ValueError(f"split of key {sp.key!r}: not among the report's hot keys, so its key group "
                             "is unknown")
        bad = [h for h in sp.helpers if not 0 <= h < report.instances or h == report.owners[g]]
        if bad or len(set(sp.helpers)) != len(sp.helpers):
            raise ValueError(f"split {sp}: helpers must be distinct instances in 0..{report.instances - 1} "
                             f"other than the key's home {int(report.owners[g])}")
    return owners


def complete_plan(report: LoadReport, plan: list) -> list:
    """``plan`` with a merge back added for every split key whose key group it moves: a
    balancer that knows nothing of splits still gets its moves. The plugin and the
    simulator carry plans out completed so.

    >>> r = LoadReport("op", np.array([0, 1]), np.array([5.0, 1.0]), 2, hot_keys=(("a", 0, 4.0),),
    ...                splits=(("a", (1,)),), splittable=True)
    >>> complete_plan(r, [Move((0,), 0, 1)])
    [Split(key='a', helpers=()), Move(key_groups=(0,), from_instance=0, to_instance=1)]
    """
    owners = apply_plan(report.owners, plan)
    named = {sp.key for sp in plan if isinstance(sp, Split)}
    merges = [Split(k) for k, _ in report.splits
              if k not in named and (g := report.hot_group(k)) is not None and owners[g] != report.owners[g]]
    return merges + list(plan)


def splits_after(report: LoadReport, plan: list) -> dict:
    """Split key -> helpers once ``plan`` is carried out."""
    out = dict(report.splits)
    for sp in plan:
        if isinstance(sp, Split):
            if sp.helpers:
                out[sp.key] = sp.helpers
            else:
                out.pop(sp.key, None)
    return out


def group_moves(old: np.ndarray, new: np.ndarray) -> list[Move]:
    """The moves turning ``old`` owners into ``new``, one per (from, to) pair, sorted."""
    pairs: dict[tuple[int, int], list[int]] = {}
    for g in np.flatnonzero(old != new):
        pairs.setdefault((int(old[g]), int(new[g])), []).append(int(g))
    return [Move(tuple(gs), a, b) for (a, b), gs in sorted(pairs.items())]


def available_balancers() -> dict[str, object]:
    """Entry points of group ``streamlb.balancers`` by name; a clash warns, first wins.

    Examples
    --------
    >>> {"static", "autoflow", "greedy", "hybrid"} <= set(available_balancers())
    True
    """
    return registered(GROUP, "balancer")


def get_balancer(name: str | Balancer, **kwargs) -> Balancer:
    """Build the balancer registered as ``name`` (an instance is returned as is).

    Parameters
    ----------
    name : str or Balancer
        A name from :func:`available_balancers`.
    **kwargs
        Keyword options of the balancer's constructor.

    Returns
    -------
    Balancer

    Raises
    ------
    ValueError
        If no balancer is registered as ``name``; the message lists the valid names.

    Examples
    --------
    >>> get_balancer("static").plan(LoadReport("op", np.array([0, 1]), np.array([9.0, 1.0]), 2))
    []
    """
    return build(GROUP, "balancer", Balancer, name, **kwargs)
