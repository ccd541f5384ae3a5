"""``to_parquet(path)``: DataFrames written as a Parquet dataset, committed by the driver.

Each instance writes its own file under ``<path>/_temporary`` (``part-<stage>-<index>``,
``-r<run>`` for a replacement). Without checkpoints it is one file, moved into ``path``
when the job finishes (with a ``_SUCCESS`` marker). With checkpoints each checkpoint's rows
are one file (``-<job>-c<segment>``: the job's id keeps a resumed job's files apart from
those the job it resumes committed), closed when its barrier passes and named in the
instance's acknowledgement; the driver moves it into ``path`` once that checkpoint is
complete, removes what was staged for one that did not when it recovers, and removes
``_temporary`` when the job stops or fails before it finished.

A checkpoint's manifest names the files it sealed that were not moved yet, with their final
names (:meth:`ParquetCommitter.sealed`): whoever resumes it moves those still staged
(:meth:`ParquetCommitter.resume`; a file already moved is left, so a second resume, or one
after a commit stopped half-way, moves each file once) and removes the rest of
``_temporary``, which the dead job staged after the checkpoint."""
from __future__ import annotations

import logging
import os
import re
import shutil

import pandas as pd

from ..exceptions import PipelineError, SinkWriteError
from ._base import Committer, SinkWriter
from ._errors import write_error

logger = logging.getLogger("streamlb.checkpoint")

_STAGED = re.compile(r"-c\d+\.parquet$")     # a file staged per checkpoint (any job's)


class ParquetWriter(SinkWriter):
    """The file of Parquet sink ``step.path`` in one instance, open while rows come."""

    kind = "parquet_sink"
    segment = "files"

    def __init__(self, step, ctx) -> None:
        super().__init__(step, ctx)
        self.path = step.path
        # a replacement writes its own file
        self.part = f"part-{ctx.stage_id:03d}-{ctx.index:04d}" + (f"-r{ctx.run}" if ctx.run else "")
        self.segment_no = 0         # checkpoints sealed so far: the next staged file's number
        self._writer = None         # the open pyarrow ParquetWriter
        self._file: str | None = None
        self.closed: list[list[str]] = []   # [path, file] closed at the end, not yet sealed

    @property
    def where(self) -> str:
        """The sink as the user sees it: ``to_parquet('out') in agg[1]``."""
        return f"to_parquet({self.path!r}) in {self.ctx.operator}[{self.ctx.index}]"

    def write(self, x) -> None:
        import pyarrow as pa

        path = self.path
        if not isinstance(x, pd.DataFrame):
            raise PipelineError(
                f"to_parquet({path!r}) in {self.ctx.operator!r} got {type(x).__name__}; it writes DataFrames"
            )
        table = pa.Table.from_pandas(x)
        w = self._writer or self._open(table.schema)
        try:
            table = table.cast(w.schema)
        except (pa.ArrowInvalid, ValueError) as exc:
            raise PipelineError(
                f"to_parquet({path!r}): a batch's schema {table.schema} does not match the "
                f"first batch's {w.schema}: {exc}"
            ) from exc
        try:
            w.write_table(table)
        except OSError as exc:          # a full disk, a quota: the instance fails, named (not retried here)
            raise write_error(self.where, self._file, exc) from exc

    def _open(self, schema):
        """Open the file the rows go to, under ``_temporary``."""
        import pyarrow.parquet as pq

        tmp = os.path.join(self.path, "_temporary")
        fn = os.path.join(tmp, self._staged_name() if self.ctx.staged else f"{self.part}.parquet")
        try:
            os.makedirs(tmp, exist_ok=True)
            self._writer = pq.ParquetWriter(fn, schema)
        except OSError as exc:
            raise write_error(self.where, fn, exc, "create") from exc
        self._file = fn
        return self._writer

    def _staged_name(self) -> str:
        job = f"-{self.ctx.job}" if self.ctx.job else ""
        return f"{self.part}{job}-c{self.segment_no:05d}.parquet"

    def _close(self) -> list[list[str]]:
        if self._writer is None:
            return []
        try:
            self._writer.close()        # writes the footer: it may find the disk full too
        except OSError as exc:          # the writer is kept: abort() removes the half-written file
            raise write_error(self.where, self._file, exc, "finish") from exc
        self._writer = None
        return [[self.path, self._file]]

    def seal(self, cid: int) -> list[list[str]]:
        """Close the file written since the previous barrier (later rows go to a new one);
        the files to commit with checkpoint ``cid``: that one and one closed at the end."""
        files = self._close() + self.closed
        self.closed = []
        self.segment_no += 1
        return files

    def close(self) -> None:
        """End of stream: close the file (the driver commits it)."""
        self.closed.extend(self._close())

    def abort(self) -> None:
        """A failed or stopped instance removes the file it was writing."""
        w, self._writer = self._writer, None
        if w is None:
            return
        try:
            w.close()
        except OSError:                 # a full disk: it is removed all the same
            pass
        try:
            os.remove(self._file)
        except OSError:
            pass


def _move(path: str, fn: str, final: str) -> None:
    """The driver commits staged file ``fn`` of the sink on ``path`` as ``final`` (an
    ``OSError`` is the sink's :class:`~streamlb.exceptions.SinkWriteError`, named)."""
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(fn, final)
    except OSError as exc:
        raise write_error(f"to_parquet({path!r})", final, exc, "commit") from exc


class ParquetCommitter(Committer):
    """Moves the files of the job's Parquet sinks (``plan.parquet_paths``) out of ``_temporary``."""

    name = "parquet"
    segment = "files"

    def __init__(self, plan, dead: list, job: str = "") -> None:
        super().__init__(plan, dead, job)
        # staged files of a complete checkpoint that could not be moved: a recovery or a
        # failure leaves them staged, for whoever resumes the checkpoint to move
        self.unmoved: set[str] = set()

    def commit(self, part) -> None:
        """Files (``[path, file]``) of a complete checkpoint: into their dataset. Those that
        cannot be (a :class:`~streamlb.exceptions.SinkWriteError`, raised once all were
        tried) are left in ``part`` and staged, to be tried again."""
        failed, first = [], None
        for path, fn in part or ():
            if not os.path.exists(fn):
                continue
            try:
                _move(path, fn, os.path.join(path, os.path.basename(fn)))
            except SinkWriteError as exc:
                failed.append([path, fn])
                first = first or exc
                self.unmoved.add(fn)
                continue
            self.unmoved.discard(fn)
        if first is not None:
            part[:] = failed
            raise first

    def sealed(self, part, keep, cid: int) -> list[list[str]]:
        """``[staged file, final name]`` of each file of ``part``."""
        return [[fn, os.path.join(path, os.path.basename(fn))] for path, fn in part or ()]

    def resume(self, recorded, read) -> None:
        """Move each recorded file still staged to its final name; then remove what else is
        staged (written after the checkpoint by the job that wrote it)."""
        for fn, final in recorded or ():
            if os.path.exists(fn):
                _move(os.path.dirname(final), fn, final)
            elif not os.path.exists(final):
                logger.warning("to_parquet: %s, sealed by the checkpoint resumed, is neither staged nor "
                               "committed (removed by hand?): its rows are not in the output", final)
        self.unmoved.clear()            # what a failed commit left is the checkpoint's: moved now
        self.discard()

    def finish(self) -> None:
        """The files left under ``_temporary`` by this job without checkpoints into their
        dataset, and ``_SUCCESS``. With checkpoints every file is committed by the segment
        that lists it, so a file of this job staged per checkpoint and still there was
        written by an instance after it was replaced (a frozen worker's that woke up after
        the recovery): removed, never committed. A file another job staged is left alone."""
        for path in self.plan.parquet_paths:
            tmp = os.path.join(path, "_temporary")
            if os.path.isdir(tmp):
                for fn in sorted(os.listdir(tmp)):
                    if not self._mine(fn):
                        continue
                    if _STAGED.search(fn) and os.path.join(tmp, fn) not in self.unmoved:
                        logger.warning("to_parquet(%r): removing %s: no checkpoint committed it (written by an "
                                       "instance after it was replaced)", path, fn)
                        try:
                            os.remove(os.path.join(tmp, fn))
                        except OSError:
                            pass
                        continue
                    _move(path, os.path.join(tmp, fn), os.path.join(path, fn))
                try:
                    os.rmdir(tmp)
                except OSError:         # another job's files are there
                    pass
            marker = os.path.join(path, "_SUCCESS")
            try:
                os.makedirs(path, exist_ok=True)
                open(marker, "w").close()
            except OSError as exc:
                raise write_error(f"to_parquet({path!r})", marker, exc) from exc

    def _mine(self, fn: str) -> bool:
        """Whether staged file ``fn`` is this job's: not staged per checkpoint, or named
        with this job's id."""
        return not _STAGED.search(fn) or (bool(self.job) and f"-{self.job}-c" in fn)

    def discard(self) -> None:
        """Remove what is staged, but a complete checkpoint's files that could not be moved."""
        for path in self.plan.parquet_paths:
            tmp = os.path.join(path, "_temporary")
            if os.path.isdir(tmp):
                for fn in os.listdir(tmp):
                    if os.path.join(tmp, fn) in self.unmoved:
                        continue
                    try:
                        os.remove(os.path.join(tmp, fn))
                    except OSError:
                        pass

    def abort(self) -> None:
        """Remove ``_temporary``, but a complete checkpoint's files that could not be moved
        (the run that resumes it moves them)."""
        if self.unmoved:
            self.discard()
        for path in self.plan.parquet_paths:
            tmp = os.path.join(path, "_temporary")
            if not self.unmoved:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                try:
                    os.rmdir(tmp)
                except OSError:         # the files left for a resume
                    pass
