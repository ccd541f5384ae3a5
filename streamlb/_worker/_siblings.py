"""The other instances of an instance's stage and the control lane to and from them.

Siblings exchange state (migrations), partial aggregates of split keys, their ends,
checkpoint marks and watermarks on a numbered control lane of their own, applied ahead of
the data (see ``Instance.control``). Who they are changes while the job runs (a rescale
adds or retires some, a replacement takes an index over): a new or replaced sibling is
numbered from 0, both ways.
"""
from __future__ import annotations

from ._channels import Inbox, Numbered, Peer
from ._messages import PeerEnd


class Siblings:
    """The siblings of instance ``index`` of a stage: ``inbox`` is the control lane from
    them, ``numbered`` numbers what goes to them; ``splittable``: its keys may be split over
    them (then each partial aggregate and the end of each sibling are waited for);
    ``spawn`` runs a task of the instance."""

    def __init__(self, index: int, inbox: Inbox, numbered: Numbered, *, splittable: bool, spawn) -> None:
        self.index, self.splittable, self.spawn = index, splittable, spawn
        self.peers: list[Peer] = []
        self.inbox = inbox                  # the control lane from them (ahead of the data)
        self.numbered = numbered            # what this one sends them
        self.ended: set[int] = set()        # siblings whose PeerEnd was applied here
        self.combines = False               # split keys: partials go to and come from them

    def __len__(self) -> int:
        return len(self.peers)

    def others(self) -> list[int]:
        return [j for j in range(len(self.peers)) if j != self.index]

    def send(self, dest: int, msg):
        """Number ``msg`` for sibling ``dest`` now; the awaitable completes once applied there."""
        return self.peers[dest].call("control", self.numbered.envelope(dest, msg))

    def tell(self, msg, to=None) -> None:
        """``msg`` to every other sibling (or to those of ``to``), in the background."""
        for j in self.others() if to is None else to:
            if j != self.index:
                self.spawn(self.send(j, msg))

    def all_ended(self) -> bool:
        """Every other sibling sent its end (nothing more comes from them)."""
        return len(self.ended) == len(self.peers) - 1

    def still_running(self) -> set[int]:
        return set(self.others()) - self.ended

    def set(self, worker, siblings: list, inputs_ended: bool) -> None:
        """The instances of this stage, by index: ``(address, actor key[, run])``.
        ``inputs_ended``: this one's inputs all ended, so a new sibling waits for its end too."""
        peers = [(a, k, int(r[0]) if r else 0) for a, k, *r in siblings]
        new = []
        for j, (a, k, r) in enumerate(peers):
            old = self.peers[j] if j < len(self.peers) else None
            if old is None or (old.address, old.key) != (a, k):
                self.numbered.reset(j)
                self.inbox.add_sender(j, r)
                self.ended.discard(j)
                new.append(j)
        for j in range(len(peers), len(self.peers)):
            self.numbered.reset(j)
            self.inbox.remove_sender(j)
            self.ended.discard(j)       # a retired sibling's end no longer counts
        self.peers = [Peer(worker, a, k) for a, k, _ in peers]
        self.combines = self.splittable and len(self.peers) > 1
        if inputs_ended and self.combines:
            # this one ended before it knew them: a new sibling waits for its end too
            self.tell(PeerEnd(self.index), to=new)
