"""What a store that keeps one Python entry per key (``keys``: key -> entry, ``by_group``:
key group -> its keys) answers alike: window state and ``process`` state."""
from __future__ import annotations

import numpy as np

from ._stateful_map import _key_array


class KeyDict:
    keys: dict
    by_group: dict

    def contains(self, keys, groups=None) -> np.ndarray:
        return np.fromiter((k in self.keys for k in np.asarray(keys).tolist()), bool, len(keys))

    def keys_per_group(self, groups) -> np.ndarray:
        return np.array([len(self.by_group.get(int(g), ())) for g in groups], np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def key_kind(self) -> str | None:
        return _key_array([next(iter(self.keys))]).dtype.kind if self.keys else None
