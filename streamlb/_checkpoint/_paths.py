"""Where checkpoints live: local paths and fsspec URLs, atomic writes, deletes.

A checkpoint root or savepoint is a local directory (made absolute) or any fsspec URL
(``s3://bucket/chk``, ``memory://x``, a chained URL). :func:`resolve` gives its filesystem
and the path within it; the other modules of :mod:`streamlb._checkpoint` name files from
there. Files are written through a temporary name and a rename, so none is seen half
written.
"""
from __future__ import annotations

import os
import posixpath
import uuid

import fsspec

from ..exceptions import CheckpointError

__all__ = ["resolve", "check_writable"]


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

    Examples
    --------
    >>> fs, path = resolve("memory://x/chk")
    >>> type(fs).__name__, path
    ('MemoryFileSystem', '/x/chk')
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
