"""Which key groups move when an operator's parallelism changes."""
from __future__ import annotations

import numpy as np


def spread(owners, parallelism: int) -> dict[int, int]:
    """Moves that leave ``parallelism`` instances with key groups as even as possible
    (counts differ by at most one), moving as few groups as needed: groups leave only
    instances ``>= parallelism`` (retired) or instances above their share, and go to those
    below it.

    Examples
    --------
    >>> spread([0, 0, 0, 0, 1, 1, 1, 1], 4)
    {2: 2, 3: 2, 6: 3, 7: 3}
    >>> spread([0, 1, 2, 3, 0, 1, 2, 3], 2)
    {2: 0, 3: 0, 6: 1, 7: 1}
    """
    owners = np.asarray(owners, dtype=np.int64)
    G = len(owners)
    base, extra = divmod(G, parallelism)
    # instances that hold most keep the larger shares (fewest moves)
    held = np.bincount(owners[owners < parallelism], minlength=parallelism)
    order = sorted(range(parallelism), key=lambda i: (-held[i], i))
    quota = {i: base + (1 if r < extra else 0) for r, i in enumerate(order)}
    kept: dict[int, int] = {i: 0 for i in range(parallelism)}
    free: list[int] = []
    for g, o in enumerate(owners.tolist()):
        if o < parallelism and kept[o] < quota[o]:
            kept[o] += 1
        else:
            free.append(g)
    # each target takes its share of the freed groups as one run, in group order: an old
    # owner then gives each new one a range (few, larger messages per epoch), and every
    # instance's groups stay in ranges, which its state's shards follow
    slots = [i for i in range(parallelism) for _ in range(quota[i] - kept[i])]
    return dict(zip(free, slots))
