"""The embedded cluster's worker processes do not run the user's script again.

Distributed starts each worker of a ``LocalCluster(processes=True)`` with multiprocessing's
``spawn`` (or ``forkserver``): the parent sends the child its preparation data, which names
the parent's ``__main__`` (its file, or its module for ``python -m``), and the child runs
that script again as ``__mp_main__`` before it unpickles its target. A script that calls
``streamlb.run`` at top level then starts a cluster inside every worker, and Python refuses
("bootstrapping phase"), unless the call sits under ``if __name__ == "__main__":``.

A streamlb worker needs nothing of ``__main__``: user functions travel by value
(``streamlb._functions``) and distributed pickles anything else from ``__main__`` by value
too. So while an embedded cluster of streamlb is alive, the worker processes its nannies
spawn (at start, and when a nanny restarts a worker later) get preparation data without
``__main__``; every other process is spawned as multiprocessing does it.
"""
from __future__ import annotations

import multiprocessing.spawn
import threading
import weakref

__all__ = ["embedded"]

#: The name distributed's Nanny gives the worker process it spawns (``distributed.nanny``).
NANNY_PROCESS = "Dask Worker process (from Nanny)"

_clusters: weakref.WeakSet = weakref.WeakSet()     # the embedded clusters started
_starting = 0                                      # embedded clusters being started
_lock = threading.Lock()
_prepare = None                                    # multiprocessing's own get_preparation_data


def _without_main() -> bool:
    return _starting > 0 or any(c.status.name not in ("closing", "closed", "failed") for c in list(_clusters))


def _preparation_data(name):
    data = _prepare(name)
    if name == NANNY_PROCESS and _without_main():
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


def embedded(start):
    """``start()``, which returns a new embedded cluster, its worker processes spawned
    without ``__main__``, as are those its nannies restart while it is open."""
    global _prepare, _starting
    with _lock:
        if _prepare is None:
            # the Popen classes look the function up in the module at each start
            _prepare = multiprocessing.spawn.get_preparation_data
            multiprocessing.spawn.get_preparation_data = _preparation_data
        _starting += 1
    try:
        cluster = start()
        _clusters.add(cluster)
        return cluster
    finally:
        with _lock:
            _starting -= 1
