"""One submitted job as the registry keeps it: its record, and where its files live.

A job's directory in the registry holds ``job.json`` (the record, rewritten whole on each
change: written to a temporary file, then renamed over the old one), ``definition.pkl``
(what the client submitted: the planned graph and the options, with the versions that
wrote them) and ``driver-<n>.log`` (the output of the n-th driver process).
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, fields

__all__ = ["JobRecord", "ACTIVE", "TERMINAL", "check_name"]

#: A job whose driver runs, or is to run again.
ACTIVE = ("starting", "running", "restarting", "stopping")
#: A job that is over: ``finished`` (its input ended or it was stopped gracefully),
#: ``cancelled`` (aborted), ``failed`` (the error says why).
TERMINAL = ("finished", "cancelled", "failed")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(name) -> str:
    """``name`` if it can name a job (and its directory), else a ValueError saying what can."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"job name {name!r} is not valid: use 1 to 64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


@dataclass
class JobRecord:
    """What the registry knows of one job (``info`` is what its driver last reported)."""

    name: str
    id: str
    status: str
    submitted: float
    checkpoint: str | None = None
    restarts: int = 0                   # drivers started again after one was lost
    drivers: int = 0                    # driver processes started (the current one's number)
    started: float | None = None        # when the current driver started the job
    ended: float | None = None
    error: str | None = None
    driver: dict = field(default_factory=dict)      # pid, host, log, incarnation
    info: dict = field(default_factory=dict)        # the driver's last report
    versions: dict = field(default_factory=dict)    # streamlb and Python that submitted it
    workers: int = 1                    # workers the job ran on: a resume waits for as many
    reason: str | None = None           # why it is restarting, or how it ended

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def as_dict(self) -> dict:
        out = asdict(self)
        live = self.status in ("running", "stopping")
        out["uptime"] = (time.time() - self.started) if self.started and live else None
        return out

    @classmethod
    def from_dict(cls, d: dict) -> JobRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    # -- files -----------------------------------------------------------------------------------
    @staticmethod
    def directory(root: str, name: str) -> str:
        return os.path.join(root, name)

    def save(self, root: str) -> None:
        d = self.directory(root, self.name)
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".job.json.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(asdict(self), f, indent=1, default=str)
        os.replace(tmp, os.path.join(d, "job.json"))

    @classmethod
    def load_all(cls, root: str) -> tuple[dict[str, JobRecord], list[str]]:
        """The records under ``root`` by name, and what could not be read (each such job is
        listed as failed, with the reason)."""
        out, bad = {}, []
        for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            path = os.path.join(root, name, "job.json")
            if not os.path.isfile(path):
                continue
            try:
                with open(path) as f:
                    rec = cls.from_dict(json.load(f))
            except (OSError, ValueError, TypeError) as exc:
                why = f"{path}: {type(exc).__name__}: {exc}"
                bad.append(why)
                # listed as failed with the reason, never dropped (the file is left as it is)
                out[name] = cls(name=name, id="?", status="failed", submitted=os.path.getmtime(path),
                                error=f"its record cannot be read: {why}")
                continue
            out[rec.name] = rec
        return out, bad
