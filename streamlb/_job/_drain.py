"""A graceful stop of a running job (:meth:`streamlb.Job.drain`), Flink's ``stop``.

Where :meth:`streamlb.Job.stop` aborts (instances stop, outputs not committed are removed),
a drain ends the job as a bounded job ends: every source stops reading where it is and
ends its stream (the :class:`~streamlb._worker._commands.EndInput` command), what the
sources emitted goes through the whole pipeline, and the job finishes as
:meth:`~streamlb.Job.wait` finishes any job: its final outputs committed, its status
``"done"``; the end of input fires what windows, joins and timers hold, as for a bounded
job (Flink's ``stop --drain``). With a savepoint path, the sources end right after that
savepoint's barrier (Flink's stop-with-savepoint), so the savepoint holds exactly what they
emitted and ``streamlb.run(..., restore=path)`` goes on after it: no record lost or read
twice across the two runs; event time stops in every instance once told, so nothing fires
after the savepoint's barrier in this run: what is open stays in the savepoint, and the
restored job fires it. The savepoint goes through :mod:`._checkpoints`; the wait and the
commit are :mod:`._lifecycle`'s.
"""
from __future__ import annotations

import logging
import time

from .. import config
from ..exceptions import CheckpointError, StreamlbError

__all__ = ["drain", "end_inputs"]

logger = logging.getLogger("streamlb.job")


def drain(job, savepoint: str | None, timeout: float | None) -> str | None:
    """See :meth:`streamlb.Job.drain` (``timeout`` in seconds, or None)."""
    deadline = None if timeout is None else time.time() + timeout
    life = job._lifecycle
    if savepoint is not None:
        _refuse_existing(job, savepoint)
    with life.ending:               # not while a failure or a stop ends the job
        if job.status != "running" or life.closed or life.draining:
            state = "draining" if life.draining and job.status == "running" else job.status
            raise StreamlbError(f"job {job.id} is {state}; only a running job drains "
                                "(Job.stop() releases a job that is not running)")
        life.draining = True
    logger.info("job %s: draining%s", job.id, f" with a savepoint to {savepoint}" if savepoint else "")
    saved = failed = None
    if savepoint is not None:
        try:
            saved = job._checkpoints.savepoint(savepoint, end_inputs=lambda target: end_inputs(job, target))
        except CheckpointError as exc:      # the sources end all the same: the job drains
            failed = exc
    end_inputs(job, None)           # every source not ended yet (all of them without a savepoint)
    _until_finished(job, deadline, savepoint)
    if failed is not None:
        raise CheckpointError(f"job {job.id} drained and finished, but its savepoint to {savepoint!r} did not "
                              f"complete: {failed}") from failed
    return saved


def _until_finished(job, deadline: float | None, savepoint: str | None) -> None:
    """Wait for the job to finish (committing it), by the job's own wait. A recovery from
    a lost worker meanwhile restores instances whose sources had not ended: they are told
    again (into a savepoint, this run's outputs then no longer end where the savepoint
    does: said in the log)."""
    life = job._lifecycle
    actors = job.actors
    while True:
        left = None if deadline is None else deadline - time.time()
        try:
            life.wait(1.0 if left is None else max(min(left, 1.0), 0.0), False)
            return
        except TimeoutError:
            if left is not None and left <= 1.0:
                raise TimeoutError(f"job {job.id} still draining after the timeout; it keeps draining "
                                   "(Job.wait() finishes it)") from None
        if job.actors is not actors:        # recovered (or reconfigured): new instances
            actors = job.actors
            if savepoint is not None:
                logger.warning("job %s: instances were replaced (a recovery) while it drained into savepoint %s: "
                               "this run's outputs no longer end where the savepoint does, so a job restored "
                               "from it may repeat or miss the outputs of some records", job.id, savepoint)
            end_inputs(job, None)


def end_inputs(job, after: str | None) -> int:
    """Tell every source instance of ``job`` to end its input (see
    :class:`~streamlb._worker._commands.EndInput`): now, or (``after``, a savepoint's path
    as the instances know it) right after that savepoint's barrier; then every other
    instance is told too, and event time stops everywhere (what is open stays in the
    savepoint). Returns how many instances answered that something changes."""
    from .._worker._commands import EndInput

    timeout = config.seconds("stop-timeout")
    cmd = EndInput(after)
    told = [(k, a) for k, a in list(job.actors.items()) if after is not None or job.plan.stages[k[0]].is_source]
    asked = [(k, a.command(cmd)) for k, a in told]
    ending = 0
    for k, f in asked:
        try:
            ending += bool(f.result(timeout=timeout))
        except Exception as exc:        # a lost worker: the wait recovers it or fails the job
            logger.warning("job %s: instance %s[%d] was not told to end its input: %s: %s", job.id,
                           job.plan.stages[k[0]].name, k[1], type(exc).__name__, exc)
    return ending


def _refuse_existing(job, path: str) -> None:
    """A savepoint is never written over what a path holds: refused before anything changes."""
    from .._checkpoint._paths import resolve

    try:
        fs, where = resolve(path)
        exists = fs.exists(where)
    except Exception as exc:
        raise CheckpointError(f"job {job.id}: savepoint path {path!r} cannot be checked: "
                              f"{type(exc).__name__}: {exc}") from exc
    if exists:
        raise CheckpointError(f"job {job.id}: savepoint path {path!r} already exists; give a path that does not "
                              "(a savepoint is never written over another); the job keeps running")
