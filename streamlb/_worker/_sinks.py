"""Sinks an instance writes to: lists collected by the driver, Parquet datasets, and Kafka
topics (:mod:`._kafka_sink`)."""
from __future__ import annotations

import collections
import os

import pandas as pd

from ..exceptions import PipelineError


class Sinks:
    """The ``sink_to_list`` outputs waiting for the driver's poll, the open Parquet
    writers of one instance (files staged under ``<path>/_temporary`` until the job
    commits them) and its Kafka producers (``steps``: the stage's, whose ``to_kafka_topic``
    sinks are opened now)."""

    def __init__(self, operator: str, stage_id: int, index: int, run: int = 0, job: str = "", steps=()) -> None:
        self.operator, self.stage_id, self.index = operator, stage_id, index
        self.kafka = None       # KafkaSinks: the to_kafka_topic producers, opened at the start
        # transactional ids of this instance's Kafka producers: the same for its replacement
        self.kafka_prefix = f"streamlb-{job}-{stage_id}-{index}"
        # a replacement writes its own file
        self.part = f"part-{stage_id:03d}-{index:04d}" + (f"-r{run}" if run else "")
        self.lists: dict[int, list] = collections.defaultdict(list)
        self._writers: dict[str, object] = {}
        self._files: dict[str, str] = {}
        # a checkpointed job stages its outputs per checkpoint (two-phase commit): each
        # checkpoint's files are closed when its barrier passes and committed by the driver
        # once the checkpoint is complete
        self.staged = False
        self.segment = 0
        self.closed: list[list[str]] = []   # [path, file] closed at the end, not yet reported
        self.steps = steps

    def append(self, target: int, x) -> None:
        self.lists[target].append(x)

    def take_lists(self) -> dict[int, list]:
        out = {k: v for k, v in self.lists.items() if v}
        self.lists = collections.defaultdict(list)
        return out

    def write_parquet(self, path: str, x) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not isinstance(x, pd.DataFrame):
            raise PipelineError(
                f"to_parquet({path!r}) in {self.operator!r} got {type(x).__name__}; it writes DataFrames"
            )
        table = pa.Table.from_pandas(x)
        w = self._writers.get(path)
        if w is None:
            tmp = os.path.join(path, "_temporary")
            os.makedirs(tmp, exist_ok=True)
            fn = os.path.join(tmp, f"{self.part}-c{self.segment:05d}.parquet" if self.staged
                              else f"{self.part}.parquet")
            w = self._writers[path] = pq.ParquetWriter(fn, table.schema)
            self._files[path] = fn
        try:
            table = table.cast(w.schema)
        except (pa.ArrowInvalid, ValueError) as exc:
            raise PipelineError(
                f"to_parquet({path!r}): a batch's schema {table.schema} does not match the "
                f"first batch's {w.schema}: {exc}"
            ) from exc
        w.write_table(table)

    def open_kafka(self) -> None:
        """Open the producers of the stage's ``to_kafka_topic`` sinks now (when the instance
        starts: a replacement aborts what the instance it replaces left open, even if it
        writes nothing; one that moves is stopped by then)."""
        from ._kafka_sink import KafkaSinks, kafka_steps

        for step in kafka_steps(self.steps):
            if self.kafka is None:
                self.kafka = KafkaSinks(self.kafka_prefix, lambda: self.staged)
            self.kafka.open(step)

    def write_kafka(self, step, x) -> None:
        if self.kafka is None:
            from ._kafka_sink import KafkaSinks

            self.kafka = KafkaSinks(self.kafka_prefix, lambda: self.staged)
        self.kafka.write(step, x)

    def seal_kafka(self, cid: int) -> None:
        """Checkpoint ``cid``'s barrier passed: Kafka rows since the previous one wait for it."""
        if self.kafka is not None:
            self.kafka.seal(cid)

    def completed(self, cid: int) -> None:
        """Checkpoint ``cid`` is complete: commit the Kafka rows it covers."""
        if self.kafka is not None:
            self.kafka.completed(cid)

    def commit_kafka(self) -> None:
        """A checkpointed job finished: commit the Kafka rows that waited for it."""
        if self.kafka is not None:
            self.kafka.commit_all()

    def end_kafka(self, how: str):
        """A retiring instance's Kafka rows not committed yet (after :meth:`close`): ``"linger"``
        (rescaled away) keeps them for the next checkpoint, and says whether any wait;
        ``"hand_off"`` (moved) returns them for the replacement to write."""
        if self.kafka is None:
            return {} if how == "hand_off" else False
        return self.kafka.hand_off() if how == "hand_off" else self.kafka.linger()

    def adopt_kafka(self, messages: dict) -> None:
        """Write the rows an instance this one replaces handed off (before its own)."""
        self.open_kafka()
        for target, msgs in messages.items():
            if msgs:
                self.kafka.topics[target].adopt(msgs)

    def abort_kafka(self) -> None:
        if self.kafka is not None:
            self.kafka.abort()

    def seal(self) -> list[list[str]]:
        """A checkpoint barrier passed: close the files written since the previous one and
        return them (``[path, file]``); later rows go to new files."""
        files = [[path, self._files[path]] for path in self._writers]
        for w in self._writers.values():
            w.close()
        self._writers.clear()
        self._files.clear()
        self.segment += 1
        return files

    def close(self) -> None:
        """End of stream: close the files (the driver commits them) and commit what the
        Kafka producers hold."""
        if self.kafka is not None:
            self.kafka.close()
        self.closed.extend([path, self._files[path]] for path in self._writers)
        for w in self._writers.values():
            w.close()
        self._writers.clear()

    def take_closed(self) -> list[list[str]]:
        out, self.closed = self.closed, []
        return out

    def abort(self) -> None:
        """A failed or stopped instance removes what it wrote (aborts its Kafka transactions)."""
        if self.kafka is not None:
            self.kafka.abort()
        for path, w in self._writers.items():
            try:
                w.close()
                os.remove(self._files[path])
            except OSError:
                pass
        self._writers.clear()
