"""Planning event time: which column each window, join and process stage reads, and checks of it."""
from __future__ import annotations

from ..exceptions import PipelineError, SchemaError


def _sources(by_id, st) -> list:
    """The sources whose records reach stage ``st`` (through any of its inputs)."""
    out, todo, seen = [], [st], set()
    while todo:
        s = todo.pop()
        if s.id in seen:
            continue
        seen.add(s.id)
        if s.is_source:
            out.append(s)
        else:
            todo.extend(by_id[u] for u in s.inputs)
    return sorted(out, key=lambda s: s.id)


def _clock(by_id, st, slots, what: str) -> tuple:
    """``(column, unit)`` of the event time of the sources behind input ``slots`` of ``st``:
    one column for all of them."""
    srcs = [s for slot in slots for s in _sources(by_id, by_id[st.inputs[slot]])]
    bare = [s for s in srcs if s.watermark is None]
    if bare:
        raise PipelineError(
            f"{what} {st.name!r} needs event time: put .with_watermark(column) in the stage of source "
            f"{bare[0].name!r} (Stream.from_parquet(...).with_watermark('event_time')); every source that "
            "feeds it needs one, or its watermark could not advance")
    clocks = {(s.watermark["column"], s.watermark["unit"]) for s in srcs}
    if len(clocks) > 1:
        raise PipelineError(
            f"{what} {st.name!r} reads event time from sources with different columns or units "
            f"({', '.join(sorted(f'{c!r} (unit {u})' for c, u in clocks))}); give its inputs one event-time column")
    return next(iter(clocks))


def event_time(plan) -> None:
    """Each window, join and process stage takes the event-time column of the sources its
    records come from (per side, for a join)."""
    by_id = {s.id: s for s in plan.stages}
    for st in plan.stages:
        slots = range(len(st.inputs))
        if st.kind == "window":
            column, unit = _clock(by_id, st, slots, "window join" if st.join else "window operator")
            st.window.update(column=column, unit=unit)
        elif st.kind == "process":
            column, unit = _clock(by_id, st, slots, "process operator")
            st.process.update(column=column, unit=unit)
        elif st.kind == "join":
            if st.join["between"] is None and st.join["ttl"] is None:
                continue            # a regular join that keeps every row needs no event time
            for side in (0, 1):
                mine = [k for k in slots if st.sides[k] == side]
                st.join["columns"][side], st.join["units"][side] = _clock(by_id, st, mine, "join")


def check_event_time(src, cols: dict) -> None:
    """The with_watermark column of a Parquet source: there, and a timestamp (or integers
    with unit=)."""
    import pyarrow.types as pt

    wm = src.watermark
    what = f"with_watermark({wm['column']!r}) of source {src.name!r}"
    if wm["column"] not in cols:
        raise SchemaError(f"{what}: column {wm['column']!r} is not in {src.files[0]!r}; columns there: "
                          f"{', '.join(cols)}")
    t = cols[wm["column"]]
    if pt.is_timestamp(t):
        if wm["unit"] is not None:
            raise SchemaError(f"{what}: the column holds timestamps ({t}); drop unit={wm['unit']!r}, which is "
                              "for integer columns")
    elif pt.is_integer(t):
        if wm["unit"] is None:
            raise SchemaError(f"{what}: the column holds integers ({t}); say what they count with unit= one of "
                              "s, ms, us, ns")
    else:
        raise SchemaError(f"{what}: the column has type {t}; event times must be timestamps, or integers with unit=")
