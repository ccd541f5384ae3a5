"""``submit``, ``jobs`` and ``attach``: hand a job to a cluster, list its jobs, operate one.

``submit`` checks and plans the graph as :func:`streamlb.run` does, then hands the job's
definition (:mod:`._definition`) to the scheduler's job registry
(:class:`streamlb._jobs.JobRegistry`, registered if the scheduler has none), which starts
its driver on the cluster; the calling process may exit at once.
"""
from __future__ import annotations

import uuid
from typing import Any

from ..exceptions import JobServiceError
from . import _definition
from ._remote import RemoteJob, connect, scheduler_call

__all__ = ["submit", "jobs", "attach", "client_only_outputs"]


def client_only_outputs(plan) -> str | None:
    """Why ``plan``'s results could reach only the process that submitted it (a list sink,
    or no sink at all), or None."""
    from .._sinks import sink_steps

    kinds = {}
    for st in plan.stages:
        for step in sink_steps([*st.children, *st.late]):
            kinds.setdefault(step.kind, st.name)
    if "list_sink" in kinds:
        return (f"operator {kinds['list_sink']!r} ends in sink_to_list (or .sink(list.append)), whose list lives in "
                "the submitting process, which may exit: write the results with .to_parquet(path) or "
                ".to_kafka_topic(...), or run the job with streamlb.run")
    if not kinds:
        return ("the pipeline has no sink: its results could only be read with job.state() by the process that "
                "runs it; add .to_parquet(path) or .to_kafka_topic(...), or run the job with streamlb.run")
    return None


def submit(node, address: str | None = None, name: str | None = None, *, client=None, security=None,
           wait: bool = True, **options: Any) -> RemoteJob:
    """Plan the pipeline ``node`` belongs to and hand it to the cluster at ``address``, which
    runs it whether or not this process lives on; return a handle.

    Parameters
    ----------
    node : streamz.Stream
        Any node of the pipeline, as for :func:`streamlb.run`.
    address : str
        The scheduler (``tcp://...`` or ``tls://...``). Required unless ``client`` is given:
        a job handed to an embedded cluster would die with this process.
    name : str, optional
        The job's name on the cluster (1-64 letters, digits, ``.``, ``_``, ``-``); default
        ``job-<8 hex digits>``. Refused while a job of that name runs.
    client : distributed.Client, optional
        A client of the cluster instead of ``address``.
    security : distributed.Security, optional
        For a TLS cluster, as for a Dask ``Client``.
    wait : bool
        Return once the job's driver runs it (default); False returns at once.
    **options
        Every keyword of :func:`streamlb.run` but ``n_workers`` and ``client``:
        ``checkpoint=`` (without it a lost driver cannot be resumed), ``restore=``,
        ``parallelism=``, ``balancer=``...

    Raises
    ------
    JobServiceError
        A pipeline whose outputs only this process could receive (a list sink, or no sink),
        a name taken by a running job, a bad name, a cluster without workers.
    PipelineError, CheckpointError
        As :func:`streamlb.run` raises them, before anything reaches the cluster.
    """
    from .._jobs import ensure_registry
    from .._job._options import RunOptions
    from ..planner import _on_cluster

    name = name or f"job-{uuid.uuid4().hex[:8]}"
    if "n_workers" in options:
        raise JobServiceError("submit takes no n_workers=: the job runs on the workers of the cluster at address= "
                              "(start them with `dask worker`)")
    run_options = RunOptions.build(address=address, **options)
    _on_cluster.check_graph(node, run_options)
    client, owned = connect(address, client, security)
    try:
        workers, plan, ranges = _on_cluster.plan_on(client, node, run_options)
        why = client_only_outputs(plan)
        if why is not None:
            raise JobServiceError(f"job {name!r} cannot be submitted: {why}")
        ensure_registry(client)
        data = _definition.dump(name, plan, run_options, ranges)
        scheduler_call(client, "streamlb_jobs_submit", name=name, definition=data,
                       checkpoint=run_options.checkpoint, versions=_definition.versions(), workers=len(workers))
        job = RemoteJob(client, name, owns_client=owned)
        if wait:
            job.running()
        return job
    except BaseException:
        if owned:
            client.close()
        raise


def jobs(address: str | None = None, *, client=None, security=None):
    """The jobs of the cluster at ``address``, as a DataFrame, oldest first: ``name``,
    ``id``, ``status``, ``uptime`` (seconds the current driver has run it), ``parallelism``
    (per operator), ``records_per_s``, ``checkpoint`` (the last complete one's id),
    ``checkpoint_age`` (seconds), ``restarts`` (drivers started again after a loss) and
    ``recoveries`` (from lost workers), ``error``."""
    import time

    import pandas as pd

    client, owned = connect(address, client, security)
    try:
        records = scheduler_call(client, "streamlb_jobs_list")
    finally:
        if owned:
            client.close()
    rows = []
    for r in records:
        info = r.get("info") or {}
        cp = info.get("checkpoint") or {}
        live = r["status"] in ("running", "stopping")
        rows.append({"name": r["name"], "id": r["id"], "status": r["status"], "uptime": r.get("uptime"),
                     "parallelism": info.get("parallelism", {}),
                     "records_per_s": info.get("records_per_s") if live else None,
                     "checkpoint": cp.get("id"),
                     "checkpoint_age": (time.time() - cp["completed"]) if cp.get("completed") else None,
                     "restarts": r.get("restarts", 0), "recoveries": info.get("recoveries", 0),
                     "error": r.get("error")})
    return pd.DataFrame(rows, columns=["name", "id", "status", "uptime", "parallelism", "records_per_s",
                                       "checkpoint", "checkpoint_age", "restarts", "recoveries", "error"])


def attach(address: str | None, name: str, *, client=None, security=None) -> RemoteJob:
    """A handle on the job ``name`` of the cluster at ``address`` (see :class:`RemoteJob`);
    :class:`JobServiceError` if the cluster has no job of that name."""
    client, owned = connect(address, client, security)
    job = RemoteJob(client, name, owns_client=owned)
    try:
        job.describe()
    except BaseException:
        job.close()
        raise
    return job
