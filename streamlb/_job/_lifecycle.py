"""The life of a job on its cluster: deploy, start, poll, wait, fail, stop, Ctrl-C, exit.

:class:`Lifecycle` creates the instances as actors and wires them (again after a recovery,
as a new incarnation), starts them, polls them for their status and outputs, waits until
they finish (committing outputs and checkpoints) or fail, and stops them within one
deadline, ``streamlb.stop-timeout``. While no :meth:`Lifecycle.wait` polls, a watcher thread
does, as Flink's JobMaster hears of a failed task: a failure fails the job at once (its
status and error change, its other instances stop), and a lost worker of a checkpointed job
is recovered from as during a wait. Ctrl-C in :meth:`Lifecycle.wait` is taken between two
calls to the cluster (:func:`interrupts_between_calls`) and stops the job before the
interrupt goes on; :func:`stop_live_jobs`, registered with :mod:`atexit` once a job
exists, stops the jobs still running when the interpreter exits. Letting go of instances
(and of the client ``run`` made) is :mod:`._release`'s.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import threading
import time
import weakref

from .. import config
from ..exceptions import InstanceUnresponsiveError, JobFailedError, SchedulerUnreachableError, StreamlbError

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


@contextlib.contextmanager
def interrupts_between_calls():
    """Ctrl-C (SIGINT in the main thread) only sets the event yielded, for the caller to
    raise ``KeyboardInterrupt`` between two calls to the cluster; a second Ctrl-C raises at once.

    A ``KeyboardInterrupt`` inside a blocking call of distributed (``distributed.utils.sync``,
    2026.8) makes it schedule ``cancel()`` on the client's event loop; if the loop has not
    yet run the call's coroutine far enough to bind the ``future`` that ``cancel`` reads,
    tornado logs ``ERROR ... NameError: cannot access free variable 'future'`` with a
    traceback. Elsewhere (another thread, a handler of the user's own) nothing changes.
    """
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield interrupted
        return

    def defer(signum, frame):
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()

    previous = signal.signal(signal.SIGINT, defer)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():            # came as the wait ended
        raise KeyboardInterrupt


class Lifecycle:
    """Deploys, starts, polls, waits for and stops the instances of ``job``."""

    def __init__(self, job) -> None:
        self.job = job
        self.closed = False
        self.pending: dict = {}         # instance -> (its actor, a poll that did not answer in time)
        self.polling = threading.RLock()    # one poll at a time: wait(), the watcher, the readers
        self.waiting = 0                # wait() calls under way: the watcher rests meanwhile
        self.ending = threading.Lock()  # a failure and a stop: only the first ends the job
        self.finishing = threading.Lock()   # two waits that see the job done: one commits it
        self.draining = False           # Job.drain was called (see ._drain)
        self.silent_since: dict = {}    # instance -> when it first left a poll unanswered (monotonic)
        self.unwatch = threading.Event()
        self.watcher: threading.Thread | None = None

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
        self.silent_since.clear()       # new instances: nothing unanswered yet
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
            from .._recovery._restore import install_state

            install_state(job, *restored)

    def start(self, restored: tuple[dict, str] | None, fresh_clock: bool) -> None:
        """Start the instances; sources go on from a checkpoint's positions if ``restored``
        (``fresh_clock``: pacing starts afresh, as for a new job)."""
        from .. import _placement

        resume = None
        if restored is not None:
            from .._recovery._restore import source_positions

            resume = source_positions(restored[0], self.job.plan.stages, fresh_clock)
        _placement.start(self.job.actors, self.job.plan.stages, resume)

    def poll(self, timeout: float | None = None) -> list[dict]:
        """Every instance's status and new outputs. ``timeout``: seconds to wait for an
        answer before raising ``TimeoutError`` (an instance on a worker that died may keep
        the call waiting for the connect timeout)."""
        with self.polling:          # a late answer kept by one poll is taken by the next
            return self._poll(timeout)

    def _poll(self, timeout: float | None) -> list[dict]:
        job = self.job
        futs = []
        for k, a in list(job.actors.items()):      # a rescale may change them
            late_actor, late_answer = self.pending.pop(k, (None, None))
            if late_actor is a:         # an answer that came too late last time: it holds outputs
                futs.append((k, late_answer, True))
                continue                # (a replacement's actor is asked afresh)
            if late_actor is not None:
                self.silent_since.pop(k, None)
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
                self.silent_since.setdefault(k, time.monotonic())
                late = True
                continue
            except Exception as exc:
                if again:               # a late answer that never came: ask afresh next time
                    late = True
                    continue
                failure = failure or (k, exc)
                continue
            r["key"] = k
            self.silent_since.pop(k, None)
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
        self.waiting += 1
        try:
            with interrupts_between_calls() as interrupted:
                self._until_done(timeout, progress, interrupted)
                self._finish()
        except KeyboardInterrupt:
            self.interrupted()
            raise
        finally:
            self.waiting -= 1
        return job

    def _until_done(self, timeout: float | None, progress: bool, interrupted: threading.Event) -> None:
        """Poll until every instance is done; recover from lost workers meanwhile. Raise
        ``KeyboardInterrupt`` once ``interrupted`` is set."""
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
                if interrupted.is_set():
                    raise KeyboardInterrupt
                if job.status == "stopped":     # by another thread: its instances are let go
                    raise JobFailedError(f"job {job.id} was stopped before it finished")
                try:
                    rows = self._look(poll_timeout)
                except TimeoutError:                # slow to answer: was its worker lost?
                    if deadline is not None and time.time() > deadline:
                        raise TimeoutError(f"job {job.id} still running after {timeout}s") from None
                    continue
                if rows is None:
                    continue                        # a worker was lost: restored from a checkpoint
                if bar is not None:
                    bar.n = sum(r["records_out"] for r in rows if job.plan.stages[r["key"][0]].is_source)
                    bar.refresh()
                if rows and all(r["status"] == "done" for r in rows):
                    break
                if any(r["status"] == "stopped" for r in rows):   # failed by another thread: its error
                    raise job.error or JobFailedError(f"job {job.id} was stopped before it finished")
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(f"job {job.id} still running after {timeout}s")
                self._settle([r["key"] for r in rows if r["status"] in ("ready", "running")], interval)
        finally:
            if bar is not None:
                bar.close()

    def _look(self, poll_timeout: float) -> list[dict] | None:
        """Poll the instances once (``TimeoutError`` if one is slow to answer): their rows;
        None if a fault (a lost, cut off or frozen worker) was met and the job recovered from
        a checkpoint meanwhile. A failure that no recovery handles fails the job: its error
        is raised, and ``status``/``error`` say the same."""
        job = self.job
        if job.error is not None:           # failed in another thread (the watcher, a checkpoint's recovery)
            raise job.error
        since = job.recovery.count if job.recovery is not None else 0
        try:
            if getattr(job.client, "status", None) == "connecting":     # the scheduler's connection broke
                self._scheduler_gone(self.scheduler_lost())
            return self._look_once(poll_timeout, since)
        except SchedulerUnreachableError as exc:
            return self._unexpected(exc, since)
        except (StreamlbError, TimeoutError):
            raise
        except Exception as exc:            # the driver's own call failed: the network's or the scheduler's
            return self._unexpected(exc, since)

    def _look_once(self, poll_timeout: float, since: int) -> list[dict] | None:
        job = self.job
        if job.recovery is not None and job.recovery.check():
            return None
        gone = job.cluster_gone()
        if gone:
            self.on_failure(JobFailedError(f"job {job.id} cannot finish: {gone}"))
        try:
            with job.topology_lock:         # not halfway through a recovery or a rescale
                rows = self.poll(timeout=poll_timeout)
            failed = [r["error"] for r in rows if r["status"] == "failed"]
        except JobFailedError as exc:       # an instance could not be reached
            rows, failed = [], [exc]
        except TimeoutError:
            if self._unresponsive(since):
                return None
            raise
        if failed:
            if job.recovery is not None and job.status == "running" and job.recovery.handle(failed[0], since=since):
                return None
            if job.error is not None:       # the recoveries ran out, or the job failed meanwhile
                raise job.error
            self.on_failure(failed[0])
        return rows

    def _unresponsive(self, since: int) -> bool:
        """An instance answered no poll for ``streamlb.fault.heartbeat-timeout``: a fault.
        True once recovered from; the job fails if it cannot be (no checkpoint, attempts
        used up); False while no instance has been silent that long."""
        job = self.job
        limit = config.seconds("fault.heartbeat-timeout")
        now = time.monotonic()
        silent = {k: now - t for k, t in self.silent_since.items() if now - t > limit and k in job.actors}
        if not silent:
            return False
        k = max(silent, key=silent.get)
        w, label = job.workers_of.get(k), f"{job.plan.stages[k[0]].name}[{k[1]}]"
        err = InstanceUnresponsiveError(
            f"job {job.id}: instance {label} on {w} answered no poll for {silent[k]:.1f} s "
            f"(streamlb.fault.heartbeat-timeout={limit:g}s): its worker is frozen, stopped or stuck",
            label, w, silent[k])
        logger.warning("%s", err)
        self.silent_since.clear()
        if job.recovery is not None and job.status == "running" and \
                job.recovery.handle(err, suspects=[w] if w else [], since=since):
            return True
        if job.error is not None:
            raise job.error
        self.on_failure(err)

    def _unexpected(self, exc: BaseException, since: int) -> None:
        """A call of the driver's own failed with an error of Dask or the network: the
        scheduler is gone (the job with it: the error names the checkpoint to resume from),
        or it is a fault to recover from, or the job fails with it."""
        job = self.job
        self._scheduler_gone(self.scheduler_lost(exc))
        if job.recovery is not None and job.status == "running" and job.recovery.handle(exc, since=since):
            return None
        err = JobFailedError(f"job {job.id}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        self.on_failure(err)

    def _scheduler_gone(self, lost: JobFailedError | None) -> None:
        """The scheduler was lost (``lost``: the error saying so, None: it was not): the job
        fails with it, its staged outputs removed; nothing is asked of its instances."""
        if lost is None:
            return
        job = self.job
        with self.ending:
            if job.status != "running":
                raise job.error or lost
            job.status, job.error = "failed", lost
        job._release.gone = "its scheduler was lost"
        self._remove_uncommitted()
        raise lost

    def scheduler_lost(self, exc: BaseException | None = None) -> JobFailedError | None:
        """The error of a job whose scheduler cannot be reached any more (None while it
        can): it names the scheduler, the latest complete checkpoint and how to resume."""
        job = self.job
        client = job.client
        deadline = time.monotonic() + 5.0      # a reconnect this quick is no loss
        while getattr(client, "status", "closed") == "connecting" and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            if getattr(client, "status", "closed") not in ("running", "newly-created"):
                raise OSError(f"the client's connection is {client.status!r}")
            client.sync(client.scheduler.identity, n_workers=0, callback_timeout=5)
            return None
        except Exception as probe:
            why = f"{type(probe).__name__}: {probe}"
        address = getattr(getattr(client, "scheduler", None), "address", "?")
        ckpt = job.checkpointer
        if ckpt is not None and ckpt.last is not None:
            resume = (f"The latest complete checkpoint is {ckpt.completed_id} in {ckpt.last_base}; resume the job "
                      f"on a running cluster with streamlb.run(<the same pipeline>, address=..., "
                      f"checkpoint={ckpt.url!r}), which starts from it (or streamlb.submit, to keep it running "
                      f"beyond this process).")
        elif ckpt is not None and ckpt.url:
            resume = (f"No checkpoint completed yet under {ckpt.url}: run the job again from the start.")
        else:
            resume = ("It ran without checkpoint=, so it cannot be resumed: run it again; with checkpoint=... a new "
                      "run resumes from the latest complete checkpoint.")
        err = JobFailedError(f"job {job.id}: its scheduler at {address} was lost ({why}); the job's instances "
                             f"are gone with it. {resume}")
        if exc is not None:
            err.__cause__ = exc
        return err

    def watch(self) -> None:
        """Start the watcher: while no :meth:`wait` polls the running job, poll it every
        ``streamlb.watch-interval`` (sooner when an instance ends), so that a failure fails
        the job without a call to ``wait``."""
        self.watcher = threading.Thread(target=self._watch, name=f"streamlb-watch-{self.job.id}", daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        job = self.job
        interval = config.seconds("watch-interval")
        poll_timeout = 2.0 if job.recovery is not None else config.seconds("stop-timeout")
        running = None                  # the instances to hear from: all at first
        while not self.unwatch.is_set() and job.status == "running":
            if self.waiting:
                self.unwatch.wait(interval)
                continue
            self._rest(list(job.actors) if running is None else running, interval)
            if self.unwatch.is_set() or self.waiting or job.status != "running":
                continue
            try:
                rows = self._look(poll_timeout)
            except TimeoutError:
                continue
            except Exception as exc:        # the job failed: said once, wait() raises it
                if job.error is exc:
                    logger.warning("job %s failed: %s: %s", job.id, type(exc).__name__, exc)
                return
            if rows is None:
                running = None              # recovered: new instances
            elif all(r["status"] == "done" for r in rows):
                return                      # finished: wait() commits it
            else:
                running = [r["key"] for r in rows if r["status"] in ("ready", "running")]

    def _settle(self, running: list, interval: float) -> None:
        """Wait ``interval`` between polls, less if one of the ``running`` instances ends
        meanwhile (each waits for that on its worker, see ``Instance.settled``): the job is
        seen done when its last instance ends. Outside the topology lock, so a rescale or a
        recovery from another thread gets it between polls."""
        t0 = time.monotonic()
        futs = self._hold(running, interval)
        for f in futs:
            try:
                f.result(timeout=max(interval - (time.monotonic() - t0), 0.0) + 1.0)
            except Exception:               # slow or lost: the next poll tells
                pass
        if not futs:
            time.sleep(interval)

    def _hold(self, running: list, interval: float) -> list:
        """Ask each of the ``running`` instances for its status once it ends, or after
        ``interval`` (``Instance.settled``); the answers to come."""
        futs = []
        for a in [a for k in running if (a := self.job.actors.get(k)) is not None]:
            try:
                futs.append(a.settled(interval))
            except Exception:               # a lost worker: the next poll says so
                pass
        return futs

    def _rest(self, running: list, interval: float) -> None:
        """The watcher's pause between polls: ``interval``, less if one of the ``running``
        instances ends meanwhile, and over within 0.1 s of a stop or of a wait() starting."""
        futs = self._hold(running, interval)
        end = time.monotonic() + interval
        while not self.unwatch.wait(0.1):
            if self.waiting or time.monotonic() >= end or any(f.done() for f in futs):
                return

    def _finish(self) -> None:
        """Every instance is done: commit the outputs, end the job's threads, and keep what
        the plugin knew of it (readable once the cluster is gone)."""
        job = self.job
        with self.finishing:
            if job.status == "done":        # another wait (a drain's, the user's) committed it
                return
            try:
                job._checkpoints.finish()
                job._results.outputs.finish()   # what no checkpoint committed (all, without checkpoints)
            except StreamlbError as exc:    # a final commit that failed (SinkWriteError): the job failed
                self.on_failure(exc)
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
        """An instance failed: the job fails with ``err``, its instances stopped (unless it
        ended meanwhile: failed from another thread, or stopped)."""
        job = self.job
        with self.ending:
            if job.status != "running":
                raise job.error or err
            job.status = "failed"
            job.error = err
        job._release.stop_instances(list(job.actors), config.seconds("stop-timeout"))
        self._remove_uncommitted()
        raise err

    def _remove_uncommitted(self) -> None:
        """Outputs the job staged but never committed (it stopped before it finished)."""
        self.job._results.outputs.abort()

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
        self.unwatch.set()
        with self.ending:
            running = job.status == "running"
            if running:
                job.status = "stopped"      # the checkpoint, autoscaling and watcher threads end at once
        if self.watcher is not None and self.watcher is not threading.current_thread():
            self.watcher.join(timeout=left())
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
