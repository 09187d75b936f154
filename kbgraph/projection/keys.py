"""Every interned concept id as UTF-8 bytes, so the numba kernels compare ids in ``str`` order.

UTF-8 with surrogates passed through orders byte strings exactly as ``str`` orders code
points, so a bisect over these bytes lands where ``bisect`` on the strings would. Each id's
first 16 bytes are kept as two big-endian words (``Keys.pre``), which decide most comparisons
with one memory access; the whole bytes decide a tie.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final

import numba
import numpy as np

from kbgraph.projection.arrays import MIN_POOL_CAP, grown

_PREFIX: Final = struct.Struct(">QQ")  # an id's first 16 bytes as two big-endian words


@numba.njit(cache=True)
def bytes_less(
    kdata: np.ndarray, koff: np.ndarray, a: int, b: int
) -> bool:  # pragma: no cover - compiled
    """ids[a] < ids[b] (a != b), comparing the whole UTF-8 bytes."""
    sa, ea, sb, eb = koff[a], koff[a + 1], koff[b], koff[b + 1]
    for i in range(min(ea - sa, eb - sb)):
        ca, cb = kdata[sa + i], kdata[sb + i]
        if ca != cb:
            return bool(ca < cb)
    return bool(ea - sa < eb - sb)


class Keys:
    """The UTF-8 bytes of every interned id, for the kernels' comparisons in ``str`` order.

    ``data[off[u] : off[u + 1]]`` is ids[u], and ``pre[u]`` its first 16 bytes (zero-padded)
    as two big-endian words, which decide most comparisons with one memory access. Ids are
    interned for good, so only appended. Follower-only (readers never look): grown in place.
    """

    __slots__ = ("data", "end", "off", "pre")

    def __init__(self, ids: list[str], node_cap: int) -> None:
        raw = [utf8(i) for i in ids]
        n = len(raw)
        self.off = np.zeros(node_cap + 1, np.int64)
        np.cumsum(np.fromiter(map(len, raw), np.int64, n), out=self.off[1 : n + 1])
        self.end = int(self.off[n])
        self.data = np.zeros(max(MIN_POOL_CAP, 2 * self.end), np.uint8)
        self.data[: self.end] = np.frombuffer(b"".join(raw), np.uint8)
        self.pre = np.zeros((node_cap, 2), np.uint64)
        self.pre[:n] = prefixes(raw)

    @classmethod
    def from_encoded(cls, blob: np.ndarray, off: np.ndarray, node_cap: int) -> Keys:
        """``Keys`` of the strings of an encoded column (``kbgraph.store.columns.encode_strings``:
        each followed by a NUL), without a Python object per id."""
        n = len(off) - 1
        keys = cls([], node_cap)
        keep = np.ones(len(blob), bool)
        keep[off[1:] - 1] = False  # the NULs
        data = blob[keep]
        keys.off[: n + 1] = off - np.arange(n + 1, dtype=np.int64)
        keys.end = len(data)
        keys.data = np.zeros(max(MIN_POOL_CAP, 2 * keys.end), np.uint8)
        keys.data[: keys.end] = data
        _prefixes_of(keys.data, keys.off, n, keys.pre)
        return keys

    def arrays(self, cap: int) -> dict[str, np.ndarray]:
        """The arrays of the first ``cap`` nodes and the bytes used (``from_arrays``)."""
        return {"pre": self.pre[:cap], "data": self.data[: self.end], "off": self.off[: cap + 1]}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Keys:
        keys = cls([], 0)
        keys.pre, keys.data, keys.off = arrays["pre"], arrays["data"], arrays["off"]
        keys.end = len(keys.data)
        return keys

    def reserve(self, nodes: int, size: int) -> None:
        """Room for ``nodes`` ids in all and ``size`` more bytes."""
        if nodes > len(self.pre):
            cap = 2 * nodes
            self.off = grown(self.off, len(self.off), cap + 1)
            pre = np.zeros((cap, 2), np.uint64)
            pre[: len(self.pre)] = self.pre
            self.pre = pre
        if self.end + size > len(self.data):
            self.data = grown(self.data, self.end, 2 * (self.end + size))

    def add(self, u: int, concept_id: str) -> None:
        """Append ids[u] (u = the number of ids so far). One id at a time (the follower
        interns one an upsert): its bytes and prefix words written through memoryviews, a
        few hundred ns where numpy's per-call overhead (``prefixes``) took microseconds."""
        raw = utf8(concept_id)
        end = self.end + len(raw)
        self.reserve(u + 1, len(raw))
        self.data.data[self.end : end] = raw
        self.off[u + 1] = end
        pre = self.pre.data
        pre[u, 0], pre[u, 1] = _PREFIX.unpack(raw[:16].ljust(16, b"\0"))
        self.end = end


@numba.njit(cache=True)
def _prefixes_of(
    data: np.ndarray, off: np.ndarray, n: int, pre: np.ndarray
) -> None:  # pragma: no cover - compiled
    """pre[u] = ``prefixes`` of ids[u], for u < n."""
    for u in range(n):
        start, end = off[u], off[u + 1]
        for w in range(2):
            word = np.uint64(0)
            for j in range(8):
                at = start + 8 * w + j
                byte = np.uint64(data[at]) if at < end else np.uint64(0)
                word = (word << np.uint64(8)) | byte
            pre[u, w] = word


def prefixes(raw: list[bytes]) -> np.ndarray:
    """uint64[len(raw), 2]: the first 16 bytes of each, zero-padded, as big-endian words."""
    padded = b"".join([r[:16].ljust(16, b"\0") for r in raw])
    return np.frombuffer(padded, ">u8").astype(np.uint64).reshape(len(raw), 2)


def utf8(concept_id: str) -> bytes:
    # surrogatepass: a lone surrogate still encodes, at its code point's place in the order
    return concept_id.encode("utf-8", "surrogatepass")
