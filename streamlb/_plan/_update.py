"""Find the user function ``Job.update`` replaces, check the new one, and switch it.

A function is named by its operator: a ``stateful_map`` by the operator's name, a fused
``map``/``starmap``/``filter`` step by its streamz node name (``stream_name=``). Its *path*
says where it lives in a stage: ``("stage",)`` for the stage's own function, else
``("steps", i, j, ...)``, the indices down the tree of fused steps.
"""
from __future__ import annotations

import inspect

from ..exceptions import ReconfigurationError
from ._model import Plan, Stage
from ._step import Step

STEP_KINDS = ("map", "starmap", "filter")


def _walk(steps: list[Step], path: tuple):
    for i, step in enumerate(steps):
        yield step, path + (i,)
        yield from _walk(step.children, path + (i,))


def find_function(plan: Plan, operator: str) -> tuple[Stage, tuple, object]:
    """``(stage, path, function)`` of what ``operator`` names; ReconfigurationError listing the
    names that can be updated otherwise."""
    names = []
    for st in plan.stages:
        if st.kind == "stateful_map":
            if st.name == operator:
                return st, ("stage",), st.func
            names.append(st.name)
        for step, path in _walk(st.children, ()):
            if step.kind in STEP_KINDS and step.name:
                if step.name == operator:
                    return st, ("steps",) + path, step.func
                names.append(step.name)
    raise ReconfigurationError(
        f"no function named {operator!r} can be updated; updatable: stateful_map operators and "
        f"map/starmap/filter nodes given stream_name=: {', '.join(names) or 'none in this job'}")


def step_at(stage: Stage, path: tuple) -> Step:
    steps, step = stage.children, None
    for i in path[1:]:
        step = steps[i]
        steps = step.children
    return step


def set_function(stage: Stage, path: tuple, func, store=None) -> None:
    """Put ``func`` at ``path`` of ``stage`` (and in the stateful map's ``store``)."""
    if path == ("stage",):
        stage.func = func
        if store is not None:
            store.func = getattr(func, "func", func)
    else:
        step_at(stage, path).func = func


def check_function(operator: str, kind: str, new, old) -> None:
    """``new`` must be callable with the arguments ``old`` is called with."""
    if not callable(new):
        raise ReconfigurationError(f"operator {operator!r}: the new function is a {type(new).__name__}, not callable")
    args = 2 if kind == "stateful_map" else 1
    extra = getattr(old, "args", ()) if kind != "stateful_map" else ()
    try:
        sig = inspect.signature(new)
    except (TypeError, ValueError):
        return                                  # a builtin without a signature: trust it
    try:
        sig.bind(*([None] * (args + len(extra))))
    except TypeError as exc:
        want = "(state, record)" if kind == "stateful_map" else "(batch)"
        raise ReconfigurationError(f"operator {operator!r}: the new function {getattr(new, '__name__', new)!r} "
                                   f"cannot be called as f{want}: {exc}") from exc
