"""Checkpoint storage: what a checkpoint is on disk (see docs/fault-tolerance.md).

``_format``: the snapshot format, a state blob as an Arrow table (one row per key) and back.
``_files``: snapshot files per instance, written streamed and checksummed, read back by key
group; compression.
``_manifest``: manifests (written last: a checkpoint without one is partial), reading and
verifying them, the complete checkpoints of a root.
``_retention``: old checkpoints and files no kept manifest references deleted.
``_paths``: local paths and fsspec URLs, atomic writes, the writable check.

The driver's side (trigger, collect, commit, recovery, restore) is :mod:`streamlb._recovery`;
the instance side is :mod:`streamlb._worker._checkpoint`.
"""
