"""What the driver reads of an instance: status and figures, metrics rows, keyed state."""
from __future__ import annotations

import asyncio
import contextlib

import pandas as pd

from .. import config
from ..exceptions import PipelineError


class Readable:
    """Mixed into :class:`~streamlb._worker._instance.Instance`."""

    @property
    def status(self) -> str:
        """created, ready, running, then done, failed, stopped or retired."""
        return self._status

    @status.setter
    def status(self, value: str) -> None:
        self._status = value
        settled = self.__dict__.get("_settled")
        if settled is not None and value not in ("created", "ready", "running"):
            settled.set()           # a poll held until now answers at once

    async def settled(self, hold: float) -> str:
        """Wait up to ``hold`` seconds while the instance runs; its status then. The driver
        waiting for a job asks this between polls (outside its topology lock), so an
        instance that ends is seen at once rather than at the next poll interval."""
        if self._status in ("ready", "running"):
            settled = self.__dict__.setdefault("_settled", asyncio.Event())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(settled.wait(), hold)
        return self._status

    async def poll(self) -> dict:
        """Status and figures (:meth:`status_row`), taken on the event loop: a synchronous
        actor method runs in Dask's actor thread, where taking the sinks' lists raced the
        loop appending to them (an output appended between the copy and the swap was lost;
        the likely cause of 13 of 1.26M window-join rows missing once in a fresh-clone run,
        when polls came right as the instances ended: 1 in 5 runs of that test, 0 in 12
        since)."""
        return self.status_row()

    def status_row(self) -> dict:
        """Status and figures; outputs too, unless the job checkpoints (then each
        checkpoint's acknowledgement carries them, see ``Checkpointed.seal``)."""
        staged = self.sinks.staged
        return {"status": self.status, "error": self.error, "lists": {} if staged else self.sinks.take_lists(),
                "records_in": self.records_in, "records_out": self.records_out,
                "started_at": self.started_at, "finished_at": self.finished_at,
                "offsets": dict(self.source.offsets) if self.source else {},
                "dead_letters": [] if staged else self.dead.take(),
                "offered_rate": self.source.offered_rate if self.source else None,
                "lag": self.source.lag if self.source else 0.0,
                "watermark": self.watermarks.status(),
                "keys": getattr(self.store, "approx_len", self.store.__len__)()
                if self.store is not None and self.stage.kind == "aggregate" else None}

    def metrics(self) -> list[dict]:
        return list(self.meter.rows)

    def key_kind(self) -> str | None:
        """dtype kind of the keys of an aggregate (split keys must match it); None before any."""
        return self.store.key_kind() if self.stage.kind == "aggregate" else None

    def state_size(self) -> int:
        return len(self.store) if self.store is not None else 0

    async def group_keys(self, groups: list[int]) -> list[int]:
        """Keys held here of each of ``groups`` (on the loop, where the store changes)."""
        return self.store.keys_per_group(groups).tolist() if self.store is not None else [0] * len(groups)

    async def state(self, groups: list[int] | None = None) -> pd.DataFrame:
        """The keyed state held here (of key groups ``groups``, an aggregate's), once no
        merging lazy move is half done (no key counted twice)."""
        if self.store is None:
            raise PipelineError(f"{self.stage.name!r} holds no keyed state")
        await self.owner.merged(config.seconds("migration.timeout"), lambda: self.status == "running")
        return self.store.frame() if groups is None else self.store.frame_of_groups(groups)
