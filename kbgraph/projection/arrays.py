"""Growing the projection's numpy arrays (capacity doubles; never on a request path)."""

from __future__ import annotations

from typing import Final

import numpy as np

MIN_POOL_CAP: Final = 1024
MIN_NODE_CAP: Final = 64  # a new KB's node capacity


def sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct keys (np.unique's hash path is ~10x slower on millions of int64)."""
    keys.sort()
    if len(keys) < 2:
        return keys
    keep = np.empty(len(keys), dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def grown(arr: np.ndarray, size: int, new_cap: int) -> np.ndarray:
    out = np.zeros(new_cap, dtype=arr.dtype)
    out[:size] = arr[:size]
    return out
