"""The driver side of a job, behind the one public handle :class:`streamlb.Job`.

:func:`streamlb.run` checks its arguments into one frozen :class:`RunOptions`
(``_options``), reaches a cluster and plans the graph on it (``_launch``), and builds the
``Job``, which composes one part per concern, each in its own private module:

- ``_lifecycle``: deploy, start, poll, wait, fail, stop, Ctrl-C, the exit hook;
- ``_release``: letting go of instances, whether the cluster is gone, closing the client;
- ``_results``: state, metrics, imbalance, dead letters, offsets, summary, load traces;
- ``_reconfigure``: rescale, move, update, migrate, reassign, split, routing, topology,
  history;
- ``_checkpoints``: the checkpointer and recovery, savepoints, the checkpoint record.

The parts share the job's deployment (its plan, actors, routing tables and locks), which
stays on the ``Job`` where the reconfiguration and checkpoint packages read it.
"""
from __future__ import annotations

from ._options import RunOptions

__all__ = ["RunOptions"]
