"""``ds2``: give each operator the instances its input needs at their true processing rate."""
from __future__ import annotations

import math
import numbers

from streamlb import config
from streamlb.scaler import Scaler

# a ratio this close above an integer is float noise, not demand for one more instance
_EPS = 1e-9


class DS2Scaler(Scaler):
    """The DS2 rule (Kalavri et al., OSDI 2018): parallelism from true processing rates.

    An instance's true rate is what it processes per busy second, so it does not depend on
    how often the instance waits. Each operator needs::

        needed = ceil((input_rate + backlog / catch_up) / (true_rate * target_utilisation))

    instances, clamped to its ``[min, max]``: enough to take its input with each instance
    busy ``target_utilisation`` of the time, and to work off its backlog within
    ``catch_up`` seconds. An operator is left alone while its parallelism changed less than
    ``cooldown`` seconds ago (its rates still settle), and when its true rate or input rate
    is unknown. An unknown backlog counts as none.

    Parameters
    ----------
    target_utilisation : float, optional
        Share of the time an instance is planned to be busy, in (0, 1] (setting
        ``streamlb.scaler.target-utilisation``, default 0.7).
    cooldown : float or str, optional
        Seconds (or a duration such as ``"5s"``) after an operator's parallelism changed
        before judging it again, >= 0 (setting ``streamlb.scaler.cooldown``, default 5s).
    catch_up : float or str, optional
        Seconds (or a duration) to work off a backlog in, > 0 (setting
        ``streamlb.scaler.catch-up``, default 10s).

    Examples
    --------
    >>> op = {"parallelism": 2, "min": 1, "max": 16, "input_rate": 9000.0, "backlog": 0.0,
    ...       "true_rate": 2000.0, "since_change": float("inf")}
    >>> DS2Scaler(target_utilisation=0.7).plan({"time": 0.0, "operators": {"totals": op}})
    {'totals': 7}
    """

    name = "ds2"

    def __init__(self, target_utilisation: float | None = None, cooldown: float | str | None = None,
                 catch_up: float | str | None = None) -> None:
        target = config.get("scaler.target-utilisation", target_utilisation)
        if isinstance(target, bool) or not isinstance(target, numbers.Real) or not 0 < target <= 1:
            raise ValueError(f"ds2: target_utilisation must be a number in (0, 1], got {target!r}")
        self.target_utilisation = float(target)
        self.cooldown = _seconds("cooldown", "scaler.cooldown", cooldown)
        if not self.cooldown >= 0:
            raise ValueError(f"ds2: cooldown must be >= 0 seconds, got {self.cooldown!r}")
        self.catch_up = _seconds("catch_up", "scaler.catch-up", catch_up)
        if not self.catch_up > 0:
            raise ValueError(f"ds2: catch_up must be > 0 seconds, got {self.catch_up!r}")

    def __repr__(self) -> str:
        return (f"DS2Scaler(target_utilisation={self.target_utilisation!r}, cooldown={self.cooldown!r}, "
                f"catch_up={self.catch_up!r})")

    def plan(self, report: dict) -> dict[str, int]:
        operators = report.get("operators") if isinstance(report, dict) else None
        if not isinstance(operators, dict):
            raise ValueError("ds2: a scaler report is a dict with an 'operators' dict (see streamlb.scaler.Scaler), "
                             f"got {report!r}")
        out: dict[str, int] = {}
        for name in sorted(operators):
            needed = self._needed(name, operators[name])
            if needed is not None and needed != operators[name]["parallelism"]:
                out[name] = needed
        return out

    def _needed(self, name: str, op: dict) -> int | None:
        """The parallelism ``op`` needs now, or None when it cannot be judged now."""
        current, lo, hi = (_count(name, op, field) for field in ("parallelism", "min", "max"))
        if not 1 <= lo <= hi:
            raise ValueError(f"ds2: operator {name!r} has min {lo} and max {hi}; need 1 <= min <= max")
        since = _rate(name, op, "since_change")
        if since is not None and since < self.cooldown:
            return None
        rate, backlog = _rate(name, op, "input_rate"), _rate(name, op, "backlog")
        true = op.get("true_rate")
        if rate is None or true is None or not 0 < float(true) < math.inf:
            return None
        true = float(true)
        ratio = (rate + (backlog or 0.0) / self.catch_up) / (true * self.target_utilisation)
        needed = math.ceil(ratio - _EPS * max(1.0, ratio)) if ratio < math.inf else hi
        return min(max(needed, lo), hi)


def _seconds(option: str, setting: str, value) -> float:
    """A duration option in seconds: a number as is, a string such as ``"5s"`` parsed."""
    value = config.get(setting, value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    try:
        return config.seconds(setting, value)
    except (TypeError, ValueError, KeyError):
        raise ValueError(f"ds2: {option} must be a duration in seconds or a string such as '5s', "
                         f"got {value!r}") from None


def _count(name: str, op: dict, field: str) -> int:
    """An integer field of an operator's report."""
    value = op.get(field)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"ds2: operator {name!r}: {field!r} must be an integer >= 1, got {value!r}")
    return int(value)


def _rate(name: str, op: dict, field: str) -> float | None:
    """A non-negative float field of an operator's report; None when missing, None or nan."""
    value = op.get(field)
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"ds2: operator {name!r}: {field!r} must be a number, got {value!r}") from None
    if math.isnan(value):
        return None
    if value < 0:
        raise ValueError(f"ds2: operator {name!r}: {field!r} must be >= 0, got {value!r}")
    return value
