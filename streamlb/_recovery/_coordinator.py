"""The driver's side of checkpoints: trigger, collect, complete, commit the outputs.

One checkpoint at a time, every ``interval`` seconds, from a thread of the driver:

1. hold the job's topology (no rescale, move, update or drain starts; one under way is
   waited for) and pause the migrations of every keyed operator (the one in flight ends
   first), so a checkpoint never cuts through an epoch;
2. ask every source for a barrier between two batches; the instances align on it, snapshot
   and acknowledge (see :mod:`streamlb._worker._checkpoint`);
3. once every instance acknowledged, write the manifest (last, by an atomic rename: the
   checkpoint is then complete), drop old checkpoints, and commit the outputs staged for
   it, each part through its sink's committer (:mod:`streamlb._sinks`: Parquet files move
   out of ``_temporary``, ``sink_to_list`` items reach the lists), and tell the instances
   (their writers commit what they hold, e.g. Kafka transactions).

The manifest records, under ``outputs``, what the checkpoint sealed that is not committed
yet, as each sink's committer describes it (:meth:`streamlb._sinks.Committer.sealed`: the
staged Parquet files and their final names, the Kafka transactions and their records, kept
in ``chk-<id>/outputs/``). Whoever resumes the checkpoint commits what is not committed
yet (:func:`streamlb._recovery._restore.resume_outputs`), so a driver lost between the
manifest and the commit loses no output.

A key group no instance rewrote since the previous complete checkpoint is referenced in
the new manifest, not written again (incremental). A failed checkpoint (a write error, a
timeout) is counted and logged; the job goes on and the next checkpoint writes everything.

Test hook: with the environment variable ``STREAMLB_TEST_KILL_AFTER_MANIFEST=<id>`` the
driver SIGKILLs its own process right after the manifest of checkpoint ``<id>`` (or of the
first checkpoint past it) is written, before its outputs are committed: the moment a
resume has to commit them (tests/test_sealed_outputs.py). ``=<file>`` (a file holding the
id) kills only the first driver to get there, which removes the file: a submitted job's
driver started again resumes (tests/test_jobs_service.py). Not for use outside tests.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

import numpy as np

from .. import config
from ..exceptions import CheckpointError, SinkWriteError
from .._plan._model import KEYED_KINDS

logger = logging.getLogger("streamlb.checkpoint")

FORMAT = 1
KILL_AFTER_MANIFEST = "STREAMLB_TEST_KILL_AFTER_MANIFEST"     # the test hook (module docstring)
CHECKPOINT_COLUMNS = ["id", "kind", "epoch", "started", "completed", "duration", "bytes_written",
                      "bytes_referenced", "keys", "full", "path"]


def graph_of(plan, key_groups: int) -> dict:
    """What a restore must find again: each keyed operator's kind, key and aggregate spec,
    each source's files (relative to its root), root or topic."""
    ops = {}
    for st in plan.stages:
        if st.kind in KEYED_KINDS:
            spec = {k: list(v) for k, v in sorted(st.spec.items())} if st.kind != "stateful_map" else None
            ops[st.name] = {"kind": st.kind, "key": st.key_name, "spec": spec}
            if st.window is not None:
                ops[st.name]["window"] = {k: st.window[k] for k in ("kind", "size", "slide", "gap", "mode")}
    sources = {st.name: _source_graph(st) for st in plan.stages if st.is_source}
    return {"key_groups": key_groups, "operators": ops, "sources": sources}


def _source_graph(st) -> dict:
    """A source in a manifest's graph. Its files are named as its positions name them,
    relative to its ``root`` (a checkpoint written before roots were recorded holds
    absolute paths and no root)."""
    from .._sources._parquet import file_key

    out = {"kind": st.kind, "files": [], "parallelism": st.parallelism, "replay": bool(st.rate and st.event_time)}
    if st.kind in ("parquet_source", "directory_source"):
        out["root"] = st.source["path"]
        out["files"] = [file_key(out["root"], f) for f in st.files]
    elif st.kind == "kafka_source":
        out["topic"] = st.source["topic"]
    return out


def _test_kill(cid: int) -> None:
    """The test hook: die here, after checkpoint ``cid``'s manifest and before its commit.
    The variable holds a checkpoint id, or the path of a file holding one: then only the
    first driver to get there dies (it removes the file), not the one that resumes."""
    at = os.environ.get(KILL_AFTER_MANIFEST)
    if at and not at.isdigit():
        try:
            with open(at) as f:
                first = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return
        if cid < first:
            return
        os.remove(at)
        at = str(first)
    if at and cid >= int(at):
        logger.warning("%s=%s: SIGKILL after the manifest of checkpoint %d", KILL_AFTER_MANIFEST, at, cid)
        os.kill(os.getpid(), signal.SIGKILL)


def _due(segment: dict, cid: int) -> bool:
    """Whether staged ``segment`` is committed with checkpoint ``cid``: it was sealed by a
    barrier up to ``cid``, or (the final outputs of an instance that retired) staged
    after the checkpoint before ``cid`` had been triggered."""
    label = segment["label"]
    return label <= cid if label is not None else segment["after"] < cid


class Checkpointer:
    """The checkpoints of one :class:`~streamlb.Job` (``url`` None: savepoints only)."""

    def __init__(self, job, url: str | None, interval: float | None = None) -> None:
        from .._checkpoint._files import check_compression
        from .._checkpoint._manifest import checkpoint_ids

        from .._checkpoint._paths import _norm

        self.job = job
        # absolute on the driver: the instances write there from their own working directory
        self.url = _norm(url) if url else None
        self.interval = config.seconds("checkpoint.interval", interval)
        if self.interval <= 0:
            raise CheckpointError(f"checkpoint_interval must be > 0 seconds, got {interval!r}")
        self.retained = int(config.get("checkpoint.retained"))
        self.timeout = config.seconds("checkpoint.timeout")
        self.compression = config.get("checkpoint.compression")
        check_compression(self.compression)        # a bad setting fails the run, named
        self.next_id = max(checkpoint_ids(url), default=0) + 1 if url else 1
        self.last: dict | None = None       # the last complete checkpoint's manifest
        self.last_base: str | None = None
        self.completed_id = 0               # id of the last complete checkpoint (0: none)
        self.triggered_id = 0               # id of the last checkpoint triggered
        self.force_full = True
        self.failures = 0
        self.in_progress: int | None = None     # id of the checkpoint under way
        self.rows: list[dict] = []
        self.staged: list[dict] = []        # output segments waiting for their checkpoint
        self.late: list[tuple] = []         # (instance key, checkpoint id, actor) not acknowledged in time
        self._outputs = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self.url is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name=f"streamlb-checkpoint-{self.job.id}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """No more checkpoints; wait up to ``timeout`` seconds (default: a checkpoint's
        timeout) for one under way to end."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timeout + 5 if timeout is None else timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            job = self.job
            if job.status != "running" or job.client.status not in ("running", "connecting"):
                return          # finished, failed, or its client was closed under it
            try:
                if job.recovery is not None and job.recovery.check():
                    continue            # a worker was lost: recovered instead
                self.take()
            except SinkWriteError as exc:   # committing a sink's outputs (the job fails if it cannot pass)
                if exc.permanent and job.status == "running" and not self._stop.is_set():
                    try:
                        job._lifecycle.on_failure(exc)      # raises it (or the error the job failed with)
                    except Exception:
                        return
                logger.warning("job %s: committing a checkpoint's outputs failed: %s", job.id, exc)
            except Exception as exc:        # never stops the job: the next one retries
                if job.status == "running" and not self._stop.is_set():
                    logger.warning("job %s: checkpoint failed: %s", job.id, exc)

    # -- one checkpoint -----------------------------------------------------------------------------
    def take(self, target: str | None = None) -> dict | None:
        """Take a checkpoint now (``target``: a savepoint written there, kept, full);
        returns its manifest, or None if it did not complete."""
        from .._checkpoint._paths import _norm

        job = self.job
        keyed = [st.name for st in job.plan.stages if st.id in job.tables]
        with job.topology_lock:
            if job.status != "running":
                raise CheckpointError(f"job {job.id} is {job.status}; a checkpoint needs a running job")
            job._migrations.pause_moves(keyed, self.timeout)
            try:
                return self._take(_norm(target) if target else None)
            finally:
                self.in_progress = None
                job._migrations.resume_moves(keyed)

    def _take(self, target: str | None) -> dict | None:
        from .._checkpoint._manifest import write_manifest
        from .._checkpoint._paths import resolve
        from .._checkpoint._retention import retain

        job = self.job
        self.collect_late()
        cid = self.next_id
        self.next_id += 1
        self.triggered_id = self.in_progress = cid
        full = self.force_full or target is not None
        url = target or self.url
        t0 = time.time()
        actors = dict(job.actors)
        stages = {st.id: st for st in job.plan.stages}
        sources = [k for k in actors if stages[k[0]].is_source]
        # every source is asked, whatever one of them answers: a barrier some sources sent
        # and others not would hold back the senders past it for good
        asked = []
        for k in sources:
            try:
                asked.append(actors[k].checkpoint(cid, full, target))
            except Exception as exc:        # Dask knows the actor's worker is gone
                asked.append(exc)
        for f in asked:
            if isinstance(f, Exception):
                raise f
            self._answer(f)
        acks, errors = self._await_acks(cid, full, target, actors, stages)
        for ack in acks.values():
            if ack.get("segment"):
                self.stage_outputs(ack["segment"], label=cid)
            if ack.get("error"):
                errors.append(ack["error"])
        if errors:
            self.failures += 1
            self.force_full = True
            logger.warning("job %s: checkpoint %d failed (%d so far): %s", job.id, cid, self.failures, errors[0])
            return None
        manifest = self._manifest(cid, full, target, acks, t0)
        name = "." if target else f"chk-{cid:06d}"
        manifest["base"] = "." if target else ".."
        if target is None:
            # an instance that acknowledged an earlier checkpoint late has done so by now
            self.collect_late()
            manifest["outputs"] = self._sealed(cid, url, name)
        try:
            write_manifest(url, name, manifest)
        except Exception as exc:
            self.failures += 1
            self.force_full = True
            logger.warning("job %s: checkpoint %d: the manifest could not be written: %s", job.id, cid, exc)
            return None
        if target is None:
            _test_kill(cid)
        done = time.time()
        self.rows.append({"id": cid, "kind": "savepoint" if target else "checkpoint", "epoch": manifest["epoch"],
                          "started": t0, "completed": done, "duration": done - t0,
                          "bytes_written": manifest["bytes_written"], "bytes_referenced": manifest["bytes_referenced"],
                          "keys": manifest["keys"], "full": full, "path": resolve(url)[1]})
        # a savepoint's snapshot reset what changed since the last checkpoint: the next writes all
        self.force_full = target is not None
        if target is None:
            self.last, self.last_base = manifest, resolve(url)[1]
            self.completed_id = cid
            if job.recovery is not None:
                job.recovery.progressed()
            retain(url, self.retained)
        unwritten = None
        try:
            self.commit()
        except SinkWriteError as exc:       # the checkpoint is complete all the same: its outputs stay staged
            unwritten = exc
        # a recovery goes back to the last checkpoint, never to a savepoint: the outputs a
        # savepoint's barrier sealed (Kafka transactions too) commit with the next checkpoint
        for k, a in actors.items():
            a.forget_checkpoint(cid, target is None)
        if target is None:
            job._release.checkpoint_complete(cid)
        logger.info("job %s: %s %d complete in %.3f s (%d bytes written, %d referenced)", job.id,
                    "savepoint" if target else "checkpoint", cid, done - t0, manifest["bytes_written"],
                    manifest["bytes_referenced"])
        if unwritten is not None:
            raise unwritten
        return manifest

    def _await_acks(self, cid: int, full: bool, target: str | None, actors: dict,
                    stages: dict) -> tuple[dict, list]:
        """The acknowledgements of checkpoint ``cid`` by every instance of ``actors``, and the
        errors of those that failed or did not answer in time (each noted as late)."""
        job = self.job
        # the instances wait longer than this does: a stuck one is asked what it waits for
        futs = {k: a.await_checkpoint(cid, full, self.timeout + 30, target) for k, a in actors.items()}
        acks, errors = {}, []
        deadline = time.time() + self.timeout
        pending = dict(futs)
        look = time.time() + 0.25          # when to ask the scheduler whether a worker left
        failed = False
        while pending:
            for k, f in list(pending.items()):
                if f.done():
                    del pending[k]
                    try:
                        acks[k] = f.result()
                        failed = failed or bool(acks[k].get("failed"))
                    except Exception as exc:
                        errors.append(f"{stages[k[0]].name}[{k[1]}]: {type(exc).__name__}: {exc}")
                        self.late.append((k, cid, actors[k]))
                        failed = True
            if not pending:
                break
            lost = failed           # an instance failed (e.g. its sink's disk is full): this one cannot complete
            if job.recovery is not None and time.time() > look:
                look = time.time() + 0.25
                # lost, frozen, or an instance failed (e.g. it could not send across a
                # partition, after it acknowledged): this one cannot complete, and the
                # recovery that answers the fault waits for the topology lock it holds
                lost = lost or self._fault() is not None or self._an_instance_failed()
            if time.time() > deadline or lost:
                for k in pending:       # a worker died or froze, or an instance is stuck: give this one up
                    errors.append(f"{stages[k[0]].name}[{k[1]}]: no acknowledgement "
                                  f"({self._stuck(actors[k], cid)})")
                    self.late.append((k, cid, actors[k]))   # its outputs of this checkpoint are still to collect
                break
            time.sleep(0.005)
        return acks, errors

    def _fault(self) -> str | None:
        """What keeps a checkpoint from completing on the workers: a worker of the job lost
        or silent past ``streamlb.fault.heartbeat-timeout`` (None: neither)."""
        if self.job.recovery is None:
            return None
        gone, silent = self.job.recovery.faulty()
        if gone:
            return f"worker {', '.join(gone)} lost"
        if silent:
            return f"worker {', '.join(silent)} silent for {max(silent.values()):.1f} s"
        return None

    def _an_instance_failed(self) -> bool:
        """Whether an instance of the job has failed: its failure is a fault the recovery
        answers once the checkpoint lets go of the topology lock (the watcher, which would
        see it, polls under that lock)."""
        try:
            rows = self.job._lifecycle.poll(timeout=1.0)
        except Exception:               # a slow or silent instance: _fault() tells
            return False
        return any(r["status"] == "failed" for r in rows)

    def _answer(self, f) -> None:
        """Wait for a source's answer to the barrier, ``checkpoint.timeout`` at most; give up
        at once when a worker of the job is lost or silent (a frozen one never answers)."""
        deadline = time.time() + self.timeout
        look = time.time() + 0.25
        while not f.done():
            if time.time() > look:
                look = time.time() + 0.25
                fault = self._fault()
                if fault is not None:
                    raise CheckpointError(f"a source was asked for checkpoint {self.in_progress}, but {fault}")
            if time.time() > deadline:
                raise CheckpointError(f"a source did not answer checkpoint {self.in_progress}'s barrier "
                                      f"within {self.timeout:g} s")
            time.sleep(0.005)
        f.result()

    def _stuck(self, actor, cid: int) -> str:
        """What an instance that did not acknowledge says of checkpoint ``cid`` (for the log)."""
        try:
            return str(actor.checkpoint_status(cid).result(timeout=2))
        except Exception as exc:
            return f"unreachable: {type(exc).__name__}: {exc}"

    def _manifest(self, cid: int, full: bool, target: str | None, acks: dict, t0: float) -> dict:
        job = self.job
        prev = None if full else self.last
        files: dict[str, dict] = {}
        written = referenced = keys = 0
        operators, epochs = {}, []
        for st in job.plan.stages:
            if st.id not in job.tables:
                continue
            table = job._migrations.routing(st.name)
            epochs.append(table.epoch)
            old = prev["operators"][st.name]["groups"] if prev else {}
            groups: dict[str, list] = {}
            for i in range(st.parallelism):
                ack = acks[(st.id, i)]
                fresh = set(ack["groups"] or ())
                entry = ack["file"] or {}
                if entry.get("file"):
                    files[entry["file"]] = {"bytes": entry["bytes"], "crc32": entry["crc32"]}
                    written += entry["bytes"]
                at = {int(g): r for g, r in (entry.get("groups") or {}).items()}
                for g in np.flatnonzero(table.owners == i).tolist():
                    if g in fresh:
                        if g in at:
                            groups[str(g)] = [entry["file"], *map(int, at[g])]
                    elif str(g) in old:
                        groups[str(g)] = old[str(g)]
                        f = old[str(g)][0]
                        if f not in files:
                            files[f] = prev["files"][f]
                            referenced += prev["files"][f]["bytes"]
            keys += sum(int(r[-1]) for r in groups.values())   # [file, offset, rows(, keys)]
            operators[st.name] = {"parallelism": st.parallelism, "table": table.owners.tolist(),
                                  "epoch": table.epoch, "groups": groups}
        sources: dict[str, list] = {}
        for st in job.plan.stages:
            if st.is_source:
                sources[st.name] = [acks[(st.id, i)]["position"] for i in range(st.parallelism)]
        return {"format": FORMAT, "id": cid, "kind": "savepoint" if target else "checkpoint", "job": job.id,
                "epoch": max(epochs, default=0), "started": t0, "completed": time.time(), "full": full,
                "graph": graph_of(job.plan, job.key_groups), "operators": operators, "sources": sources,
                "files": files, "bytes_written": written, "bytes_referenced": referenced, "keys": keys}

    # -- outputs (two-phase commit) -----------------------------------------------------------------
    def _sealed(self, cid: int, url: str, name: str) -> dict:
        """What the manifest of checkpoint ``cid`` (directory ``name`` under ``url``) records
        of the outputs its completion commits: by sink, for whoever resumes it."""
        from .._checkpoint._paths import _write_atomic, resolve

        fs, root = resolve(url)

        def keep(file: str, write) -> str:
            rel = f"{name}/outputs/{file}"
            _write_atomic(fs, f"{root}/{rel}", write)
            return rel

        with self._outputs:
            sealed = [s for s in self.staged if _due(s, cid)]
        return self.job._results.outputs.sealed(sealed, keep, cid)

    def stage_outputs(self, segment: dict, label: int | None) -> None:
        """Outputs of one instance: those before checkpoint ``label``'s barrier, or (None)
        those after its last barrier, of an instance that retired."""
        if not segment or not any(segment.values()):
            return
        with self._outputs:
            self.staged.append({"label": label, "after": self.triggered_id, **segment})
        try:
            self.commit()
        except SinkWriteError as exc:       # they stay staged: the next checkpoint's commit tries again
            logger.warning("job %s: committing a checkpoint's outputs failed: %s", self.job.id, exc)

    def commit(self, everything: bool = False) -> None:
        """Hand over the outputs of complete checkpoints (``everything``: the job finished)."""
        with self._outputs:
            done = self.completed_id
            ready = [s for s in self.staged if everything or _due(s, done)]
            self.staged = [s for s in self.staged if not any(s is r for r in ready)]
        ready.sort(key=lambda s: (s["label"] is None, s["label"] or 0))
        outputs = self.job._results.outputs
        first = None
        for s in ready:                 # each is tried: a sink keeps what it could not move, to be resumed
            try:
                outputs.commit(s)
            except SinkWriteError as exc:   # what was not committed stays staged (``s`` holds only that)
                with self._outputs:
                    self.staged.append(s)
                first = first or exc
        if first is not None:
            raise first

    def collect_late(self, wait: bool = False) -> None:
        """Outputs of instances that acknowledged a checkpoint after it was given up: staged
        under that checkpoint's id (committed with the next complete one). ``wait``: the job
        finished, so every one of them is there."""
        keep = []
        for k, cid, actor in self.late:
            if self.job.actors.get(k) is not actor:
                continue            # retired, moved or recovered since: nothing to collect
            try:
                ack = actor.await_checkpoint(cid, True, self.timeout if wait else 0.05).result(
                    timeout=self.timeout + 5)
            except Exception:
                keep.append((k, cid, actor))
                continue
            self.stage_outputs(ack.get("segment"), label=cid)
            actor.forget_checkpoint(cid, False)     # given up: its outputs wait for a complete one
        self.late = [] if wait else keep

    def discard_outputs(self) -> int:
        """A recovery: outputs of checkpoints that did not complete are dropped (their
        records are replayed); returns how many segments."""
        with self._outputs:
            n, self.staged = len(self.staged), []
        self.late = []
        self.job._results.outputs.discard()
        return n

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=CHECKPOINT_COLUMNS)
