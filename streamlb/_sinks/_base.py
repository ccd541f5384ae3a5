"""The sink seam: each sink of an instance writes through one :class:`SinkWriter`, and the
driver finishes what it staged through one :class:`Committer` per kind (Flink's
``SinkWriter`` / ``Committer`` split).

Outputs are exactly once with checkpoints by a two-phase commit: what a writer got since
the previous barrier is *sealed* when the next one passes (:meth:`SinkWriter.seal`) and
made visible once that checkpoint is complete. Where the commit happens depends on the
sink: a Parquet file is renamed out of ``_temporary`` and a list item handed to the user's
list by the driver (its committer), from the part the writer put in the instance's
acknowledgement; a Kafka transaction lives in the instance's producer, so the writer
commits it itself when told the checkpoint completed (:meth:`SinkWriter.completed`).
Without checkpoints nothing is staged: what a writer reports goes to the driver at each
poll (:meth:`SinkWriter.poll`), files are committed when the job finishes.

A writer's part of what an instance reports is a JSON-like value under its kind's key
(:attr:`SinkWriter.segment` in a checkpoint's outputs, :attr:`SinkWriter.report` in a poll
answer): a dict (merged) or a list (concatenated) over the instance's writers of that kind.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass
class SinkContext:
    """What the writers of one instance share: who writes (for file names, transactional
    ids and errors) and whether the job checkpoints (set once it is known, before any row)."""

    operator: str
    stage_id: int
    index: int
    run: int = 0
    job: str = ""
    staged: bool = False        # the job checkpoints: outputs wait for their checkpoint


class SinkWriter(ABC):
    """One sink (``step``, a step of the stage's plan) in one instance.

    A sink module implements :meth:`write`; the rest are hooks with a default that does
    nothing: :meth:`open` when the instance starts, :meth:`seal` when a checkpoint barrier
    passes, :meth:`completed` when that checkpoint is complete, :meth:`commit_all` when the
    job finished, :meth:`close` at the end of the instance's stream, :meth:`abort` when it
    fails or stops, :meth:`poll` at each poll of a job without checkpoints, and
    :meth:`hand_off` / :meth:`adopt` / :meth:`linger` when it is rescaled away.
    """

    #: the kind of plan step this writer serves (its key in :data:`streamlb._sinks.WRITERS`)
    kind: str = ""
    #: key of its part in a checkpoint's sealed outputs (None: it seals nothing to commit)
    segment: str | None = None
    #: key of its part in a poll answer (None: it reports nothing to the driver)
    report: str | None = None

    def __init__(self, step, ctx: SinkContext) -> None:
        self.step, self.ctx = step, ctx

    @abstractmethod
    def write(self, x) -> None:
        """One output of the step the sink follows."""

    def open(self) -> None:
        """The instance starts (or, a replacement, is about to adopt what the one it
        replaces handed off); called again later, it does nothing more."""

    def seal(self, cid: int) -> Any:
        """Checkpoint ``cid``'s barrier passed (-1: the instance's outputs after its last
        barrier, taken when it finished or retired): the part of the outputs that belongs
        to it, for the driver to commit once it completes (None: nothing)."""
        return None

    def completed(self, cid: int):
        """Checkpoint ``cid`` is complete: commit what the writer holds for it. A writer
        whose commit waits for a broker may do it in a thread of its own and return its
        ``concurrent.futures.Future`` (the instance awaits it; its exception fails the
        instance); None: done."""

    def commit_all(self) -> None:
        """The job finished: commit everything the writer still holds."""

    def close(self) -> None:
        """End of the instance's stream (or it retires): no more writes."""

    def abort(self) -> None:
        """The instance failed or was stopped: remove or abort what no commit covered."""

    def poll(self) -> Any:
        """What the driver takes at a poll of a job without checkpoints (None: nothing)."""
        return None

    def hand_off(self) -> Any:
        """The instance is rescaled away and its index taken again: what it wrote that is
        not committed, for the new instance to write first (its own is aborted). None: nothing."""
        return None

    def adopt(self, handed) -> None:
        """Write first what the instance this one replaces handed off."""

    def linger(self) -> bool:
        """The instance is rescaled away: whether it holds outputs that commit with the next
        checkpoint to complete (the driver then keeps it until then)."""
        return False


class Committer:
    """The driver's side of one kind of sink: commits the parts its writers sealed under
    :attr:`segment` once their checkpoint is complete, and what they reported under
    :attr:`report` at a poll; ``plan``: the job's plan, ``dead``: its dead-letter list,
    ``job``: the job's id.

    A checkpoint's manifest records, under :attr:`name`, what :meth:`sealed` says of the
    outputs it sealed that are not committed yet; whoever resumes that checkpoint (a run
    that restores it, a recovery) hands that record to :meth:`resume`, which commits them
    if the job that wrote the checkpoint did not (its driver may have died in between).
    """

    #: key of its record in a manifest's ``outputs`` (None: it records nothing)
    name: str | None = None
    segment: str | None = None
    report: str | None = None

    def __init__(self, plan, dead: list, job: str = "") -> None:
        self.plan, self.dead, self.job = plan, dead, job

    def commit(self, part) -> None:
        """Make ``part`` (a writer's sealed or reported outputs, merged) visible."""

    def sealed(self, part, keep, cid: int) -> Any:
        """What the manifest of checkpoint ``cid`` records of ``part`` (this kind's outputs
        that the checkpoint sealed and that are not committed yet, merged) for another
        process to commit them with :meth:`resume`: a JSON-like value. ``keep(name, write)`` stores
        data beside the manifest (``write(fh)`` writes it to an open binary file) and
        returns the path to give :meth:`resume`'s ``read``. None: nothing to record."""
        return None

    def resume(self, recorded, read) -> None:
        """A checkpoint is resumed, before any instance starts: commit what its manifest
        recorded (:meth:`sealed`; None when nothing was) that is not committed yet,
        idempotently (an output committed already is left as it is, a commit stopped
        half-way is completed), and drop what its job staged after it (those records are
        replayed). ``read(path)`` opens a file that ``keep`` stored, for reading."""

    def finish(self) -> None:
        """Every instance is done and every checkpoint's outputs committed: the last step."""

    def discard(self) -> None:
        """A recovery: what was staged for checkpoints that did not complete is dropped
        (its records are replayed)."""

    def abort(self) -> None:
        """The job stopped or failed before it finished: remove what was never committed."""


def merge(into: dict, key: str | None, part) -> None:
    """Add a writer's ``part`` to ``into[key]``: dicts are merged, lists concatenated.

    >>> out = {}
    >>> merge(out, "files", [["p", "a"]]); merge(out, "files", [["p", "b"]]); merge(out, "x", None)
    >>> out
    {'files': [['p', 'a'], ['p', 'b']]}
    """
    if key is None or part is None:
        return
    have = into.get(key)
    if have is None:
        into[key] = part
    elif isinstance(have, dict):
        into[key] = {**have, **part}
    else:
        into[key] = [*have, *part]
