"""What every streamlb node shares: argument checks, the described-only base class, and
the late stream of window operators."""
from __future__ import annotations

from streamz import Stream

from ..exceptions import PipelineError


def _check_parallelism(parallelism: int | None, what: str) -> None:
    if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
        raise PipelineError(f"{what}: parallelism must be a positive integer or None, got {parallelism!r}")


def _check_name(name: str | None, what: str) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise PipelineError(f"{what}: name must be a non-empty string, got {name!r}")


def _check_cost(cost, what: str):
    """``cost``: emulated service time, seconds per record (a number) or the name of a column
    holding each record's seconds."""
    if cost is None or isinstance(cost, str) and cost:
        return cost
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0:
        return float(cost)
    raise PipelineError(
        f"{what}: cost must be None, a number of seconds per record >= 0, or the name of a "
        f"column of seconds per record, got {cost!r}"
    )


def _keep_alive(node: Stream) -> None:
    """Let the sources hold ``node``: streamz links downstream nodes only weakly, and an
    aggregate is often the end of a pipeline with no sink to keep it."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        ups = [u for u in n.upstreams if u is not None]
        if not ups and n is not node:
            n.__dict__.setdefault("_streamlb_keep", []).append(node)
        todo.extend(ups)


class _Described(Stream):
    """A node that only describes a step: it runs under :func:`streamlb.run`."""

    def __init__(self, upstream, **kwargs):
        super().__init__(upstream, **kwargs)
        _keep_alive(self)

    def update(self, x, who=None, metadata=None):
        raise PipelineError(
            f"{type(self).__name__} runs on a Dask cluster: pass the pipeline to "
            "streamlb.run(...) instead of emitting into it"
        )


class late_records(_Described):
    """The late stream of a window operator (see ``late()`` of ``aggregate`` and ``apply``)."""


class _Late:
    """``late()``: the stream of records that came after their window was final."""

    def late(self) -> late_records:
        """Records too late for one of their windows (window operators only): one row per
        record and window missed, with the record's columns, ``window_start``,
        ``window_end`` and ``watermark``. Feed it any sink; without one, the same rows go
        to the dead letters with reason ``"late"``."""
        return late_records(self)
