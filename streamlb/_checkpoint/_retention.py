"""Retention: keep the newest complete checkpoints of a root, delete the rest.

Old checkpoints go manifest first, so one half deleted is partial, never restored from.
Snapshot files are shared by checkpoints: a file goes once no kept manifest references it
and it is older than the newest kept manifest (a checkpoint in progress keeps its files).
"""
from __future__ import annotations

import posixpath
from datetime import datetime

from ..exceptions import CheckpointError
from ._manifest import MANIFEST, _chk_dirs, _complete, _load_manifest
from ._paths import _remove, resolve

__all__ = ["retain"]


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
