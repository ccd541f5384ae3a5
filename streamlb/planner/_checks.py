"""Checks and tuning of a planned job that read its Parquet inputs: the columns each
operator needs, the columns a source reads, and the batch size of paced sources."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import config
from ..exceptions import KeyTypeError, SchemaError
from ._time import check_event_time as _check_event_time
from .._sources._directory import accepts

if TYPE_CHECKING:
    from .._plan._model import Plan


def _check_columns(plan: Plan) -> None:
    """Check key and aggregate columns against Parquet schemas where nothing reshapes the batch."""
    import pyarrow.parquet as pq

    by_id = {s.id: s for s in plan.stages}
    for src in plan.stages:
        if src.kind != "parquet_source":
            continue
        schema = pq.read_schema(src.files[0])
        cols = {f.name: f.type for f in schema}
        if src.columns:
            missing = [c for c in src.columns if c not in cols]
            if missing:
                raise SchemaError(
                    f"from_parquet: column {missing[0]!r} is not in {src.files[0]!r}; "
                    f"columns there: {', '.join(cols)}"
                )
            cols = {c: cols[c] for c in src.columns}
        if any(s.kind == "watermark" for s in src.children):
            _check_event_time(src, cols)
        todo = [(s, cols, "") for s in src.children]
        while todo:
            step, cols, after = todo.pop()
            if step.kind in ("filter", "watermark"):
                todo.extend((s, cols, after) for s in step.children)
            if step.kind == "select":       # below it, only the columns it keeps
                kept = {c: cols[c] for c in step.args[0] if c in cols}
                todo.extend((s, kept, f" after select({list(step.args[0])})") for s in step.children)
            if step.kind != "exchange":
                continue
            st = by_id[step.target]
            cost = [st.cost] if isinstance(st.cost, str) else []
            if st.exchange != "keyed":
                feature = (st.shuffle or {}).get("feature")
                needed = cost + ([feature] if isinstance(feature, str) else [])
            else:
                key = st.key_of(src.id)
                needed = ([key] if isinstance(key, str) else []) + [c for c, _ in st.spec.values()] + cost
            for c in needed:
                if c not in cols:
                    raise SchemaError(
                        f"operator {st.name!r} needs column {c!r}, which is not in {src.files[0]!r}{after}; "
                        f"columns there: {', '.join(cols)}"
                    )
            if st.exchange == "keyed":
                _check_numeric(st, cols, src.files[0], after)
            if st.exchange == "keyed" and isinstance(key, str):
                t = cols[key]
                import pyarrow.types as pt

                if not accepts("key", t):
                    raise KeyTypeError(
                        f"operator {st.name!r}: key column {key!r} has type {t}, which the "
                        "key-group hash cannot take; valid key types are integers, booleans and strings"
                    )
                st.key_kind = "i" if pt.is_integer(t) else "b" if pt.is_boolean(t) else "O"


def _check_numeric(st, cols: dict, path: str, after: str) -> None:
    """Raise SchemaError where aggregate ``st`` sums (or takes the mean, minimum or maximum
    of) a column whose Parquet type is not a number."""
    for c, how in st.spec.values():
        t = cols[c]
        if how == "count" or accepts("number", t):
            continue
        raise SchemaError(
            f"operator {st.name!r}: {how} of column {c!r}, which has type {t} in {path!r}{after}; "
            f"{how} needs a numeric column (integers, floats, decimals or booleans): write it as "
            "numbers, or parse it in a map before key_by"
        )


#: An open-loop source (``rate=``) whose batch size nobody chose emits about this many
#: batches per instance per load window (docs/balancers.md, "Reading imbalance").
PACED_BATCHES = 16
#: ... but no batch of fewer rows than this.
MIN_PACED_BATCH = 256


def pace_batches(plan: Plan, window: float, given: bool = False) -> None:
    """Smaller batches for the open-loop sources of ``plan``, so that a load window of
    ``window`` seconds holds about PACED_BATCHES of each source instance's batches.

    At the default 65,536 rows a source paced at 200k records/s sends about three batches
    a second: what an instance applies in a one-second window then depends on where the
    window's edges fall between those batches, and a balancer planning on it chases that
    noise. A source with ``batch_size=`` of its own, or every source when ``given`` (the
    job's ``batch_size=``), keeps it; the setting ``streamlb.batch-size`` stays the largest.

    A Parquet source read at full speed (no ``rate=``) by aggregates alone takes larger
    batches (the setting ``streamlb.aggregate-batch-size``): its batches go out summed per
    key, which costs per batch, not per row, and a larger batch has fewer keys per row.
    For aggregates whose state is in RocksDB, a quarter of that: their workers' memory is
    what they save (30M distinct keys on 2 workers of 1 GiB, before the store's buffer,
    peaked at 860 MiB a worker with the full size, 650 MiB with a quarter, 570 MiB with
    65536 rows).
    """
    by_id = {s.id: s for s in plan.stages}
    for st in plan.stages:
        if st.kind not in ("parquet_source", "directory_source") or st.batch_size_given or given:
            continue
        if not st.rate:
            if st.kind == "parquet_source" and config.get("exchange.combine") and _aggregates_only(st, by_id) \
                    and all(by_id[c.target].cost is None for c in st.children):
                large = int(config.get("aggregate-batch-size"))
                if any(by_id[c.target].state for c in st.children):
                    large //= ON_DISK_SHARE      # a batch's keys cost their workers' memory too
                st.batch_size = max(st.batch_size, large)
            elif st.kind == "parquet_source":
                st.batch_size = max(st.batch_size, full_speed_rows(st))
            continue
        per_window = st.rate / st.parallelism * window
        st.batch_size = int(min(st.batch_size, max(MIN_PACED_BATCH, per_window // PACED_BATCHES)))


ON_DISK_SHARE = 4


def full_speed_rows(st) -> int:
    """Rows per batch of Parquet source stage ``st`` read at full speed (no ``rate=``): as
    many as ``streamlb.full-speed-batch-bytes`` of its decoded columns hold, at most
    ``streamlb.full-speed-batch-size``. Nothing waits on a batch of a file already
    written, and each batch costs every step it passes a fixed overhead (NEXMark q12 at 2M
    events took 0.47 s at 65,536 rows a batch, 0.25 s at 262,144); the bytes keep wide
    rows' batches as small as before."""
    from dask.utils import parse_bytes

    from ..exceptions import PipelineError

    cap, budget = config.get("full-speed-batch-size"), config.get("full-speed-batch-bytes")
    try:
        cap, budget = int(cap), int(parse_bytes(budget))
    except (TypeError, ValueError):
        cap = budget = -1
    if cap < 1 or budget < 1:
        raise PipelineError(f"settings streamlb.full-speed-batch-size and full-speed-batch-bytes: must be a row "
                            f"count >= 1 and a size in bytes >= 1 (an int, or a string such as '16MiB'), got "
                            f"{config.get('full-speed-batch-size')!r} and {config.get('full-speed-batch-bytes')!r}")
    return min(cap, int(budget // bytes_per_row(st.files, st.columns)))


def bytes_per_row(files: list[str], columns: list[str] | None) -> float:
    """About how many bytes a row of ``columns`` (None: all) of Parquet ``files`` takes
    decoded, in Arrow (as pandas holds numbers and, from pandas 3, strings): from the first
    1,024 rows of the first file. Parquet's own sizes would not do: a dictionary-encoded
    string column is small in the file and large decoded."""
    import pyarrow.parquet as pq

    if not files:
        return 1.0
    pf = pq.ParquetFile(files[0])
    if columns is not None:     # a partition column (``part=0/``) is not in the file
        columns = [c for c in columns if c in pf.schema_arrow.names]
    first = next(pf.iter_batches(batch_size=1024, columns=columns), None)
    if first is None or not first.num_rows:
        return 1.0
    return max(first.nbytes / first.num_rows, 1.0)


def _aggregates_only(src, by_id: dict) -> bool:
    """Every consumer of source stage ``src`` is an aggregate keyed by a column: nothing
    else sees its batches (and each is sent summed per key, see ``_worker/_combine.py``)."""
    targets = [by_id[c.target] if c.kind == "exchange" else None for c in src.children]
    return bool(targets) and all(t is not None and t.kind == "aggregate" and isinstance(t.key, str)
                                 for t in targets)


def _project(plan: Plan) -> None:
    """Read only the columns a source's consumers use, when every consumer is an aggregate
    keyed by a column (nothing else sees the batch, so nothing else can need a column, and
    nothing writes to it: its frames may share Arrow's read-only buffers)."""
    by_id = {s.id: s for s in plan.stages}
    for src in plan.stages:
        if src.kind == "parquet_source" and src.columns is None:
            _prune(src)
        if src.kind != "parquet_source" or not src.children or not _aggregates_only(src, by_id):
            continue
        src.read_only = True
        if src.columns is None:
            targets = [by_id[c.target] for c in src.children]
            needed = {t.key for t in targets} | {c for t in targets for c, _ in t.spec.values()}
            import pyarrow.parquet as pq

            needed |= {src.event_time} - {None}
            needed |= {t.cost for t in targets if isinstance(t.cost, str)}
            src.columns = [f.name for f in pq.read_schema(src.files[0]) if f.name in needed]


def _selected(steps: list) -> set | None:
    """The columns ``steps`` read when every path through them starts with a ``select``
    (after a ``with_watermark``, whose column it adds); else None."""
    need: set = set()
    for step in steps:
        if step.kind == "select":
            need |= set(step.args[0])
        elif step.kind == "watermark" and (after := _selected(step.children)) is not None:
            need |= after | {step.name}
        else:
            return None
    return need or None


def _prune(src) -> None:
    """A Parquet source whose every consumer starts with ``select`` reads only the columns
    they keep (and its event-time columns); a selected column not in its files is refused."""
    need = _selected(src.children)
    if need is None:
        return
    import pyarrow.parquet as pq

    have = [f.name for f in pq.read_schema(src.files[0])]
    missing = sorted(need - set(have))
    if missing:
        raise SchemaError(f"select: column {missing[0]!r} is not in the files of source {src.name!r} "
                          f"({src.files[0]!r}); their columns: {', '.join(have)}")
    need |= {src.event_time} - {None}
    src.columns = [c for c in have if c in need]
