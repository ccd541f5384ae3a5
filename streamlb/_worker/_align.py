"""The aligner: which upstream senders have passed which epoch.

An owner is *aligned* on epoch ``e`` once every upstream sender has sent marker(e) or ended
its stream: no record routed by an older table can reach it any more. Subscribers ask to be
told once an epoch is aligned (migration is the first; checkpoints and watermarks reuse it).
Senders may be added and removed while the job runs; a removed sender no longer holds any
epoch back.
"""
from __future__ import annotations

import collections
from collections.abc import Callable, Iterable


class Aligner:
    """Markers and ends of stream per upstream sender.

    Examples
    --------
    >>> a = Aligner(senders=[0, 1])
    >>> seen = []
    >>> a.when_aligned(3, lambda: seen.append(3))
    >>> a.marker(0, 3); seen
    []
    >>> a.end(1); seen
    [3]
    >>> a.ended_all
    False
    """

    def __init__(self, senders: Iterable[int] = ()) -> None:
        self.senders: set[int] = set(senders)
        self.ended: set[int] = set()
        self._marks: dict[int, set[int]] = collections.defaultdict(set)
        self._waiting: dict[int, list[Callable[[], None]]] = collections.defaultdict(list)

    def aligned(self, epoch: int) -> bool:
        return self.senders <= (self._marks.get(epoch, set()) | self.ended)

    @property
    def ended_all(self) -> bool:
        """Every sender ended its stream (an instance with no sender never ends this way)."""
        return bool(self.senders) and self.senders <= self.ended

    def when_aligned(self, epoch: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once ``epoch`` is aligned (now, if it already is)."""
        if self.aligned(epoch):
            callback()
        else:
            self._waiting[epoch].append(callback)

    def marker(self, sender: int, epoch: int) -> None:
        self._marks[epoch].add(sender)
        self._check()

    def end(self, sender: int) -> None:
        self.ended.add(sender)
        self._check()

    def add_sender(self, sender: int) -> None:
        """A new upstream instance: epochs not yet aligned now wait for it too."""
        self.senders.add(sender)
        self.ended.discard(sender)

    def remove_sender(self, sender: int) -> None:
        """An upstream instance retired: it holds nothing back any more."""
        self.senders.discard(sender)
        self.ended.discard(sender)
        for marks in self._marks.values():
            marks.discard(sender)
        self._check()

    def forget(self, epoch: int) -> None:
        """Epoch ``epoch`` is recorded everywhere: drop its markers and subscribers."""
        self._marks.pop(epoch, None)
        self._waiting.pop(epoch, None)

    def _check(self) -> None:
        for epoch in [e for e in self._waiting if self.aligned(e)]:
            for cb in self._waiting.pop(epoch):
                cb()
