"""Which workers a recovery can deploy on: those that answer the driver and reach each other.

A partition can leave every worker alive and listed by the scheduler while two of them
cannot exchange a byte; a frozen worker stays listed too. Deploying a job across such a
cut fails again at the first record sent over it. :func:`reachable` probes the workers
before a recovery deploys:

1. the driver calls each worker's ``run`` handler directly (the client's connection pool,
   not the scheduler's broadcast) under :func:`asyncio.wait_for`: a worker that does not
   answer within ``timeout`` (stopped, overloaded, cut off from the driver) is left out,
   and never holds the probe up longer than that;
2. the function it runs opens a connection (:func:`distributed.comm.connect`, the workers'
   own protocol and security) to every other worker's address, all at once, each within
   half the timeout, and answers the ones it could not reach;
3. two workers are linked when each reached the other; the workers kept are the largest
   set of answering workers all linked to each other (:func:`largest_linked_set`).

The whole probe ends within ``timeout`` seconds, whatever the workers do.
"""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Mapping

#: Up to this many candidates, every subset is tried (2**12 = 4096 sets); beyond, greedily.
EXACT_UP_TO = 12

#: What :func:`reachable` lists, for a worker that did not answer the driver, as the one it
#: could not reach.
DRIVER = "driver"


def largest_linked_set(workers: Iterable[str], unreached: Mapping[str, Iterable[str]],
                       current: Iterable[str] = ()) -> list[str]:
    """The largest set of ``workers`` in which every two reached each other, sorted.

    ``unreached[w]``: the workers ``w`` could not reach (a link needs both directions).
    Of several largest sets, the one holding more of ``current`` (the workers the job ran
    on), then the first in sorted order. Exact for up to :data:`EXACT_UP_TO` workers;
    beyond, greedy (each worker in turn as a seed, then the best-linked workers that fit).
    """
    nodes = sorted(set(workers))
    cut = {w: set(unreached.get(w, ())) for w in nodes}

    def linked(a: str, b: str) -> bool:
        return b not in cut[a] and a not in cut[b]

    here = set(current)

    def rank(group) -> tuple:
        return (len(group), sum(w in here for w in group))

    if len(nodes) <= EXACT_UP_TO:
        for size in range(len(nodes), 0, -1):
            fits = [g for g in itertools.combinations(nodes, size)
                    if all(linked(a, b) for a, b in itertools.combinations(g, 2))]
            if fits:        # combinations come in sorted order: max keeps the first of a tie
                return list(max(fits, key=rank))
        return []
    degree = {w: sum(linked(w, o) for o in nodes if o != w) for w in nodes}
    order = sorted(nodes, key=lambda w: (-degree[w], w not in here, w))
    best: list[str] = []
    for seed in order:
        group = [seed]
        for w in order:
            if w != seed and all(linked(w, g) for g in group):
                group.append(w)
        if rank(group) > rank(best) or (rank(group) == rank(best) and sorted(group) < sorted(best)):
            best = group
    return sorted(best)


async def unreached_peers(peers: list[str], timeout: float, dask_worker=None) -> list[str]:
    """Run on a worker (``Client.run`` or its ``run`` handler): the ``peers`` it cannot open
    a connection to within ``timeout`` seconds, tried all at once."""
    from distributed.comm import connect

    args = dask_worker.connection_args if dask_worker is not None else {}

    async def fails(address: str) -> bool:
        try:
            comm = await asyncio.wait_for(connect(address, timeout=timeout, **args), timeout)
        except Exception:
            return True
        comm.abort()
        return False

    results = await asyncio.gather(*(fails(p) for p in peers))
    return [p for p, failed in zip(peers, results) if failed]


async def _probe(client, workers: list[str], timeout: float) -> dict[str, list[str]]:
    """Each worker's unreached peers; :data:`DRIVER` alone for a worker that did not answer."""
    from distributed.protocol.pickle import dumps

    async def ask(worker: str) -> list[str]:
        peers = [w for w in workers if w != worker]
        call = client.rpc(worker).run(function=dumps(unreached_peers), args=dumps((peers, timeout / 2)),
                                      kwargs=dumps({}), wait=True)
        try:
            reply = await asyncio.wait_for(call, timeout)
        except Exception:
            return [DRIVER]
        if not isinstance(reply, dict) or reply.get("status") != "OK":
            return [DRIVER]
        return list(reply["result"])

    answers = await asyncio.gather(*(ask(w) for w in workers))
    return dict(zip(workers, answers))


def reachable(client, workers: list[str], timeout: float = 3.0,
              current: Iterable[str] = ()) -> tuple[list[str], dict[str, list[str]]]:
    """The largest set of ``workers`` that answer the driver within ``timeout`` seconds and
    reach each other, and for the log, each worker's unreached ones (:data:`DRIVER` for a
    worker that did not answer; a worker that reached all is not listed). Ties go to the
    set holding more of ``current``. Called from a driver thread (never the client's loop);
    returns within about ``timeout`` seconds."""
    workers = sorted(set(workers))
    if not workers:
        return [], {}
    unreached = client.sync(_probe, client, workers, timeout, callback_timeout=timeout + 5)
    answered = [w for w in workers if DRIVER not in unreached[w]]
    kept = largest_linked_set(answered, unreached, current)
    return kept, {w: cut for w, cut in unreached.items() if cut}
