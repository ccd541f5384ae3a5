"""The scaler interface: a pure function from a rate report to new parallelisms.

A scaler never touches a cluster: it sees a report of each operator's rates and backlog and
returns the operators whose parallelism should change. The runtime measures the report and
carries the plan out. Policies are found by name in the entry-point group
``streamlb.scalers``; the built-in ``ds2`` in ``balancers/`` is registered there exactly as
a third party registers its own.

Examples
--------
>>> true_rate(5000, 2.5)
2000.0
>>> true_rate(0, 0.0) is None
True
>>> "ds2" in scaler_names()
True
"""
from __future__ import annotations

import abc

from ._registry import build, registered

__all__ = ["Scaler", "get_scaler", "scaler_names", "true_rate"]

GROUP = "streamlb.scalers"


class Scaler(abc.ABC):
    """An autoscaling policy: one pure, deterministic method.

    :meth:`plan` takes a report of the last window and returns the new parallelism of the
    operators that should change. The report is::

        {"time": float,
         "operators": {name: {"parallelism": int, "min": int, "max": int,
                              "input_rate": float,   # records/s offered to this operator
                              "backlog": float,      # records offered but not yet processed
                              "true_rate": float,    # records per busy second of ONE instance (nan/None if unknown)
                              "since_change": float  # seconds since its parallelism last changed (inf if never)
                             }}}

    ``time`` is when the window ended (epoch seconds). A scaler keeps no state between
    calls: whatever it needs to remember (such as when an operator last changed) is in
    the report, so the same report always gives the same plan.

    Attributes
    ----------
    name : str
        The name the policy is registered under in ``streamlb.scalers``.
    """

    name: str = ""

    @abc.abstractmethod
    def plan(self, report: dict) -> dict[str, int]:
        """The new parallelism of each operator that should change, by operator name in
        sorted order; ``{}`` for none.

        Parameters
        ----------
        report : dict
            The rates of the last window, laid out as in the class docstring.

        Returns
        -------
        dict of str to int
            Operator name -> new parallelism, only for operators whose parallelism
            changes.
        """


def true_rate(records: float, busy_seconds: float) -> float | None:
    """Records processed per busy second: what one instance manages when it never waits.

    Parameters
    ----------
    records : float
        Records an instance processed in a window.
    busy_seconds : float
        Seconds of that window it spent processing them.

    Returns
    -------
    float or None
        ``records / busy_seconds``; None when ``busy_seconds`` is not positive (an idle
        instance says nothing about its rate).

    Examples
    --------
    >>> true_rate(900, 0.5)
    1800.0
    >>> true_rate(900, 0) is None
    True
    """
    if not busy_seconds > 0:
        return None
    return float(records) / float(busy_seconds)


def _available_scalers() -> dict[str, object]:
    """Entry points of group ``streamlb.scalers`` by name; a clash warns, first wins."""
    return registered(GROUP, "scaler")


def scaler_names() -> list[str]:
    """Names registered in the entry-point group ``streamlb.scalers``, sorted."""
    return sorted(_available_scalers())


def get_scaler(name: str | Scaler, **options) -> Scaler:
    """Build the scaler registered as ``name`` (an instance is returned as is).

    Parameters
    ----------
    name : str or Scaler
        A name from :func:`scaler_names`.
    **options
        Keyword options of the scaler's constructor.

    Returns
    -------
    Scaler

    Raises
    ------
    ValueError
        If no scaler is registered as ``name``; the message lists the valid names.

    Examples
    --------
    >>> get_scaler("ds2", cooldown=0).cooldown
    0.0
    """
    return build(GROUP, "scaler", Scaler, name, **options)
