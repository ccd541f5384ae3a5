"""The job service's side on the scheduler: the registry of submitted jobs, which starts
and supervises their drivers and relays the calls made on them (``_registry``), the record
it keeps per job (``_record``) and how a driver process is started (``_spawn``). The
driver itself, and the client's side, are :mod:`streamlb.service`'s."""
from __future__ import annotations

from ._record import ACTIVE, TERMINAL, JobRecord
from ._registry import NAME, JobRegistry, ensure_registry

__all__ = ["ACTIVE", "TERMINAL", "JobRecord", "JobRegistry", "NAME", "ensure_registry"]
