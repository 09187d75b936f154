"""Growing the projection's numpy arrays (capacity doubles; never on a request path)."""

from __future__ import annotations

from typing import Final

import numpy as np

MIN_POOL_CAP: Final = 1024
MIN_NODE_CAP: Final = 64  # a new KB's node capacity


def grown(arr: np.ndarray, size: int, new_cap: int) -> np.ndarray:
    out = np.zeros(new_cap, dtype=arr.dtype)
    out[:size] = arr[:size]
    return out
