"""Jobs that outlive the process that started them (docs/jobs.md).

:func:`submit` hands a job to a cluster whose scheduler keeps a registry of jobs
(:mod:`streamlb._jobs`); :func:`jobs` lists them, :func:`attach` returns a
:class:`RemoteJob` to operate one from any process. Each submitted job has a driver
process on the cluster (``_driver``), started again from the job's latest complete
checkpoint when it is lost; ``_definition`` is what the driver starts from.
"""
from __future__ import annotations

from ._remote import RemoteJob
from ._submit import attach, client_only_outputs, jobs, submit

__all__ = ["submit", "jobs", "attach", "RemoteJob", "client_only_outputs"]
