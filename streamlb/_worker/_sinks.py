"""The sinks of one instance, each through its :class:`~streamlb._sinks.SinkWriter`
(:mod:`streamlb._sinks`): the instance drives them alike, whatever their kind."""
from __future__ import annotations

from .._sinks import WRITERS, DeadLetters, SinkContext, merge, sink_steps, writer_key


class Sinks:
    """The writers of the sink steps among ``steps`` (the stage's), and the instance's
    dead letters (:attr:`dead`), as one: what a step emits goes to its writer
    (:meth:`write`); the instance's lifecycle and checkpoints reach every writer at once."""

    def __init__(self, operator: str, stage_id: int, index: int, run: int = 0, job: str = "", steps=()) -> None:
        self.ctx = SinkContext(operator, stage_id, index, run, str(job))
        self.dead = DeadLetters(index, self.ctx)
        self.writers: dict[tuple, object] = {}      # writer_key(step) -> its writer
        self._of: dict[int, object] = {}            # id(step) -> its writer
        for step in sink_steps(steps):
            key = writer_key(step)
            w = self.writers.get(key)
            if w is None:
                w = self.writers[key] = WRITERS[step.kind](step, self.ctx)
            self._of[id(step)] = w
        self.all = [*self.writers.values(), self.dead]

    @property
    def staged(self) -> bool:
        """Whether the job checkpoints: outputs are then staged per checkpoint (two-phase
        commit), sealed at each barrier and committed once their checkpoint completes."""
        return self.ctx.staged

    @staged.setter
    def staged(self, value: bool) -> None:
        self.ctx.staged = value

    def write(self, step, x) -> None:
        self._of[id(step)].write(x)

    def open(self) -> None:
        """The instance starts (a replacement's opening aborts what the one it replaces
        left open, even if it writes nothing)."""
        for w in self.all:
            w.open()

    def seal(self, cid: int) -> dict:
        """Checkpoint ``cid``'s barrier passed (-1: the final outputs): what the writers got
        since the previous one, by kind (see :class:`~streamlb._sinks.SinkWriter`)."""
        out: dict = {}
        for w in self.all:
            merge(out, w.segment, w.seal(cid))
        return out

    def poll(self) -> dict:
        """What the driver takes at a poll of a job without checkpoints, by kind."""
        out: dict = {}
        for w in self.all:
            merge(out, w.report, w.poll())
        return out

    def completed(self, cid: int) -> list:
        """Checkpoint ``cid`` is complete: the writers commit what it covers. Returns the
        futures (``concurrent.futures.Future``) of the commits still under way in a writer's
        own thread (a Kafka transaction's), for the instance to await."""
        return [f for f in (w.completed(cid) for w in self.all) if f is not None]

    def commit_all(self) -> None:
        """A checkpointed job finished: the writers commit what waited for it."""
        for w in self.all:
            w.commit_all()

    def close(self) -> None:
        """End of stream."""
        for w in self.all:
            w.close()

    def abort(self) -> None:
        """A failed or stopped instance removes or aborts what no commit covered."""
        for w in self.all:
            w.abort()

    def linger(self) -> bool:
        """A retiring instance (after :meth:`close`): what no checkpoint committed waits for
        the next one; whether anything does."""
        return any([w.linger() for w in self.all])

    def hand_off(self) -> dict:
        """A retiring instance whose index is taken again: what no checkpoint committed,
        by writer, for the new instance to write (:meth:`adopt`)."""
        out = {}
        for key, w in self.writers.items():
            handed = w.hand_off()
            if handed is not None:
                out[key] = handed
        return out

    def adopt(self, handed: dict) -> None:
        """Write first what the instance this one replaces handed off."""
        self.open()
        for key, h in handed.items():
            if h:
                self.writers[key].adopt(h)
