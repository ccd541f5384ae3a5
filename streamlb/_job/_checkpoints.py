"""A job's checkpoints from the driver: savepoints, the record of checkpoints, and the
last commit when the job finishes.

:class:`Checkpoints` builds the job's periodic :class:`~streamlb._recovery._coordinator.Checkpointer`
and its :class:`~streamlb._recovery._recovery.Recovery` from lost workers when the job
runs with ``checkpoint=``; takes savepoints (with that checkpointer, or one made for
savepoints when the job has none); lists what completed; and, once every instance is done,
commits the outputs staged since the last checkpoint. The protocol itself is
:mod:`streamlb._checkpoint`'s.
"""
from __future__ import annotations

import pandas as pd

from ..exceptions import CheckpointError
from ._options import RunOptions

__all__ = ["Checkpoints"]


class Checkpoints:
    """The checkpoints and savepoints of ``job``, run with ``options``."""

    def __init__(self, job, options: RunOptions) -> None:
        from .._recovery._coordinator import Checkpointer
        from .._recovery._recovery import Recovery

        self.job = job
        self.checkpointer = None
        self.recovery = None
        if options.checkpoint:
            self.checkpointer = Checkpointer(job, options.checkpoint, options.checkpoint_interval)
            self.recovery = Recovery(job, options.restart_attempts)
        self._savepoints = None         # the checkpointer savepoints are taken with

    def savepoint(self, path: str, end_inputs=None) -> str:
        """See :meth:`streamlb.Job.savepoint`. ``end_inputs`` (the job drains, see
        :mod:`._drain`): called with the savepoint's path as the instances know it before
        it is triggered, with no other checkpoint in between, to have every source end its
        input right after this savepoint's barrier (Flink's stop-with-savepoint)."""
        from .._recovery._coordinator import Checkpointer
        from .._checkpoint._paths import _norm, check_writable, resolve

        job = self.job
        check_writable(path)
        if job.status != "running":
            raise CheckpointError(f"job {job.id} is {job.status}; a savepoint needs a running job")
        if self._savepoints is None:
            self._savepoints = self.checkpointer or Checkpointer(job, None)
        with job.topology_lock:         # no periodic checkpoint starts between the two
            if end_inputs is not None:
                end_inputs(_norm(path))
            manifest = self._savepoints.take(target=path)
        if manifest is None:
            raise CheckpointError(f"job {job.id}: the savepoint to {path!r} did not complete (see the log); "
                                  "the job keeps running")
        return resolve(path)[1]

    def checkpoints(self) -> pd.DataFrame:
        """See :meth:`streamlb.Job.checkpoints`."""
        from .._recovery._coordinator import CHECKPOINT_COLUMNS

        rows = []
        for c in {id(c): c for c in (self.checkpointer, self._savepoints) if c is not None}.values():
            rows.extend(c.rows)
        return pd.DataFrame(sorted(rows, key=lambda r: r["completed"]), columns=CHECKPOINT_COLUMNS)

    @property
    def failures(self) -> int:
        """See :attr:`streamlb.Job.checkpoint_failures`."""
        return self.checkpointer.failures if self.checkpointer is not None else 0

    def finish(self) -> None:
        """Every instance is done: the checkpoint under way completes, then the outputs
        staged since the last checkpoint (and the instances' final ones) are committed."""
        cp = self.checkpointer
        if cp is None:
            return
        job = self.job
        cp.stop()
        with job.topology_lock:         # a checkpoint under way completes first
            cp.collect_late(wait=True)
            for f in [a.take_final() for a in job.actors.values()]:
                cp.stage_outputs(f.result(), label=None)
            job._release.finished()
            cp.commit(everything=True)
