"""Checkpoint manifests: written last, read back, verified; the checkpoints of a root.

The coordinator writes a manifest naming every snapshot file of a checkpoint and, per
operator, the file and row range of each key group (:func:`write_manifest`). The manifest
is written last, by an atomic rename: a checkpoint without one is partial and never
restored from.

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

A checkpoint's manifest (not a savepoint's) also has ``outputs``: what the checkpoint sealed
that was not committed when it was written, by sink, as each sink's committer records it
(:meth:`streamlb._sinks.Committer.sealed`; files it keeps are under ``chk-<id>/outputs/``),
for whoever resumes it to commit. A manifest without it (written before) still restores.

File paths in ``files`` and ``groups`` are relative to the base. A key group absent from an
operator's ``groups`` held no state. An incremental checkpoint references the files of its
predecessors for the key groups that did not change. A group's entry ``[relpath, offset,
rows]`` gives all its rows, in a file sorted by key group; in a file kept in runs, the entry
is ``[relpath, offset, rows, keys]``: the run's rows, among which the group's ``keys`` (a
reader keeps those of the groups it wants).
"""
from __future__ import annotations

import json
import logging
import posixpath
import re

import numpy as np

from ..exceptions import CheckpointError
from ._files import _check_bytes, _crc_of
from ._paths import _child, _exists, _norm, _relative, _write_atomic, resolve

logger = logging.getLogger("streamlb.checkpoint")

__all__ = ["MANIFEST", "write_manifest", "read_manifest", "verify", "checkpoint_ids"]

#: File name of a manifest, in a ``chk-<id>`` directory or a savepoint.
MANIFEST = "_manifest.json"

_REQUIRED = ("format", "files", "operators")
_CHK = re.compile(r"chk-(\d+)")


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


def read_manifest(url: str, check: bool = False) -> tuple[dict, str]:
    """The manifest of a checkpoint or savepoint, and the base its files are named from.

    Parameters
    ----------
    url : str
        A checkpoint root (its newest usable checkpoint is taken), one ``chk-<id>``
        directory, or a savepoint directory (holding ``_manifest.json``).
    check : bool
        Also :func:`verify` the files the manifest names (their sizes and checksums).

    Under a root, a checkpoint whose manifest cannot be read or validated (truncated,
    garbage, a key missing; with ``check``, a file missing or corrupt) is skipped with a
    warning naming it and what is wrong, and the previous complete one is taken.

    Returns
    -------
    tuple
        ``(manifest, base)``: ``base`` is the manifest's ``"base"`` resolved against its
        directory, in the style of ``url``; pass it to :func:`verify` and :func:`read_groups`.

    Raises
    ------
    CheckpointError
        When ``url`` does not exist, holds no usable checkpoint, or names one that is
        unusable: the message lists every checkpoint found there with why each is unusable.
    """
    url = _norm(url)
    fs, root = resolve(url)
    if not _exists(fs, root):
        raise CheckpointError(f"checkpoint path {url!r} does not exist")
    if _exists(fs, f"{root}/{MANIFEST}") or _CHK.fullmatch(posixpath.basename(root)):
        try:
            return _usable(url, check)
        except CheckpointError as exc:
            parent = _relative(url, "..")
            raise CheckpointError(f"{exc}{_listing(parent, check, f'checkpoints under {parent}')}") from None
    dirs = _chk_dirs(fs, root)
    complete = False
    for i in sorted(dirs, reverse=True):
        where = _child(url, posixpath.basename(dirs[i]))
        if not _exists(fs, f"{dirs[i]}/{MANIFEST}"):
            continue                        # partial (or being written): never a candidate
        try:
            return _usable(where, check)
        except CheckpointError as exc:
            logger.warning("checkpoint %s is unusable, skipped: %s; trying the previous one (the records after "
                           "the one taken are replayed: outputs committed since it may hold some of them twice)",
                           where, exc)
            complete = True
    if complete:
        raise CheckpointError(f"no usable checkpoint under {url}: every complete one is unusable"
                              + _listing(url, check, "checkpoints found"))
    raise CheckpointError(_no_checkpoint(url) + _listing(url, check, "checkpoints found"))


def _usable(where: str, check: bool) -> tuple[dict, str]:
    """The manifest and base of the checkpoint or savepoint at ``where`` (its files
    verified if ``check``); a CheckpointError saying what makes it unusable."""
    wfs, wpath = resolve(where)
    if not _exists(wfs, f"{wpath}/{MANIFEST}"):
        raise CheckpointError(_no_checkpoint(where))
    manifest = _load_manifest(wfs, f"{wpath}/{MANIFEST}")
    base = _relative(where, str(manifest.get("base", ".")))
    if check:
        try:
            verify(base, manifest)
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint {where}: {exc}") from None
        except (AttributeError, TypeError, ValueError) as exc:      # "files" is not a {path: info} map
            raise CheckpointError(f"checkpoint manifest {wpath}/{MANIFEST} names its files wrongly: "
                                  f"{type(exc).__name__}: {exc}") from None
    return manifest, base


def _listing(url: str, check: bool, title: str, most: int = 20) -> str:
    """``"; <title>: chk-000003: <why unusable>; chk-000002: usable"``: the checkpoints and
    savepoints directly under ``url``, newest first (``""`` when there are none)."""
    fs, root = resolve(url)
    try:
        entries = fs.ls(root, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return ""
    found = []
    for e in entries:
        name = posixpath.basename(e["name"].rstrip("/"))
        m = _CHK.fullmatch(name)
        if e.get("type") == "directory" and (m or _exists(fs, f"{e['name'].rstrip('/')}/{MANIFEST}")):
            found.append((int(m.group(1)) if m else -1, name))
    lines = []
    for _, name in sorted(found, reverse=True)[:most]:
        try:
            _usable(_child(url, name), check)
            lines.append(f"{name}: usable")
        except CheckpointError as exc:
            lines.append(f"{name}: {exc}")
    more = f" (and {len(found) - most} more)" if len(found) > most else ""
    return f"; {title}{more}: " + "; ".join(lines) if lines else ""


def _no_checkpoint(url: str) -> str:
    if _CHK.fullmatch(posixpath.basename(url)):
        return (f"checkpoint {url!r} is partial: it has no {MANIFEST} (a checkpoint without a "
                f"manifest is partial and never restored from)")
    return (f"no complete checkpoint under {url}: no chk-*/{MANIFEST} (a checkpoint without a "
            f"manifest is partial and never restored from)")


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
