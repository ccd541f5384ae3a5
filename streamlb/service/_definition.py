"""A submitted job's definition: what a driver needs to start (or resume) it anywhere.

It is the job graph as planned at submit (:class:`~streamlb._plan._model.Plan`: stages,
steps and the user's functions, pickled by value), the checked options of the call
(:class:`~streamlb._job.RunOptions`) and the operators to autoscale, behind a one-line JSON
header that names the streamlb and Python versions that wrote it. The header is read
first: a driver of another streamlb version refuses the definition with both versions
named before it unpickles anything, and a body that cannot be unpickled (a module the
functions need is missing) is refused naming the module. The registry keeps it as
``definition.pkl`` in the job's directory; a job with ``checkpoint=`` also keeps a copy
beside its checkpoints (``<checkpoint>/job/definition.pkl``), so the job can be resumed
from its checkpoints alone.
"""
from __future__ import annotations

import json
import platform

from ..exceptions import JobServiceError

__all__ = ["dump", "load", "versions", "DEFINITION"]

FORMAT = 1
#: Where a job with checkpoints keeps its definition, under its checkpoint root.
DEFINITION = "job/definition.pkl"


def versions() -> dict:
    from .. import __version__

    return {"streamlb": __version__, "python": platform.python_version()}


def dump(name: str, plan, options, ranges: dict) -> bytes:
    """The definition of job ``name`` as bytes."""
    import cloudpickle

    header = {"format": FORMAT, "name": name, **versions()}
    body = cloudpickle.dumps({"plan": plan, "options": options, "ranges": ranges})
    return json.dumps(header).encode() + b"\n" + body


def load(data: bytes, where: str) -> dict:
    """``{"name", "plan", "options", "ranges", "streamlb", "python"}`` of a definition read
    from ``where``; a :class:`JobServiceError` that says why it cannot be loaded."""
    import pickle

    head, _, body = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        raise JobServiceError(f"{where} is not a streamlb job definition (no header line)") from None
    here = versions()
    wrote = f"written by streamlb {header.get('streamlb')} on Python {header.get('python')}"
    if header.get("format") != FORMAT or header.get("streamlb") != here["streamlb"]:
        raise JobServiceError(f"the job definition {where} was {wrote}; this is streamlb {here['streamlb']}, which "
                              "cannot load it: run that version, or stop the job with a savepoint and submit it "
                              "again with --restore")
    try:
        out = pickle.loads(body)
    except Exception as exc:
        raise JobServiceError(f"the job definition {where} ({wrote}) cannot be loaded here: "
                              f"{type(exc).__name__}: {exc}") from None
    return {**header, **out}
