"""``run``: plan a streamz graph, place its instances as Dask actors, and the ``Job`` handle."""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import threading
import time
import uuid
import weakref
from typing import Any

import numpy as np
import pandas as pd

from . import config
from .exceptions import (CheckpointError, JobFailedError, JobReleasedError, MigrationError, PipelineError,
                         SchedulerUnreachableError, StreamlbError)
from .planner import Plan, Stage, pace_batches, plan
from .routing import RoutingTable

__all__ = ["run", "Job", "METRIC_COLUMNS", "IMBALANCE_COLUMNS"]

logger = logging.getLogger("streamlb.job")

# Jobs still running, stopped at interpreter exit before Dask closes its clusters (atexit
# runs handlers last registered first, and ours is registered once a client exists): a job
# left running would otherwise see its workers retired under it and its client retry a
# scheduler that is gone, logging errors at exit.
_live_jobs: "weakref.WeakSet[Job]" = weakref.WeakSet()
_exit_hook = False


def _stop_live_jobs() -> None:
    for job in list(_live_jobs):
        try:
            job.stop()
        except BaseException as exc:     # exiting: say it once, never a traceback
            logger.info("job %s: not stopped cleanly at exit (%s: %s)", job.id, type(exc).__name__, exc)


def _track(job: "Job") -> None:
    global _exit_hook
    _live_jobs.add(job)
    if not _exit_hook:
        atexit.register(_stop_live_jobs)
        _exit_hook = True


_ENDED = {"done": "had finished", "failed": "had failed", "stopped": "was stopped"}

METRIC_COLUMNS = [
    "operator", "instance", "worker", "window_start", "records", "busy_seconds",
    "queued_batches", "latency_p50_ms", "latency_p99_ms", "latency_max_ms", "latency_mean_ms",
    "split_records", "latency_hist", "batches",
]

#: Columns of :meth:`Job.imbalance`.
IMBALANCE_COLUMNS = ["window_start", "applied", "routed", "planned", "floor", "records", "batches", "epoch"]


@contextlib.contextmanager
def _workers_ignore_ctrl_c():
    """Worker processes started meanwhile ignore SIGINT (a disposition a child inherits):
    Ctrl-C in a terminal reaches the whole process group, and the embedded cluster's
    workers must outlive it until the driver has stopped the job and closes them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _connect(address: str | None, n_workers: int | None):
    from distributed import Client, LocalCluster

    if address is None:
        with _workers_ignore_ctrl_c():
            cluster = LocalCluster(
                n_workers=n_workers or min(os.cpu_count() or 1, 4), threads_per_worker=1,
                processes=True, dashboard_address=":0", silence_logs=logging.ERROR,
            )
        return Client(cluster), cluster
    timeout = config.seconds("connect-timeout")
    try:
        client = Client(address, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    else:
        why = None
    if why is not None:
        # the half-made Client, kept alive by the traceback, would be collected at some later
        # moment: if a new Client is starting then, both wait on one lock for ever
        # (distributed 2026.8). Collected now, and only the message kept.
        import gc

        gc.collect()
        raise SchedulerUnreachableError(
            f"no Dask scheduler answered at {address!r} within {timeout:g}s ({why}); start one "
            "with `dask scheduler` and `dask worker <address>`, or pass address=None for an "
            "embedded local cluster"
        )
    if n_workers:
        client.wait_for_workers(n_workers, timeout=timeout)
    return client, None


def run(node, address: str | None = None, n_workers: int | None = None, *,
        key_groups: int | None = None, batch_size: int | None = None,
        parallelism: int | None = None, window: Any = None, credits: int | None = None,
        client=None, balancer: str | None = None, migration: str | None = None,
        balancer_options: dict | None = None, autoscale: dict | bool | None = None,
        scaler: str = "ds2", scaler_options: dict | None = None, checkpoint: str | None = None,
        checkpoint_interval: Any = None, restore: str | None = None,
        restart_attempts: int | None = None) -> Job:
    """Plan and start the pipeline that ``node`` belongs to; return its :class:`Job`.

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
        records after it (see docs/fault-tolerance.md). None: no checkpoints, and a lost
        worker fails the job.
    checkpoint_interval : float or str, optional
        Seconds (or "500ms"...) between checkpoints (setting ``streamlb.checkpoint.interval``, 1 s).
    restore : str, optional
        Start from a checkpoint or savepoint: a checkpoint directory (its latest complete
        checkpoint), one ``chk-*`` directory or a savepoint path. The parallelism may differ
        from the job that wrote it; the operators, their kinds, keys and aggregates must match.
    restart_attempts : int, optional
        Recoveries from lost workers before the job fails (setting
        ``streamlb.checkpoint.restart-attempts``).

    Returns
    -------
    Job
        The job is already running: call ``job.wait()``.
    """
    from ._migration import check_strategy
    from ._placement import cluster_workers
    from .balancer import get_balancer
    from .keygroups import check_key_groups
    from .scaler import get_scaler

    scaling = None
    if autoscale:
        scaling = get_scaler(scaler, **(scaler_options or {}))     # unknown names fail here too
        balancer = balancer or "static"
    if balancer is not None:
        get_balancer(balancer, **(balancer_options or {}))     # unknown names fail here, listing the valid ones
    if migration is not None:
        check_strategy(migration)
    restored = None
    if restore is not None:
        from ._checkpoint._storage import read_manifest, verify

        restored = read_manifest(restore)
        verify(restored[1], restored[0])
        key_groups = key_groups or restored[0]["graph"]["key_groups"]
    if checkpoint is not None:
        from ._checkpoint._storage import check_writable

        check_writable(checkpoint)
    G = config.get("key-groups", key_groups)
    check_key_groups(G)
    bs = config.get("batch-size", batch_size)
    win = config.seconds("window", window)
    cr = config.get("channel.credits", credits)
    if client is not None:
        cluster = None
        owned = False
    else:
        owned = True
        client, cluster = _connect(address, n_workers)
    try:
        workers = sorted(cluster_workers(client))
        if not workers:
            raise StreamlbError(f"the cluster at {client.scheduler.address} has no workers")
        p = plan(node, workers=len(workers), key_groups=G, batch_size=bs,
                 parallelism=config.get("parallelism", parallelism))
        pace_batches(p, win, given=batch_size is not None)
        if restored is not None:
            from ._checkpoint._restore import check_compatible

            check_compatible(restored, p, G, restore)
        ranges = None
        if scaling is not None:
            from ._reconfig import check_autoscale

            ranges = check_autoscale(p.stages, autoscale, G)
        job = Job(p, client, cluster if owned else None, workers, G, win, cr, owns_client=owned,
                  balancer=balancer, migration=migration, balancer_options=balancer_options,
                  checkpoint=checkpoint, checkpoint_interval=checkpoint_interval, restored=restored,
                  restart_attempts=restart_attempts)
        if ranges:
            from ._reconfig._autoscale import Autoscaler

            job.autoscaler = Autoscaler(job, scaling, ranges, window=win)
            job.autoscaler.start()
        return job
    except BaseException:
        if owned:
            client.close()
            if cluster is not None:
                cluster.close()
        raise


class Job:
    """A running pipeline."""

    def __init__(self, plan: Plan, client, cluster, workers: list[str], key_groups: int,
                 window: float, credits: int, owns_client: bool = True, balancer: str | None = None,
                 migration: str | None = None, balancer_options: dict | None = None,
                 checkpoint: str | None = None, checkpoint_interval: Any = None,
                 restored: tuple[dict, str] | None = None, restart_attempts: int | None = None) -> None:
        from . import _placement
        from ._checkpoint._coordinator import Checkpointer
        from ._checkpoint._recovery import Recovery
        from ._migration import open_control
        from ._reconfig import Reconfigurer
        from ._reconfig._retire import Drainer

        self.balancer = balancer
        self.migration = migration
        self.window, self.credits, self.workers = window, credits, workers
        self.runs: dict = {}             # (stage id, index) -> run of instances that were replaced
        self._reconfigs: list[dict] = []
        self._retired_metrics: list[dict] = []
        self.autoscaler = None
        # reconfigurations, checkpoints and recoveries change or read the whole topology: one at a time
        self.topology_lock = threading.RLock()

        self.plan = plan
        self.client = client
        self.cluster = cluster
        self.key_groups = key_groups
        self.id = uuid.uuid4().hex[:8]
        self._owns_client = owns_client
        self._closed = False
        self._gone: str | None = None           # why the cluster can no longer be reached
        self._released: set[str] = set()        # retired workers whose instances were let go
        self.status = "running"
        self.error: BaseException | None = None
        self._last: list[dict] = []
        self._dead: list[dict] = []
        self._futures: dict = {}
        self.actors: dict = {}
        self._savepoints = None
        self.checkpointer = Checkpointer(self, checkpoint, checkpoint_interval) if checkpoint else None
        self.recovery = Recovery(self, restart_attempts) if checkpoint else None
        self.tables = {
            st.id: RoutingTable.initial(key_groups, st.parallelism)
            for st in plan.stages if st.exchange == "keyed"
        }
        if restored is not None:
            from ._checkpoint._restore import restored_tables

            self.tables.update(restored_tables(restored[0], plan.stages))
        self.exchanges = _placement.exchange_specs(plan.stages, balanced=balancer is not None,
                                                   hot_keys=_placement.hot_keys_for(balancer, balancer_options))
        self._deploy(workers, restored, fresh_clock=True)
        self._migrations = open_control(client, self.topology(), balancer=balancer, options=balancer_options,
                                        migration=migration)
        self.control = self._migrations.control
        self.reconfig = Reconfigurer(self)
        self._drainer = Drainer(self)       # retiring workers: move the instances off first
        self._start(restored, fresh_clock=True)
        self.started_at = time.time()
        _track(self)
        if self.checkpointer is not None:
            self.checkpointer.start()
        logger.info("job %s started: %s on %d workers, balancer %s, migration %s%s", self.id,
                    ", ".join(f"{st.name}x{st.parallelism}" for st in plan.stages),
                    len(set(self.workers_of.values())), balancer, migration,
                    f", checkpoints to {checkpoint}" if checkpoint else "")

    def _deploy(self, workers: list[str], restored: tuple[dict, str] | None, fresh_clock: bool,
                run: int = 0) -> None:
        """Create every instance as an actor (incarnation ``run``), wire them, and install
        the state of a checkpoint (``restored``: its manifest and base path) if any."""
        from . import _placement

        plan = self.plan
        by_id = {s.id: s for s in plan.stages}
        futures = {}
        for st in plan.stages:
            up = by_id[st.upstream] if st.upstream is not None else None
            futures.update(_placement.create_instances(
                self.client, self.id, st, range(st.parallelism), workers,
                upstream=({j: run for j in range(up.parallelism)} if run else up.parallelism) if up else 0,
                key_groups=self.key_groups, window=self.window, credits=self.credits, run=run))
        if run:
            self.runs = dict.fromkeys(futures, run)
        self._futures = futures  # actors referenced only by actors would be collected
        self.actors = {k: f.result() for k, f in futures.items()}
        self.workers_of = _placement.wire(self.actors, plan.stages, self.tables, self.exchanges,
                                          report=self.balancer is not None, runs=self.runs or None)
        if self.checkpointer is not None:
            cp = self.checkpointer
            for f in [a.checkpointing(cp.url, cp.compression) for a in self.actors.values()]:
                f.result()
        if restored is not None:
            from ._checkpoint._restore import install_state

            install_state(self, *restored)

    def _start(self, restored: tuple[dict, str] | None, fresh_clock: bool) -> None:
        """Start the instances; sources go on from a checkpoint's positions if ``restored``
        (``fresh_clock``: pacing starts afresh, as for a new job)."""
        from . import _placement

        resume = None
        if restored is not None:
            from ._checkpoint._restore import source_positions

            resume = source_positions(restored[0], self.plan.stages, fresh_clock)
        _placement.start(self.actors, self.plan.stages, resume)

    # -- lifecycle ------------------------------------------------------------------------------
    def _poll(self, timeout: float | None = None) -> list[dict]:
        """Every instance's status and new outputs. ``timeout``: seconds to wait for an
        answer before raising ``TimeoutError`` (an instance on a worker that died may keep
        the call waiting for the connect timeout)."""
        futs = []
        for k, a in list(self.actors.items()):      # a rescale may change them
            try:
                futs.append((k, a.poll()))
            except Exception as exc:    # Dask already knows the actor's worker is gone
                self._unreachable(k, exc)
        out, late, failure = [], False, None
        deadline = None if timeout is None else time.time() + timeout
        for k, f in futs:
            try:
                r = f.result(timeout=None if deadline is None else max(deadline - time.time(), 0.01))
            except TimeoutError:
                late = True             # the others' answers are still taken: they hold outputs
                continue
            except Exception as exc:
                failure = failure or (k, exc)
                continue
            r["key"] = k
            if r["status"] == "retired":      # retired by a rescale meanwhile: absorbed there
                continue
            out.append(r)
        for r in out:
            self._take_outputs(r)
        if failure is not None:
            self._unreachable(*failure)
        if late:
            raise TimeoutError(f"job {self.id}: an instance did not answer a poll within {timeout:g}s")
        self._last = out
        return out

    def _unreachable(self, k, exc: BaseException):
        st = self.plan.stages[k[0]]
        raise JobFailedError(f"instance {st.name}[{k[1]}] on {self.workers_of.get(k)} is unreachable: "
                             f"{type(exc).__name__}: {exc}") from exc

    def _take_outputs(self, r: dict) -> None:
        for sid, items in r["lists"].items():
            self.plan.list_sinks[sid].extend(items)
        self._dead.extend(r["dead_letters"])

    def _absorb_retired(self, key, last: dict) -> None:
        """The last poll of a retired actor: its outputs and metrics are the job's."""
        self._take_outputs(last)
        if last.get("final") and self.checkpointer is not None:
            self.checkpointer.stage_outputs(last["final"], label=None)
        self._retired_metrics.extend(last.get("metrics", ()))

    def wait(self, timeout: float | None = None, progress: bool = False) -> Job:
        """Block until every instance finished; raise the first failure.

        Parameters
        ----------
        timeout : float, optional
            Seconds; raise ``TimeoutError`` (the job keeps running) when exceeded.
        progress : bool
            Show a progress bar of source records.

        Ctrl-C (``KeyboardInterrupt``) while it waits stops the job and removes its
        uncommitted outputs before the interrupt goes on.
        """
        if self.status == "done":
            return self
        if self.error is not None:
            raise self.error
        try:
            return self._wait(timeout, progress)
        except KeyboardInterrupt:
            self._interrupted()
            raise

    def _wait(self, timeout: float | None, progress: bool) -> Job:
        deadline = None if timeout is None else time.time() + timeout
        interval = config.seconds("poll-interval")
        bar = None
        if progress:
            from tqdm import tqdm

            total = sum(s.total_rows for s in self.plan.stages if s.is_source) or None
            bar = tqdm(total=total, unit="rec", unit_scale=True, desc="records")
        poll_timeout = 2.0 if self.recovery is not None else config.seconds("stop-timeout")
        try:
            while True:
                if self.recovery is not None and self.recovery.check():
                    continue                        # a worker was lost: restored from a checkpoint
                gone = self.cluster_gone()
                if gone:
                    self._on_failure(JobFailedError(f"job {self.id} cannot finish: {gone}"))
                try:
                    with self.topology_lock:        # not halfway through a recovery or a rescale
                        rows = self._poll(timeout=poll_timeout)
                    failed = [r["error"] for r in rows if r["status"] == "failed"]
                except TimeoutError:                # slow to answer: was its worker lost?
                    if deadline is not None and time.time() > deadline:
                        raise TimeoutError(f"job {self.id} still running after {timeout}s") from None
                    continue
                except JobFailedError as exc:       # an instance could not be reached
                    rows, failed = [], [exc]
                if failed:
                    if self.recovery is not None and self.status == "running" and self.recovery.handle(failed[0]):
                        continue                    # a worker was lost: restored from a checkpoint
                    if self.error is not None:      # the recoveries ran out
                        raise self.error
                    self._on_failure(failed[0])
                if bar is not None:
                    bar.n = sum(r["records_out"] for r in rows if self.plan.stages[r["key"][0]].is_source)
                    bar.refresh()
                if rows and all(r["status"] == "done" for r in rows):
                    break
                if any(r["status"] == "stopped" for r in rows):
                    raise JobFailedError(f"job {self.id} was stopped before it finished")
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(f"job {self.id} still running after {timeout}s")
                time.sleep(interval)
        finally:
            if bar is not None:
                bar.close()
        if self.checkpointer is not None:
            self.checkpointer.stop()
            with self.topology_lock:        # a checkpoint under way completes first
                self.checkpointer.collect_late(wait=True)
                for f in [a.take_final() for a in self.actors.values()]:
                    self.checkpointer.stage_outputs(f.result(), label=None)
                self.checkpointer.commit(everything=True)
        self._commit_parquet()
        self.status = "done"
        if self.autoscaler is not None:
            self.autoscaler.stop()
        self._migrations.snapshot(config.seconds("stop-timeout"))     # readable once the cluster is gone
        return self

    def _interrupted(self) -> None:
        """Ctrl-C in :meth:`wait`: stop the job now, its uncommitted outputs removed (a second
        Ctrl-C meanwhile is held off until it is done, so nothing is left half stopped)."""
        logger.info("job %s: interrupted; stopping it", self.id)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self.stop()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def _on_failure(self, err: BaseException) -> None:
        self.status = "failed"
        self.error = err
        self._stop_instances(list(self.actors), config.seconds("stop-timeout"))
        self._remove_uncommitted()
        raise err

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
        st = self._keyed(operator, "imbalance is measured between the instances of a keyed operator")
        try:
            entries = self._migrations.balancer_state().get("operators", {}).get(operator, {}).get("imbalance")
        except PipelineError:           # no balancer: what the instances measured
            entries = None
        if entries is not None:
            frame = pd.DataFrame(entries).rename(columns={"imbalance": "applied"})
            frame = frame.reindex(columns=IMBALANCE_COLUMNS)
            frame["window_start"] = pd.to_datetime(frame["window_start"], unit="s")
            return frame.astype({"batches": "float64"}).reset_index(drop=True)
        m = self.metrics()
        m = m[m["operator"] == st.name]
        rows = []
        for ws, w in m.groupby("window_start", sort=True):
            if len(w) < st.parallelism or w["records"].sum() <= 0:
                continue
            rec = w["records"].to_numpy(float)
            rows.append({"window_start": ws, "applied": rec.max() / rec.mean(), "routed": np.nan,
                         "planned": np.nan, "floor": np.nan, "records": rec.sum(),
                         "batches": float(w["batches"].min()), "epoch": np.nan})
        return pd.DataFrame(rows, columns=IMBALANCE_COLUMNS)

    def load_trace(self, operator: str):
        """The load the balancer plugin saw for ``operator``, window by window (the last
        ``streamlb.balancer.trace-windows`` of them), as a :class:`streamlb.simulator.Trace`
        to replay through any balancer with :func:`streamlb.simulate`."""
        return self._migrations.load_trace(
            operator, check=lambda: self._keyed(operator, "only keyed operators have load traces"))

    def _commit_parquet(self) -> None:
        for path in self.plan.parquet_paths:
            tmp = os.path.join(path, "_temporary")
            os.makedirs(path, exist_ok=True)
            if os.path.isdir(tmp):
                for fn in sorted(os.listdir(tmp)):
                    os.replace(os.path.join(tmp, fn), os.path.join(path, fn))
                os.rmdir(tmp)
            open(os.path.join(path, "_SUCCESS"), "w").close()

    def stop(self) -> None:
        """Stop every instance and release the cluster if ``run`` started it.

        Never hangs: the calls to the scheduler and to the instances wait at most the
        setting ``streamlb.stop-timeout`` in all (and closing the cluster ``run`` started as
        long again); a job whose scheduler or workers are gone stops locally (one line at
        INFO says so). Outputs of a job stopped before it finished are
        not committed: ``to_parquet`` files not yet committed are removed.
        """
        if self._closed:
            return
        self._closed = True
        _live_jobs.discard(self)
        timeout = config.seconds("stop-timeout")
        deadline = time.time() + timeout
        left = lambda: max(deadline - time.time(), 0.05)     # noqa: E731
        running = self.status == "running"
        if running:
            self.status = "stopped"         # the checkpoint and autoscaling threads end at once
        for part in (self.autoscaler, self.checkpointer):
            if part is not None:
                part.stop(timeout=left())
        gone = self.cluster_gone()
        self._drainer.close()
        self._migrations.close(timeout=0 if gone else left())
        if gone:
            self._forget_actors()
        else:
            self._release_actors(timeout=left())
        if running:
            self._remove_uncommitted()      # once no instance writes any more
        if gone:
            logger.info("job %s %s locally: %s", self.id, "stopped" if running else "released", gone)
        else:
            logger.info("job %s %s", self.id, "finished" if self.status == "done" else self.status)
        if self._owns_client:
            self._close_client(timeout)

    def cluster_gone(self) -> str | None:
        """Why the job's scheduler cannot be reached any more (its client or cluster was
        closed, or the scheduler said it closes), or None while it can."""
        if self._gone is not None:
            return self._gone
        status = getattr(self.client, "status", "closed")
        if status not in ("running", "newly-created"):
            return f"its client was closed (status {status!r})"
        if self.cluster is not None and str(getattr(self.cluster, "status", "")).endswith(("closed", "closing")):
            return "its cluster was closed"
        return None

    def scheduler_closed(self) -> None:
        """The scheduler said it closes (see ``_reconfig._retire``): what is left of the job
        stops locally."""
        self._gone = "its scheduler closed"

    def _release_actors(self, keys=None, timeout: float = 5.0) -> None:
        """Stop the instances ``keys`` (all by default), waiting at most ``timeout`` seconds
        in all, and let go of their actors: the workers free them, and Dask no longer counts
        them when retiring the workers."""
        keys = list(self.actors) if keys is None else [k for k in keys if k in self.actors]
        self._stop_instances(keys, timeout)
        self._forget_actors(keys)

    def _stop_instances(self, keys, timeout: float) -> None:
        """Ask the instances ``keys`` to stop, all at once; wait ``timeout`` seconds at most in all."""
        calls = []
        for k in keys:
            try:
                calls.append(self.actors[k].stop())
            except Exception:           # its worker is already gone
                pass
        deadline = time.time() + timeout
        for c in calls:
            try:
                c.result(timeout=max(deadline - time.time(), 0.05))
            except Exception:
                pass

    def _forget_actors(self, keys=None) -> None:
        for k in (list(self.actors) if keys is None else keys):
            a, f = self.actors.pop(k, None), self._futures.pop(k, None)
            if f is not None and self.cluster_gone() is None:
                try:
                    f.release()
                except Exception:
                    pass
            if hasattr(a, "_future"):
                a._future = None

    def release_workers(self, workers) -> None:
        """Workers holding instances of this finished job retire: release those instances
        (and the state they hold); reading it afterwards raises :class:`JobReleasedError`."""
        workers = set(workers)
        keys = [k for k, w in self.workers_of.items() if w in workers and k in self.actors]
        if not keys:
            return
        self._released.update(workers & {self.workers_of[k] for k in keys})
        timeout = config.seconds("stop-timeout")
        deadline = time.time() + timeout
        for k in keys:                  # their load windows stay in Job.metrics()
            try:
                self._retired_metrics.extend(self.actors[k].metrics().result(
                    timeout=max(deadline - time.time(), 0.05)))
            except Exception:
                pass
        self._release_actors(keys, timeout=max(deadline - time.time(), 0.05))
        logger.info("job %s (%s): released %d instances on retiring workers %s", self.id, self.status,
                    len(keys), ", ".join(sorted(self._released)))

    def _close_client(self, timeout: float) -> None:
        try:
            if self.client.status not in ("closed", "closing"):
                self.client.close(timeout=timeout)
        except Exception:
            pass
        if self.cluster is not None:
            try:
                self.cluster.close(timeout=timeout)
            except Exception:
                pass

    def _remove_uncommitted(self) -> None:
        """Outputs the job staged but never committed (it stopped before it finished)."""
        for path in self.plan.parquet_paths:
            shutil.rmtree(os.path.join(path, "_temporary"), ignore_errors=True)

    close = stop

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- checkpoints (see streamlb._checkpoint and docs/fault-tolerance.md) --------------------------
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
        from ._checkpoint._coordinator import Checkpointer
        from ._checkpoint._storage import check_writable, resolve

        check_writable(path)
        if self.status != "running":
            raise CheckpointError(f"job {self.id} is {self.status}; a savepoint needs a running job")
        if self._savepoints is None:
            self._savepoints = self.checkpointer or Checkpointer(self, None)
        manifest = self._savepoints.take(target=path)
        if manifest is None:
            raise CheckpointError(f"job {self.id}: the savepoint to {path!r} did not complete (see the log); "
                                  "the job keeps running")
        return resolve(path)[1]

    def checkpoints(self) -> pd.DataFrame:
        """The complete checkpoints and savepoints of this job, oldest first: ``id``,
        ``kind``, ``epoch`` (the routing epoch it was taken at), ``started``, ``completed``,
        ``duration`` (seconds), ``bytes_written``, ``bytes_referenced`` (files of earlier
        checkpoints it reuses: incremental), ``keys``, ``full`` and ``path``."""
        from ._checkpoint._coordinator import CHECKPOINT_COLUMNS

        rows = []
        for c in {id(c): c for c in (self.checkpointer, self._savepoints) if c is not None}.values():
            rows.extend(c.rows)
        return pd.DataFrame(sorted(rows, key=lambda r: r["completed"]), columns=CHECKPOINT_COLUMNS)

    @property
    def checkpoint_failures(self) -> int:
        """Checkpoints that did not complete (a write failed or timed out); the job went on."""
        return self.checkpointer.failures if self.checkpointer is not None else 0

    # -- live migration --------------------------------------------------------------------------
    def topology(self) -> dict:
        """What a coordinator needs: actors by role and the routing tables (msgpack-able)."""
        peer = lambda k: [self.actors[k]._address, self.actors[k].key]  # noqa: E731
        ops = {}
        for st in self.plan.stages:
            if st.id in self.tables:
                up = self.plan.stages[st.upstream]
                ops[st.name] = {
                    "stage": st.id,
                    "owners": [peer((st.id, i)) for i in range(st.parallelism)],
                    "routers": [peer((up.id, i)) for i in range(up.parallelism)],
                    "table": self.tables[st.id].owners.tolist(), "epoch": self.tables[st.id].epoch,
                    "kind": st.kind,
                    "merges_lazily": st.merges_lazily,
                }
        return {
            "job": self.id, "key_groups": self.key_groups,
            "sources": [peer(k) for k in self.actors if self.plan.stages[k[0]].is_source],
            "instances": [peer(k) for k in self.actors], "operators": ops,
        }

    def routing(self, operator: str) -> RoutingTable:
        """The current routing table (key group -> instance, with its epoch) of ``operator``."""
        self._keyed(operator, "only keyed operators have a routing table")
        return self._migrations.routing(operator)

    def _keyed(self, operator: str, only: str, error: type[StreamlbError] = PipelineError) -> Stage:
        """The stage of ``operator`` if it is keyed; else ``error``: "... is not keyed; <only>"."""
        st = self.plan.stage(operator)
        if st.id not in self.tables:
            raise error(f"operator {operator!r} is not keyed; {only}")
        return st

    @property
    def history(self) -> list[dict]:
        """Completed migration epochs (operator, epoch, strategy, key groups, from, to,
        times) and reconfigurations (``kind`` rescale, move, update or autoscale), oldest first."""
        moves = list(self._migrations.history())
        if not self._reconfigs:
            return moves
        return sorted(moves + self._reconfigs, key=lambda e: e["completed"])

    # -- live reconfiguration (see streamlb._reconfig and docs/reconfiguration.md) -------------------
    def parallelism(self, operator: str) -> int:
        """How many instances ``operator`` runs as now."""
        return self.reconfig.stage(operator).parallelism

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
            ``streamlb.reconfiguration.strategy``), ``fluid``, ``all-at-once`` or ``pause``.
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
        self._note(self.reconfig.rescale(operator, parallelism, strategy, workers))
        return self.parallelism(operator)

    def move_instance(self, operator: str, instance: int, worker: str) -> None:
        """Move instance ``instance`` of ``operator`` (its state and its role; the instance
        number stays) to a new actor on ``worker``, while the job runs: only the rows of
        that instance wait while its state is handed over."""
        self._note(self.reconfig.move_instance(operator, instance, worker))

    def update(self, operator: str, func) -> None:
        """Replace the function of a ``stateful_map`` (by operator name) or of a fused
        ``map``/``starmap``/``filter`` (by its streamz ``stream_name=``) at an epoch boundary:
        records each router sent before its marker see the old function, later ones the
        new one; state is kept."""
        self._note(self.reconfig.update(operator, func))

    def _note(self, rec: dict) -> None:
        """Keep a reconfiguration for ``history`` and log it."""
        self._reconfigs.append(rec)
        took = rec["completed"] - rec["started"]
        if rec["kind"] == "rescale":
            logger.info("job %s: rescaled %r %s -> %s (%s) in %.2f s", self.id, rec["operator"], rec["from"],
                        rec["to"], rec["strategy"], took)
        elif rec["kind"] == "move":
            logger.info("job %s: moved %r[%s] from %s to %s in %.2f s", self.id, rec["operator"], rec["instance"],
                        rec["from"], rec["to"], took)
        else:
            logger.info("job %s: updated the function of %r at epoch %s in %.2f s", self.id, rec["operator"],
                        rec.get("epoch"), took)

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
            ``all-at-once``, ``fluid``, ``lazy`` or ``pause`` (default: the job's migration
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
        self.plan.stage(operator)
        groups = self.control.validate(operator, key_groups, to_instance)
        return self.reassign(operator, {g: int(to_instance) for g in groups}, strategy)

    def reassign(self, operator: str, assignment: dict[int, int], strategy: str | None = None) -> RoutingTable:
        """Give each key group of ``assignment`` to its new instance, in one plan: an instance
        may give and take key groups in the same epoch. See :meth:`migrate`."""
        from ._migration import check_strategy

        self.plan.stage(operator)
        for g, to in assignment.items():
            self.control.validate(operator, [g], to)
        strategy = check_strategy(strategy or self.migration or config.get("migration.strategy"))
        if self.status != "running":
            raise MigrationError(f"job {self.id} is {self.status}; migrations need a running job")
        return self._migrations.reassign(operator, {int(g): int(to) for g, to in assignment.items()}, strategy)

    def split(self, operator: str, key, helpers) -> RoutingTable:
        """Spread the records of hot ``key`` of an ``aggregate`` over its home instance and
        ``helpers`` while the job runs; ``helpers=[]`` merges the key back.

        Each helper aggregates the key's records it gets and sends the partial aggregate to
        the home after every batch, where it is merged: ``Job.state`` and every value the
        operator emits stay those of an unsplit run (see docs/splitting.md).

        Parameters
        ----------
        operator : str
            An ``aggregate`` operator (``stateful_map`` state is not combinable: refused).
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
        st = self._keyed(operator, "only keyed aggregate keys can be split", MigrationError)
        if self.status != "running":
            raise MigrationError(f"job {self.id} is {self.status}; splitting a key needs a running job")
        try:
            helpers = list(helpers)
        except TypeError:
            helpers = [None]
        if any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) for h in helpers):
            raise MigrationError(f"operator {operator!r}: helpers must be a list of instance numbers in "
                                 f"0..{st.parallelism - 1}, got {helpers!r}")
        helpers = [int(h) for h in helpers]
        key = key.item() if isinstance(key, np.generic) else key
        self._check_key_type(st, key)
        return self._migrations.split(operator, {key: tuple(helpers)})

    def _check_key_type(self, st, key) -> None:
        """A split key must be of the operator's key type, or no row would ever match it."""
        kind = st.key_kind          # known from the Parquet schema, else from the keys held
        if kind is None:
            kinds = [f.result() for f in [self.actors[(st.id, i)].key_kind() for i in range(st.parallelism)]]
            kind = next((k for k in kinds if k is not None), None)
        want = {"i": (int,), "u": (int,), "O": (str,), "b": (bool, np.bool_)}.get(kind)
        if want is None:
            return                          # nothing held yet, or a type the hash handles alike
        ok = isinstance(key, want) and not (kind in "iu" and isinstance(key, bool))
        if not ok:
            names = {"i": "integers", "u": "integers", "O": "strings", "b": "booleans"}
            raise MigrationError(f"operator {st.name!r} keys by {names[kind]}; key {key!r} is a "
                                 f"{type(key).__name__}, so no record would ever match it")

    # -- results ---------------------------------------------------------------------------------
    def _stage_actors(self, name: str):
        st = self.plan.stage(name)
        actors = [self.actors.get((st.id, i)) for i in range(st.parallelism)]     # a drain may let go meanwhile
        if None in actors or self.cluster_gone():
            raise JobReleasedError(self._released_reason(st.name))
        return st, actors

    def _released_reason(self, operator: str) -> str:
        if self._released:
            why = (f"its workers are gone: the instances on {', '.join(sorted(self._released))} were released "
                   f"when those workers retired after the job {_ENDED.get(self.status, self.status)}")
        elif self.cluster_gone():
            why = f"its workers are gone ({self.cluster_gone()})"
        else:
            why = "it was stopped, which released its instances"
        return (f"job {self.id}: the state of {operator!r} cannot be read: {why}. Read results before "
                "stopping the job or closing or scaling down its cluster (see docs/reconfiguration.md)")

    def state(self, operator: str) -> pd.DataFrame:
        """Keyed state of ``operator``: a DataFrame indexed by key, sorted by key."""
        st, actors = self._stage_actors(operator)
        if st.kind not in ("aggregate", "stateful_map"):
            raise PipelineError(f"operator {operator!r} is a {st.kind} and holds no keyed state")
        parts = [f.result() for f in [a.state() for a in actors]]
        return pd.concat(parts).sort_index()

    def state_size(self, operator: str) -> dict[int, int]:
        """Keys held by each instance of ``operator`` (cheap: no state is copied)."""
        st, actors = self._stage_actors(operator)
        if st.kind not in ("aggregate", "stateful_map"):
            raise PipelineError(f"operator {operator!r} is a {st.kind} and holds no keyed state")
        return {i: f.result() for i, f in enumerate([a.state_size() for a in actors])}

    def metrics(self) -> pd.DataFrame:
        """One row per instance per load window (see ``METRIC_COLUMNS``)."""
        rows = [r for f in [a.metrics() for a in list(self.actors.values())] for r in f.result()]
        return pd.DataFrame(self._retired_metrics + rows, columns=METRIC_COLUMNS)

    def summary(self) -> dict:
        """Records read, wall seconds from the first source start to the last finish,
        and records/s."""
        rows = self._last or self._poll()
        src = [r for r in rows if self.plan.stages[r["key"][0]].is_source]
        records = sum(r["records_out"] for r in src)
        starts = [r["started_at"] for r in src if r["started_at"]]
        ends = [r["finished_at"] for r in rows if r["finished_at"]]
        elapsed = (max(ends) - min(starts)) if starts and ends else float("nan")
        return {"records": records, "seconds": elapsed,
                "records_per_second": records / elapsed if elapsed else float("nan"),
                "dead_letters": len(self._dead)}

    def dead_letters(self) -> pd.DataFrame:
        """Records set aside instead of failing the job, with the reason.

        Columns ``operator, instance, reason, record`` (the record as a dict). Today: records
        whose key is null or of the wrong type, and aggregate inputs that are not numbers.
        """
        if self.status == "running" and self.actors:
            self._poll()
        return pd.DataFrame(self._dead, columns=["operator", "instance", "reason", "record"])

    def offsets(self) -> dict[str, int]:
        """Rows read so far from each source file."""
        rows = self._poll() if self.status == "running" else self._last
        out: dict[str, int] = {}
        for r in rows:
            out.update(r["offsets"])
        return out
