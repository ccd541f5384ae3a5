"""``RunOptions``: the arguments of :func:`streamlb.run`, checked once, as one frozen value.

:meth:`RunOptions.build` resolves every argument left ``None`` from its ``streamlb.*``
setting in dask.config and refuses a bad value before anything starts (no cluster, no
actor), with an error naming the argument (or the setting it came from) and what would be
valid. The job and its parts then read the options object whole instead of a dozen loose
arguments. Only what needs the planned graph is checked later: the operators ``autoscale``
names (:meth:`RunOptions.autoscale_ranges`) and whether a restored checkpoint fits the graph.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import config
from ..exceptions import CheckpointError, PipelineError

__all__ = ["RunOptions"]


def _source(arg: str, setting: str, given: Any) -> str:
    """Where a value came from: ``run(arg=...)`` when given, else its setting."""
    return f"run({arg}={given!r})" if given is not None else f"setting streamlb.{setting}"


def _integer(arg: str, setting: str | None, given: Any, low: int = 1, optional: bool = False) -> int | None:
    """``given`` (else the setting) as an int >= ``low``; None only if ``optional``."""
    value = given if setting is None else config.get(setting, given)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        where = f"run({arg}={given!r})" if setting is None else _source(arg, setting, given)
        raise PipelineError(f"{where}: {arg} must be an integer >= {low}{' or None' if optional else ''}, "
                            f"got {value!r}")
    return int(value)


def _seconds(arg: str, setting: str, given: Any, error: type = PipelineError) -> float:
    """``given`` (else the setting) as a duration in seconds, > 0."""
    try:
        value = config.seconds(setting, given)
    except (TypeError, ValueError, KeyError):
        value = None
    if value is None or not value > 0:
        raise error(f"{_source(arg, setting, given)}: {arg} must be a duration > 0 (seconds, or a string "
                    f"such as '500ms'), got {config.get(setting, given)!r}")
    return value


def _wrapped(where: str, check, *args, **kwargs):
    """``check(*args, **kwargs)``; its ValueError or TypeError as a PipelineError naming ``where``."""
    try:
        return check(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, PipelineError):
            raise
        raise PipelineError(f"{where}: {exc}") from exc


def _policy(build, kind: str, arg: str, name: Any, options: dict | None):
    """Build the ``kind`` registered as ``name`` with ``options``; a PipelineError naming the
    argument at fault (the name, or its options) if it cannot be built."""
    try:
        return build(name, **(options or {}))
    except (TypeError, ValueError) as exc:
        bad = f"{arg}={name!r}" if str(exc).startswith(f"unknown {kind} ") else f"{arg}_options={options!r}"
        raise PipelineError(f"run({bad}): {exc}") from exc


def _autoscale(autoscale: Any, key_groups: int) -> Mapping[str, tuple[int, int]] | bool | None:
    """``autoscale`` as None (off), True (every keyed operator) or {operator: (min, max)}."""
    if not autoscale:
        return None
    if autoscale is True:
        return True
    if not isinstance(autoscale, dict):
        raise PipelineError(f"autoscale must be True or {{operator: (min, max)}}, got {autoscale!r}")
    out = {}
    for name, rng in autoscale.items():
        try:
            lo, hi = (int(x) for x in rng)
        except (TypeError, ValueError):
            raise PipelineError(f"autoscale[{name!r}] must be (min, max), got {rng!r}") from None
        if not 1 <= lo <= hi <= key_groups:
            raise PipelineError(f"autoscale[{name!r}] = {rng!r}: need 1 <= min <= max <= {key_groups} (key groups)")
        out[name] = (lo, hi)
    return out


def _backend(given: str | None) -> str:
    """The state backend asked for (else the setting), known and importable."""
    from .._state._backends import BACKENDS

    value = config.get("state.backend", given)
    if value not in BACKENDS:
        raise PipelineError(f"{_source('state_backend', 'state.backend', given)}: unknown state backend "
                            f"{value!r}; valid backends: {', '.join(map(repr, BACKENDS))}")
    if value == "rocksdb":
        try:
            import rocksdict  # noqa: F401
        except ImportError:
            raise PipelineError("state_backend='rocksdb' needs the rocksdict package on the driver and every "
                                "worker: pip install 'streamlb[rocksdb]'") from None
    return value


def _resumed(checkpoint: str | None) -> tuple[dict, str] | None:
    """The latest complete checkpoint of the ``checkpoint=`` directory, if it holds one
    (see :func:`_restored`): a run there resumes from it, as Spark's restart on a checkpoint
    location does."""
    from .._checkpoint._manifest import checkpoint_ids

    try:
        held = checkpoint_ids(checkpoint) if checkpoint is not None else []
    except OSError:         # not a directory: the writability check names it
        held = []
    return _restored(checkpoint) if held else None


def _restored(restore: str | None) -> tuple[dict, str] | None:
    """The manifest and base of the checkpoint ``restore`` names, its files verified (a
    checkpoint directory: its newest usable checkpoint, see :func:`read_manifest`)."""
    if restore is None:
        return None
    from .._checkpoint._manifest import read_manifest

    return read_manifest(restore, check=True)


@dataclass(frozen=True)
class RunOptions:
    """What :func:`streamlb.run` was asked for, every setting resolved and checked.

    Built by :meth:`build`; the fields are those of ``run`` (durations in seconds), plus
    ``batch_size_given`` (``batch_size=`` was passed: paced sources keep it), ``scaling``
    (the scaler built for ``autoscale``), ``restored`` (the manifest and base of the
    checkpoint ``restore`` names, else of the latest complete checkpoint ``checkpoint``
    holds), ``resumed`` (``restored`` is that latest checkpoint) and ``connect_timeout``.
    """

    address: Any
    n_workers: int | None
    key_groups: int
    batch_size: int
    batch_size_given: bool
    parallelism: int | None
    window: float
    credits: int
    balancer: Any
    balancer_options: dict | None
    migration: str | None
    autoscale: Any
    scaling: Any = field(compare=False, repr=False)
    checkpoint: str | None
    checkpoint_interval: float
    restore: str | None
    restored: tuple[dict, str] | None = field(compare=False, repr=False)
    restart_attempts: int
    connect_timeout: float
    state_backend: str = "memory"
    state_dir: str | None = None
    resumed: bool = False

    @classmethod
    def build(cls, *, address: Any = None, n_workers: int | None = None, key_groups: int | None = None,
              batch_size: int | None = None, parallelism: int | None = None, window: Any = None,
              credits: int | None = None, balancer: Any = None, migration: str | None = None,
              balancer_options: dict | None = None, autoscale: dict | bool | None = None, scaler: Any = "ds2",
              scaler_options: dict | None = None, checkpoint: str | None = None, checkpoint_interval: Any = None,
              restore: str | None = None, restart_attempts: int | None = None,
              state_backend: str | None = None) -> RunOptions:
        """The options of ``run(...)`` with these arguments (see :func:`streamlb.run`).

        Raises
        ------
        PipelineError
            A value or setting out of range, an unknown balancer, scaler or migration
            strategy, or a malformed ``autoscale``: the message names the argument (or the
            setting) and the valid values.
        CheckpointError
            ``checkpoint`` is not writable, ``checkpoint_interval`` is not a positive
            duration, ``restore`` names no complete, intact checkpoint, or the latest
            checkpoint of ``checkpoint`` (resumed from without ``restore``) is not intact.
        """
        from ..balancer import get_balancer
        from ..scaler import get_scaler

        scaling = None
        if autoscale:
            scaling = _policy(get_scaler, "scaler", "scaler", scaler, scaler_options)
            balancer = balancer or "static"
        if balancer is not None:
            _policy(get_balancer, "balancer", "balancer", balancer, balancer_options)
        if migration is not None:
            from .._migration._epochs import check_strategy

            _wrapped(f"run(migration={migration!r})", check_strategy, migration)
        restored = _restored(restore) if restore is not None else _resumed(checkpoint)
        if restored is not None and key_groups is None:
            key_groups = restored[0]["graph"]["key_groups"]
        G = config.get("key-groups", key_groups)
        from ..keygroups import check_key_groups

        _wrapped(_source("key_groups", "key-groups", key_groups), check_key_groups, G)
        options = cls(
            address=address, n_workers=_integer("n_workers", None, n_workers, optional=True), key_groups=int(G),
            batch_size=_integer("batch_size", "batch-size", batch_size), batch_size_given=batch_size is not None,
            parallelism=_integer("parallelism", "parallelism", parallelism, optional=True),
            window=_seconds("window", "window", window), credits=_integer("credits", "channel.credits", credits),
            balancer=balancer, balancer_options=balancer_options, migration=migration,
            autoscale=_autoscale(autoscale, int(G)), scaling=scaling, checkpoint=checkpoint,
            checkpoint_interval=_seconds("checkpoint_interval", "checkpoint.interval", checkpoint_interval,
                                         CheckpointError),
            restore=restore, restored=restored, resumed=restore is None and restored is not None,
            restart_attempts=_integer("restart_attempts", "checkpoint.restart-attempts", restart_attempts, low=0),
            connect_timeout=_seconds("connect-timeout", "connect-timeout", None),
            state_backend=_backend(state_backend), state_dir=config.get("state.dir"),
        )
        if checkpoint is not None:
            options._check_checkpoint()
        from .._worker._heap import heap_pad

        heap_pad()          # a bad setting is refused here, before any actor starts
        return options

    def _check_checkpoint(self) -> None:
        """The snapshot compression setting is known and ``checkpoint`` is writable (last:
        the check creates the directory)."""
        from .._checkpoint._files import check_compression
        from .._checkpoint._paths import check_writable

        try:
            check_compression(config.get("checkpoint.compression"))
        except ValueError as exc:       # it names the setting and the valid values
            raise PipelineError(str(exc)) from None
        check_writable(self.checkpoint)

    def stamp_state(self, stages) -> None:
        """Give each keyed stage the state backend; the state of the kinds it cannot hold
        yet stays in memory, and the log says which operators."""
        if self.state_backend == "memory":
            return
        import logging

        from .._state._backends import ROCKSDB_KINDS, kept_in_memory

        kept = []
        for st in stages:
            left = kept_in_memory(st)
            if left is not None:
                kept.append(f"{st.name!r} ({left})")
            elif st.kind in ROCKSDB_KINDS:
                st.state = {"backend": self.state_backend, "dir": self.state_dir}
        if kept:
            logging.getLogger("streamlb.state").warning(
                "state_backend=%r holds the state of aggregate, stateful_map, process and tumbling/hopping "
                "window aggregate operators so far; the state of %s stays in memory",
                self.state_backend, ", ".join(kept))

    def autoscale_ranges(self, stages) -> dict[str, tuple[int, int]]:
        """The (min, max) parallelism of each operator to autoscale, among the planned
        ``stages``: every keyed operator within 1..G for ``autoscale=True``."""
        if not self.autoscale:
            return {}
        if self.autoscale is True:
            return {st.name: (1, self.key_groups) for st in stages if st.exchange == "keyed"}
        names = [st.name for st in stages if not st.is_source]
        for name in self.autoscale:
            if name not in names:
                raise PipelineError(f"autoscale names operator {name!r}, which is not in the job; operators: "
                                    f"{', '.join(names)}")
        return dict(self.autoscale)
