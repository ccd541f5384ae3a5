"""An instance whose driver let it go stops by itself.

A driver that dies (its process SIGKILLed, its host lost) cannot stop its instances: its
client's actors are released by the scheduler, so the worker forgets them
(``worker.state.actors``), but the tasks an instance runs on the worker's event loop go
on: a source keeps reading, instances keep calling peers that are gone. When a new driver
resumes the job from its last checkpoint, those orphans would run beside the new
instances. So each instance looks, every :data:`EVERY` seconds, whether its worker still
holds it as an actor, and stops (as ``Instance.stop``: tasks cancelled, staged outputs
aborted, never committed) once it does not. An instance released on purpose has been
stopped or retired already.
"""
from __future__ import annotations

import asyncio
import logging

__all__ = ["fence", "EVERY"]

logger = logging.getLogger("streamlb.worker")

EVERY = 1.0


def _held(worker, instance) -> bool:
    return any(a is instance for a in list(worker.state.actors.values()))


async def fence(instance, worker, stop) -> None:
    """Until ``instance`` is no longer among ``worker``'s actors; then ``await stop()``."""
    while True:
        await asyncio.sleep(EVERY)
        if not _held(worker, instance):
            logger.info("instance %s: its driver let it go (the actor was released): stopping",
                        getattr(instance, "label", instance))
            await stop()
            return
