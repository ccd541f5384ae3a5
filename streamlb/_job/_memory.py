"""Why an instance's worker was lost, when its nanny restarted it for its memory.

A Dask nanny whose worker passes ``distributed.worker.memory.terminate`` (95% of its
``memory_limit``) restarts it and records a ``worker-restart-memory`` event on the
scheduler. A job whose instances were there then fails (or recovers) with "unreachable":
this says why, with the keys its instances held at the last poll, and what to change.
"""
from __future__ import annotations

import time

__all__ = ["memory_note"]


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def memory_note(job, worker: str | None) -> str:
    """A sentence on ``worker``'s restart for its memory, or "" if its nanny recorded none."""
    if worker is None:
        return ""
    try:
        events = job.client.get_events("worker-restart-memory")
        hits = [e for _, e in events if isinstance(e, dict) and e.get("worker") == worker]
        if not hits:
            return ""
        limits: list = []
        for _ in range(20):     # the restarted worker, or another, registers again
            limits = [w.get("memory_limit") or 0 for w in job.client.scheduler_info()["workers"].values()]
            if limits:
                break
            time.sleep(0.25)
    except Exception:           # the scheduler is gone too: nothing more to say
        return ""
    limit = f", memory_limit {_gib(max(limits))}" if limits and max(limits) else ""
    held = [(r["key"], r.get("keys")) for r in job._results.last
            if job.workers_of.get(r["key"]) == worker and r.get("keys")]
    names = ", ".join(f"{job.plan.stages[s].name}[{i}]: {n:,}" for (s, i), n in held)
    keys = f"; keys held there at the last poll: {names}" if held else ""
    return (f". Its nanny restarted worker {worker} for exceeding its memory limit (RSS {_gib(hits[-1]['rss'])}"
            f"{limit}){keys}. Keyed state larger than the workers' memory: run the job with "
            "state_backend='rocksdb' (see docs/state.md), or give the workers more memory")
