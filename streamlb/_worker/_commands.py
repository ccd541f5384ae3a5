"""The epoch protocol's calls on an instance, as frozen dataclasses.

The coordinator (:mod:`streamlb._migration`) drives a migration or a split by sending these
to instances: ``call(address, actor key, command)``, which the actor receives through its
one RPC ``Instance.command`` and hands to its
:class:`~streamlb._worker._epochs.EpochParticipant`. Routers send :class:`FetchKeys` to old
owners the same way (``peer.call("command", FetchKeys(...))``). Each class says what the
instance does with it and what it answers.

Routers: :class:`SetTable`, :class:`Forget` (with a target). Owners: :class:`Prepare`,
:class:`Arm`, :class:`Abort`, :class:`Forget`, :class:`WaitEpoch`, :class:`Epochs`,
:class:`GroupKeys`, :class:`FetchKeys`. Sources: :class:`Pause`, :class:`Resume`, and, from the
driver when the job drains (``Job.drain``), :class:`EndInput`. Any instance: :class:`Idle`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..routing import RoutingTable


@dataclass(frozen=True)
class Command:
    """A call of the epoch protocol on an instance; ``name``: the call's name in errors
    (the class's, in snake case: ``SetTable`` is ``set_table``)."""

    name: ClassVar[str] = "command"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


@dataclass(frozen=True)
class SetTable(Command):
    """Router: switch the exchange to stage ``target`` to ``table`` at a batch boundary and
    put its epoch's marker on every channel. ``prefetch`` (a lazy epoch that pulls keys):
    key group -> old owner, whom the router asks for the moving keys as it routes their
    rows. ``flush``: a source sends the rows that are due at once (a lazy epoch by merging).
    Answers when the router switched (``time.time()``), or None."""

    target: int
    table: RoutingTable
    prefetch: dict[int, int] | None = None
    flush: bool = False


@dataclass(frozen=True)
class Prepare(Command):
    """Owner: ``epoch`` (carried out by ``strategy``) gives ``outgoing`` (new owner -> key
    groups) and takes ``incoming`` (key group -> old owner); ``flush``: the homes of split
    keys this helper stops helping with, sent what it holds of them once aligned.
    ``armed=False``: the outgoing groups go only once :class:`Arm` comes too. Refused
    (StreamlbError) by an instance whose input ended or that ended."""

    epoch: int
    strategy: str
    outgoing: dict[int, list[int]]
    incoming: dict[int, int]
    flush: tuple[int, ...] | list[int] = ()
    armed: bool = True


@dataclass(frozen=True)
class Arm(Command):
    """Owner: every owner accepted ``epoch``: give its outgoing groups once aligned."""

    epoch: int


@dataclass(frozen=True)
class Abort(Command):
    """Owner: forget ``epoch`` before any router switched to it (a prepare failed)."""

    epoch: int


@dataclass(frozen=True)
class Forget(Command):
    """``epoch`` is recorded: an owner drops what it kept for it; with ``target``, a router
    drops what its exchange to that stage kept for it."""

    epoch: int
    target: int | None = None


@dataclass(frozen=True)
class Epochs(Command):
    """Owner: answers its epoch status (``OwnerSide.status``: the epochs done, when each
    phase ended) with the instance's ``status`` and whether its input ended (``finishing``)."""


@dataclass(frozen=True)
class WaitEpoch(Command):
    """Owner: :class:`Epochs`, answered once ``epoch`` is done here or after ``wait`` seconds."""

    epoch: int
    wait: float


@dataclass(frozen=True)
class Pause(Command):
    """Source: hold back its batches (the pause-and-resume baseline)."""


@dataclass(frozen=True)
class Resume(Command):
    """Source: emit again after :class:`Pause`."""


@dataclass(frozen=True)
class EndInput(Command):
    """From the driver when the job drains. A source: stop reading where the stream is and
    end it as a bounded source's ends (what it emitted is processed downstream and the job
    finishes); ``after`` None: between the next two batches; else the path of a savepoint
    (as the coordinator names it to the instances): right after that savepoint's barrier,
    so that the savepoint holds exactly what was emitted. With ``after``, any instance
    (sources too) also stops event time from now on (Flink's stop-with-savepoint without
    drain): no watermark fires or is forwarded, nor does the end of input fire what is
    open, which stays in the savepoint for the restored job. Answers whether anything
    changes (False: a source that had ended or been told to already, or ``after`` None
    to an instance that is not a source)."""

    after: str | None = None


@dataclass(frozen=True)
class Idle(Command):
    """Answers whether nothing is queued, held or in flight from this instance."""


@dataclass(frozen=True)
class GroupKeys(Command):
    """Owner: answers how many keys it holds of each of ``groups`` (a list, in their order)."""

    groups: list[int]


@dataclass(frozen=True)
class FetchKeys(Command):
    """Old owner, from a router in a lazy epoch: the router (sender id ``router`` there)
    routes rows of ``keys`` (of key groups ``groups``) to ``dest``; send their state there,
    at once if aligned, else first once aligned. ``request``: that router's count of such
    requests."""

    epoch: int
    dest: int
    keys: np.ndarray
    groups: np.ndarray
    router: int
    request: int
