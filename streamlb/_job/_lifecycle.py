"""The life of a job on its cluster: deploy, start, poll, wait, fail, stop, Ctrl-C, exit.

:class:`Lifecycle` creates the instances as actors and wires them (again after a recovery,
as a new incarnation), starts them, polls them for their status and outputs, waits until
they finish (committing outputs and checkpoints) or fail, and stops them within one
deadline, ``streamlb.stop-timeout``. Ctrl-C in :meth:`Lifecycle.wait` stops the job before
the interrupt goes on; :func:`stop_live_jobs`, registered with :mod:`atexit` once a job
exists, stops the jobs still running when the interpreter exits. Letting go of instances
(and of the client ``run`` made) is :mod:`._release`'s.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import threading
import time
import weakref

from .. import config
from ..exceptions import JobFailedError

__all__ = ["Lifecycle", "stop_live_jobs", "track"]

logger = logging.getLogger("streamlb.job")

# Jobs still running, stopped at interpreter exit before Dask closes its clusters (atexit
# runs handlers last registered first, and ours is registered once a client exists): a job
# left running would otherwise see its workers retired under it and its client retry a
# scheduler that is gone, logging errors at exit.
_live_jobs: weakref.WeakSet = weakref.WeakSet()
_exit_hook = False


def stop_live_jobs() -> None:
    """Stop every job still running (at interpreter exit)."""
    for job in list(_live_jobs):
        try:
            job.stop()
        except BaseException as exc:     # exiting: say it once, never a traceback
            logger.info("job %s: not stopped cleanly at exit (%s: %s)", job.id, type(exc).__name__, exc)


def track(job) -> None:
    """Stop ``job`` at interpreter exit unless it was stopped before."""
    global _exit_hook
    _live_jobs.add(job)
    if not _exit_hook:
        atexit.register(stop_live_jobs)
        _exit_hook = True


class Lifecycle:
    """Deploys, starts, polls, waits for and stops the instances of ``job``."""

    def __init__(self, job) -> None:
        self.job = job
        self.closed = False
        self.pending: dict = {}         # instance -> (its actor, a poll that did not answer in time)

    def deploy(self, workers: list[str], restored: tuple[dict, str] | None, fresh_clock: bool,
               run: int = 0) -> None:
        """Create every instance as an actor (incarnation ``run``), wire them, and install
        the state of a checkpoint (``restored``: its manifest and base path) if any."""
        from .. import _placement

        job = self.job
        futures = {}
        for st in job.plan.stages:
            ups = {(u, j): run for u in st.inputs for j in range(job.plan.stages[u].parallelism)}
            futures.update(_placement.create_instances(
                job.client, job.id, st, range(st.parallelism), workers,
                upstream=_placement.senders(st, job.plan.stages, ups if run else None),
                key_groups=job.key_groups, window=job.window, credits=job.credits, run=run))
        if run:
            job.runs = dict.fromkeys(futures, run)
        job._futures = futures  # actors referenced only by actors would be collected
        job.actors = _placement.bound_actors(futures, job.client)
        # a restored job's windows may be past what its sources' new watermarks say: its
        # routers send rows into them as they are (see Combiner.combine)
        exchanges = job.exchanges if restored is None else _placement.rows_only(job.exchanges)
        job.workers_of = _placement.wire(job.actors, job.plan.stages, job.tables, exchanges,
                                         report=job.balancer is not None, runs=job.runs or None)
        if job.checkpointer is not None:
            cp = job.checkpointer
            for f in [a.checkpointing(cp.url, cp.compression) for a in job.actors.values()]:
                f.result()
        if restored is not None:
            from .._checkpoint._restore import install_state

            install_state(job, *restored)

    def start(self, restored: tuple[dict, str] | None, fresh_clock: bool) -> None:
        """Start the instances; sources go on from a checkpoint's positions if ``restored``
        (``fresh_clock``: pacing starts afresh, as for a new job)."""
        from .. import _placement

        resume = None
        if restored is not None:
            from .._checkpoint._restore import source_positions

            resume = source_positions(restored[0], self.job.plan.stages, fresh_clock)
        _placement.start(self.job.actors, self.job.plan.stages, resume)

    def poll(self, timeout: float | None = None) -> list[dict]:
        """Every instance's status and new outputs. ``timeout``: seconds to wait for an
        answer before raising ``TimeoutError`` (an instance on a worker that died may keep
        the call waiting for the connect timeout)."""
        job = self.job
        futs = []
        for k, a in list(job.actors.items()):      # a rescale may change them
            late_actor, late_answer = self.pending.pop(k, (None, None))
            if late_actor is a:         # an answer that came too late last time: it holds outputs
                futs.append((k, late_answer, True))
                continue                # (a replacement's actor is asked afresh)
            try:
                futs.append((k, a.poll(), False))
            except Exception as exc:    # Dask already knows the actor's worker is gone
                self._unreachable(k, exc)
        out, late, failure = [], False, None
        deadline = None if timeout is None else time.time() + timeout
        for k, f, again in futs:
            try:
                r = f.result(timeout=None if deadline is None else max(deadline - time.time(), 0.01))
            except TimeoutError:
                # the others' answers are still taken: they hold outputs; so does this one,
                # which the instance gave away when it answered: the next poll takes it
                self.pending[k] = (job.actors.get(k), f)
                late = True
                continue
            except Exception as exc:
                if again:               # a late answer that never came: ask afresh next time
                    late = True
                    continue
                failure = failure or (k, exc)
                continue
            r["key"] = k
            if r["status"] == "retired":      # retired by a rescale meanwhile: absorbed there
                continue
            out.append(r)
        for r in out:
            job._results.take_outputs(r)
        if failure is not None:
            self._unreachable(*failure)
        if late:
            raise TimeoutError(f"job {job.id}: an instance did not answer a poll within {timeout:g}s")
        job._results.last = out
        return out

    def _unreachable(self, k, exc: BaseException):
        from ._memory import memory_note

        job = self.job
        st = job.plan.stages[k[0]]
        raise JobFailedError(f"instance {st.name}[{k[1]}] on {job.workers_of.get(k)} is unreachable: "
                             f"{type(exc).__name__}: {exc}{memory_note(job, job.workers_of.get(k))}") from exc

    def wait(self, timeout: float | None, progress: bool):
        """See :meth:`streamlb.Job.wait`."""
        job = self.job
        if job.status == "done":
            return job
        if job.error is not None:
            raise job.error
        try:
            self._until_done(timeout, progress)
            self._finish()
        except KeyboardInterrupt:
            self.interrupted()
            raise
        return job

    def _until_done(self, timeout: float | None, progress: bool) -> None:
        """Poll until every instance is done; recover from lost workers meanwhile."""
        job = self.job
        deadline = None if timeout is None else time.time() + timeout
        interval = config.seconds("poll-interval")
        bar = None
        if progress:
            from tqdm import tqdm

            total = sum(s.total_rows for s in job.plan.stages if s.is_source) or None
            bar = tqdm(total=total, unit="rec", unit_scale=True, desc="records")
        poll_timeout = 2.0 if job.recovery is not None else config.seconds("stop-timeout")
        try:
            # the first poll waits for an instance to end (or an interval): a job shorter than
            # the interval, seen done by one poll rather than two (a round trip each)
            self._settle(list(job.actors), interval if deadline is None else
                         min(interval, max(deadline - time.time(), 0)))
            while True:
                if job.recovery is not None and job.recovery.check():
                    continue                        # a worker was lost: restored from a checkpoint
                gone = job.cluster_gone()
                if gone:
                    self.on_failure(JobFailedError(f"job {job.id} cannot finish: {gone}"))
                try:
                    with job.topology_lock:         # not halfway through a recovery or a rescale
                        rows = self.poll(timeout=poll_timeout)
                    failed = [r["error"] for r in rows if r["status"] == "failed"]
                except TimeoutError:                # slow to answer: was its worker lost?
                    if deadline is not None and time.time() > deadline:
                        raise TimeoutError(f"job {job.id} still running after {timeout}s") from None
                    continue
                except JobFailedError as exc:       # an instance could not be reached
                    rows, failed = [], [exc]
                if failed:
                    if job.recovery is not None and job.status == "running" and job.recovery.handle(failed[0]):
                        continue                    # a worker was lost: restored from a checkpoint
                    if job.error is not None:       # the recoveries ran out
                        raise job.error
                    self.on_failure(failed[0])
                if bar is not None:
                    bar.n = sum(r["records_out"] for r in rows if job.plan.stages[r["key"][0]].is_source)
                    bar.refresh()
                if rows and all(r["status"] == "done" for r in rows):
                    break
                if any(r["status"] == "stopped" for r in rows):
                    raise JobFailedError(f"job {job.id} was stopped before it finished")
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(f"job {job.id} still running after {timeout}s")
                self._settle([r["key"] for r in rows if r["status"] in ("ready", "running")], interval)
        finally:
            if bar is not None:
                bar.close()

    def _settle(self, running: list, interval: float) -> None:
        """Wait ``interval`` between polls, less if one of the ``running`` instances ends
        meanwhile (each waits for that on its worker, see ``Readable.settled``): the job is
        seen done when its last instance ends. Outside the topology lock, so a rescale or a
        recovery from another thread gets it between polls."""
        t0 = time.monotonic()
        actors = [a for k in running if (a := self.job.actors.get(k)) is not None]
        futs = []
        for a in actors:
            try:
                futs.append(a.settled(interval))
            except Exception:               # a lost worker: the next poll says so
                pass
        for f in futs:
            try:
                f.result(timeout=max(interval - (time.monotonic() - t0), 0.0) + 1.0)
            except Exception:               # slow or lost: the next poll tells
                pass
        if not futs:
            time.sleep(interval)

    def _finish(self) -> None:
        """Every instance is done: commit the outputs, end the job's threads, and keep what
        the plugin knew of it (readable once the cluster is gone)."""
        job = self.job
        job._checkpoints.finish()
        self._commit_parquet()
        job.status = "done"
        if job.autoscaler is not None:
            job.autoscaler.stop()
        job._migrations.snapshot(config.seconds("stop-timeout"))

    def interrupted(self) -> None:
        """Ctrl-C in :meth:`wait`: stop the job now, its uncommitted outputs removed (a second
        Ctrl-C meanwhile is held off until it is done, so nothing is left half stopped)."""
        logger.info("job %s: interrupted; stopping it", self.job.id)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self.job.stop()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def on_failure(self, err: BaseException) -> None:
        """An instance failed: the job fails with ``err``, its instances stopped."""
        job = self.job
        job.status = "failed"
        job.error = err
        job._release.stop_instances(list(job.actors), config.seconds("stop-timeout"))
        self._remove_uncommitted()
        raise err

    def _commit_parquet(self) -> None:
        for path in self.job.plan.parquet_paths:
            tmp = os.path.join(path, "_temporary")
            os.makedirs(path, exist_ok=True)
            if os.path.isdir(tmp):
                for fn in sorted(os.listdir(tmp)):
                    os.replace(os.path.join(tmp, fn), os.path.join(path, fn))
                os.rmdir(tmp)
            open(os.path.join(path, "_SUCCESS"), "w").close()

    def _remove_uncommitted(self) -> None:
        """Outputs the job staged but never committed (it stopped before it finished)."""
        for path in self.job.plan.parquet_paths:
            shutil.rmtree(os.path.join(path, "_temporary"), ignore_errors=True)

    def stop(self) -> None:
        """See :meth:`streamlb.Job.stop`."""
        job = self.job
        if self.closed:
            return
        self.closed = True
        _live_jobs.discard(job)
        timeout = config.seconds("stop-timeout")
        deadline = time.time() + timeout
        left = lambda: max(deadline - time.time(), 0.05)     # noqa: E731
        running = job.status == "running"
        if running:
            job.status = "stopped"          # the checkpoint and autoscaling threads end at once
        for part in (job.autoscaler, job.checkpointer):
            if part is not None:
                part.stop(timeout=left())
        gone = job.cluster_gone()
        job._drainer.close()
        job._migrations.close(timeout=0 if gone else left())
        if gone:
            job._release.forget()
        else:
            job._release.actors(timeout=left())
        if running:
            self._remove_uncommitted()      # once no instance writes any more
        if gone:
            logger.info("job %s %s locally: %s", job.id, "stopped" if running else "released", gone)
        else:
            logger.info("job %s %s", job.id, "finished" if job.status == "done" else job.status)
        if job._owns_client:
            job._release.close_client(timeout)
