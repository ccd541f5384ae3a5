"""A directory that grows (``Stream.from_parquet(path, watch=...)``): a split per file.

The files are the ``*.parquet`` under ``stage.source["path"]`` (searched recursively) none
of whose path components starts with ``_`` or ``.``: a writer writes under such a name
(``_tmp-x.parquet``, ``.x.parquet``, a ``_temporary/`` directory) and renames the file into
place once it is complete, as Spark does. A rename within a file system is atomic on POSIX,
so a visible file is complete, and it is read once.

A split's id is the file's path relative to the directory (``/``-separated); its position
is the rows of the file before the next one to read. Instance ``index`` of
``stage.parallelism`` owns the files with :func:`owner` ``== index``, a stable hash of that
path: nothing is coordinated, and a restarted instance owns the same files.

The reader lists the directory at most every ``watch`` seconds, from :meth:`poll`; the new
files it owns are opened at row 0 and that poll hands out an empty batch, so the runtime
registers them before any of their rows goes out. A file read to its end ends (for the
watermark it is finished); the reader never does (``live``): with nothing to read it waits
a moment and hands out an empty batch, until the job stops.

A file of another schema is set aside, not read: the planner writes in
``stage.source["expects"]`` the columns the pipeline takes from the files as read (by
:func:`set_expectations`), and a file that lacks one, or has it with a type its consumer
cannot take, goes to the dead letters with its path, its columns and the expected ones, as
a split of no rows: read to its end at once, so it is in the positions saved as done and
set aside once across a recovery. Extra columns are fine.

A saved position keeps ``{"directory": {"files": {path: rows}, "done": [path, ...]}}``: the
files being read at the rows emitted, and the files emitted to their end, so after a
recovery or a restore a finished file is not read again and a half-read one goes on at its
row. (Not the Parquet source's top-level ``"files"``: a restore rebuilds that key from the
files planned, and a watched directory plans none.)
"""
from __future__ import annotations

import logging
import os
import time
import zlib

import numpy as np
import pandas as pd

from ._base import Split, SplitBatch
from ._parquet import ParquetReader, _skipping

logger = logging.getLogger("streamlb.sources.directory")

POLL_WAIT = 0.05        # s a poll with nothing to read waits before handing out an empty batch

#: what a column expected in a watched directory's files must hold, by its use
KINDS = {
    "key": "integers, booleans or strings",
    "number": "numbers (integers, floats, decimals or booleans)",
    "timestamp": "timestamps",
    "integer": "integers",
    "time": "timestamps or numbers",
    "any": "any type",
}


def accepts(kind: str, t) -> bool:
    """Whether a column of Arrow type ``t`` holds what a use of kind ``kind`` (a key of
    :data:`KINDS`) takes; the planner's checks of a fixed input's schema ask the same.

    >>> import pyarrow as pa
    >>> accepts("key", pa.string()), accepts("key", pa.float64()), accepts("number", pa.decimal128(5, 2))
    (True, False, True)
    """
    import pyarrow.types as pt

    if kind == "key":
        return pt.is_integer(t) or pt.is_boolean(t) or pt.is_string(t) or pt.is_large_string(t)
    if kind == "number":
        return pt.is_integer(t) or pt.is_floating(t) or pt.is_boolean(t) or pt.is_decimal(t)
    if kind == "timestamp":
        return pt.is_timestamp(t)
    if kind == "integer":
        return pt.is_integer(t)
    if kind == "time":
        return pt.is_timestamp(t) or pt.is_integer(t) or pt.is_floating(t)
    return True


def set_expectations(plan) -> None:
    """Write in each watched directory's ``stage.source["expects"]`` what its files must
    hold: ``{column: [kind, who needs it]}`` (a kind of :data:`KINDS`), from ``columns=``,
    ``event_time=``, ``with_watermark`` and the keys and aggregated columns of the keyed
    operators its batches reach as read (through filters, selects and watermarks; past a
    ``map`` the columns are the function's, checked where they are used)."""
    by_id = {s.id: s for s in plan.stages}
    for src in plan.stages:
        if src.kind != "directory_source":
            continue
        need: dict[str, list] = {}

        def add(column, kind: str, who: str) -> None:
            if isinstance(column, str) and need.get(column, ["any"])[0] == "any":
                need[column] = [kind, who]

        wm = src.watermark or {}
        add(wm.get("column"), "timestamp" if wm.get("unit") is None else "integer",
            f"with_watermark({wm.get('column')!r})")
        add(src.event_time, "time", f"event_time={src.event_time!r}")
        todo = list(src.children)
        while todo:
            step = todo.pop()
            if step.kind in ("filter", "select", "watermark"):
                todo.extend(step.children)
                continue
            if step.kind != "exchange":
                continue
            st = by_id[step.target]
            who = f"operator {st.name!r}"
            if st.exchange == "keyed":
                add(st.key_of(src.id), "key", who)
            for column, how in (st.spec or {}).values():
                add(column, "any" if how == "count" else "number", who)
            add(st.cost, "any", who)
            add((st.shuffle or {}).get("feature"), "any", who)
        for column in src.columns or ():
            add(column, "any", f"columns={list(src.columns)}")
        src.source["expects"] = need


def schema_problems(schema, expects: dict) -> list[str]:
    """What keeps a file of Arrow ``schema`` from being read by a source that ``expects``
    these columns (see :func:`set_expectations`); ``[]``: nothing.

    >>> import pyarrow as pa
    >>> for p in schema_problems(pa.schema([("key", pa.float64()), ("v", pa.int64())]),
    ...                          {"key": ["key", "operator 'n'"], "value": ["number", "operator 'n'"]}):
    ...     print(p)
    column 'key' is double, operator 'n' needs integers, booleans or strings
    no column 'value' (operator 'n' needs it)
    """
    types = {f.name: f.type for f in schema}
    out = []
    for column, (kind, who) in expects.items():
        if column not in types:
            out.append(f"no column {column!r} ({who} needs it)")
        elif not accepts(kind, types[column]):
            out.append(f"column {column!r} is {types[column]}, {who} needs {KINDS[kind]}")
    return out


def owner(path: str, parallelism: int) -> int:
    """The instance that reads file ``path`` (relative to the watched directory).

    >>> [owner(f"part-{i}.parquet", 4) for i in range(4)], owner("part-0.parquet", 1)
    ([3, 0, 1, 2], 0)
    """
    return zlib.crc32(path.encode()) % parallelism


def visible_files(root: str) -> list[str]:
    """The complete Parquet files under ``root``, as sorted paths relative to it: none of
    their path components starts with ``_`` or ``.`` (those are being written).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for f in ["a.parquet", "_tmp-b.parquet", ".c.parquet", "x/d.parquet", "_temporary/e.parquet", "f.csv"]:
    ...     (d / f).parent.mkdir(exist_ok=True); (d / f).touch()
    >>> visible_files(str(d))
    ['a.parquet', 'x/d.parquet']
    """
    out = []
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        rel = os.path.relpath(here, root)
        for f in files:
            if f.endswith(".parquet") and not f.startswith(("_", ".")):
                out.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
    return sorted(out)


class DirectoryReader(ParquetReader):
    """Reads the files of a watched directory that instance ``index`` owns, each once, as
    they appear (``stage.batch_size`` rows at a time, only ``stage.columns`` if given)."""

    live = True

    def __init__(self, stage, index: int) -> None:
        super().__init__(stage, index)
        self.root: str = stage.source["path"]
        self.watch = float(stage.source["watch"])
        self.parallelism = stage.parallelism
        self._done: frozenset[str] = frozenset()    # files emitted to their end before this reader
        self._total: dict[str, int] = {}            # split -> rows of its file
        self._found: dict = {}                      # split -> its ParquetFile, found and not opened yet
        self._unreadable: set[str] = set()          # visible files that did not open (warned once)
        self._aside: set[str] = set()               # files of another schema: splits of no rows
        self.expects: dict = stage.source.get("expects") or {}
        self._listed = -np.inf                      # last listing (monotonic s)

    # -- where splits start --------------------------------------------------------------------
    def splits_at(self, saved: dict) -> list[Split]:
        mine = saved.get("directory") or {}
        self._done = frozenset(mine.get("done") or ())
        # a half-read file goes on where it was, read by its owner (after a restore at another
        # parallelism every instance gets every instance's positions)
        files = {f: int(n) for f, n in (mine.get("files") or {}).items()
                 if f not in self._done and owner(f, self.parallelism) == self.index}
        gone = [f for f in files if not os.path.exists(self._path(f))]
        for f in gone:
            logger.warning("watched directory %r: %r, half read, is gone; the rest of it is not read", self.root, f)
            files.pop(f)
        return [Split(f, n) for f, n in sorted(files.items())] + self._unseen(set(files))

    def save(self, splits: list[Split]) -> dict:
        files, done = {}, set(self._done)
        for s in splits:
            total = self._total.get(s.split_id)
            if total is not None and s.position >= total:
                done.add(s.split_id)
            else:
                files[s.split_id] = s.position
        return {"directory": {"files": files, "done": sorted(done)}}

    def new_splits(self) -> list[Split]:
        """Files of this instance that appeared since the last listing, at row 0; ``[]``
        until ``watch`` seconds have passed since then."""
        if time.monotonic() - self._listed < self.watch:
            return []
        return self._unseen(set())

    def _unseen(self, opening: set[str]) -> list[Split]:
        """A listing: the files this instance owns that it never opened nor finished (and
        that open: one that does not is tried again at the next listing)."""
        import pyarrow.parquet as pq

        self._listed = time.monotonic()
        seen = self._read.keys() | self._done | opening
        out = []
        for f in visible_files(self.root):
            if f in seen or f in self._found or owner(f, self.parallelism) != self.index:
                continue
            try:
                self._found[f] = pq.ParquetFile(self._path(f))
            except Exception as exc:    # not a Parquet file (yet): written in place, not renamed
                if f not in self._unreadable:
                    self._unreadable.add(f)
                    logger.warning("watched directory %r: %r does not open as Parquet (%s); trying again at "
                                   "each listing (write files under a name starting with '_' or '.' and "
                                   "rename them into place)", self.root, f, exc)
                continue
            self._unreadable.discard(f)
            if self.expects:
                self._check_schema(f)
            out.append(Split(f, 0))
        return out

    def _check_schema(self, f: str) -> None:
        """Set file ``f`` (found, open) aside as a dead letter if its schema is another."""
        schema = self._found[f].schema_arrow
        problems = schema_problems(schema, self.expects)
        if not problems:
            return
        del self._found[f]
        self._aside.add(f)
        columns = {c.name: str(c.type) for c in schema}
        expected = {c: KINDS[kind] for c, (kind, _) in self.expects.items()}
        self.dead_letters.append((
            {"file": self._path(f), "columns": columns, "expected": expected},
            f"watched directory {self.root!r}: file {f!r} has another schema and is set aside, not read: "
            f"{'; '.join(problems)}. Its columns: {', '.join(f'{c} ({t})' for c, t in columns.items())}; "
            f"expected: {', '.join(f'{c} ({k})' for c, k in expected.items())}"))
        logger.warning("watched directory %r: file %r set aside (a dead letter): %s", self.root, f,
                       "; ".join(problems))

    def _path(self, split_id: str) -> str:
        return os.path.join(self.root, *split_id.split("/"))

    # -- reading -------------------------------------------------------------------------------
    def _open(self, split: Split) -> None:
        import pyarrow.parquet as pq

        st = self.stage
        if split.split_id in self._aside:       # read to its end at once: no rows
            self._total[split.split_id], self._rows[split.split_id] = 0, 1
            self._batches[split.split_id] = iter(())
            return
        pf = self._found.pop(split.split_id, None) or pq.ParquetFile(self._path(split.split_id))
        n = pf.metadata.num_rows
        self._total[split.split_id] = n
        self._rows[split.split_id] = max(n, 1)
        self._batches[split.split_id] = _skipping(
            pf.iter_batches(batch_size=st.batch_size, columns=st.columns, use_threads=False), split.position)

    def read(self, split_id: str) -> pd.DataFrame | None:
        frame = super().read(split_id)
        if frame is None:       # read once: let go of the file (its split stays, ended)
            self._batches.pop(split_id, None)
        return frame

    def poll(self) -> SplitBatch:
        """The next batch of the files open (as :meth:`SplitReader.poll`); an empty batch
        when new files were opened (the runtime registers them before their rows) or when
        none has rows now: never None, the directory may grow."""
        new = self.new_splits()
        if new:
            self.add_splits(new)
            return SplitBatch(new[0].split_id, pd.DataFrame())
        batch = super().poll()
        if batch is not None:
            return batch
        time.sleep(min(POLL_WAIT, max(self._listed + self.watch - time.monotonic(), 0.0)))
        return SplitBatch(".", pd.DataFrame())

    def close(self) -> None:
        self._batches.clear()
        self._found.clear()
