"""Checkpoint storage under one name: the public names of the modules that hold them.

The runtime, the instances and the tests import these from here; new code imports them from
the module that holds them:

- :mod:`._format`: the snapshot format, a state blob as an Arrow table (``encode``,
  ``decode``, ``empty_blob``);
- :mod:`._files`: snapshot files, written checksummed and read back by key group
  (``write_snapshot``, ``read_groups``, ``check_compression``);
- :mod:`._manifest`: manifests and the checkpoints of a root (``write_manifest``,
  ``read_manifest``, ``verify``, ``checkpoint_ids``);
- :mod:`._retention`: old checkpoints and unreferenced files deleted (``retain``);
- :mod:`._paths`: local paths and fsspec URLs (``resolve``, ``check_writable``).
"""
from __future__ import annotations

from ._files import COMPRESSIONS, check_compression, read_groups, write_snapshot
from ._format import FORMAT, KINDS, decode, empty_blob, encode
from ._manifest import MANIFEST, checkpoint_ids, read_manifest, verify, write_manifest
from ._paths import check_writable, resolve
from ._retention import retain

__all__ = [
    "FORMAT", "MANIFEST", "resolve", "check_writable", "encode", "decode", "empty_blob",
    "write_snapshot", "write_manifest", "read_manifest", "verify", "read_groups", "checkpoint_ids",
    "retain", "COMPRESSIONS", "KINDS", "check_compression",
]
