"""The snapshot file format: a state blob as an Arrow table, and back.

A snapshot holds one row per key: ``key_group`` (int32), ``key``, then the state. Its rows
are sorted by key group, so a group's rows are one range; or the table keeps the rows as
the store held them, in *runs* (one per shard of the store, listed in the schema metadata)
that each hold whole key groups, which spares a sort of every snapshot (see
:mod:`streamlb._checkpoint._manifest` for how a manifest locates a group in either).

Aggregate state has one column per table, ``"<name>:<column>"`` (name one of cnt / sum / min
/ max); a stateful map has ``state``, each one ``cloudpickle.dumps(state)``.
The schema's metadata holds what :func:`decode` needs to give back the exact blob.
Writing and reading the files is :mod:`streamlb._checkpoint._files`.
"""
from __future__ import annotations

import json
import pickle

import cloudpickle
import numpy as np
import pyarrow as pa

from ..exceptions import CheckpointError

__all__ = ["FORMAT", "KINDS", "encode", "decode", "empty_blob"]

#: Version of the snapshot files and manifests this package writes.
FORMAT = 1

KINDS = ("aggregate", "stateful_map", "window", "join", "process")
PICKLED = ("window", "join", "process")     # kinds whose state is pickled per key (or key group)
_TABLES = ("cnt", "sum", "min", "max")
_META = "streamlb."

# Python key types stored as Arrow columns; any other key is pickled.
_ARROW_KEYS = {str: pa.large_string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64(),
               bytes: pa.large_binary()}


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


def _pickled(states) -> pa.Array:
    return pa.array([cloudpickle.dumps(s) for s in states], type=pa.large_binary())


def _encode_stateful_map(blob: dict) -> pa.Table:
    states = blob["states"]
    return _sorted_table("stateful_map", blob["key_groups"], list(states), [("state", _pickled(states.values()))], {})


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

    Examples
    --------
    >>> import numpy as np
    >>> table = encode("stateful_map", {"states": {"b": 2, "a": 1}, "key_groups": np.array([7, 3])})
    >>> table.column("key").to_pylist(), table.column("key_group").to_pylist()
    (['a', 'b'], [3, 7])
    >>> decode("stateful_map", table)["states"]
    {'a': 1, 'b': 2}
    """
    _check_kind(kind)
    if kind in PICKLED:         # one pickled state per key (and per key group: its Floor), as a map's
        return _sorted_table(kind, blob["key_groups"], list(blob["states"]),
                             [("state", _pickled(blob["states"].values()))], {})
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


# -- merge ------------------------------------------------------------------------------------

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
