"""``BalancerPlugin`` and the job registry: streamlb's scheduler plugins.

Register the balancer with ``client.register_plugin(BalancerPlugin(...))``, or both at
scheduler start with ``dask scheduler --preload streamlb.plugin`` (``dask_setup`` below
adds them, with settings from dask config ``streamlb.*``). ``--streamlb-jobs-dir D`` after
the preload gives the job registry its directory (setting ``streamlb.jobs.dir``): jobs
submitted with :func:`streamlb.submit` then resume by themselves after the scheduler is
started again on that directory (docs/jobs.md). The balancer lives in
``streamlb._migration._plugin``, the registry in ``streamlb._jobs``.
"""
from __future__ import annotations

import click

from ._jobs import JobRegistry
from ._migration._plugin import NAME, BalancerPlugin, _Job, ensure_plugin  # noqa: F401

__all__ = ["BalancerPlugin", "JobRegistry", "dask_setup"]


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--streamlb-jobs-dir", default=None, type=click.Path(file_okay=False),
              help="Directory of the job registry: submitted jobs survive a scheduler restart on it "
                   "(setting streamlb.jobs.dir; default a temporary directory).")
def dask_setup(scheduler, streamlb_jobs_dir=None) -> None:
    """Preload hook: ``dask scheduler --preload streamlb.plugin [--streamlb-jobs-dir D]``."""
    scheduler.add_plugin(BalancerPlugin(), name=NAME)
    scheduler.add_plugin(JobRegistry(streamlb_jobs_dir), name=JobRegistry.name)
