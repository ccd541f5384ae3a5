"""``select``: keep some columns of each batch; right after a Parquet source, read only
those (docs/user-guide.md, "Reading only the columns you use").

Like every streamlb node it describes a step; :func:`streamlb.run` plans and runs it.
"""
from __future__ import annotations

from streamz import Stream

from ._base import _Described
from ..exceptions import PipelineError


@Stream.register_api()
class select(_Described):
    """Keep only ``columns`` of each batch (a DataFrame), in that order.

    Right after ``from_parquet`` (or after its ``with_watermark``), ``select`` also tells
    the source which columns to read: the files' other columns are never decoded, as Spark
    and Flink prune the columns a query does not use from its scan. When every path out of
    a source starts with a ``select``, the source reads the union of their columns, plus
    its watermark's event-time column (the watermark is taken before ``select``; the
    column is in the output only if listed). Columns a user function reads cannot be known
    otherwise: without ``select`` every column is read, except for a source read by keyed
    aggregates alone, which reads the columns they name.

    Parameters
    ----------
    columns : list of str
        The columns to keep, distinct. A column missing from a Parquet source's files is
        refused when the job is planned; one missing from a batch fails the job with a
        :class:`~streamlb.exceptions.SchemaError` naming it and the batch's columns.

    Examples
    --------
    >>> from streamz import Stream
    >>> bids = Stream.from_parquet("data/nexmark/bid").with_watermark("date_time", delay="4s")
    >>> prices = bids.select(["auction", "price", "date_time"])
    """

    def __init__(self, upstream, columns, **kwargs):
        if (isinstance(columns, str) or not isinstance(columns, (list, tuple)) or not columns
                or not all(isinstance(c, str) and c for c in columns) or len(set(columns)) != len(columns)):
            raise PipelineError(f"select: columns must be a non-empty list of distinct column names, got {columns!r}")
        self.columns = list(columns)
        super().__init__(upstream, **kwargs)
