"""The contract of a keyed state store: what an operator instance asks of its state."""
from __future__ import annotations

import abc
from typing import Any

import numpy as np
import pandas as pd


class StateStore(abc.ABC):
    """Keyed state of one operator instance, partitioned by key group.

    A store applies batches, emits its state as a DataFrame indexed by key, and gives
    away or takes in the state of whole key groups or single keys (migration). A batch's
    key groups are computed once, by the router that sent it, and passed along: a store
    hashes keys only when a direct caller passes no groups.

    Blobs (:meth:`cut`, :meth:`cut_keys`, :meth:`snapshot`) are picklable and carry each
    key's key group, so :meth:`install` hashes nothing.

    Examples
    --------
    >>> import pandas as pd
    >>> from streamlb._state import AggregateState
    >>> a = AggregateState("agg", {"n": ("v", "count")}, "k", 8)
    >>> b = AggregateState("agg", {"n": ("v", "count")}, "k", 8)
    >>> touched = a.update(pd.DataFrame({"k": [1, 2, 1], "v": [1.0, 2.0, 3.0]}))
    >>> a.frame(touched)["n"].to_dict()
    {1: 2, 2: 1}
    >>> b.install(a.cut(range(8)))
    >>> len(a), len(b)
    (0, 2)
    """

    # -- what changed since the last checkpoint (incremental snapshots) ------------------------
    groups: int                     # key groups of the job (set by each store)
    _dirty: np.ndarray | None = None

    def mark_dirty(self, groups) -> None:
        """Key groups ``groups`` changed here (None: possibly any of them)."""
        if self._dirty is None:
            self._dirty = np.zeros(self.groups, bool)
        if groups is None:
            self._dirty[:] = True
        elif len(groups):
            self._dirty[np.asarray(groups, np.int64)] = True

    def take_dirty(self) -> np.ndarray:
        """The key groups that changed since the previous call (ascending), forgetting them:
        a checkpoint writes these and references its previous files for the rest."""
        d, self._dirty = self._dirty, None
        return np.zeros(0, np.int64) if d is None else np.flatnonzero(d)

    @abc.abstractmethod
    def update(self, frame: pd.DataFrame, groups: np.ndarray | None = None) -> Any:
        """Apply one batch.

        Parameters
        ----------
        frame : pandas.DataFrame
            The batch, with the key column.
        groups : numpy.ndarray of int64, optional
            Key group of each row, as the router computed it. Computed here only when
            None, for direct callers such as unit tests.

        Returns
        -------
        touched
            What the batch touched, for :meth:`frame` (a store may return the outputs of
            the batch instead; it says so).
        """

    @abc.abstractmethod
    def frame(self, touched: Any = None) -> pd.DataFrame:
        """The state as a DataFrame indexed by key.

        Parameters
        ----------
        touched : optional
            What :meth:`update` returned: only the keys it touched. None: every key.
        """

    def clean(self, frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray | None, list[str]]:
        """Find the rows this store cannot apply, before :meth:`update`.

        Parameters
        ----------
        frame : pandas.DataFrame
            The batch.

        Returns
        -------
        cleaned : pandas.DataFrame
            ``frame`` with its columns coerced as the store reads them, all rows kept.
        bad : numpy.ndarray of bool or None
            The rows that must go to the dead letters; None when there are none.
        reasons : list of str
            One reason per bad row, in row order.

        The default finds nothing wrong: ``(frame, None, [])``.
        """
        return frame, None, []

    @abc.abstractmethod
    def cut(self, groups) -> dict:
        """Remove the state of key groups ``groups`` and return it, for :meth:`install`.

        Parameters
        ----------
        groups : iterable of int
            The key groups to move.

        Returns
        -------
        dict
            A picklable blob.
        """

    @abc.abstractmethod
    def cut_keys(self, keys: np.ndarray, groups: np.ndarray | None = None) -> dict:
        """Remove the state of single keys (those held here) and return it, for :meth:`install`.

        Parameters
        ----------
        keys : numpy.ndarray
            Keys, held here or not.
        groups : numpy.ndarray of int64, optional
            Key group of each key; computed here only when None.

        Returns
        -------
        dict
            A picklable blob.
        """

    @abc.abstractmethod
    def snapshot(self, groups) -> dict:
        """A copy of the state of key groups ``groups``: the blob :meth:`cut` would give,
        with nothing removed.

        Installing it into an empty store reproduces those key groups' state.

        Parameters
        ----------
        groups : iterable of int
            The key groups to copy.

        Returns
        -------
        dict
            A picklable blob; it may share objects with the store, so state must not
            change in place once snapshotted.

        See Also
        --------
        cut : the same blob, the state removed.
        """

    def hold(self, epoch: int, groups) -> None:
        """Key groups ``groups`` move (out or in) in migration ``epoch``: a store whose
        output waits on time (windows) stops it advancing for them until :meth:`unhold`.
        Nothing to do by default."""

    def unhold(self, epoch: int) -> None:
        """Migration ``epoch`` is done (or aborted) here. Nothing to do by default."""

    def release(self, blob: dict) -> None:
        """``blob``, of :meth:`snapshot`, is written and dropped: a store that lends its
        snapshots arrays it reuses gets them back. Nothing to do by default."""

    @abc.abstractmethod
    def install(self, blob: dict) -> None:
        """Take in state cut from another store (by :meth:`cut`, :meth:`cut_keys`).

        Parameters
        ----------
        blob : dict
            The blob. Its keys are absent here, or hold what arrived since the switch:
            a store that can merge state merges them.
        """

    @abc.abstractmethod
    def contains(self, keys: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
        """Whether each of ``keys`` has state here.

        Parameters
        ----------
        keys : numpy.ndarray
            Keys.
        groups : numpy.ndarray of int64, optional
            Key group of each key; computed here only when None (and needed).

        Returns
        -------
        numpy.ndarray of bool
        """

    def reserve(self, groups) -> None:
        """Prepare for the state of key groups ``groups``, ahead of its arrival.

        Parameters
        ----------
        groups : iterable of int
            Key groups whose state is to come.

        The default prepares nothing.
        """

    @abc.abstractmethod
    def keys_per_group(self, groups) -> np.ndarray:
        """Keys held here of each key group of ``groups``.

        Parameters
        ----------
        groups : array-like of int
            Key groups.

        Returns
        -------
        numpy.ndarray of int64
        """

    def read_estimate(self, groups=None) -> tuple[int, tuple[str, ...]]:
        """What a read of the state of key groups ``groups`` (None: all of it) would build:
        its rows and the numpy dtype kinds of its index and columns (see ``._budget``).

        The default counts a row per key held and every field a Python object; a store
        whose frame is laid out otherwise says so."""
        rows = len(self) if groups is None else int(np.sum(self.keys_per_group(np.asarray(list(groups), np.int64))))
        return rows, (self.key_kind() or "O", "O")

    @abc.abstractmethod
    def __len__(self) -> int:
        """Keys held here."""

    @abc.abstractmethod
    def key_kind(self) -> str | None:
        """numpy dtype kind of the keys held (``"i"``, ``"u"``, ``"b"``, ``"O"``...); None
        before any key."""
