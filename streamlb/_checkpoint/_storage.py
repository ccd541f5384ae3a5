"""Checkpoint storage: columnar snapshot files per key group, manifests, checksums, retention.

Each keyed operator instance snapshots the state of the key groups it owns into one Arrow
IPC file (:func:`write_snapshot`); the coordinator then writes a manifest naming every file
and, per operator, the file and row range of each key group (:func:`write_manifest`). The
manifest is written last, by an atomic rename: a checkpoint without one is partial and never
restored from. A restore reads back any subset of key groups (:func:`read_groups`), so it
may use another parallelism than the job that wrote the checkpoint.

Layout under a checkpoint root (a local directory or any fsspec URL)::

    <root>/data/<operator>/<file>.arrow     snapshot files, shared by checkpoints
    <root>/chk-<id:06d>/_manifest.json      one per complete checkpoint, "base": ".."

A savepoint is self-contained::

    <path>/data/<operator>/<file>.arrow
    <path>/_manifest.json                   "base": "."

A manifest is JSON with at least::

    {"format": 1,
     "base": "..",                                  # the root, relative to the manifest's dir
     "files": {relpath: {"bytes": int, "crc32": int}},
     "operators": {operator: {"groups": {"<g>": [relpath, offset, rows(, keys)]}}}}

File paths in ``files`` and ``groups`` are relative to the base. A key group absent from an
operator's ``groups`` held no state. An incremental checkpoint references the files of its
predecessors for the key groups that did not change.

A snapshot file holds one row per key: ``key_group`` (int32), ``key``, then the state. Its
rows are sorted by key group, and a group's entry ``[relpath, offset, rows]`` gives them all;
or the file keeps the rows as the store held them, in *runs* (one per shard of the store,
listed in the schema metadata) that each hold whole key groups: then the entry is
``[relpath, offset, rows, keys]``, the run's rows, among which the group's ``keys`` (a reader
keeps those of the groups it wants). Writing runs spares a sort of every snapshot.

Aggregate state has one column per table, ``"<name>:<column>"`` (name one of cnt / sum / min
/ max); a stateful map has ``state``, each one ``cloudpickle.dumps(state)``.
The schema's metadata holds what :func:`decode` needs to give back the exact blob.

Files are Arrow IPC, uncompressed unless setting ``streamlb.checkpoint.compression`` says
``lz4`` or ``zstd`` (see :data:`COMPRESSIONS`).
"""
from __future__ import annotations

import json
import os
import pickle
import posixpath
import re
import uuid
import zlib
from datetime import datetime

import cloudpickle
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.ipc

from ..exceptions import CheckpointError

__all__ = [
    "FORMAT", "MANIFEST", "resolve", "check_writable", "encode", "decode", "empty_blob",
    "write_snapshot", "write_manifest", "read_manifest", "verify", "read_groups", "checkpoint_ids",
    "retain",
]

#: Version of the snapshot files and manifests this module writes.
FORMAT = 1

#: File name of a manifest, in a ``chk-<id>`` directory or a savepoint.
MANIFEST = "_manifest.json"

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


KINDS = ("aggregate", "stateful_map")
_TABLES = ("cnt", "sum", "min", "max")
_REQUIRED = ("format", "files", "operators")
_CHK = re.compile(r"chk-(\d+)")
_READ_CHUNK = 8 << 20
_META = "streamlb."

# Python key types stored as Arrow columns; any other key is pickled.
_ARROW_KEYS = {str: pa.large_string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64(),
               bytes: pa.large_binary()}


# -- paths -----------------------------------------------------------------------------------

def _is_plain(url: str) -> bool:
    """Whether ``url`` is a plain local path (no protocol, no chained URL)."""
    return "://" not in url and "::" not in url


def _norm(url) -> str:
    """``url`` as a string: plain local paths absolute, no trailing slash."""
    url = os.fspath(url)
    if _is_plain(url):
        return os.path.abspath(os.path.expanduser(url))
    stripped = url.rstrip("/")
    return stripped if not stripped.endswith(":") else url


def _child(url: str, rel: str) -> str:
    """``rel`` (slash-separated) under ``url``."""
    return url.rstrip("/") + "/" + rel.lstrip("/")


def _relative(url: str, rel: str) -> str:
    """``url`` moved by the relative path ``rel`` (``"."``, ``".."``, ``"../x"``)."""
    if rel.startswith("/") or not _is_plain(rel):
        return rel
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            head = url.rstrip("/").rsplit("/", 1)[0]
            url = head if head and not head.endswith(":") and not head.endswith(":/") else url
        else:
            url = _child(url, part)
    return url


def resolve(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem of ``url`` and the path within it.

    Parameters
    ----------
    url : str
        A local path (made absolute) or any fsspec URL (``s3://bucket/chk``, ``memory://x``).

    Returns
    -------
    tuple
        ``(fs, path)``: path without the protocol, as ``fs`` takes it.
    """
    return fsspec.core.url_to_fs(_norm(url))


def _exists(fs, path: str) -> bool:
    try:
        return fs.exists(path)
    except FileNotFoundError:
        return False


def _write_atomic(fs, path: str, data) -> None:
    """Write ``data`` (bytes, or a function writing to an open binary file) to ``path``
    through a temporary name in the same directory and a rename (atomic on a local
    filesystem; on object stores a put is atomic anyway)."""
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with fs.open(tmp, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data)
        fs.mv(tmp, path)
    except BaseException:
        try:
            _remove(fs, tmp)
        except Exception:       # the write's own error is the one to report
            pass
        raise


def _remove(fs, path: str, recursive: bool = False) -> bool:
    """Delete ``path``; False when it is already gone (a race is no error)."""
    try:
        if recursive:
            fs.rm(path, recursive=True)
        else:
            fs.rm_file(path)
        return True
    except FileNotFoundError:
        return False


def check_writable(url: str) -> None:
    """Create the directory ``url`` if missing and write and delete a probe file there.

    Raises
    ------
    CheckpointError
        When the directory cannot be created or written.
    """
    try:
        fs, root = resolve(url)
        fs.makedirs(root, exist_ok=True)
        probe = f"{root}/.streamlb-probe-{uuid.uuid4().hex}"
        fs.pipe_file(probe, b"streamlb")
        fs.rm_file(probe)
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint path {url!r} is not writable: {type(exc).__name__}: {exc}; give a "
            f"directory (or fsspec URL) the workers and the driver can write"
        ) from exc


# -- keys ------------------------------------------------------------------------------------

def _encode_keys(keys) -> tuple[pa.Array, str]:
    """Keys (a numpy array or a list of Python values) as an Arrow array, and how they
    were stored: ``"arrow"``, or ``"pickle"`` (one pickle per key) for keys Arrow would not
    give back as they were (mixed types, subclasses, ints past int64)."""
    if isinstance(keys, np.ndarray) and keys.dtype != object:
        return pa.array(keys), "arrow"
    types = set(map(type, keys))
    if len(types) == 1 and next(iter(types)) in _ARROW_KEYS:
        try:
            return pa.array(keys, type=_ARROW_KEYS[next(iter(types))]), "arrow"
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    return pa.array([cloudpickle.dumps(k) for k in keys], type=pa.large_binary()), "pickle"


def _key_list(column: pa.ChunkedArray, encoding: str) -> list:
    """Keys as Python values."""
    if encoding == "pickle":
        return [pickle.loads(b) for b in column.to_pylist()]
    return column.to_pylist()


def _key_array(column: pa.ChunkedArray, encoding: str, dtype: np.dtype) -> np.ndarray:
    """Keys as the numpy array of ``dtype`` they were."""
    if encoding == "pickle":
        out = np.empty(len(column), object)
        out[:] = _key_list(column, encoding)
        return out
    arr = column.to_numpy()
    return arr if arr.dtype == dtype else arr.astype(dtype)


# -- encode ----------------------------------------------------------------------------------

def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown state kind {kind!r}; expected one of {', '.join(KINDS)}")


def _schema_meta(kind: str, key_encoding: str, **extra) -> dict:
    meta = {"kind": kind, "format": FORMAT, "key_encoding": key_encoding, **extra}
    return {f"{_META}{k}".encode(): json.dumps(v).encode() for k, v in meta.items()}


def _meta(table: pa.Table) -> dict:
    raw = table.schema.metadata or {}
    return {k[len(_META):].decode(): json.loads(v) for k, v in raw.items() if k.startswith(_META.encode())}


def _stable_order(groups: np.ndarray) -> np.ndarray:
    """The stable sort order of key groups ``groups``: a radix sort (as uint16) when they
    fit, 5x cheaper than the merge sort of wider integers."""
    if len(groups) and 0 <= groups.min() and groups.max() < 1 << 16:
        return np.argsort(groups.astype(np.uint16), kind="stable")
    return np.argsort(groups, kind="stable")


def _run_groups(groups: np.ndarray, runs) -> list | None:
    """``[(offset, rows, {g: keys})]`` of each run of rows, or None when a key group has
    rows in two runs (or runs do not cover the rows end to end)."""
    out, seen, at = [], set(), 0
    for off, n in runs or ():
        if off != at:
            return None
        counts = np.bincount(groups[off:off + n])
        held = np.flatnonzero(counts)
        if seen.intersection(held.tolist()):
            return None
        seen.update(held.tolist())
        out.append((off, n, dict(zip(held.tolist(), counts[held].tolist()))))
        at = off + n
    return out if runs and at == len(groups) else None


def _sorted_table(kind: str, groups: np.ndarray, keys, state: list, meta: dict, runs=None) -> pa.Table:
    """The table of ``key_group``, ``key`` and the ``state`` columns (``(name, array)``
    pairs), rows sorted by key group (stable); or, given ``runs`` of rows that each hold
    whole key groups, the rows as they are (the runs noted in the schema metadata)."""
    groups = np.asarray(groups, np.int64)
    located = _run_groups(groups, runs) if len(groups) else None
    if located is not None:
        meta = {**meta, "runs": [[off, n] for off, n, _ in located]}
    key_col, encoding = _encode_keys(keys)       # in their order: Python objects in memory order
    table = pa.Table.from_arrays(
        [pa.array(groups.astype(np.int32)), key_col, *[arr for _, arr in state]],
        names=["key_group", "key", *[name for name, _ in state]], metadata=_schema_meta(kind, encoding, **meta))
    if located is not None or (len(groups) and (groups[1:] >= groups[:-1]).all()):
        return table                                # sorted already, or in runs: no copy
    return table.take(pa.array(_stable_order(groups)))


def _joined(arrays: list) -> np.ndarray:
    """``arrays`` end to end; a single array as it is (no copy)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _agg_column(parts: list, t: tuple) -> pa.Array:
    """Table ``t`` of every part as one Arrow array, null in the rows of parts without it."""
    have = [p["tables"][t] for p in parts if t in p["tables"]]
    dtype = np.result_type(*[v.dtype for v in have])
    if len(have) == len(parts):
        return pa.array(_joined([v.astype(dtype, copy=False) for v in have]))
    values = np.concatenate([p["tables"][t].astype(dtype, copy=False) if t in p["tables"]
                             else np.zeros(len(p["keys"]), dtype) for p in parts])
    missing = np.concatenate([np.full(len(p["keys"]), t not in p["tables"]) for p in parts])
    return pa.array(values, mask=missing)


def _encode_aggregate(blob: dict) -> pa.Table:
    parts = [p for p in blob["parts"] if len(p["keys"])]
    tables = list(dict.fromkeys(t for p in parts for t in p["tables"]))
    for name, _ in tables:
        if name not in _TABLES:
            raise ValueError(f"aggregate table {name!r} is none of {', '.join(_TABLES)}")
    if parts:
        keys = _joined([p["keys"] for p in parts])
        groups = _joined([p["key_groups"] for p in parts])
    else:
        keys, groups = np.empty(0, np.int64), np.empty(0, np.int64)
    state = [(f"{name}:{c}", _agg_column(parts, (name, c))) for name, c in tables]
    meta = {"dtypes": [[c, np.dtype(dt).str] for c, dt in blob["dtypes"].items()],
            "tables": [[name, c] for name, c in tables], "key_dtype": keys.dtype.str}
    return _sorted_table("aggregate", groups, keys, state, meta, runs=blob.get("runs") if len(parts) == 1 else None)


def _encode_stateful_map(blob: dict) -> pa.Table:
    states = blob["states"]
    pickled = pa.array([cloudpickle.dumps(s) for s in states.values()], type=pa.large_binary())
    return _sorted_table("stateful_map", blob["key_groups"], list(states), [("state", pickled)], {})


def encode(kind: str, blob: dict) -> pa.Table:
    """A state blob as an Arrow table, one row per key, sorted by key group.

    Parameters
    ----------
    kind : {"aggregate", "stateful_map"}
        The store the blob comes from (``snapshot``/``cut`` of
        :class:`~streamlb._state.AggregateState` or :class:`~streamlb._state.StatefulMapState`).
    blob : dict
        The blob.

    Returns
    -------
    pyarrow.Table
        Columns ``key_group`` (int32), ``key``, then the state: ``"<table>:<column>"`` per
        aggregate table (null in the rows of a part without that table), or ``state``
        (binary, cloudpickled). The schema metadata (``streamlb.*``, JSON) holds the kind,
        the dtypes and how the keys are stored, for :func:`decode`.
    """
    _check_kind(kind)
    return _encode_aggregate(blob) if kind == "aggregate" else _encode_stateful_map(blob)


# -- decode ----------------------------------------------------------------------------------

def empty_blob(kind: str) -> dict:
    """A blob of ``kind`` holding no key."""
    _check_kind(kind)
    if kind == "aggregate":
        return {"dtypes": {}, "parts": []}
    return {"states": {}, "key_groups": np.zeros(0, np.int64)}


def _hashable(name):
    """A column name back from JSON (a tuple name came back as a list)."""
    return tuple(map(_hashable, name)) if isinstance(name, list) else name


def _patterns(columns: list) -> np.ndarray | None:
    """For each row, a code of which state columns are valid; None when all are."""
    if all(col.null_count == 0 for col in columns):
        return None
    code = np.zeros(len(columns[0]), np.int64)
    for bit, col in enumerate(columns):
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        code |= valid.astype(np.int64) << bit
    return code


def _decode_aggregate(table: pa.Table, meta: dict) -> dict:
    dtypes = {_hashable(c): np.dtype(dt) for c, dt in meta["dtypes"]}
    if not table.num_rows:
        return {"dtypes": dtypes, "parts": []}
    tables = [(name, _hashable(c)) for name, c in meta["tables"]]
    columns = [table.column(2 + i) for i in range(len(tables))]     # by place: names may clash
    keys = _key_array(table.column("key"), meta["key_encoding"], np.dtype(meta["key_dtype"]))
    groups = table.column("key_group").to_numpy().astype(np.int64)
    code = _patterns(columns)
    if code is None:
        return {"dtypes": dtypes, "parts": [
            {"keys": keys, "key_groups": groups,
             "tables": {t: col.to_numpy() for t, col in zip(tables, columns)}}]}
    parts = []
    for pattern in dict.fromkeys(code.tolist()):
        rows = np.flatnonzero(code == pattern)
        idx = pa.array(rows)
        parts.append({"keys": keys[rows], "key_groups": groups[rows],
                      "tables": {t: col.take(idx).to_numpy() for bit, (t, col) in enumerate(zip(tables, columns))
                                 if pattern >> bit & 1}})
    return {"dtypes": dtypes, "parts": parts}


def _decode_stateful_map(table: pa.Table, meta: dict) -> dict:
    keys = _key_list(table.column("key"), meta["key_encoding"])
    states = [pickle.loads(b) for b in table.column("state").to_pylist()]
    return {"states": dict(zip(keys, states)),
            "key_groups": table.column("key_group").to_numpy().astype(np.int64)}


def decode(kind: str, table: pa.Table) -> dict:
    """An Arrow table of :func:`encode` (or rows of one) back as a blob the store's
    ``install`` takes: the same keys, values and dtypes.

    Parameters
    ----------
    kind : {"aggregate", "stateful_map"}
        The kind of store restored into; it must be the one the table was written from.
    table : pyarrow.Table
        Rows of a table :func:`encode` made (any slice or concatenation of them).

    Returns
    -------
    dict
        The blob. Aggregate rows that lacked some table come back as parts of their own.

    Raises
    ------
    CheckpointError
        When the table was written from another kind of state, or not by this module.
    """
    _check_kind(kind)
    meta = _meta(table)
    if meta.get("kind") != kind:
        raise CheckpointError(
            f"snapshot holds state of kind {meta.get('kind')!r}, not {kind!r}: the operator "
            f"restored into is not the one checkpointed")
    return _decode_aggregate(table, meta) if kind == "aggregate" else _decode_stateful_map(table, meta)


# -- snapshot files --------------------------------------------------------------------------

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


# -- manifests -------------------------------------------------------------------------------

def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def write_manifest(url: str, name: str, manifest: dict) -> str:
    """Write ``manifest`` as ``<url>/<name>/_manifest.json``, through a temporary file and
    a rename: written last, it makes the checkpoint visible.

    Parameters
    ----------
    url : str
        The checkpoint root.
    name : str
        The checkpoint's directory, e.g. ``"chk-000012"`` (``"."`` or ``""`` for a
        savepoint, whose manifest sits in ``url`` itself).
    manifest : dict
        The manifest (see the module docstring); it needs ``format``, ``files`` and
        ``operators``.

    Returns
    -------
    str
        The manifest's path, in the style of ``url``.
    """
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise ValueError(f"checkpoint manifest {name!r} lacks {', '.join(map(repr, missing))}")
    data = json.dumps(manifest, default=_json_default, separators=(",", ":")).encode()
    fs, root = resolve(url)
    name = name.strip("/")
    rel = f"{name}/{MANIFEST}" if name not in ("", ".") else MANIFEST
    path = f"{root}/{rel}"
    try:
        _write_atomic(fs, path, data)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint manifest {path}: {type(exc).__name__}: {exc}") from exc
    return _child(_norm(url), rel)


def _load_manifest(fs, path: str) -> dict:
    """The manifest at ``path``, checked to be a manifest."""
    try:
        with fs.open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint manifest {path} is missing (deleted meanwhile?)") from exc
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint manifest {path} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise CheckpointError(f"checkpoint manifest {path} holds a {type(manifest).__name__}, not an object")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise CheckpointError(
            f"checkpoint manifest {path} lacks the key(s) {', '.join(map(repr, missing))}: "
            f"not a streamlb checkpoint manifest")
    return manifest


def _chk_dirs(fs, root: str) -> dict[int, str]:
    """``{id: path}`` of the ``chk-<id>`` directories under ``root`` (complete or not)."""
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for e in entries:
        m = _CHK.fullmatch(posixpath.basename(e["name"].rstrip("/")))
        if m and e.get("type") == "directory":
            out[int(m.group(1))] = e["name"].rstrip("/")
    return out


def _complete(fs, dirs: dict[int, str]) -> list[int]:
    """Ids of the directories of ``dirs`` that hold a manifest, ascending."""
    return sorted(i for i, d in dirs.items() if _exists(fs, f"{d}/{MANIFEST}"))


def checkpoint_ids(url: str) -> list[int]:
    """Ids of the complete checkpoints (``chk-<id>/_manifest.json``) under ``url``,
    ascending; none when ``url`` does not exist."""
    fs, root = resolve(url)
    return _complete(fs, _chk_dirs(fs, root))


def read_manifest(url: str) -> tuple[dict, str]:
    """The manifest of a checkpoint or savepoint, and the base its files are named from.

    Parameters
    ----------
    url : str
        A checkpoint root (the complete checkpoint of the highest id is taken), one
        ``chk-<id>`` directory, or a savepoint directory (holding ``_manifest.json``).

    Returns
    -------
    tuple
        ``(manifest, base)``: ``base`` is the manifest's ``"base"`` resolved against its
        directory, in the style of ``url``; pass it to :func:`verify` and :func:`read_groups`.

    Raises
    ------
    CheckpointError
        When ``url`` does not exist, holds no complete checkpoint, or its manifest is not
        valid JSON or lacks ``format``, ``files`` or ``operators``.
    """
    url = _norm(url)
    fs, root = resolve(url)
    if not _exists(fs, root):
        raise CheckpointError(f"checkpoint path {url!r} does not exist")
    if _exists(fs, f"{root}/{MANIFEST}"):
        where = url
    else:
        dirs = _chk_dirs(fs, root)
        ids = _complete(fs, dirs)
        if not ids:
            raise CheckpointError(_no_checkpoint(url))
        where = _child(url, posixpath.basename(dirs[ids[-1]]))
    wfs, wpath = resolve(where)
    manifest = _load_manifest(wfs, f"{wpath}/{MANIFEST}")
    return manifest, _relative(where, str(manifest.get("base", ".")))


def _no_checkpoint(url: str) -> str:
    if _CHK.fullmatch(posixpath.basename(url)):
        return (f"checkpoint {url!r} is partial: it has no {MANIFEST} (a checkpoint without a "
                f"manifest is partial and never restored from)")
    return (f"no complete checkpoint under {url}: no chk-*/{MANIFEST} (a checkpoint without a "
            f"manifest is partial and never restored from)")


# -- verify and read -------------------------------------------------------------------------

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


def verify(base: str, manifest: dict) -> None:
    """Check that every file of ``manifest["files"]`` exists under ``base`` with its size
    and crc32.

    Raises
    ------
    CheckpointError
        Naming the first file missing, of another size, or failing its checksum.
    """
    fs, root = resolve(base)
    for relpath, info in manifest["files"].items():
        path = f"{root}/{relpath}"
        try:
            size = fs.size(path)
            crc = _crc_of(fs, path)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file {relpath} is missing ({path})") from None
        _check_bytes(relpath, path, info, size, crc)


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


def _merge(kind: str, blobs: list) -> dict:
    """One blob holding the keys of ``blobs`` (of distinct key groups)."""
    if not blobs:
        return empty_blob(kind)
    if len(blobs) == 1:
        return blobs[0]
    if kind == "aggregate":
        dtypes: dict = {}
        for b in blobs:
            for c, dt in b["dtypes"].items():
                dtypes.setdefault(c, dt)
        return {"dtypes": dtypes, "parts": _join_parts([p for b in blobs for p in b["parts"]])}
    states: dict = {}
    for b in blobs:
        states.update(b["states"])
    return {"states": states, "key_groups": np.concatenate([b["key_groups"] for b in blobs])}


def _join_parts(parts: list) -> list:
    """Parts with the same tables (and dtypes) joined into one, as the stores' blobs do."""
    if len(parts) > 1 and all(
            p["tables"].keys() == parts[0]["tables"].keys() and p["keys"].dtype == parts[0]["keys"].dtype
            and all(p["tables"][t].dtype == parts[0]["tables"][t].dtype for t in p["tables"])
            for p in parts):
        return [{"keys": np.concatenate([p["keys"] for p in parts]),
                 "key_groups": np.concatenate([p["key_groups"] for p in parts]),
                 "tables": {t: np.concatenate([p["tables"][t] for p in parts]) for t in parts[0]["tables"]}}]
    return parts


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


# -- retention -------------------------------------------------------------------------------

def _mtime(fs, info: dict) -> float:
    """Modification time (seconds since the epoch) of a file of an ``fs.ls``/``find``."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return fs.modified(info["name"]).timestamp()


def _drop_old(fs, dirs: dict[int, str], old: list[int]) -> list[str]:
    """Delete the checkpoints ``old``, each manifest first: one half-deleted is partial."""
    removed = []
    for i in old:
        if _remove(fs, f"{dirs[i]}/{MANIFEST}"):
            removed.append(f"{dirs[i]}/{MANIFEST}")
        if _remove(fs, dirs[i], recursive=True):
            removed.append(dirs[i])
    return removed


def _referenced(fs, dirs: dict[int, str], kept: list[int]) -> set | None:
    """Files the manifests of ``kept`` reference; None if one cannot be read."""
    refs: set = set()
    for i in kept:
        try:
            manifest = _load_manifest(fs, f"{dirs[i]}/{MANIFEST}")
        except CheckpointError:
            return None
        refs.update(manifest["files"])
        for entry in manifest["operators"].values():
            refs.update(loc[0] for loc in entry.get("groups", {}).values())
    return refs


def _sweep_data(fs, root: str, refs: set, before: float) -> list[str]:
    """Delete the files under ``<root>/data`` not in ``refs`` and older than ``before``."""
    try:
        files = fs.find(f"{root}/data", detail=True)
    except FileNotFoundError:
        return []
    removed = []
    for path, info in files.items():
        rel = posixpath.relpath(path, root)
        if info.get("type", "file") != "file" or rel in refs:
            continue
        try:
            old = _mtime(fs, info) < before
        except FileNotFoundError:
            continue
        if old and _remove(fs, path):
            removed.append(path)
    return removed


def retain(url: str, keep: int) -> list[str]:
    """Keep the ``keep`` newest complete checkpoints under ``url``; delete the rest.

    Deletes the older ``chk-<id>`` directories (each manifest first), the ``chk-<id>``
    directories without a manifest older than the newest complete checkpoint (abandoned),
    and the files under ``<url>/data/`` that no kept manifest references and that are older
    than the newest kept manifest, so the files of a checkpoint in progress survive. Call it
    between checkpoints: a file written before the newest manifest, by a checkpoint still in
    progress, would count as garbage.

    Parameters
    ----------
    url : str
        The checkpoint root.
    keep : int
        Complete checkpoints to keep, at least 1.

    Returns
    -------
    list of str
        The paths removed (within the filesystem of ``url``). A path already gone (another
        process deleting too) is no error and is not listed.
    """
    if keep < 1:
        raise ValueError(f"retain keeps at least one checkpoint, got keep={keep!r}")
    fs, root = resolve(url)
    dirs = _chk_dirs(fs, root)
    ids = _complete(fs, dirs)
    if not ids:
        return []
    kept, old = ids[-keep:], ids[:-keep]
    removed = _drop_old(fs, dirs, old)
    partial = [i for i in dirs if i < ids[-1] and i not in ids]
    for i in sorted(partial):
        if _remove(fs, dirs[i], recursive=True):
            removed.append(dirs[i])
    refs = _referenced(fs, dirs, kept)
    if refs is None:
        return removed
    try:
        newest = _mtime(fs, fs.info(f"{dirs[kept[-1]]}/{MANIFEST}"))
    except FileNotFoundError:
        return removed
    return removed + _sweep_data(fs, root, refs, newest)
