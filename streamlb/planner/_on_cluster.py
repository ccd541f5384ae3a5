"""A job's graph planned for its cluster: what :func:`streamlb.run` does between reaching the
cluster and building the :class:`~streamlb.Job`.

:func:`check_graph` raises what planning raises before any cluster starts; :func:`plan_on`
plans the graph on the cluster's workers and checks what needs the plan (a restored
checkpoint fits it, the operators ``autoscale`` names exist).
"""
from __future__ import annotations

import logging

from .._job._launch import _local_workers
from .._job._options import RunOptions
from ..exceptions import StreamlbError

__all__ = ["check_graph", "plan_on"]

logger = logging.getLogger("streamlb.checkpoint")


def _checked_plan(node, options: RunOptions, workers: int):
    """``(plan, autoscale ranges)`` of the graph of ``node`` on ``workers`` workers: every
    planner check (paths, Parquet schemas and columns, event time, supported nodes, unique
    names, user functions pickled), a restored checkpoint checked against it."""
    from . import plan

    p = plan(node, workers=workers, key_groups=options.key_groups, batch_size=options.batch_size,
             parallelism=options.parallelism)
    if options.restored is not None:
        from .._recovery._restore import check_compatible

        check_compatible(options.restored, p, options.key_groups, options.restore or options.checkpoint,
                         resumed=options.resumed)
    ranges = options.autoscale_ranges(p.stages) if options.scaling is not None else {}
    return p, ranges


def check_graph(node, options: RunOptions) -> None:
    """Raise what planning ``node``'s graph raises, before any cluster is started or reached.

    The graph is planned on a nominal worker count (``n_workers``, else what an embedded
    cluster would start): no check depends on how many workers there are, only the
    parallelism of the plan does, and :func:`plan_on` plans again on the real workers.
    Warnings of planning are left to that real plan, so each shows once.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _checked_plan(node, options, _local_workers(options))


def plan_on(client, node, options: RunOptions):
    """``(workers, plan, autoscale ranges)``: the graph of ``node`` planned on the
    cluster's workers, a restored checkpoint checked against it."""
    from .._placement import cluster_workers
    from ._checks import pace_batches

    workers = sorted(cluster_workers(client))
    if not workers:
        raise StreamlbError(f"the cluster at {client.scheduler.address} has no workers")
    p, ranges = _checked_plan(node, options, len(workers))
    if options.resumed:
        logger.info("checkpoint=%r holds complete checkpoints: resuming from the latest, checkpoint %s "
                    "(restore= starts from another)", options.checkpoint, options.restored[0].get("id"))
    options.stamp_state(p.stages)
    pace_batches(p, options.window, given=options.batch_size_given)
    return workers, p, ranges
