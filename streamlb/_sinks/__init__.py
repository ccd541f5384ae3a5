"""Sinks behind one seam: a writer for each kind of sink step, a committer for each kind
whose outputs the driver commits.

``_base`` holds the seam (:class:`SinkWriter`, :class:`Committer`, :class:`SinkContext`),
``_errors`` the error of a write that failed (:func:`~._errors.write_error`);
every other module holds one sink, its writer and (when the driver commits its outputs)
its committer: ``_list`` (``sink_to_list``), ``_parquet`` (``to_parquet``, files staged
under ``_temporary``), ``_kafka`` (``to_kafka_topic``, transactional producers; imports
confluent_kafka only when opened) and ``_dead`` (the dead letters every instance has). A new
sink is one new module with a ``SinkWriter`` and its entry in :data:`WRITERS` under the
kind of step the planner makes for it (and a ``Committer`` in :data:`COMMITTERS` if the
driver finishes what it stages). The worker drives every writer of an instance alike
(:class:`streamlb._worker._sinks.Sinks`), the driver every committer alike
(:class:`Committers`); see docs/runtime.md, "The sink seam".
"""
from __future__ import annotations

from ..exceptions import SinkWriteError
from ._base import Committer, SinkContext, SinkWriter, merge
from ._dead import DeadCommitter, DeadLetters
from ._kafka import KafkaCommitter
from ._list import ListCommitter, ListWriter
from ._parquet import ParquetCommitter, ParquetWriter


def _kafka(step, ctx):
    from ._kafka import KafkaWriter       # imports confluent_kafka when opened: only for a Kafka sink

    return KafkaWriter(step, ctx)


# kind of sink step -> its writer
WRITERS: dict[str, type[SinkWriter]] = {"list_sink": ListWriter, "parquet_sink": ParquetWriter,
                                        "kafka_sink": _kafka}

# the driver's side of the sinks whose outputs it commits
COMMITTERS: list[type[Committer]] = [ListCommitter, ParquetCommitter, KafkaCommitter, DeadCommitter]


def writer_key(step) -> tuple:
    """Which writer of an instance a sink step writes through: steps with the same key
    share one (two ``to_parquet`` of one path write one file)."""
    return (step.kind, step.path if step.path else step.target)


def sink_steps(steps) -> list:
    """The sink steps among ``steps`` and their children, in plan order."""
    out = []
    for st in steps:
        if st.kind in WRITERS:
            out.append(st)
        out.extend(sink_steps(st.children))
    return out


class Committers:
    """The driver's side of every sink of a job (``plan``; ``dead``: its dead-letter list;
    ``job``: its id)."""

    def __init__(self, plan, dead: list, job: str = "") -> None:
        self.all = [cls(plan, dead, job) for cls in COMMITTERS]

    def commit(self, outputs: dict) -> None:
        """An instance's sealed outputs of a complete checkpoint (or of one that finished).
        A sink that cannot commit its part (a :class:`~streamlb.exceptions.SinkWriteError`,
        raised once every sink had its turn) leaves in ``outputs`` what it could not commit,
        and ``outputs`` holds nothing more of the others: committed again, nothing is twice."""
        done, first = [], None
        for c in self.all:
            if c.segment is not None and outputs.get(c.segment):
                try:
                    c.commit(outputs[c.segment])
                except SinkWriteError as exc:
                    first = first or exc
                    continue
                done.append(c.segment)
        if first is not None:
            for key in done:
                outputs[key] = None
            raise first

    def sealed(self, segments: list[dict], keep, cid: int) -> dict:
        """What checkpoint ``cid``'s manifest records (its ``outputs``) of ``segments``, the
        instances' outputs it sealed that are not committed yet: by committer name (see
        :meth:`Committer.sealed`)."""
        out = {}
        for c in self.all:
            if c.name is None:
                continue
            part: dict = {}
            for s in segments:
                merge(part, "p", s.get(c.segment))
            recorded = c.sealed(part.get("p"), keep, cid) if part else None
            if recorded is not None:
                out[c.name] = recorded
        return out

    def resume(self, outputs: dict, read) -> None:
        """A checkpoint whose manifest recorded ``outputs`` is resumed: each committer
        commits what it recorded (see :meth:`Committer.resume`)."""
        for c in self.all:
            if c.name is not None:
                c.resume(outputs.get(c.name), read)

    def take(self, answer: dict) -> None:
        """What an instance of a job without checkpoints reported at a poll."""
        for c in self.all:
            if c.report is not None and answer.get(c.report):
                c.commit(answer[c.report])

    def finish(self) -> None:
        for c in self.all:
            c.finish()

    def discard(self) -> None:
        for c in self.all:
            c.discard()

    def abort(self) -> None:
        for c in self.all:
            c.abort()


__all__ = ["SinkWriter", "SinkContext", "Committer", "Committers", "WRITERS", "COMMITTERS", "DeadLetters",
           "merge", "sink_steps", "writer_key"]
