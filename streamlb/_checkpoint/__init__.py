"""Exactly-once checkpoints, savepoints, restore and recovery (see docs/fault-tolerance.md).

``_storage``: columnar snapshot files per key group, manifests, checksums, retention.
``_coordinator``: the driver side: trigger, collect, complete, commit sinks.
``_recovery``: restore a job from a checkpoint after a lost worker or on ``run(restore=)``.
The instance side is :mod:`streamlb._worker._checkpoint`.
"""
