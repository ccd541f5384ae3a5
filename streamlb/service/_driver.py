"""The driver of a submitted job: the process the job registry starts for it.

``python -m streamlb.service._driver JOB_DIR --address ADDRESS`` (the registry runs it;
see :mod:`streamlb._jobs._spawn`). It reads the job's definition, connects to the
scheduler as a client, and runs the job as :func:`streamlb.run` would (the same
:class:`~streamlb.Job`: checkpoints, recovery from lost workers, reconfiguration), resuming
from the latest complete checkpoint of the job's ``checkpoint=`` directory when it holds
one (a driver started again after the last one was lost, or after the scheduler was), at
the parallelism that checkpoint was taken at. Meanwhile it reports to the registry every
``streamlb.jobs.heartbeat`` (status, records/s, parallelism, last checkpoint), runs the
calls made on the job from any client (:data:`CALLS`) and answers them, and when the job
ends reports how (finished, cancelled or failed, with the error) and exits.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import logging
import os
import sys
import threading
import time

from .. import config
from ..exceptions import JobServiceError, StreamlbError
from . import _definition

__all__ = ["main", "Driver", "CALLS"]

logger = logging.getLogger("streamlb.jobs")

#: Seconds the records/s a driver reports are averaged over.
RATE_OVER = 10.0


def _history(job):
    return job.history


def _savepoint(job, path: str) -> str:
    """A savepoint into ``path``, which must not exist (a savepoint never overwrites one)."""
    from .._checkpoint._paths import _exists, resolve
    from ..exceptions import CheckpointError

    fs, where = resolve(path)
    if _exists(fs, where):
        raise CheckpointError(f"savepoint path {path!r} exists already; a savepoint goes to a path that does not "
                              "exist yet (nothing was written, the job runs on)")
    return job.savepoint(path)


def _drain_worker(job, worker: str):
    return job.reconfig.drain_worker(worker)


#: The calls a client may make on a submitted job, by name: a method of the ``Job`` (the
#: same name), or the function that carries it out. ``drain`` and ``cancel`` are the
#: driver's own (:meth:`Driver.drain`, :meth:`Driver.cancel`).
CALLS = {name: None for name in (
    "rescale", "move_instance", "update", "migrate", "reassign", "split", "metrics",
    "imbalance", "state", "state_size", "checkpoints", "dead_letters", "parallelism", "routing",
    "watermarks", "summary", "offsets", "balancer_state", "load_trace", "topology")}
CALLS.update({"history": _history, "drain_worker": _drain_worker, "savepoint": _savepoint})
#: Calls that only read: not logged
READS = {"metrics", "imbalance", "state", "state_size", "checkpoints", "dead_letters", "parallelism", "routing",
         "watermarks", "summary", "offsets", "balancer_state", "load_trace", "topology", "history"}


class Driver:
    """Runs the job of ``job_dir`` for the registry of the scheduler ``client`` is connected to."""

    def __init__(self, client, job_dir: str, incarnation: int) -> None:
        self.client, self.dir, self.incarnation = client, job_dir, incarnation
        self.name = os.path.basename(os.path.normpath(job_dir))
        self.job = None
        self.ending: str | None = None      # "cancelled" or "finished" once asked to end
        self.pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="streamlb-call")
        self.done = threading.Event()       # the job ended (and ``wait`` returned or raised)
        self.ended = False                  # the end was reported: the registry forgets this driver
        self._seen = collections.deque([(time.time(), 0)])     # (time, records read) of recent reports

    # -- talking to the registry ------------------------------------------------------------------
    def _scheduler(self, op: str, **kw):
        return self.client.sync(getattr(self.client.scheduler, op), **kw)

    def report(self, status: str, error: str | None = None) -> None:
        info = self._info() if self.job is not None else {}
        workers = len(set(self.job.workers_of.values())) if self.job is not None else None
        answer = self._scheduler("streamlb_jobs_report", name=self.name, incarnation=self.incarnation,
                                 status=status, info=info, error=error, workers=workers)
        if answer.get("stale"):
            self._exit_stale()

    def _exit_stale(self) -> None:
        if self.ended:
            return
        logger.warning("job %s: driver %d is not the job's driver any more (the registry started another, or "
                       "the job ended): exiting", self.name, self.incarnation)
        os._exit(3)

    def _info(self) -> dict:
        job = self.job
        rows = job._results.last or []
        records = sum(r.get("records_out", 0) for r in rows if job.plan.stages[r["key"][0]].is_source)
        now = time.time()
        self._seen.append((now, records))
        while len(self._seen) > 2 and now - self._seen[1][0] >= RATE_OVER:
            self._seen.popleft()
        t0, r0 = self._seen[0]
        cp = job.checkpointer
        last = cp.last if cp is not None else None
        return {"run": job.id, "status": job.status,
                "parallelism": {st.name: st.parallelism for st in job.plan.stages},
                "records": int(records), "records_per_s": max(records - r0, 0) / (now - t0) if now > t0 else 0.0,
                "checkpoint": None if not last else {"id": last.get("id"), "completed": last.get("completed"),
                                                     "path": cp.last_base},
                "recoveries": job.recovery.count if job.recovery is not None else 0,
                "instances": len(job.actors), "workers": len(set(job.workers_of.values())),
                "dead_letters": len(job._results.dead)}

    # -- starting the job -------------------------------------------------------------------------
    def start(self):
        from ..runtime import Job

        with open(os.path.join(self.dir, "definition.pkl"), "rb") as f:
            data = f.read()
        d = _definition.load(data, os.path.join(self.dir, "definition.pkl"))
        plan, options = d["plan"], d["options"]
        if options.checkpoint:
            options = self._resume_point(data, plan, options)
        from .._job._launch import start_autoscaling
        from .._placement import cluster_workers

        workers = sorted(cluster_workers(self.client))
        if not workers:
            raise JobServiceError(f"the cluster at {self.client.scheduler.address} has no workers")
        self.job = Job(plan, self.client, None, workers, options, owns_client=False)
        start_autoscaling(self.job, options, d["ranges"])
        return self.job

    def _resume_point(self, data: bytes, plan, options):
        """The options to start from: resumed from the latest complete checkpoint of the
        job's directory (at its parallelism) when there is one; the definition kept there."""
        from .._checkpoint._manifest import checkpoint_ids
        from .._checkpoint._paths import _child, _write_atomic, resolve
        from .._job._options import _restored

        fs, root = resolve(_child(options.checkpoint, _definition.DEFINITION))
        _write_atomic(fs, root, data)
        if not checkpoint_ids(options.checkpoint):
            return options
        restored = _restored(options.checkpoint)
        ops = restored[0].get("operators", {})
        for st in plan.stages:
            if st.name in ops:
                st.parallelism = int(ops[st.name]["parallelism"])
        logger.info("job %s: resuming from checkpoint %s of %s", self.name, restored[0].get("id"), options.checkpoint)
        return dataclasses.replace(options, restore=None, restored=restored, resumed=True)

    # -- calls from clients -----------------------------------------------------------------------
    def serve(self) -> None:
        """Take the calls made on the job and run them (a thread)."""
        while True:
            try:
                got = self._scheduler("streamlb_jobs_next", name=self.name, incarnation=self.incarnation, timeout=5.0)
            except Exception as exc:        # the scheduler is gone: the process dies with it
                logger.warning("job %s: the registry did not answer (%s: %s)", self.name, type(exc).__name__, exc)
                time.sleep(1.0)
                continue
            if got.get("stale"):
                self._exit_stale()
                return
            for call in got["calls"]:
                self.pool.submit(self._run_call, call)

    def _run_call(self, call: dict) -> None:
        import cloudpickle

        method = call["method"]
        try:
            args, kwargs = cloudpickle.loads(call["payload"]) if call["payload"] else ((), {})
            result = self.call(method, *args, **kwargs)
            ok, payload = True, cloudpickle.dumps(result)
        except BaseException as exc:
            ok = False
            try:
                payload = cloudpickle.dumps(exc)
            except Exception:
                payload = cloudpickle.dumps(JobServiceError(f"{type(exc).__name__}: {exc}"))
        try:
            self._scheduler("streamlb_jobs_reply", id=call["id"], ok=ok, payload=payload)
        except Exception as exc:
            logger.warning("job %s: the answer to %s was not delivered (%s)", self.name, method, exc)

    def call(self, method: str, *args, **kwargs):
        (logger.debug if method in READS else logger.info)("job %s: %s%s", self.name, method, args if args else "")
        if method == "cancel":
            return self.cancel()
        if method == "drain":
            return self.drain(*args, **kwargs)
        if method not in CALLS:
            raise JobServiceError(f"a submitted job has no call {method!r}; calls: "
                                  f"{', '.join(sorted([*CALLS, 'cancel', 'drain']))}")
        fn = CALLS[method]
        return fn(self.job, *args, **kwargs) if fn is not None else getattr(self.job, method)(*args, **kwargs)

    def cancel(self) -> None:
        """Abort the job: its instances stop, nothing more is committed."""
        self.ending = "cancelled"
        self.report("stopping")
        self.job.stop()
        self.done.wait(config.seconds("stop-timeout") * 4)

    def drain(self, savepoint: str | None = None):
        """End the job gracefully (:meth:`streamlb.Job.drain`), then answer."""
        self.ending = "finished"
        self.report("stopping")
        out = self.job.drain(savepoint=savepoint)
        self.done.wait()
        if self.job.error is not None:
            raise self.job.error
        return out

    # -- the life of the driver -------------------------------------------------------------------
    def beat(self) -> None:
        """Report every ``streamlb.jobs.heartbeat`` while the job runs (a thread)."""
        every = config.seconds("jobs.heartbeat")
        while self.job is not None and self.job.status == "running":
            time.sleep(every)
            try:
                self.report("stopping" if self.ending else "running")
            except Exception as exc:
                logger.warning("job %s: heartbeat not delivered (%s: %s)", self.name, type(exc).__name__, exc)

    def run(self) -> int:
        try:
            self.start()
        except BaseException as exc:
            logger.exception("job %s: could not start", self.name)
            self.report("failed", error=f"{type(exc).__name__}: {exc}" if not isinstance(exc, StreamlbError)
                        else str(exc))
            return 1
        self.report("running")
        threading.Thread(target=self.serve, name="streamlb-serve", daemon=True).start()
        threading.Thread(target=self.beat, name="streamlb-beat", daemon=True).start()
        status, error = "finished", None
        try:
            self.job.wait()
        except BaseException as exc:
            if self.ending == "cancelled":
                status = "cancelled"
            else:
                logger.exception("job %s: failed", self.name)
                status = "failed"
                error = str(exc) if isinstance(exc, StreamlbError) else f"{type(exc).__name__}: {exc}"
        if self.ending == "cancelled":
            status = "cancelled"
        self.ended = True
        try:
            self.report(status, error=error)
        finally:
            self.done.set()                 # a stop's or a cancel's answer goes out after the end is on record
        self.pool.shutdown(wait=True)       # the answers of the calls under way (a stop's) go out
        return 0 if status != "failed" else 1


def _standby() -> tuple[str, str, int]:
    """Import what a driver needs, then wait for a job on standard input (a line of JSON
    from the registry); the output goes to that job's log from then on."""
    import json

    import distributed  # noqa: F401
    import pandas  # noqa: F401

    from .. import runtime  # noqa: F401
    from .._recovery import _coordinator  # noqa: F401

    line = sys.stdin.readline()
    if not line:
        sys.exit(0)             # the registry closed: no job for this one
    job = json.loads(line)
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return job["job_dir"], job["address"], int(job["incarnation"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m streamlb.service._driver", description="A submitted job's driver.")
    ap.add_argument("job_dir", nargs="?")
    ap.add_argument("--address")
    ap.add_argument("--standby", action="store_true", help="import, then wait for a job on standard input")
    args = ap.parse_args(argv)
    if args.standby:
        job_dir, address, incarnation = _standby()
    else:
        if not args.job_dir or not args.address:
            ap.error("give JOB_DIR and --address, or --standby")
        job_dir, address = args.job_dir, args.address
        incarnation = int(os.environ.get("STREAMLB_DRIVER_INCARNATION", "1"))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from distributed import Client

    client = Client(address, timeout=config.seconds("connect-timeout"), set_as_default=True)
    logger.info("driver %d of job %s (pid %d) connected to %s", incarnation,
                os.path.basename(os.path.normpath(job_dir)), os.getpid(), address)
    code = Driver(client, job_dir, incarnation).run()
    try:
        client.close(timeout=5)
    except Exception:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
