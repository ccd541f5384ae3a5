"""What :func:`streamlb.run` does before and after it builds the :class:`~streamlb.Job`.

:func:`connected` reaches the cluster (an embedded ``LocalCluster``, a scheduler's address
or the caller's client) and closes what it started if the job does not start;
planning is :mod:`streamlb.planner._on_cluster`'s (the user API's layer);
:func:`start_autoscaling` starts the autoscaler of a job that asked for one.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from ..exceptions import SchedulerUnreachableError
from ._options import RunOptions

__all__ = ["connected", "start_autoscaling", "workers_ignore_ctrl_c"]

logger = logging.getLogger("streamlb.checkpoint")


@contextlib.contextmanager
def workers_ignore_ctrl_c():
    """Worker processes started meanwhile ignore SIGINT (a disposition a child inherits):
    Ctrl-C in a terminal reaches the whole process group, and the embedded cluster's
    workers must outlive it until the driver has stopped the job and closes them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _local_workers(options: RunOptions) -> int:
    """Worker processes of an embedded cluster: ``n_workers``, else the cores, at most 4."""
    return options.n_workers or min(os.cpu_count() or 1, 4)


def _connect(options: RunOptions):
    """A client of the scheduler at ``options.address`` (no cluster), or of a new embedded
    ``LocalCluster`` (and the cluster)."""
    from distributed import Client, LocalCluster

    address, n_workers = options.address, options.n_workers
    if address is None:
        from .._worker._quiet_close import QuietClose

        from ._spawn import embedded

        with workers_ignore_ctrl_c():
            # a script that calls run() at top level, with no `if __name__ == "__main__":`, works
            cluster = embedded(lambda: LocalCluster(
                n_workers=_local_workers(options), threads_per_worker=1,
                processes=True, dashboard_address=":0", silence_logs=logging.ERROR, plugins={QuietClose()},
            ))
        return Client(cluster), cluster
    timeout = options.connect_timeout
    try:
        client = Client(address, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    else:
        why = None
    if why is not None:
        # the half-made Client, kept alive by the traceback, would be collected at some later
        # moment: if a new Client is starting then, both wait on one lock for ever
        # (distributed 2026.8). Collected now, and only the message kept.
        import gc

        gc.collect()
        raise SchedulerUnreachableError(
            f"no Dask scheduler answered at {address!r} within {timeout:g}s ({why}); start one "
            "with `dask scheduler` and `dask worker <address>`, or pass address=None for an "
            "embedded local cluster"
        )
    if n_workers:
        client.wait_for_workers(n_workers, timeout=timeout)
    return client, None


@contextlib.contextmanager
def connected(options: RunOptions, client=None):
    """``(client, cluster, owned)``: the caller's ``client`` (not owned, no cluster), else a
    new client of ``options.address`` or of an embedded cluster, both closed again if the
    block raises (the job did not start)."""
    if client is not None:
        yield client, None, False
        return
    client, cluster = _connect(options)
    try:
        yield client, cluster, True
    except BaseException:
        client.close()
        if cluster is not None:
            cluster.close()
        raise


def start_autoscaling(job, options: RunOptions, ranges: dict[str, tuple[int, int]]) -> None:
    """Start ``job``'s autoscaler over the operators ``ranges``, if there are any."""
    if ranges:
        from .._reconfig._autoscale import Autoscaler

        job.autoscaler = Autoscaler(job, options.scaling, ranges, window=options.window)
        job.autoscaler.start()
