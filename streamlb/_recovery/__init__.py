"""The driver's side of checkpoints (see docs/fault-tolerance.md).

``_coordinator``: trigger, collect, complete, commit sinks.
``_restore``: start a job from a checkpoint: check the graph, route, install state, rewind.
``_recovery``: restore a job from a checkpoint after a lost worker or on ``run(restore=)``.
Storage (what a checkpoint is on disk) is :mod:`streamlb._checkpoint`.
"""
