"""Planning stages with several inputs: ``union`` and ``join``.

A ``union`` is no stage of its own: what follows it is planned in the stage of each of its
inputs, and the first stateful operator or ``rebalance`` after it is one stage with an input
from each (Flink's union, without a shuffle). A ``join`` is one keyed stage with an input
per stage that feeds either side; each side's router hashes that side's key into the one
key-group space and routing table of the join, so both sides' state of a key group live,
move and are checkpointed together. An input slot's senders have ids
``slot * SENDERS + index`` (see :data:`streamlb.planner.SENDERS`).
"""
from __future__ import annotations

from ..exceptions import PipelineError


def another_input(p, st, stage, side: int | None = None):
    """Stage ``stage`` feeds the already planned ``st`` too (through a union, or as the
    other side of a join): one more input slot, unless it is one already."""
    from .._plan._step import Step

    if stage.id in st.inputs:
        have = st.sides[st.inputs.index(stage.id)] if st.sides else None
        if side is not None and have != side:
            raise PipelineError(
                f"join {st.name!r}: both sides come from the stage of {stage.name!r}; a join's sides must come "
                "from different stages (put a rebalance() on one side, or read the source twice)")
        return Step("exchange", target=st.id)
    st.inputs.append(stage.id)
    if side is not None:
        st.sides.append(side)
    return Step("exchange", target=st.id)


def _side(op, kb, window) -> int:
    """0 when ``kb`` (or the window after it) is the join's left input, else 1."""
    return 0 if kb is (window.upstreams[0] if window is not None else op.upstreams[0]) else 1


def joined(p, kb, op, stage):
    """The exchange from ``stage`` into join ``op`` (a window join when its left input is a
    window, whichever side the planner reaches it from first)."""
    from ..nodes._time import window as window_node
    from .._plan._step import Step, _ship

    window = op.upstreams[0] if isinstance(op.upstreams[0], window_node) else None
    side = _side(op, kb, window)
    st = p.memo.get(id(op))
    if st is not None:
        step = another_input(p, st, stage, side)
        _set_key(st, side, kb, p)
        return step
    if window is not None and window.kind == "session":
        raise PipelineError(f"join after window(gap=...) of key_by({kb.key_name!r}): window joins take "
                            "tumbling or hopping windows (size=, slide=)")
    name = p.unique_name(op.op_name, "window_join" if window is not None else "join")
    st = p.new_stage(
        name=name, kind="window" if window is not None else "join",
        parallelism=min(p.default_parallelism(op.parallelism), p.key_groups),
        upstream=stage.id, exchange="keyed", key=None, key_name=kb.key_name,
        window={**window.describe(), "mode": "join"} if window is not None else None,
    )
    st.sides, st.keys = [side], [None, None]
    st.join = {"how": op.how, "between": op.between, "ttl": op.ttl, "suffixes": op.suffixes,
               "where": _ship(op.where, name) if op.where is not None else None,
               "key_names": [None, None], "columns": [None, None], "units": [None, None]}
    _set_key(st, side, kb, p)
    p.memo[id(op)] = st
    st.children = p.children(op, st)
    return Step("exchange", target=st.id)


def _set_key(st, side: int, kb, p) -> None:
    from .._plan._step import _ship

    if st.keys[side] is None:
        st.keys[side] = _ship(kb.key, st.name) if callable(kb.key) else kb.key
        st.join["key_names"][side] = kb.key_name
        if side == 0:
            st.key, st.key_name = st.keys[0], kb.key_name


def check_joins(plan) -> None:
    """Every join has both sides, and its output columns are those of ``pandas.merge``."""
    for st in plan.stages:
        if st.join is None:
            continue
        missing = [n for n, s in (("left", 0), ("right", 1)) if s not in st.sides]
        if missing:
            raise PipelineError(f"join {st.name!r} has no {missing[0]} input: both sides must come from "
                                "the job's sources")
