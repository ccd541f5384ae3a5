"""Calls of a Kafka sink's writer that wait for the broker, each with a bound it keeps.

librdkafka's own timeouts are not always kept: after a broker restarts, a producer's
``send_offsets_to_transaction`` can wait for ever for the consumer group's coordinator
whatever its timeout (librdkafka 2.x, confluentinc/librdkafka#5456 and #5511; seen with
the test broker, noida-db, in about 1 run of 4 of the broker-restart test). :func:`bounded`
runs such a call in a daemon thread and stops waiting for it after its bound: the caller
then gives the producer up (:class:`Stuck`) and fences it with a new one of the same
transactional id. A thread left waiting keeps its producer alive (never destroyed under it)
and cannot keep the worker process from exiting.
"""
from __future__ import annotations

import threading
import time

GRACE = 2.0         # s a call may overrun the timeout it was given before it counts as stuck


class Stuck(Exception):
    """A broker call that did not return within its bound (its producer is given up)."""


def left(deadline: float, cap: float) -> float:
    """The timeout of the next call: at most ``cap`` s and what remains before ``deadline``
    (a ``time.monotonic()`` value), at least 0.1 s."""
    return max(0.1, min(cap, deadline - time.monotonic()))


def bounded(what: str, timeout: float, fn, *args):
    """``fn(*args, timeout)`` (a librdkafka call given ``timeout`` s), waited for at most
    ``timeout`` + :data:`GRACE` s; raises :class:`Stuck` naming ``what`` if it has not
    returned by then, else returns or raises what it did.

    >>> bounded("sum", 1.0, lambda a, b, t: a + b, 1, 2)
    3
    """
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, timeout)
        except BaseException as exc:        # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name=f"streamlb-kafka-{what}", daemon=True)
    t.start()
    t.join(timeout + GRACE)
    if t.is_alive():
        raise Stuck(f"{what} did not return within {timeout + GRACE:g} s (given {timeout:g} s)")
    if "error" in box:
        raise box["error"]
    return box.get("value")
