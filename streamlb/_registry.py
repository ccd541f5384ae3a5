"""Policies found by name in an entry-point group (balancers, scalers): one lookup for all."""
from __future__ import annotations

import warnings
from importlib.metadata import entry_points


def registered(group: str, kind: str) -> dict[str, object]:
    """Entry points of ``group`` by name; a name registered twice warns, the first wins."""
    found: dict[str, object] = {}
    for ep in entry_points(group=group):
        if ep.name in found and found[ep.name].value != ep.value:
            warnings.warn(f"{kind} {ep.name!r} is registered twice ({found[ep.name].value} and "
                          f"{ep.value}); using the first", RuntimeWarning, stacklevel=3)
            continue
        found.setdefault(ep.name, ep)
    return found


def build(group: str, kind: str, base: type, name, **options):
    """The ``kind`` registered in ``group`` as ``name``, built with ``options`` (an instance
    of ``base`` is returned as is); ValueError listing the valid names if there is none."""
    if isinstance(name, base):
        return name
    eps = registered(group, kind)
    if name not in eps:
        valid = ", ".join(sorted(eps)) or "(none installed)"
        raise ValueError(f"unknown {kind} {name!r}; valid {kind}s are {valid}")
    obj = eps[name].load()(**options)
    if not isinstance(obj, base):
        raise TypeError(f"{kind} {name!r} ({eps[name].value}) is not a {base.__module__}.{base.__name__}")
    return obj
