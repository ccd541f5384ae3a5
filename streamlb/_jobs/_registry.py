"""``JobRegistry``: the scheduler plugin that keeps a cluster's submitted jobs alive.

It holds one :class:`~streamlb._jobs._record.JobRecord` per job in a directory (setting
``streamlb.jobs.dir``, or ``dask scheduler --preload streamlb.plugin --streamlb-jobs-dir
D``), starts each job's driver as a child process (:mod:`._spawn`), and supervises it:

- a driver that exits before its job ended, or stops reporting for
  ``streamlb.jobs.driver-timeout``, is replaced by a new one, which resumes the job from
  its latest complete checkpoint (a job without ``checkpoint=`` fails instead, saying so);
- a registry started on a directory that holds running jobs (the scheduler was lost and
  started again) resumes each of them the same way once as many workers joined as it ran
  on, or after ``streamlb.jobs.worker-wait`` with those there.

Everything that changes a job comes over the Dask comm, TLS where the cluster uses it:
``streamlb_jobs_call`` puts a call in the job's mailbox, its driver takes it with a long
poll (``streamlb_jobs_next``), runs it against its :class:`~streamlb.Job` and answers
(``streamlb_jobs_reply``). Arguments and answers travel pickled, as bytes the scheduler
never opens. ``/streamlb/jobs.json`` on the scheduler's HTTP server shows the records,
read-only. The registry never imports the job's code: it is a relay and a supervisor.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
import uuid

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import config
from ..exceptions import JobServiceError
from ._record import TERMINAL, JobRecord, check_name
from ._spawn import assign, spawn_driver, spawn_standby

__all__ = ["JobRegistry", "NAME", "ensure_registry"]

logger = logging.getLogger("streamlb.jobs")

NAME = "streamlb-jobs"
#: A driver that exits within this many seconds of starting, this many times in a row,
#: fails its job instead of being started again (its log says why).
QUICK_EXIT_S, QUICK_EXITS = 10.0, 5


class JobRegistry(SchedulerPlugin):
    """The job service on the scheduler (a Dask ``SchedulerPlugin``)."""

    name = NAME

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.records: dict[str, JobRecord] = {}
        self.procs: dict = {}               # name -> the driver process running
        self.mailbox: dict[str, list] = {}  # name -> calls its driver has not taken
        self.taken: dict[str, set] = {}     # name -> ids of the calls its driver took
        self.calls: dict[str, asyncio.Future] = {}
        self.wakeup: dict[str, asyncio.Event] = {}
        self.seen: dict[str, float] = {}    # name -> when its driver last reported
        self.waiting: dict[str, float] = {}     # name -> since when it waits for workers
        self.quick: dict[str, int] = {}     # name -> drivers in a row that exited soon after starting
        self.saved: dict[str, float] = {}
        self.ephemeral = False
        self.standby = None                 # a driver process waiting for a job (see _spawn)
        self._standby_at = 0.0
        self._pc = None

    # -- plugin ----------------------------------------------------------------------------------
    async def start(self, scheduler) -> None:
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        root = config.get("jobs.dir", self.directory)
        if root is None:
            root, self.ephemeral = tempfile.mkdtemp(prefix="streamlb-jobs-"), True
        self.root = os.path.abspath(os.path.expanduser(str(root)))
        os.makedirs(self.root, exist_ok=True)
        self.records, unreadable = JobRecord.load_all(self.root)
        for what in unreadable:
            logger.error("job registry: %s cannot be read; the job is listed as failed (fix or remove the file)", what)
        for rec in self.records.values():
            if rec.active:
                rec.status, rec.reason, rec.driver = "restarting", "the scheduler started again", {}
                rec.restarts += 1
                rec.save(self.root)
                logger.info("job %s: resumes from its latest complete checkpoint once %d worker(s) joined",
                            rec.name, rec.workers)
        scheduler.handlers.update({
            "streamlb_jobs_submit": self.submit, "streamlb_jobs_list": self.list,
            "streamlb_jobs_get": self.get, "streamlb_jobs_call": self.call,
            "streamlb_jobs_next": self.next, "streamlb_jobs_reply": self.reply,
            "streamlb_jobs_report": self.report,
        })
        _add_json_view(scheduler, self)
        self._pc = PeriodicCallback(self._supervise, 200)      # ms: a lost driver is seen within 0.2 s
        self._pc.start()
        logger.info("job registry in %s%s: %d job(s), %d active", self.root,
                    " (temporary: jobs do not survive the scheduler)" if self.ephemeral else "",
                    len(self.records), sum(r.active for r in self.records.values()))

    async def close(self) -> None:
        if self._pc is not None:
            self._pc.stop()
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                proc.kill()       # its job stays active: a registry started again resumes it
        self.procs.clear()
        if self.standby is not None and self.standby.poll() is None:
            self.standby.kill()
        for fut in self.calls.values():
            if not fut.done():
                fut.set_exception(JobServiceError("the scheduler closed before the job's driver answered"))

    # -- requests from clients --------------------------------------------------------------------
    def submit(self, name: str, definition: bytes, checkpoint: str | None = None, versions: dict | None = None,
               workers: int = 1) -> dict:
        try:
            check_name(name)
        except ValueError as exc:
            raise JobServiceError(str(exc)) from None
        old = self.records.get(name)
        if old is not None and old.active:
            raise JobServiceError(
                f"a job named {name!r} is {old.status} on this cluster (id {old.id}); stop or cancel it first "
                f"(`streamlb job stop {name}` / `streamlb job cancel {name}`), or submit under another name")
        d = JobRecord.directory(self.root, name)
        if old is not None:         # a job of that name that ended: the new one takes its place
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "definition.pkl"), "wb") as f:
            f.write(definition)
        # drivers are numbered on from the job of that name that ended: one of its drivers still
        # exiting can never pass for one of the new job's
        rec = JobRecord(name=name, id=uuid.uuid4().hex[:8], status="starting", submitted=time.time(),
                        checkpoint=checkpoint, versions=dict(versions or {}), workers=max(int(workers), 1),
                        drivers=old.drivers if old is not None else 0)
        self.records[name] = rec
        rec.save(self.root)
        self._start_driver(rec)
        logger.info("job %s (%s) submitted%s", name, rec.id, f", checkpoints to {checkpoint}" if checkpoint else "")
        return rec.as_dict()

    def list(self) -> list[dict]:
        return [r.as_dict() for r in sorted(self.records.values(), key=lambda r: r.submitted)]

    def get(self, name: str) -> dict:
        return self._record(name).as_dict() | {"registry": self.root}

    async def call(self, name: str, method: str, payload: bytes, timeout: float | None = None) -> dict:
        """Run ``method`` of job ``name`` in its driver; the driver's answer, pickled."""
        rec = self._record(name)
        if method == "cancel" and rec.active and name not in self.procs:
            self._end(rec, "cancelled", reason="cancelled while no driver ran")
            return {"ok": True, "payload": None}
        if not rec.active:
            raise JobServiceError(f"job {name!r} is {rec.status}{': ' + rec.error if rec.error else ''}; "
                                  f"`{method}` needs a running job")
        timeout = config.seconds("jobs.call-timeout", timeout)
        cid = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.calls[cid] = fut
        self.mailbox.setdefault(name, []).append({"id": cid, "method": method, "payload": payload})
        self._wake(name)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            raise JobServiceError(f"job {name!r}: its driver did not answer `{method}` within {timeout:g} s "
                                  f"(status {self.records[name].status}); the call may still take effect") from None
        finally:
            self.calls.pop(cid, None)
            box = self.mailbox.get(name, [])
            self.mailbox[name] = [c for c in box if c["id"] != cid]
            self.taken.get(name, set()).discard(cid)

    # -- requests from drivers ---------------------------------------------------------------------
    async def next(self, name: str, incarnation: int, timeout: float = 5.0) -> dict:
        """A driver's long poll: the calls waiting for it (``stale``: it is not the job's
        current driver and must exit)."""
        rec = self.records.get(name)
        if rec is None or rec.drivers != incarnation or not rec.active:
            return {"stale": True, "calls": []}
        self.seen[name] = time.time()
        if not self.mailbox.get(name):
            ev = self.wakeup.setdefault(name, asyncio.Event())
            ev.clear()
            try:
                await asyncio.wait_for(ev.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            rec = self.records.get(name)
            if rec is None or rec.drivers != incarnation or not rec.active:
                # a driver lost while it waited: the calls are for the one that replaced it
                return {"stale": True, "calls": []}
        calls, self.mailbox[name] = self.mailbox.get(name, []), []
        self.taken.setdefault(name, set()).update(c["id"] for c in calls)
        return {"stale": False, "calls": calls}

    def reply(self, id: str, ok: bool, payload: bytes | None = None) -> None:
        fut = self.calls.get(id)
        if fut is not None and not fut.done():
            fut.set_result({"ok": ok, "payload": payload})

    def report(self, name: str, incarnation: int, status: str, info: dict | None = None,
               error: str | None = None, workers: int | None = None) -> dict:
        """A driver's heartbeat: the job's status and figures."""
        rec = self.records.get(name)
        if rec is None or rec.drivers != incarnation or not rec.active:
            return {"stale": True}
        now = time.time()
        self.seen[name] = now
        if info:
            rec.info = info
        if workers:
            rec.workers = int(workers)
        changed = False
        if status == "running" and rec.status in ("starting", "restarting"):
            rec.status, rec.started, changed = "running", now, True
            self.quick.pop(name, None)
            logger.info("job %s: running (driver %d, pid %s)", name, incarnation, rec.driver.get("pid"))
        elif status == "stopping" and rec.status != "stopping":
            rec.status, changed = "stopping", True
        elif status in TERMINAL:
            self._end(rec, status, error=error)
            return {"stale": False}
        if changed or now - self.saved.get(name, 0) > 5:
            self.saved[name] = now
            rec.save(self.root)
        return {"stale": False}

    # -- supervision ------------------------------------------------------------------------------
    def _supervise(self) -> None:
        now = time.time()
        timeout = config.seconds("jobs.driver-timeout")
        for name, rec in list(self.records.items()):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                del self.procs[name]
                self._driver_gone(rec, proc)
            elif proc is not None and rec.active and now - self.seen.get(name, now) > timeout:
                logger.warning("job %s: driver %d (pid %d) has not reported for %.0f s (streamlb.jobs.driver-timeout):"
                               " killed; a new one resumes the job", name, rec.drivers, proc.pid, now - self.seen[name])
                proc.kill()
            elif proc is None and rec.active and self._enough_workers(rec, now):
                self._start_driver(rec)
        spare = self.standby is not None and self.standby.poll() is None
        if not spare and now - self._standby_at > 10 and any(r.active for r in self.records.values()):
            self._standby_at = now
            try:
                self.standby = spawn_standby(self.root, getattr(self.scheduler, "security", None))
            except OSError as exc:
                logger.warning("job registry: no standby driver (%s: %s)", type(exc).__name__, exc)

    def _enough_workers(self, rec: JobRecord, now: float) -> bool:
        n = len(self.scheduler.workers)
        if n >= rec.workers:
            return True
        since = self.waiting.setdefault(rec.name, now)
        return n >= 1 and now - since >= config.seconds("jobs.worker-wait")

    def _start_driver(self, rec: JobRecord) -> None:
        if not self._enough_workers(rec, time.time()):
            return
        self.waiting.pop(rec.name, None)
        rec.drivers += 1
        sec = getattr(self.scheduler, "security", None)
        job_dir = JobRecord.directory(self.root, rec.name)
        proc, self.standby = self.standby, None
        log = assign(proc, job_dir, self.scheduler.address, rec.drivers) if proc is not None else None
        try:
            if log is None:
                proc, log = spawn_driver(job_dir, self.scheduler.address, rec.drivers, sec)
        except OSError as exc:
            self._end(rec, "failed", error=f"its driver process could not be started: {type(exc).__name__}: {exc}")
            return
        self.procs[rec.name] = proc
        self.seen[rec.name] = time.time()
        rec.driver = {"pid": proc.pid, "host": self.scheduler.address, "log": log, "incarnation": rec.drivers,
                      "started": time.time()}
        rec.save(self.root)

    def _driver_gone(self, rec: JobRecord, proc) -> None:
        name, code = rec.name, proc.returncode
        for cid in self.taken.pop(name, set()):
            fut = self.calls.get(cid)
            if fut is not None and not fut.done():
                fut.set_exception(JobServiceError(
                    f"job {name!r}: its driver (pid {proc.pid}) exited with code {code} while it ran the call; "
                    "the job resumes from its latest complete checkpoint: look at `streamlb job describe` and "
                    "repeat the call if it did not take effect"))
        self._forget_run(rec)
        if not rec.active:
            return              # it reported how the job ended before it exited
        why = f"its driver process (pid {proc.pid}) exited with code {code}"
        started = rec.driver.get("started") or 0
        self.quick[name] = self.quick.get(name, 0) + 1 if time.time() - started < QUICK_EXIT_S else 0
        if rec.checkpoint is None:
            self._end(rec, "failed", error=f"{why}; the job ran without checkpoint=, so there is nothing to "
                                           "resume it from: submit it again")
        elif self.quick[name] >= QUICK_EXITS:
            self._end(rec, "failed", error=f"{why}, the {QUICK_EXITS}th driver in a row to exit within "
                                           f"{QUICK_EXIT_S:g} s of starting: see {rec.driver.get('log')}")
        else:
            rec.status, rec.reason = "restarting", why
            rec.restarts += 1
            rec.save(self.root)
            logger.warning("job %s: %s; a new driver resumes it from its latest complete checkpoint", name, why)
            self._start_driver(rec)

    def _end(self, rec: JobRecord, status: str, error: str | None = None, reason: str | None = None) -> None:
        rec.status, rec.ended = status, time.time()
        rec.error = error
        rec.reason = reason
        rec.save(self.root)
        self.waiting.pop(rec.name, None)
        (logger.error if status == "failed" else logger.info)(
            "job %s: %s%s", rec.name, status, f": {error}" if error else "")

    def _forget_run(self, rec: JobRecord) -> None:
        """The balancer plugin forgets the run of a driver that is gone."""
        run = (rec.info or {}).get("run")
        plugin = self.scheduler.plugins.get("streamlb-balancer")
        if run and plugin is not None and run in getattr(plugin, "jobs", {}):
            plugin.unregister_job(job=run)

    # -- helpers ----------------------------------------------------------------------------------
    def _record(self, name: str) -> JobRecord:
        rec = self.records.get(name)
        if rec is None:
            known = ", ".join(sorted(self.records)) or "none"
            raise JobServiceError(f"no job named {name!r} on this cluster (jobs: {known}; `streamlb jobs` lists them)")
        return rec

    def _wake(self, name: str) -> None:
        ev = self.wakeup.get(name)
        if ev is not None:
            ev.set()


def _add_json_view(scheduler, registry: JobRegistry) -> None:
    """``/streamlb/jobs.json``: the records, read-only, on the scheduler's HTTP server."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return
    from tornado.web import RequestHandler

    class JobsHandler(RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps({"jobs": registry.list()}, default=str))

    app.add_handlers(r".*", [(r"/streamlb/jobs.json", JobsHandler)])


def ensure_registry(client) -> bool:
    """Register a :class:`JobRegistry` on the client's scheduler unless one is there (its
    directory is then the setting ``streamlb.jobs.dir`` of the scheduler, else temporary);
    True if added."""
    present = client.run_on_scheduler(lambda dask_scheduler: NAME in dask_scheduler.plugins)
    if not present:
        client.register_plugin(JobRegistry())
    return not present
