"""Batches queued for an instance, applied as one.

An operator's cost per batch has a fixed part (the call, the store's bookkeeping, a
``process`` function's set-up, the metrics) beside its cost per row. When an instance falls
behind, its queue holds several small batches, and paying that fixed part once for all of
them is what lets it catch up, as Flink's network stack hands an operator whole buffers and
timely dataflow an operator everything that is ready. One place where it matters: after a
move of a keyed join, the keyed stage after it (same key, groups not moved) gets two batches
for each one it got before, one from each instance (docs/nexmark.md, session 32).

What may be applied together, taken from the front of the queue: data batches only, each
sender's in its own order and none of a sender's past its first message that is not one
(a watermark, an epoch marker, a checkpoint barrier, an end), so every sender's messages
keep their order. Messages of different senders come in any order anyway, so taking another
sender's batch ahead of such a message is an order that could have happened. Nothing is
gathered while the instance aligns an epoch or a checkpoint, while key groups move to it,
for batches of a lazy epoch or with split-key partials, for combined batches (one row per
distinct key: an aggregate merges them as such, and two of them together would hold a key
twice), or across batches with other columns, dtypes or kind of index (a join's two
sides). Batches of :data:`MAX_ROWS` rows or more go alone, so full-speed batches are not
copied. The merged batch counts as emitted when its oldest part was, so a latency measured
on it is never below its records' own.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd

from .._state._partials import RECORDS
from ._messages import Batch

MAX_ROWS = 65_536       # gather while the rows stay below this
SCAN = 32               # queued messages looked at, at most


def _plain(msg) -> bool:
    return (isinstance(msg, Batch) and not msg.partials and msg.need is None and not msg.arrived
            and RECORDS not in msg.frame.columns)


def _gatherable(inst, msg) -> bool:
    return (_plain(msg) and len(msg.frame) < MAX_ROWS and not inst.blocked and not inst.ckpt.blocking
            and not inst.owner.pending_in and not inst.owner.merging)


def _same_kind(a: Batch, b: Batch) -> bool:
    """Batches that make one frame of the same columns, dtypes and kind of index as each
    (a Parquet sink keeps an index that is not a range as a column: every batch it writes
    must have one, or none)."""
    fa, fb = a.frame, b.frame
    return ((a.groups is None) == (b.groups is None) and fa.columns.equals(fb.columns)
            and fa.dtypes.equals(fb.dtypes) and _ranged(fa) == _ranged(fb)
            and (_ranged(fa) or (fa.index.dtype == fb.index.dtype and fa.index.names == fb.index.names)))


def _ranged(frame: pd.DataFrame) -> bool:
    return isinstance(frame.index, pd.RangeIndex)


def gather(ready, first: tuple) -> list:
    """``first`` (``(sender, msg, fut)``, just taken from the deque ``ready``) and the batches
    behind it that may be applied with it, taken out of ``ready``; the rest stays in order."""
    msg = first[1]
    taken, kept, stopped, rows = [first], [], set(), len(msg.frame)
    for _ in range(min(len(ready), SCAN)):
        item = ready.popleft()
        sender, m, _ = item
        if sender in stopped or not _plain(m) or rows + len(m.frame) > MAX_ROWS or not _same_kind(msg, m):
            stopped.add(sender)     # none of this sender's later messages may pass this one
            kept.append(item)
            continue
        taken.append(item)
        rows += len(m.frame)
    ready.extendleft(reversed(kept))
    return taken


def coalesce(inst, sender: int, msg, fut) -> tuple:
    """The message to apply next at instance ``inst``: ``msg`` itself, or a batch of it and
    the batches queued behind it (see the module's docstring), whose future, once set, sets
    each part's."""
    if not inst.inbox or not _gatherable(inst, msg):
        return sender, msg, fut
    parts = gather(inst.inbox.ready, (sender, msg, fut))
    if len(parts) == 1:
        return sender, msg, fut
    try:
        # a range index stays one (numbered afresh); any other keeps each part's labels
        frame = pd.concat([inst.op.arrive(m.frame, s) for s, m, _ in parts], ignore_index=_ranged(msg.frame))
    except Exception:       # a batch it cannot take: each goes alone, and fails where it would have
        inst.inbox.ready.extendleft(reversed(parts[1:]))
        return sender, msg, fut
    groups = None if msg.groups is None else np.concatenate([m.groups for _, m, _ in parts])
    futs = [f for _, _, f in parts if f is not None]
    done = asyncio.get_running_loop().create_future()
    done.add_done_callback(lambda _: [f.set_result(None) for f in futs if not f.done()])
    return sender, Batch(frame, min(m.emitted for _, m, _ in parts), groups, arrived=True), done
