"""A ``sink`` whose function holds a container of the driver: warned about at planning.

A sink's function travels to the workers by value, so a list, dict, set or deque it reaches
(in its closure, its defaults or the globals it reads) is a copy there: whatever it appends
never reaches the driver's, which stays as it was, with no error. ``sink(L.append)`` is the
exception, recognised by the planner as a list sink whose items the driver collects.
"""
from __future__ import annotations

import collections
import functools
import os
import sys
import types
import warnings

from .._functions import describe
from ..exceptions import StreamlbWarning

__all__ = ["warn_driver_state"]

_CONTAINERS = (list, dict, set, collections.deque)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep     # streamlb/


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the functions defined in it may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _held(func) -> list[tuple[str, object]]:
    """``(how it is reached, container)`` for each driver container ``func`` holds."""
    out: list[tuple[str, object]] = []
    owner = getattr(func, "__self__", None)
    if isinstance(owner, _CONTAINERS):          # d.update, s.add, L.extend, deque.append
        out.append((f"the {type(owner).__name__} whose .{func.__name__} it is", owner))
    while isinstance(func, functools.partial):
        out += [(f"argument {a!r} of functools.partial", a)
                for a in (*func.args, *func.keywords.values()) if isinstance(a, _CONTAINERS)]
        func = func.func
    code = getattr(func, "__code__", None)
    if code is None:
        return out
    for name, cell in zip(code.co_freevars, func.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:                      # a cell not yet filled
            continue
        if isinstance(value, _CONTAINERS):
            out.append((f"variable {name!r} of its closure", value))
    defaults = func.__defaults__ or ()
    params = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]
    out += [(f"the default of argument {n!r}", v) for n, v in zip(params, defaults) if isinstance(v, _CONTAINERS)]
    out += [(f"the default of argument {n!r}", v) for n, v in (func.__kwdefaults__ or {}).items()
            if isinstance(v, _CONTAINERS)]
    scope = getattr(func, "__globals__", {})
    out += [(f"global {n!r}", scope[n]) for n in sorted(_global_names(code))
            if isinstance(scope.get(n), _CONTAINERS)]
    return out


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside streamlb, seen from this module's caller."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def warn_driver_state(node, func) -> None:
    """Warn once per container of the driver that sink ``node``'s ``func`` holds."""
    for how, value in _held(func):
        kind = type(value).__name__
        warnings.warn(
            f"sink {node.name or type(node).__name__!r} ({describe(func)}) holds a {kind} of the driver "
            f"({how}): the sink runs on the workers, each on its own copy, so the driver's {kind} "
            "stays as it is. To get a sink's output in the driver, sink into a list with "
            ".sink_to_list() or .sink(L.append) and read it with job.results(L) while the job runs.",
            StreamlbWarning, stacklevel=_caller_level())
