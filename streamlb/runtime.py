"""``run``: plan a streamz graph, place its instances as Dask actors, and the ``Job`` handle.

``run`` checks its arguments into one :class:`~streamlb._job.RunOptions`, reaches a cluster
(``streamlb._job._launch``) and plans the graph there (``streamlb.planner._on_cluster``);
``Job`` is the one public handle and composes a part per concern, each in a private module
of ``streamlb._job``: its lifecycle, the release of its instances, its results, its
reconfiguration and its checkpoints. The deployment the parts share (plan, actors, routing
tables, locks) stays on the ``Job``.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pandas as pd

from ._job import _launch
from ._job._checkpoints import Checkpoints
from ._job._lifecycle import Lifecycle, track
from ._job._options import RunOptions
from ._job._reconfigure import Reconfiguration
from ._job._release import Release
from ._job._results import IMBALANCE_COLUMNS, METRIC_COLUMNS, Results
from ._plan._model import Plan
from .planner import _on_cluster
from .routing import RoutingTable

__all__ = ["run", "Job", "METRIC_COLUMNS", "IMBALANCE_COLUMNS"]

logger = logging.getLogger("streamlb.job")


def run(node, address: str | None = None, n_workers: int | None = None, *,
        key_groups: int | None = None, batch_size: int | None = None,
        parallelism: int | None = None, window: Any = None, credits: int | None = None,
        client=None, balancer: str | None = None, migration: str | None = None,
        balancer_options: dict | None = None, autoscale: dict | bool | None = None,
        scaler: str = "ds2", scaler_options: dict | None = None, checkpoint: str | None = None,
        checkpoint_interval: Any = None, restore: str | None = None,
        restart_attempts: int | None = None, state_backend: str | None = None) -> Job:
    """Plan and start the pipeline that ``node`` belongs to; return its :class:`Job`.

    A graph that cannot run (a missing path or column, a window without a watermark, an
    unsupported node, two operators of one name, a function that cannot be pickled) is
    refused before a cluster is started or reached.

    Parameters
    ----------
    node : streamz.Stream
        Any node of the pipeline (the whole connected graph runs).
    address : str, optional
        Scheduler of an existing cluster. None starts an embedded ``LocalCluster`` with
        ``n_workers`` worker processes (default: number of cores, at most 4).
    n_workers : int, optional
        With ``address``, wait until that many workers joined.
    key_groups, batch_size, parallelism, window, credits : optional
        Override the settings ``streamlb.key-groups``, ``batch-size``, ``parallelism``,
        ``window`` and ``channel.credits``.
    client : distributed.Client, optional
        Use this client (and its cluster) instead of ``address``.
    balancer : str, optional
        A balancer registered under ``streamlb.balancers`` (``static``, ``autoflow``,
        ``greedy``...). Registers :class:`streamlb.BalancerPlugin` on the scheduler if it is
        not there, and lets it move key groups of this job live; the plugin also shows the
        job (``/metrics``, the dashboard page). ``static`` moves nothing by itself. None: no
        plugin (no load reports, nothing on ``/metrics`` or the dashboard), no moves but
        manual ones (``Job.migrate``).
    migration : str, optional
        How this job's moves are carried out: ``all-at-once``, ``fluid``, ``lazy`` or
        ``pause`` (default: setting ``streamlb.migration.strategy``).
    balancer_options : dict, optional
        Keyword arguments for the balancer's constructor.
    autoscale : dict or True, optional
        ``{operator: (min, max)}``, or True for every keyed operator within ``1..G``: the
        job rescales them by itself (see docs/reconfiguration.md). Registers the balancer
        plugin (``static`` if no ``balancer``), where decisions show in ``balancer_state()``.
    scaler : str
        The autoscaling policy, registered under ``streamlb.scalers`` (default ``ds2``).
    scaler_options : dict, optional
        Keyword arguments for the scaler's constructor.
    checkpoint : str, optional
        A directory or fsspec URL the driver and every worker can write: the job takes an
        exactly-once checkpoint there every ``checkpoint_interval`` and, when a worker holding
        its instances is lost, restores the latest one on the workers left and replays the
        records after it; a directory that already holds a complete checkpoint is resumed from
        its latest one unless ``restore`` names another (docs/fault-tolerance.md). None: no
        checkpoints, and a lost worker fails the job.
    checkpoint_interval : float, str or timedelta, optional
        A duration (seconds, or "500ms"...: docs/configuration.md, "Durations") between
        checkpoints (setting ``streamlb.checkpoint.interval``, 1 s).
    restore : str, optional
        Start from a checkpoint or savepoint: a checkpoint directory (its latest complete
        checkpoint), one ``chk-*`` directory or a savepoint path. The parallelism may differ
        from the job that wrote it; the operators, their kinds, keys and aggregates must match.
    restart_attempts : int, optional
        Recoveries from faults (lost, frozen or cut-off workers) in a row, with no checkpoint
        completed between them, before the job fails (setting
        ``streamlb.checkpoint.restart-attempts``).
    state_backend : {"memory", "rocksdb"}, optional
        Where keyed state lives (setting ``streamlb.state.backend``): ``"rocksdb"`` for
        aggregates' state larger than memory (see docs/state.md).

    Returns
    -------
    Job
        The job is already running: call ``job.wait()``.
    """

    options = RunOptions.build(
        address=address, n_workers=n_workers, key_groups=key_groups, batch_size=batch_size,
        parallelism=parallelism, window=window, credits=credits, balancer=balancer, migration=migration,
        balancer_options=balancer_options, autoscale=autoscale, scaler=scaler, scaler_options=scaler_options,
        checkpoint=checkpoint, checkpoint_interval=checkpoint_interval, restore=restore,
        restart_attempts=restart_attempts, state_backend=state_backend)
    if client is None:              # nothing is started or reached for a graph that cannot run
        _on_cluster.check_graph(node, options)
    with _launch.connected(options, client) as (client, cluster, owned):
        workers, p, ranges = _on_cluster.plan_on(client, node, options)
        job = Job(p, client, cluster, workers, options, owns_client=owned)
        _launch.start_autoscaling(job, options, ranges)
        return job


class Job:
    """A running pipeline."""

    def __init__(self, plan: Plan, client, cluster, workers: list[str], options: RunOptions,
                 owns_client: bool = True) -> None:
        from . import _placement
        from ._migration._driver import open_control
        from ._reconfig._live import Reconfigurer
        from ._reconfig._retire import Drainer

        # the deployment, which every part reads and reconfigurations and recoveries change
        self.plan, self.client, self.cluster, self.workers = plan, client, cluster, workers
        self.options = options
        self.key_groups, self.window, self.credits = options.key_groups, options.window, options.credits
        self.balancer, self.migration = options.balancer, options.migration
        self.id = uuid.uuid4().hex[:8]
        self.status = "running"
        self.error: BaseException | None = None
        self.actors: dict = {}
        self._futures: dict = {}
        self.workers_of: dict = {}
        self.runs: dict = {}             # (stage id, index) -> run of instances that were replaced
        self.autoscaler = None
        # reconfigurations, checkpoints and recoveries change or read the whole topology: one at a time
        self.topology_lock = threading.RLock()
        self._owns_client = owns_client
        # the parts, one concern each
        self._lifecycle = Lifecycle(self)
        self._release = Release(self)
        self._results = Results(self)
        self._reconfigure = Reconfiguration(self)
        self._checkpoints = Checkpoints(self, options)
        self.checkpointer, self.recovery = self._checkpoints.checkpointer, self._checkpoints.recovery

        from .planner._skew import first_tables

        self.first_tables = first_tables(plan.stages, self.key_groups)     # what a recovery starts from
        self.tables = dict(self.first_tables)
        restored = options.restored
        if restored is not None:
            from ._recovery._restore import restored_tables

            self.tables.update(restored_tables(restored[0], plan.stages))
        self.exchanges = _placement.exchange_specs(
            plan.stages, balanced=self.balancer is not None,
            hot_keys=_placement.hot_keys_for(self.balancer, options.balancer_options))
        self._deploy(workers, restored, fresh_clock=True)
        self._migrations = open_control(client, self.topology(), balancer=self.balancer,
                                        options=options.balancer_options, migration=self.migration)
        self.control = self._migrations.control
        self.reconfig = Reconfigurer(self)
        self._drainer = Drainer(self)       # retiring workers: move the instances off first
        self._start(restored, fresh_clock=True)
        self.started_at = time.time()
        track(self)
        self._lifecycle.watch()
        if self.checkpointer is not None:
            self.checkpointer.start()
        logger.info("job %s started: %s on %d workers, balancer %s, migration %s%s", self.id,
                    ", ".join(f"{st.name}x{st.parallelism}" for st in plan.stages),
                    len(set(self.workers_of.values())), self.balancer, self.migration,
                    f", checkpoints to {options.checkpoint}" if options.checkpoint else "")

    # -- what streamlb._reconfig and streamlb._checkpoint call -------------------------------------
    def _deploy(self, workers: list[str], restored: tuple[dict, str] | None, fresh_clock: bool,
                run: int = 0) -> None:
        self._lifecycle.deploy(workers, restored, fresh_clock, run)

    def _start(self, restored: tuple[dict, str] | None, fresh_clock: bool) -> None:
        self._lifecycle.start(restored, fresh_clock)

    def _absorb_retired(self, key, last: dict) -> None:
        self._results.absorb_retired(key, last)

    def _release_actors(self, keys=None, timeout: float = 5.0) -> None:
        self._release.actors(keys, timeout)

    @property
    def _reconfigs(self) -> list[dict]:
        return self._reconfigure.done

    @property
    def _last(self) -> list[dict]:
        return self._results.last

    @property
    def _dead(self) -> list[dict]:
        return self._results.dead

    # -- waiting (streamlb._job._lifecycle) --------------------------------------------------------
    def wait(self, timeout: float | None = None, progress: bool = False) -> Job:
        """Block until every instance finished; raise the first failure.

        Parameters
        ----------
        timeout : float, str or timedelta, optional
            A duration (seconds, or "2min"...: docs/configuration.md, "Durations"); raise
            ``TimeoutError`` (the job keeps running) when exceeded.
        progress : bool
            Show a progress bar of source records.

        Ctrl-C (``KeyboardInterrupt``) while it waits stops the job and removes its
        uncommitted outputs before the interrupt goes on.
        """
        from ._time import duration_s

        if timeout is not None:
            timeout = duration_s(timeout, "Job.wait: timeout")
        return self._lifecycle.wait(timeout, progress)

    # -- what the balancer plugin saw (streamlb._job._results) -------------------------------------
    def balancer_state(self) -> dict:
        """The plugin's view of this job: routing tables, epochs, moves, load per instance."""
        return self._migrations.balancer_state()

    def imbalance(self, operator: str) -> pd.DataFrame:
        """How evenly the instances of keyed ``operator`` were loaded, one row per load
        window (see ``IMBALANCE_COLUMNS`` and docs/balancers.md, "Reading imbalance").

        ``applied`` is max / mean of the records the instances applied in the window (what
        :meth:`metrics` shows); ``routed`` the same of the records the routers sent each
        instance by the table in force; ``floor`` what no move of key groups goes below;
        ``batches`` the fewest batches an instance applied in the window: with few batches
        per window ``applied`` also moves with when a batch happens to be taken. ``routed``,
        ``planned`` and ``floor`` come from the balancer plugin; a job run without
        ``balancer=`` has them NaN. Available while the job runs and after it stopped.
        """
        return self._results.imbalance(operator)

    def load_trace(self, operator: str):
        """The load the balancer plugin saw for ``operator``, window by window (the last
        ``streamlb.balancer.trace-windows`` of them), as a :class:`streamlb.simulator.Trace`
        to replay through any balancer with :func:`streamlb.simulate`."""
        return self._results.load_trace(operator)

    # -- stopping and releasing (streamlb._job._lifecycle, _release) -------------------------------
    def stop(self) -> None:
        """Stop every instance and release the cluster if ``run`` started it.

        Never hangs: the calls to the scheduler and to the instances wait at most the
        setting ``streamlb.stop-timeout`` in all (and closing the cluster ``run`` started as
        long again); a job whose scheduler or workers are gone stops locally (one line at
        INFO says so). Outputs of a job stopped before it finished are
        not committed: ``to_parquet`` files not yet committed are removed.
        """
        self._lifecycle.stop()

    def cluster_gone(self) -> str | None:
        """Why the job's scheduler cannot be reached any more (its client or cluster was
        closed, or the scheduler said it closes), or None while it can."""
        return self._release.cluster_gone()

    def scheduler_closed(self) -> None:
        """The scheduler said it closes (see ``_reconfig._retire``): what is left of the job
        stops locally."""
        self._release.gone = "its scheduler closed"

    def release_workers(self, workers) -> None:
        """Workers holding instances of this finished job retire: release those instances
        (and the state they hold); reading it afterwards raises :class:`JobReleasedError`."""
        self._release.workers(workers)

    def drain(self, savepoint: str | None = None, timeout: Any = None) -> str | None:
        """Stop the job gracefully (Flink's ``stop``): every source stops reading where it
        is and ends its input as a bounded source ends; what the sources read is processed
        through the whole pipeline and the job finishes as a bounded job finishes: its
        final outputs committed (``to_parquet`` files, ``to_kafka_topic`` transactions,
        list sinks), ``status`` ``"done"``, and :meth:`wait` returns. The way to end an
        unbounded job (a watched directory, a Kafka topic) with its last outputs.
        :meth:`stop` still aborts.

        Without ``savepoint`` the end of input fires what windows, joins and timers hold,
        as at the end of a bounded job (Flink's ``stop --drain``). With ``savepoint``,
        event time stops instead: what is open is not fired by this job but kept in the
        savepoint, and the job restored from it fires it (Flink's ``stop``), so each
        window is emitted once across the two runs.

        Parameters
        ----------
        savepoint : str, optional
            Also write a savepoint there (a directory or fsspec URL that does not exist
            yet), at the point where the sources stopped (Flink's stop-with-savepoint: its
            barrier, then the end of input): ``streamlb.run(same pipeline, restore=path)``
            goes on exactly after what this job read (a watched directory's files read
            and half read, Kafka offsets). See docs/fault-tolerance.md, "Stopping a job".
        timeout : float, str or timedelta, optional
            How long to wait for the job to finish (a duration: docs/configuration.md,
            "Durations"); ``TimeoutError`` when exceeded (the job keeps draining:
            :meth:`wait` finishes it).

        Returns
        -------
        str or None
            The savepoint's path, or None without ``savepoint``.

        Raises
        ------
        CheckpointError
            ``savepoint`` exists or is not writable (refused before anything changes), or
            the savepoint did not complete (the job still drained and finished).
        StreamlbError
            The job is not running (its status is named); nothing changes.
        """
        from ._job._drain import drain
        from ._time import duration_s

        if timeout is not None:
            timeout = duration_s(timeout, "Job.drain: timeout")
        return drain(self, savepoint, timeout)

    close = stop

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- checkpoints (streamlb._job._checkpoints) --------------------------------------------------
    def savepoint(self, path: str) -> str:
        """Take a checkpoint now, written in full to ``path`` (a directory or fsspec URL) and
        kept there (checkpoint retention never removes it); returns the path.

        Restore it with ``streamlb.run(node, restore=path, ...)``, at any parallelism.

        Raises
        ------
        CheckpointError
            If ``path`` is not writable or an instance could not write its snapshot (the job
            keeps running).
        """
        return self._checkpoints.savepoint(path)

    def checkpoints(self) -> pd.DataFrame:
        """The complete checkpoints and savepoints of this job, oldest first: ``id``,
        ``kind``, ``epoch`` (the routing epoch it was taken at), ``started``, ``completed``,
        ``duration`` (seconds), ``bytes_written``, ``bytes_referenced`` (files of earlier
        checkpoints it reuses: incremental), ``keys``, ``full`` and ``path``."""
        return self._checkpoints.checkpoints()

    @property
    def checkpoint_failures(self) -> int:
        """Checkpoints that did not complete (a write failed or timed out); the job went on."""
        return self._checkpoints.failures

    def failures(self) -> pd.DataFrame:
        """The faults the job met, oldest first, one row per recovery attempt and one for
        the failure that ended it, if any (see docs/fault-tolerance.md): ``time``, ``kind``
        (``worker lost``, ``peer unreachable``, ``worker unresponsive``, ``sink write``,
        ``instance unreachable``), ``workers`` it points to, ``detail`` (the error seen),
        ``action`` (``recovered``, ``failed``, or why the attempt failed), ``attempt`` (of
        ``restart_attempts``, counted since a checkpoint last completed) and ``checkpoint``
        (the one restored). Empty for a job run without ``checkpoint=``: there, any such
        fault fails the job (``job.error``)."""
        from ._recovery._faults import FaultLog

        return (self.recovery.faults if self.recovery is not None else FaultLog()).frame()

    # -- reconfiguration (streamlb._job._reconfigure) ----------------------------------------------
    def topology(self) -> dict:
        """What a coordinator needs: actors by role and the routing tables (msgpack-able)."""
        return self._reconfigure.topology()

    def routing(self, operator: str) -> RoutingTable:
        """The current routing table (key group -> instance, with its epoch) of ``operator``."""
        return self._reconfigure.routing(operator)

    @property
    def history(self) -> list[dict]:
        """Completed migration epochs (operator, epoch, strategy, key groups, from, to,
        times) and reconfigurations (``kind`` rescale, move, update or autoscale), oldest first."""
        return self._reconfigure.history()

    def parallelism(self, operator: str) -> int:
        """How many instances ``operator`` runs as now."""
        return self._reconfigure.parallelism(operator)

    def rescale(self, operator: str, parallelism: int, strategy: str | None = None,
                workers: list[str] | None = None) -> int:
        """Change the number of instances of ``operator`` while the job runs.

        Parameters
        ----------
        operator : str
            An ``aggregate``, a ``stateful_map`` or the stage behind a ``rebalance``.
        parallelism : int
            The new count, in ``1..G`` (key groups stay fixed).
        strategy : str, optional
            How key groups move onto new instances (or off retiring ones): ``lazy`` (setting
            ``streamlb.reconfiguration.strategy``), ``fluid``, ``all-at-once``, ``pause`` or ``batched``.
        workers : list of str, optional
            Worker addresses for the new instances, in turn; default the workers holding
            fewest of the job's instances (workers that joined after the start included).

        Returns
        -------
        int
            The parallelism now in force: the new routing is in force when this returns.

        Raises
        ------
        ReconfigurationError
            Naming the operator, the bad value or the worker; the job runs on unchanged.
        """
        return self._reconfigure.rescale(operator, parallelism, strategy, workers)

    def move_instance(self, operator: str, instance: int, worker: str) -> None:
        """Move instance ``instance`` of ``operator`` (its state and its role; the instance
        number stays) to a new actor on ``worker``, while the job runs: only the rows of
        that instance wait while its state is handed over."""
        self._reconfigure.move_instance(operator, instance, worker)

    def update(self, operator: str, func) -> None:
        """Replace the function of a ``stateful_map`` (by operator name) or of a fused
        ``map``/``starmap``/``filter`` (by its streamz ``stream_name=``) at an epoch boundary:
        records each router sent before its marker see the old function, later ones the
        new one; state is kept."""
        self._reconfigure.update(operator, func)

    def migrate(self, operator: str, key_groups, to_instance: int, strategy: str | None = None) -> RoutingTable:
        """Move ``key_groups`` of ``operator`` to ``to_instance`` while the job runs.

        Parameters
        ----------
        operator : str
            A keyed operator (``aggregate`` or ``stateful_map``).
        key_groups : iterable of int
            Key groups in ``0..G-1``; those already on ``to_instance`` are skipped.
        to_instance : int
            The new owner, in ``0..parallelism-1``.
        strategy : str, optional
            ``all-at-once``, ``fluid``, ``lazy``, ``pause`` or ``batched`` (default: the job's migration
            strategy, else setting ``streamlb.migration.strategy``).

        Returns
        -------
        RoutingTable
            The table in force when the last epoch of the move completed.

        Raises
        ------
        MigrationError
            For an unknown operator, instance or key group, or a job that is not running; the
            job keeps running on its current routing.
        """
        return self._reconfigure.migrate(operator, key_groups, to_instance, strategy)

    def reassign(self, operator: str, assignment: dict[int, int], strategy: str | None = None) -> RoutingTable:
        """Give each key group of ``assignment`` to its new instance, in one plan: an instance
        may give and take key groups in the same epoch. See :meth:`migrate`."""
        return self._reconfigure.reassign(operator, assignment, strategy)

    def split(self, operator: str, key, helpers) -> RoutingTable:
        """Spread the records of hot ``key`` of an ``aggregate`` over its home instance and
        ``helpers`` while the job runs; ``helpers=[]`` merges the key back.

        Each helper aggregates the key's records it gets and sends the partial aggregate to
        the home after every batch, where it is merged: ``Job.state`` and every value the
        operator emits stay those of an unsplit run (see docs/splitting.md).

        Parameters
        ----------
        operator : str
            An ``aggregate`` operator, or a tumbling or hopping window ``aggregate`` (the
            state of a ``stateful_map``, an ``apply`` or session windows is not combinable:
            refused).
        key
            A key of the operator's key column (of the same type).
        helpers : iterable of int
            Distinct instances other than the key's home (the owner of its key group).

        Raises
        ------
        MigrationError
            For a ``stateful_map``, a helper out of range or equal to the home, or a job that
            is not running; the job keeps running on its current routing.
        """
        return self._reconfigure.split(operator, key, helpers)

    # -- results (streamlb._job._results) ----------------------------------------------------------
    def state(self, operator: str, key_groups=None) -> pd.DataFrame:
        """Keyed state of ``operator``: a DataFrame indexed by key, sorted by key.

        ``key_groups`` (an aggregate's): only the keys of these key groups, so a state
        larger than memory can be read a slice at a time (see docs/state.md)."""
        return self._results.state(operator, key_groups)

    def state_size(self, operator: str) -> dict[int, int]:
        """Keys held by each instance of ``operator`` (cheap: no state is copied)."""
        return self._results.state_size(operator)

    def metrics(self) -> pd.DataFrame:
        """One row per instance per load window (see ``METRIC_COLUMNS``): the newest
        ``streamlb.metrics-windows`` (3600) windows of each instance."""
        return self._results.metrics()

    def summary(self) -> dict:
        """Records read, wall seconds from the first source start to the last finish,
        and records/s."""
        return self._results.summary()

    def results(self, sink=None) -> Iterator[Any]:
        """Iterate over what a list sink receives, as the job produces it, in the driver.

        Yields each item (a batch, as a rule a DataFrame) the job delivers to the list sink,
        from the first, while the job runs; ends when the job has finished (or was
        stopped), raises as :meth:`wait` does if it fails. Iterating drives the job as
        :meth:`wait` does (Ctrl-C stops it). With ``checkpoint=`` an item comes once the
        checkpoint that covers it completed, so each comes exactly once across recoveries.

        Parameters
        ----------
        sink : list or streamz sink node, optional
            The list ``.sink_to_list()`` returned, or the ``L`` of ``.sink(L.append)`` (or
            that sink node); optional when the job has one list sink.

        Raises
        ------
        PipelineError
            If ``sink`` is not a list sink of this job, or is omitted and the job has several.
        """
        return self._results.results(sink)

    def dead_letters(self) -> pd.DataFrame:
        """Records set aside instead of failing the job, with the reason.

        Columns ``operator, instance, reason, record`` (the record as a dict): records whose
        key is null or of another type than the operator's keys, aggregate inputs that are not
        numbers, and files of a watched directory of another schema (one record per file,
        naming it and its columns).
        """
        return self._results.dead_letters()

    def watermarks(self) -> pd.DataFrame:
        """The event-time watermark of each instance that has one (docs/windows.md).

        One row per instance of a source with ``with_watermark`` and of every operator
        after it: ``operator``, ``instance``, ``watermark`` (``datetime64[ns]``: no record
        behind it is expected, except late ones; NaT before the first; ``Timestamp.max``
        once its inputs ended) and ``idle`` (it holds no watermark back downstream). Integer
        event times show as nanoseconds since the epoch.
        """
        return self._results.watermarks()

    def offsets(self) -> dict[str, int]:
        """Rows read so far from each source file."""
        return self._results.offsets()
