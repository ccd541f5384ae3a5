"""Key groups: a stable, vectorised hash of keys and the key group → instance mapping.

Pure functions, no Dask. Every process computes the same hash for the same key, so routers
and owners agree without talking (Python's salted ``hash()`` is never used).

Examples
--------
>>> import numpy as np
>>> assign_to_key_group(np.array([1, 2, 3]), 128).tolist()
[65, 78, 109]
>>> assign_to_key_group(np.array(["a", "b"], dtype=object), 128).tolist()
[14, 30]
>>> [instance_for_key_group(g, 8, 2) for g in (0, 3, 4, 7)]
[0, 0, 1, 1]
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .exceptions import KeyTypeError, MigrationError

__all__ = [
    "stable_hash",
    "assign_to_key_group",
    "instance_for_key_group",
    "key_group_range_for_instance",
    "check_key_groups",
]

# A fixed 16-byte key for pandas' SipHash of strings: the same in every process and run.
_STRING_HASH_KEY = "streamlb-kg-v001"
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser: a bijection on 64 bits with good avalanche.
    z = z + _GOLDEN          # the one copy; the rest works in place
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def stable_hash(keys, *, name: str = "key") -> np.ndarray:
    """Hash keys to uint64, identically in every process.

    Parameters
    ----------
    keys : array-like
        Integers (any width, signed or unsigned), booleans or strings.
    name : str
        What the keys are called (a column name), used in error messages.

    Returns
    -------
    numpy.ndarray of uint64

    Raises
    ------
    KeyTypeError
        For floats, datetimes, mixed or other object keys, naming ``name`` and the type.
    """
    arr = keys.to_numpy() if isinstance(keys, (pd.Series, pd.Index)) else np.asarray(keys)
    kind = arr.dtype.kind
    if kind in "iu":
        return _mix64(arr.astype(np.int64, copy=False).view(np.uint64))
    if kind == "b":
        return _mix64(arr.astype(np.uint64))
    if kind in "OUT":
        obj = arr.astype(object, copy=False)
        if len(obj) and not all(isinstance(x, str) for x in obj):
            bad = next(x for x in obj if not isinstance(x, str))
            raise KeyTypeError(
                f"key {name!r} holds a value of type {type(bad).__name__} ({bad!r}); "
                "key groups can hash integers, booleans or strings: cast the key column "
                "to one of them"
            )
        with np.errstate(over="ignore"):
            h = pd.util.hash_array(obj, hash_key=_STRING_HASH_KEY, categorize=False)
        return _mix64(h.astype(np.uint64, copy=False))
    raise KeyTypeError(
        f"key {name!r} has dtype {arr.dtype}, which the key-group hash cannot take; "
        "valid key types are integers, booleans and strings (cast floats or timestamps "
        "to int64 or str first)"
    )


def assign_to_key_group(keys, key_groups: int, *, name: str = "key", dtype=np.int64) -> np.ndarray:
    """Key group of each key: ``stable_hash(key) % key_groups``, as int64 or the integer
    ``dtype`` given (a router sends the smallest that holds ``key_groups - 1``)."""
    check_key_groups(key_groups)
    return (stable_hash(keys, name=name) % np.uint64(key_groups)).astype(dtype)


def check_key_groups(key_groups: int) -> None:
    """Raise ``ValueError`` unless ``key_groups`` is an int in 1..2**20."""
    if not isinstance(key_groups, (int, np.integer)) or not 1 <= key_groups <= 2**20:
        raise ValueError(f"key-groups must be an integer in 1..1048576, got {key_groups!r}")


def instance_for_key_group(key_group: int, key_groups: int, parallelism: int) -> int:
    """Owner of ``key_group`` in the initial, contiguous assignment (as Flink does)."""
    if not 0 <= key_group < key_groups:
        raise ValueError(f"key group {key_group} is outside 0..{key_groups - 1}")
    if not 1 <= parallelism <= key_groups:
        raise ValueError(
            f"parallelism {parallelism} must be in 1..{key_groups} (the number of key groups)"
        )
    return key_group * parallelism // key_groups


def key_group_range_for_instance(instance: int, key_groups: int, parallelism: int) -> range:
    """Key groups that ``instance`` owns in the initial, contiguous assignment."""
    if not 0 <= instance < parallelism:
        raise ValueError(f"instance {instance} is outside 0..{parallelism - 1}")
    start = -(-instance * key_groups // parallelism)
    stop = -(-(instance + 1) * key_groups // parallelism)
    return range(start, stop)


def key_group_of(key, key_groups: int, operator: str = "") -> int:
    """Key group of one key; a key the hash cannot take is a MigrationError naming it."""
    try:
        return int(assign_to_key_group(np.asarray([key]), key_groups)[0])
    except Exception as exc:
        raise MigrationError(f"operator {operator!r}: key {key!r} cannot be split: {exc}") from None
