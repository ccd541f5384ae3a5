"""Exactly-once checkpoints, savepoints, restore and recovery (see docs/fault-tolerance.md).

``_format``: the snapshot format, a state blob as an Arrow table (one row per key) and back.
``_files``: snapshot files per instance, written streamed and checksummed, read back by key
group; compression.
``_manifest``: manifests (written last: a checkpoint without one is partial), reading and
verifying them, the complete checkpoints of a root.
``_retention``: old checkpoints and files no kept manifest references deleted.
``_paths``: local paths and fsspec URLs, atomic writes, the writable check.
``_storage``: the public names of the five above, under the one name older code imports.
``_coordinator``: the driver side: trigger, collect, complete, commit sinks.
``_restore``: start a job from a checkpoint: check the graph, route, install state, rewind.
``_recovery``: restore a job from a checkpoint after a lost worker or on ``run(restore=)``.
The instance side is :mod:`streamlb._worker._checkpoint`.
"""
