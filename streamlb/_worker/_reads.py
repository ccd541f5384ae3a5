"""What the driver reads of an instance: status and figures, metrics rows, keyed state."""
from __future__ import annotations

import dataclasses

import pandas as pd

from .. import config
from .._state._budget import WORKER_COPIES, fits, free_memory, frame_bytes
from ..exceptions import PipelineError, StateTooLargeError
from ._lifecycle import Lifecycle


def _memory_limit() -> int | None:
    """This worker's ``memory_limit`` (None: none, or not on a worker)."""
    try:
        from distributed import get_worker

        return get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):
        return None


@dataclasses.dataclass
class Counts:
    """Records an instance applied (``records_in``) and a source emitted (``records_out``)."""
    records_in: int = 0
    records_out: int = 0


class Reads:
    """The driver's reads of one instance of ``stage``: its lifecycle ``life`` and ``counts``,
    its ``store`` (None: stateless), ``sinks``, ``dead`` letters, ``source`` (None: not a
    source), ``watermarks``, ``meter`` and ``owner`` side."""

    def __init__(self, stage, life: Lifecycle, counts: Counts, *, store, sinks, dead, source, watermarks, meter,
                 owner) -> None:
        self.stage, self.life, self.counts = stage, life, counts
        self.store, self.sinks, self.dead, self.source = store, sinks, dead, source
        self.watermarks, self.meter, self.owner = watermarks, meter, owner

    def status_row(self) -> dict:
        """Status and figures; outputs too, unless the job checkpoints (then each
        checkpoint's acknowledgement carries them, see ``CheckpointSide.seal``)."""
        life, src = self.life, self.source
        return {"status": life.status, "error": life.error, **self.sinks.poll(),
                "records_in": self.counts.records_in, "records_out": self.counts.records_out,
                "started_at": life.started_at, "finished_at": life.finished_at,
                "offsets": dict(src.offsets) if src else {},
                "offered_rate": src.offered_rate if src else None,
                "lag": src.lag if src else 0.0,
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

    def state_estimate(self, groups: list[int] | None = None) -> dict:
        """What :meth:`state` of ``groups`` would build (``rows``, ``bytes``) and the memory
        this worker has ``free`` for it (see ``streamlb._state._budget``)."""
        if self.store is None:
            raise PipelineError(f"{self.stage.name!r} holds no keyed state")
        rows, kinds = self.store.read_estimate(groups)
        held = self.store.keys_per_group(range(self.store.groups) if groups is None else groups)
        return {"rows": rows, "bytes": frame_bytes(rows, kinds), "free": free_memory(_memory_limit()),
                "groups": int((held > 0).sum())}

    async def state(self, groups: list[int] | None = None, nbytes: int | None = None) -> pd.DataFrame:
        """The keyed state held here (of key groups ``groups``, an aggregate's), once no
        merging lazy move is half done (no key counted twice). ``nbytes``: the driver's
        estimate of it, checked again against what is free here now (a read that would not
        fit raises ``StateTooLargeError`` rather than take the worker down)."""
        if self.store is None:
            raise PipelineError(f"{self.stage.name!r} holds no keyed state")
        await self.owner.merged(config.seconds("migration.timeout"), lambda: self.life.phase.live)
        if nbytes is not None:
            free = free_memory(_memory_limit())
            if not fits(nbytes, free, WORKER_COPIES):
                raise StateTooLargeError(
                    f"state of {self.life.label}: a frame of about {nbytes / 2**20:,.0f} MiB, {WORKER_COPIES}x that "
                    f"while it is built and sent, does not fit in the {free / 2**20:,.0f} MiB this worker has free "
                    "now; read it by key groups "
                    f"(job.state(..., key_groups=...))", self.stage.name, nbytes, free)
        return self.store.frame() if groups is None else self.store.frame_of_groups(groups)
