"""Planning event time: which column each window stage reads, and checks of it."""
from __future__ import annotations

from .exceptions import PipelineError, SchemaError


def event_time(plan) -> None:
    """Each window stage takes the event-time column of the source its records come from."""
    by_id = {s.id: s for s in plan.stages}
    for st in plan.stages:
        if st.kind != "window":
            continue
        up = by_id[st.upstream]
        while not up.is_source:
            up = by_id[up.upstream]
        if up.watermark is None:
            raise PipelineError(
                f"window operator {st.name!r} needs event time: put .with_watermark(column) in the stage of "
                f"source {up.name!r} (Stream.from_parquet(...).with_watermark('event_time'))")
        st.window.update(column=up.watermark["column"], unit=up.watermark["unit"])


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
