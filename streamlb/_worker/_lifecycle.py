"""The lifecycle of an instance: one explicit phase, and the one table of its transitions.

::

    CREATED --connect--> READY --start--> RUNNING --every input ended--> FINISHING
                                             |                               |
                                             | a source's stream ended       | no state or partial still to come
                                             v                               v
                                          CLOSING (the process loop is gone: flush, end the operator, close the sinks)
                                             |
                                             | ends sent on every output
                                             v
                                          DRAINING (until every end was applied downstream) --> DONE

    RUNNING --start, replacing a source that had ended--> DONE
    RUNNING, FINISHING, CLOSING, DRAINING, DONE --retire--> RETIRED
    any phase but DONE, FAILED, RETIRED --stop--> STOPPED
    any phase but FAILED --an error--> FAILED

What the driver sees is :attr:`Phase.status`: ``created``, ``ready``, ``running`` (for
RUNNING, FINISHING, CLOSING and DRAINING), ``done``, ``failed``, ``stopped``, ``retired``.
"""
from __future__ import annotations

import asyncio
import contextlib
import enum

from ..exceptions import StreamlbError


class Phase(enum.Enum):
    CREATED = "created"         # constructed, not wired yet
    READY = "ready"             # channels to its peers open (connect)
    RUNNING = "running"         # started: a source emits, any other applies what comes
    FINISHING = "finishing"     # every input ended; state on its way or sibling partials may still come
    CLOSING = "closing"         # the process loop is gone (the control lane is read no more): outputs flushed
    DRAINING = "draining"       # its ends sent on every output, until they were applied downstream
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"
    RETIRED = "retired"

    @property
    def status(self) -> str:
        """What the driver sees (``poll()``'s ``status``)."""
        return "running" if self in _ENDING else self.value

    @property
    def live(self) -> bool:
        """Started and not ended yet: what the driver sees as ``running``."""
        return self is Phase.RUNNING or self in _ENDING

    @property
    def inputs_ended(self) -> bool:
        """Every input ended (a source's: its stream ended), whether or not it is done yet."""
        return self in (Phase.FINISHING, Phase.CLOSING, Phase.DRAINING, Phase.DONE)

    @property
    def settled(self) -> bool:
        """It runs no more: a poll held until then answers."""
        return self in (Phase.DONE, Phase.FAILED, Phase.STOPPED, Phase.RETIRED)


_ENDING = (Phase.FINISHING, Phase.CLOSING, Phase.DRAINING)

#: phase -> the phases it may move to; nothing else moves an instance
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.CREATED: frozenset({Phase.READY, Phase.STOPPED, Phase.FAILED}),
    Phase.READY: frozenset({Phase.RUNNING, Phase.STOPPED, Phase.FAILED}),
    Phase.RUNNING: frozenset({Phase.FINISHING, Phase.CLOSING, Phase.DONE, Phase.RETIRED, Phase.STOPPED,
                              Phase.FAILED}),
    Phase.FINISHING: frozenset({Phase.CLOSING, Phase.RETIRED, Phase.STOPPED, Phase.FAILED}),
    Phase.CLOSING: frozenset({Phase.DRAINING, Phase.RETIRED, Phase.STOPPED, Phase.FAILED}),
    Phase.DRAINING: frozenset({Phase.DONE, Phase.RETIRED, Phase.STOPPED, Phase.FAILED}),
    Phase.DONE: frozenset({Phase.RETIRED, Phase.FAILED}),
    Phase.RETIRED: frozenset({Phase.FAILED}),
    Phase.STOPPED: frozenset({Phase.FAILED}),
    Phase.FAILED: frozenset(),
}


class Lifecycle:
    """Where instance ``label`` stands: its phase, its error, when it started and finished."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.phase = Phase.CREATED
        self.error: BaseException | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._settled: asyncio.Event | None = None

    @property
    def status(self) -> str:
        return self.phase.status

    def may(self, new: Phase) -> bool:
        return new in TRANSITIONS[self.phase]

    def move_to(self, new: Phase) -> None:
        """Move to ``new``; a transition :data:`TRANSITIONS` does not list is a bug, refused."""
        if not self.may(new):
            raise StreamlbError(f"instance {self.label} cannot go from {self.phase.name} to {new.name}")
        self.phase = new
        if new.settled and self._settled is not None:
            self._settled.set()         # a poll held until now answers at once

    async def settled(self, hold: float) -> str:
        """Wait up to ``hold`` seconds while the instance runs; its status then."""
        if self.phase in (Phase.READY, Phase.RUNNING, *_ENDING):
            if self._settled is None:
                self._settled = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._settled.wait(), hold)
        return self.status
