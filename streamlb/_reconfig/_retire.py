"""Retiring workers drain: Dask's retirement waits while the jobs move their instances off.

Dask refuses to retire a worker that holds actors (``client.retire_workers`` returns
without it) and ``cluster.scale`` down closes it anyway, killing the actors. The
:class:`RetireGuard` scheduler plugin wraps the scheduler's ``retire_workers`` (the RPC
handler every path goes through: ``client.retire_workers``, ``cluster.scale``, adaptive
scaling; and the method, for callers in the scheduler process). When the workers to retire
hold instances of streamlb jobs, it publishes the event ``streamlb-retiring`` and waits.
Each job's driver (subscribed through :class:`Drainer`) moves its instances on those
workers to the remaining ones (``Job.move_instance``) and answers ``streamlb-retired``;
then the retirement proceeds. A job that cannot move them answers with the reason and the
retirement is refused with an error naming the job and the operators.

A job that is no longer running (finished, failed or stopped) has nothing to drain: its
driver releases the instances on the retiring workers, with the state they hold, and the
retirement proceeds (``Job.state`` then raises :class:`~streamlb.JobReleasedError`). When
the scheduler closes, the guard says so first (event ``streamlb-closing``): each job stops
locally, and a client a job made closes before it would try to reconnect.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import uuid

from distributed.diagnostics.plugin import SchedulerPlugin

logger = logging.getLogger("streamlb.retire")

NAME = "streamlb-retire-guard"
RETIRING, RETIRED = "streamlb-retiring", "streamlb-retired"
CLOSING, CLOSING_SEEN = "streamlb-closing", "streamlb-closing-seen"


def _job_of(key) -> str | None:
    """The job id in an instance's actor key ``streamlb-<job>-<stage>-<index>[-r<run>]``."""
    if isinstance(key, str) and key.startswith("streamlb-"):
        parts = key.split("-")
        return parts[1] if len(parts) >= 4 else None
    return None


class RetireGuard(SchedulerPlugin):
    """Scheduler plugin: a retirement waits until streamlb jobs moved their instances off."""

    name = NAME

    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout = timeout
        self.pending: dict[str, tuple[asyncio.Future, set, dict]] = {}
        self.closing: tuple[set, asyncio.Event] | None = None       # clients yet to acknowledge, all did

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers["retire_workers"] = self._wrap(scheduler.handlers["retire_workers"])
        scheduler.retire_workers = self._wrap(scheduler.retire_workers)

    async def before_close(self) -> None:
        """Tell the jobs' clients the scheduler closes, and wait (2 s at most) until each
        has taken it in: a client that learns it from its closed comm would try to reconnect."""
        waiting = set(self._subscribers(CLOSING))
        if not waiting:
            return
        self.closing = (waiting, asyncio.Event())
        self.scheduler.log_event(CLOSING, {"scheduler": self.scheduler.address})
        try:
            await asyncio.wait_for(self.closing[1].wait(), 2.0)
        except asyncio.TimeoutError:
            logger.info("streamlb: clients %s did not acknowledge that the scheduler closes", sorted(waiting))

    def _subscribers(self, topic: str) -> set:
        topics = getattr(getattr(self.scheduler, "_broker", None), "_topics", {})
        return set(topics[topic].subscribers) if topic in topics else set()

    def _resolve(self, workers, names, kw) -> list[str]:
        s = self.scheduler
        if workers is not None:         # SpecCluster passes worker names here
            by_name = {str(ws.name): a for a, ws in s.workers.items()}
            return [a for a in (w if w in s.workers else by_name.get(str(w)) for w in workers) if a]
        if names is not None:
            want = {str(n) for n in names}
            return [a for a, ws in s.workers.items() if str(ws.name) in want]
        return list(s.workers_to_close(**{**kw, "attribute": "address"}))

    def _listening(self) -> bool:
        return bool(self._subscribers(RETIRING))

    def _wrap(self, original):
        @functools.wraps(original)
        async def retire_workers(workers=None, *, names=None, close_workers=False, remove=True,
                                 stimulus_id=None, **kw):
            s = self.scheduler
            addrs = self._resolve(workers, names, kw)
            held = {a: [ts.key for ts in s.workers[a].actors] for a in addrs if a in s.workers}
            jobs = {j for keys in held.values() for k in keys if (j := _job_of(k))}
            if jobs and self._listening():
                await self._drain(addrs, jobs)
            if workers is None and names is None:
                workers = addrs         # the workers chosen above, not a new choice
            return await original(workers=workers, names=names, close_workers=close_workers, remove=remove,
                                  stimulus_id=stimulus_id)

        return retire_workers

    async def _drain(self, addrs: list[str], jobs: set[str]) -> None:
        s = self.scheduler
        rid = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = (fut, set(jobs), {})
        s.log_event(RETIRING, {"id": rid, "retiring": addrs, "jobs": sorted(jobs)})
        try:
            replies = await asyncio.wait_for(fut, self.timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(f"streamlb: jobs {', '.join(sorted(jobs))} did not move their instances off "
                               f"{', '.join(addrs)} within {self.timeout:g}s; retirement refused") from None
        finally:
            self.pending.pop(rid, None)
        refused = [r["error"] for r in replies.values() if not r.get("ok")]
        if refused:
            raise RuntimeError("streamlb: retirement refused: " + "; ".join(refused))
        # the released actors leave the workers' books on another comm: wait for that
        for _ in range(200):
            if not any(a in s.workers and any(_job_of(ts.key) in jobs for ts in s.workers[a].actors)
                       for a in addrs):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"streamlb: instances of jobs {', '.join(sorted(jobs))} are still on "
                           f"{', '.join(addrs)} after their drivers released them; retirement refused")

    def log_event(self, topic, msg) -> None:
        if topic == CLOSING_SEEN and self.closing is not None and isinstance(msg, dict):
            waiting, done = self.closing
            waiting.discard(msg.get("client"))
            if not waiting:
                done.set()
            return
        if topic != RETIRED or not isinstance(msg, dict) or msg.get("id") not in self.pending:
            return
        fut, waiting, replies = self.pending[msg["id"]]
        replies[msg.get("job")] = msg
        waiting.discard(msg.get("job"))
        if not waiting and not fut.done():
            fut.set_result(replies)


def ensure_guard(client) -> None:
    """Add a :class:`RetireGuard` to the client's scheduler unless one is there."""
    present = client.run_on_scheduler(lambda dask_scheduler: NAME in dask_scheduler.plugins)
    if not present:
        client.register_plugin(RetireGuard())


_DRAINERS: dict[int, dict[str, "Drainer"]] = {}     # id(client) -> job id -> its drainer


def _dispatch(client_id: int, event) -> None:
    for d in list(_DRAINERS.get(client_id, {}).values()):
        d.on_event(event)


async def _closing(client_id: int, event) -> None:
    """The scheduler closes: this client's jobs stop locally; the scheduler hears that the
    client took it in; then a client a job made closes, before its comm is closed under it
    (runs on the client's event loop, which reads nothing else meanwhile)."""
    jobs = [d.job for d in list(_DRAINERS.get(client_id, {}).values())]
    if not jobs:
        return
    for job in jobs:
        job.scheduler_closed()
    client = jobs[0].client
    try:
        await asyncio.wait_for(client.scheduler.log_event(topic=CLOSING_SEEN, msg={"client": client.id}), 1.0)
    except Exception:
        pass
    if any(job._owns_client for job in jobs) and client.status == "running":
        asyncio.ensure_future(client._close(fast=True))


class Drainer:
    """A job's side: on ``streamlb-retiring`` naming this job, move its instances off the
    retiring workers (in a thread: the handler runs on the client's event loop) and answer.
    A client subscribes once; its jobs share the subscription."""

    def __init__(self, job) -> None:
        self.job = job
        self.moves: list[dict] = []
        client = job.client
        ensure_guard(client)
        jobs = _DRAINERS.setdefault(id(client), {})
        if not jobs:
            client.subscribe_topic(RETIRING, functools.partial(_dispatch, id(client)))
            client.subscribe_topic(CLOSING, functools.partial(_closing, id(client)))
        jobs[job.id] = self

    def close(self) -> None:
        client = self.job.client
        jobs = _DRAINERS.get(id(client), {})
        jobs.pop(self.job.id, None)
        if not jobs:
            _DRAINERS.pop(id(client), None)
            for topic in (RETIRING, CLOSING):
                try:
                    client.unsubscribe_topic(topic)
                except Exception:
                    pass

    def on_event(self, event) -> None:
        _, msg = event
        if not isinstance(msg, dict) or self.job.id not in msg.get("jobs", ()):
            return
        threading.Thread(target=self._drain, args=(msg,), daemon=True,
                         name=f"streamlb-drain-{self.job.id}").start()

    def _drain(self, msg: dict) -> None:
        job = self.job
        reply = {"id": msg["id"], "job": job.id, "ok": True}
        try:
            retiring = list(msg["retiring"])
            for w in retiring:
                done = job.reconfig.drain_worker(w, exclude=retiring)
                self.moves.extend(done)
                job._reconfigs.extend(done)
            if job.status != "running":     # nothing to drain (or it finished meanwhile): let them go
                job.release_workers(retiring)
        except Exception as exc:
            logger.warning("streamlb: job %s could not drain %s: %s", job.id, msg.get("retiring"), exc)
            reply.update(ok=False, error=f"job {job.id}: {exc}")
        job.client.log_event(RETIRED, reply)
