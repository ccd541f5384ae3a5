"""Snapshot files: written streamed and checksummed, read back by key group.

Each keyed operator instance snapshots the state of the key groups it owns into one Arrow
IPC file (:func:`write_snapshot`), encoded as :mod:`streamlb._checkpoint._format` says. The
file goes to a temporary name and is renamed once whole; its size and crc32 are taken as it
is written, for the manifest. A restore reads back any subset of key groups
(:func:`read_groups`), so it may use another parallelism than the job that wrote the
checkpoint; every file it reads is checked against the size and crc32 its manifest lists.

Files are Arrow IPC, uncompressed unless setting ``streamlb.checkpoint.compression`` says
``lz4`` or ``zstd`` (see :data:`COMPRESSIONS`).
"""
from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.ipc

from ..exceptions import CheckpointError
from ._format import _check_kind, _merge, _meta, _run_groups, decode, encode
from ._paths import _write_atomic, resolve

__all__ = ["COMPRESSIONS", "check_compression", "write_snapshot", "read_groups"]


#: Compressions a snapshot file may have (setting ``streamlb.checkpoint.compression``).
#: ``"none"`` is the default: on a worker busy with the stream, LZ4 cost a 1 s checkpoint of
#: a million keys about three times the writer's CPU of no compression (41 ms against 13 ms)
#: for files 1.6x smaller, and the CPU is what the stream loses (docs/fault-tolerance.md).
COMPRESSIONS = ("none", "lz4", "zstd")


def check_compression(value) -> str | None:
    """The Arrow codec of compression setting ``value`` (None for ``"none"``).

    Raises
    ------
    ValueError
        Naming the setting and the valid values.
    """
    name = "none" if value is None else str(value).lower()
    if name not in COMPRESSIONS:
        raise ValueError(f"setting streamlb.checkpoint.compression is {value!r}; valid values: "
                         f"{', '.join(COMPRESSIONS)}")
    if name == "none" or not pa.Codec.is_available(name):
        return None                 # an Arrow built without the codec writes uncompressed
    return name


_READ_CHUNK = 8 << 20


# -- write -------------------------------------------------------------------------------------

class _Summing:
    """A binary file that keeps the size and crc32 of what goes through it (so a file is
    checksummed as it is written, not read back)."""

    def __init__(self, fh) -> None:
        self.fh, self.size, self.crc32, self.closed = fh, 0, 0, False

    def write(self, data) -> int:
        self.fh.write(data)
        view = memoryview(data)
        self.crc32 = zlib.crc32(view, self.crc32)
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:        # the file itself is closed by its owner
        self.closed = True

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size


def _write_ipc(fs, path: str, table: pa.Table, compression: str | None) -> tuple[int, int]:
    """Write ``table`` as an Arrow IPC file at ``path`` (through a temporary name and a
    rename), streamed: no copy of the file in memory. Returns its size and crc32."""
    options = pa.ipc.IpcWriteOptions(compression=check_compression(compression))
    out: list[_Summing] = []

    def write(fh) -> None:
        out.append(_Summing(fh))
        with pa.ipc.new_file(out[0], table.schema, options=options) as writer:
            writer.write_table(table)

    _write_atomic(fs, path, write)
    return out[0].size, out[0].crc32


def _group_ranges(table: pa.Table) -> dict:
    """Where each key group's rows are in a table: ``{g: [offset, rows]}`` in a table
    sorted by key group; ``{g: [offset, rows, keys]}`` in one kept in runs (the group's
    ``keys`` rows are among those ``rows``)."""
    groups = table.column("key_group").to_numpy()
    if not len(groups):
        return {}
    runs = _meta(table).get("runs")
    if runs:
        return {g: [off, n, k] for off, n, held in _run_groups(groups, runs)
                for g, k in held.items()}
    first = np.concatenate(([0], np.flatnonzero(groups[1:] != groups[:-1]) + 1))
    rows = np.diff(np.append(first, len(groups)))
    return {g: [o, n] for g, o, n in zip(groups[first].tolist(), first.tolist(), rows.tolist())}


def write_snapshot(url: str, relpath: str, kind: str, blob: dict, compression: str | None = None) -> dict:
    """Write a state blob as one snapshot file, ``<url>/<relpath>``.

    The blob is encoded (:func:`encode`) and streamed as an Arrow IPC file (compressed as
    ``compression`` says: one of :data:`COMPRESSIONS`, None for none) to a temporary name,
    checksummed as it goes, then renamed (atomic on a local filesystem).

    Parameters
    ----------
    url : str
        The checkpoint root (or savepoint directory).
    relpath : str
        The file's path under it, e.g. ``"data/agg/chk-000012-3.arrow"``.
    kind : {"aggregate", "stateful_map"}
        The blob's kind.
    blob : dict
        A blob of the store's ``snapshot``.
    compression : {"none", "lz4", "zstd"}, optional
        The file's compression (None: none).

    Returns
    -------
    dict
        ``{"file": relpath, "bytes": int, "crc32": int, "groups": {g: [offset, rows(, keys)]}}``:
        every key group of the blob with where its rows are in the file (see
        :func:`_group_ranges`). A blob without keys writes
        nothing: ``{"file": None, "bytes": 0, "crc32": 0, "groups": {}}``.
    """
    table = encode(kind, blob)
    if not table.num_rows:
        return {"file": None, "bytes": 0, "crc32": 0, "groups": {}}
    fs, root = resolve(url)
    path = f"{root}/{relpath}"
    try:
        size, crc = _write_ipc(fs, path, table, compression)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint file {path}: {type(exc).__name__}: {exc}") from exc
    return {"file": relpath, "bytes": size, "crc32": crc, "groups": _group_ranges(table)}


# -- read --------------------------------------------------------------------------------------

def _crc_of(fs, path: str) -> int:
    """crc32 of the file at ``path``, read in chunks."""
    crc = 0
    with fs.open(path, "rb") as fh:
        while chunk := fh.read(_READ_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _file_entry(manifest: dict, relpath: str) -> dict:
    try:
        return manifest["files"][relpath]
    except KeyError:
        raise CheckpointError(
            f"checkpoint file {relpath} is referenced but not listed in the manifest's files "
            f"(no size or checksum to check it against)") from None


def _check_bytes(relpath: str, path: str, info: dict, size: int, crc: int) -> None:
    if size != info["bytes"]:
        raise CheckpointError(
            f"checkpoint file {relpath} has {size} bytes, the manifest says {info['bytes']} "
            f"(truncated or overwritten: {path})")
    if crc != info["crc32"]:
        raise CheckpointError(
            f"checkpoint file {relpath} fails its checksum: crc32 {crc}, the manifest says "
            f"{info['crc32']} (corrupt: {path})")


def _read_file(fs, root: str, relpath: str, info: dict) -> pa.Table:
    """The table of one snapshot file, its size and crc32 checked."""
    path = f"{root}/{relpath}"
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {relpath} is missing ({path})") from None
    _check_bytes(relpath, path, info, len(data), zlib.crc32(data))
    try:
        return pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except pa.ArrowException as exc:
        raise CheckpointError(f"checkpoint file {relpath} is not an Arrow IPC file: {exc}") from exc


def _ranges_by_file(entry: dict, groups) -> dict[str, tuple[list, list]]:
    """``{relpath: ([(offset, rows), ...], [g, ...])}``: the ranges of rows holding the key
    groups ``groups`` held in ``entry`` (an operator of a manifest), adjacent ranges
    merged, and the groups to take from that file."""
    held = entry.get("groups", {})
    by_file: dict[str, tuple[list, list]] = {}
    for g in dict.fromkeys(int(g) for g in groups):
        loc = held.get(str(g), held.get(g))
        if loc is not None:
            relpath, offset, rows = loc[:3]
            ranges, wanted = by_file.setdefault(relpath, ([], []))
            ranges.append((int(offset), int(rows)))
            wanted.append(g)
    for relpath, (ranges, wanted) in by_file.items():
        merged: list = []
        for off, rows in sorted(set(ranges)):     # groups of one run share its range
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + rows)
            else:
                merged.append((off, rows))
        by_file[relpath] = (merged, wanted)
    return by_file


def read_groups(base: str, manifest: dict, operator: str, kind: str, groups) -> dict:
    """The blob holding exactly the state of key groups ``groups`` of ``operator``.

    Parameters
    ----------
    base : str
        The base of the manifest (:func:`read_manifest`).
    manifest : dict
        The manifest.
    operator : str
        The operator whose state is read.
    kind : {"aggregate", "stateful_map"}
        The operator's kind of store.
    groups : iterable of int
        Key groups to read; those the checkpoint holds no state of are skipped.

    Returns
    -------
    dict
        A blob for the store's ``install`` (an empty blob when no group held state). Each
        file needed is read once, its size and crc32 checked.

    Raises
    ------
    CheckpointError
        When the manifest has no such operator, or a file is missing, corrupt, or of
        another kind.
    """
    _check_kind(kind)
    operators = manifest["operators"]
    if operator not in operators:
        raise CheckpointError(
            f"the checkpoint holds no state of operator {operator!r} (it has "
            f"{', '.join(map(repr, sorted(operators))) or 'none'}): the graph restored into "
            f"does not match it")
    fs, root = resolve(base)
    blobs = []
    for relpath, (ranges, wanted) in _ranges_by_file(operators[operator], groups).items():
        table = _read_file(fs, root, relpath, _file_entry(manifest, relpath))
        rows = pa.concat_tables([table.slice(off, n) for off, n in ranges])
        if _meta(table).get("runs"):                # a run may hold groups to take elsewhere
            keep = np.isin(rows.column("key_group").to_numpy(), np.asarray(wanted, np.int64))
            if not keep.all():
                rows = rows.filter(pa.array(keep))
        try:
            blobs.append(decode(kind, rows))
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint file {relpath}: {exc}") from None
    return _merge(kind, blobs)
