"""Adjacency in flat pools, and the numba kernels that patch it per event.

Every id ever mentioned (link targets too) is interned to an int for good, so a re-created
concept keeps its int and a link to a missing concept names a node that is not alive.
Undirected and directed adjacency live in two ``Adjacency`` structures (the
``kbgraph.graphalgo.graph.Graph`` layout): one flat int32 pool each, node ``u`` owning the block
``pool[off[u] : off[u] + cap[u]]`` of which the first ``len[u]`` entries are used, kept sorted
by concept id. An insert into a full block moves it to the pool's end with doubled capacity;
a removal shifts within the block. The patches run as small numba kernels (one call per event
and kind of change) that bisect by the ids' UTF-8 bytes (``kbgraph.projection.keys``);
finding an entry that is there (or checking that it is not) scans a block of up to 64 ints
instead, as each key a bisect probes is a cache miss at a million ids. Every patch costs
O(degree of the concepts it touches).

Compaction: relocated blocks leave holes in the pool. When the holes exceed half of the pool
the follower builds a compacted copy (``compact``, GIL released) without the write lock (the
state cannot change, since it is the only writer) and swaps it in under the write lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numba
import numpy as np

from kbgraph.projection.arrays import MIN_POOL_CAP, grown
from kbgraph.projection.keys import bytes_less

_MIN_BLOCK_CAP: Final = 4
_SCAN_MAX: Final = 64  # blocks up to this length are scanned, not bisected, for an entry
COMPACT_MIN_HOLES = 1 << 16  # module-level so tests can force compaction


_SMALL_GROUP: Final = 16  # a node's neighbours up to this many are sorted by insertion


@numba.njit(nogil=True, cache=True)
def _grouped_ranks(
    src: np.ndarray, dst: np.ndarray, rank: np.ndarray, n: int, undirected: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """(start, len, ranks): node u's distinct neighbours' ranks, ascending, at
    ``ranks[start[u] : start[u] + len[u]]``; the rows grouped by a counting pass, each group
    sorted on its own (by insertion when small) and its repeats dropped in place."""
    start = np.zeros(n + 1, np.int64)
    for u in src:
        start[u + 1] += 1
    if undirected:
        for v in dst:
            start[v + 1] += 1
    for u in range(n):
        start[u + 1] += start[u]
    at = start[:-1].copy()
    ranks = np.empty(start[n], np.int32)
    for i in range(len(src)):
        u, v = src[i], dst[i]
        ranks[at[u]] = rank[v]
        at[u] += 1
        if undirected:
            ranks[at[v]] = rank[u]
            at[v] += 1
    ln = np.zeros(n, np.int64)
    for u in range(n):
        lo, hi = start[u], start[u + 1]
        if hi - lo > _SMALL_GROUP:
            ranks[lo:hi].sort()
        else:
            for i in range(lo + 1, hi):
                x = ranks[i]
                j = i - 1
                while j >= lo and ranks[j] > x:
                    ranks[j + 1] = ranks[j]
                    j -= 1
                ranks[j + 1] = x
        kept = lo
        for i in range(lo, hi):
            if kept == lo or ranks[i] != ranks[kept - 1]:
                ranks[kept] = ranks[i]
                kept += 1
        ln[u] = kept - lo
    return start, ln, ranks


@numba.njit(nogil=True, cache=True)
def _fill_blocks(
    start: np.ndarray,
    ln: np.ndarray,
    ranks: np.ndarray,
    order: np.ndarray,
    off: np.ndarray,
    pool: np.ndarray,
) -> None:  # pragma: no cover - compiled
    for u in range(len(ln)):
        o, s = off[u], start[u]
        for k in range(ln[u]):
            pool[o + k] = order[ranks[s + k]]


@numba.njit(nogil=True, cache=True)
def compact(
    off: np.ndarray,
    ln: np.ndarray,
    cap: np.ndarray,
    pool: np.ndarray,
    new_off: np.ndarray,
    new_pool: np.ndarray,
) -> int:  # pragma: no cover - compiled
    pos = 0
    for u in range(off.shape[0]):
        new_off[u] = pos
        o = off[u]
        for i in range(ln[u]):
            new_pool[pos + i] = pool[o + i]
        pos += cap[u]
    return int(pos)


#
# Blocks are kept sorted by Python ``str`` order of the ids. The kernels compare ids as UTF-8
# bytes (``Keys``): UTF-8 with surrogates passed through orders byte strings exactly as
# ``str`` orders code points, so a bisect here lands where ``bisect`` on the strings would.
# Each adjacency passes (off, len, cap, pool, meta) with meta = [end, holes, total].


@numba.njit(cache=True, inline="always")
def find(
    off: np.ndarray,
    ln: np.ndarray,
    pool: np.ndarray,
    kpre: np.ndarray,
    kdata: np.ndarray,
    koff: np.ndarray,
    u: int,
    v: int,
) -> tuple[int, bool]:  # pragma: no cover - compiled
    """(position of v in u's block, True) or (where v would go, False).

    The 16-byte prefixes decide a comparison unless they tie; then the whole bytes do.
    """
    o = off[u]
    v0, v1 = kpre[v, 0], kpre[v, 1]
    lo, hi = 0, int(ln[u])
    while lo < hi:
        mid = (lo + hi) >> 1
        w = pool[o + mid]
        if w == v:
            return mid, True
        w0 = kpre[w, 0]
        if w0 != v0:
            less = w0 < v0
        else:
            w1 = kpre[w, 1]
            less = w1 < v1 if w1 != v1 else bytes_less(kdata, koff, w, v)
        if less:
            lo = mid + 1
        else:
            hi = mid
    return lo, False


@numba.njit(cache=True, inline="always")
def _index(
    off: np.ndarray,
    ln: np.ndarray,
    pool: np.ndarray,
    kpre: np.ndarray,
    kdata: np.ndarray,
    koff: np.ndarray,
    u: int,
    v: int,
) -> int:  # pragma: no cover - compiled
    """Position of v in u's block, -1 if absent.

    A block of up to ``_SCAN_MAX`` entries is scanned for the int itself: one or two cache
    lines, where a bisect reads the key of each probed entry, a cache miss apiece at a
    million ids. Larger blocks are bisected.
    """
    n = ln[u]
    if n <= _SCAN_MAX:
        o = off[u]
        for i in range(n):
            if pool[o + i] == v:
                return i
        return -1
    pos, found = find(off, ln, pool, kpre, kdata, koff, u, v)
    return pos if found else -1


@numba.njit(cache=True, inline="always")
def _room(ln: np.ndarray, cap: np.ndarray, u: int) -> int:  # pragma: no cover - compiled
    """Pool slots one more entry in u's block may take (a full block moves, doubled)."""
    c = cap[u]
    return max(_MIN_BLOCK_CAP, 2 * c) if ln[u] == c else 0


@numba.njit(cache=True, inline="always")
def _insert_at(
    off: np.ndarray,
    ln: np.ndarray,
    cap: np.ndarray,
    pool: np.ndarray,
    meta: np.ndarray,
    u: int,
    v: int,
    pos: int,
) -> None:  # pragma: no cover - compiled
    """Insert v at ``pos`` of u's block; a full block moves to the pool's end, doubled."""
    o, n, c = off[u], ln[u], cap[u]
    if n == c:
        no = meta[0]
        for i in range(pos):
            pool[no + i] = pool[o + i]
        for i in range(pos, n):
            pool[no + i + 1] = pool[o + i]
        off[u] = no
        cap[u] = max(_MIN_BLOCK_CAP, 2 * c)
        meta[0] += cap[u]
        meta[1] += c
        o = no
    else:
        for i in range(n, pos, -1):
            pool[o + i] = pool[o + i - 1]
    pool[o + pos] = v
    ln[u] = n + 1
    meta[2] += 1


@numba.njit(cache=True, inline="always")
def _remove_at(
    off: np.ndarray, ln: np.ndarray, pool: np.ndarray, meta: np.ndarray, u: int, pos: int
) -> None:  # pragma: no cover - compiled
    o, n = off[u], ln[u]
    for i in range(pos, n - 1):
        pool[o + i] = pool[o + i + 1]
    ln[u] = n - 1
    meta[2] -= 1


@numba.njit(cache=True)
def declare(
    src: np.ndarray,
    dst: np.ndarray,
    flags: np.ndarray,
    uo: np.ndarray,
    ul: np.ndarray,
    uc: np.ndarray,
    up: np.ndarray,
    um: np.ndarray,
    oo: np.ndarray,
    ol: np.ndarray,
    oc: np.ndarray,
    op: np.ndarray,
    om: np.ndarray,
    kpre: np.ndarray,
    kdata: np.ndarray,
    koff: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """src[i] starts declaring dst[i] (both alive, distinct), pair by pair.

    flags[i]: 0 already declared, 1 declared (the undirected edge existed), 2 declared and a
    new undirected edge. Returns the pairs done: fewer than all when a pool lacks room for
    the next one (nothing of it done; grow the pools and call again with the rest).
    """
    for i in range(src.shape[0]):
        u, t = src[i], dst[i]
        pos, found = find(oo, ol, op, kpre, kdata, koff, u, t)
        if found:
            flags[i] = 0
            continue
        if om[0] + _room(ol, oc, u) > op.shape[0]:
            return i
        # u does not declare t: the edge u-t exists iff t declares u. Asked of u's own
        # undirected block (in cache: it is being patched), not of t's out-block.
        upos, had_edge = find(uo, ul, up, kpre, kdata, koff, u, t)
        if not had_edge and um[0] + _room(ul, uc, u) + _room(ul, uc, t) > up.shape[0]:
            return i
        _insert_at(oo, ol, oc, op, om, u, t, pos)
        if had_edge:
            flags[i] = 1
        else:
            _insert_at(uo, ul, uc, up, um, u, t, upos)
            _insert_at(uo, ul, uc, up, um, t, u, find(uo, ul, up, kpre, kdata, koff, t, u)[0])
            flags[i] = 2
    return len(src)


@numba.njit(cache=True)
def undeclare(
    src: np.ndarray,
    dst: np.ndarray,
    flags: np.ndarray,
    uo: np.ndarray,
    ul: np.ndarray,
    up: np.ndarray,
    um: np.ndarray,
    oo: np.ndarray,
    ol: np.ndarray,
    op: np.ndarray,
    om: np.ndarray,
    kpre: np.ndarray,
    kdata: np.ndarray,
    koff: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """src[i] stops declaring dst[i] (both alive), pair by pair.

    flags[i]: 0 was not declared, 1 undeclared (the undirected edge stays: dst declares src),
    2 undeclared and the undirected edge removed.
    """
    for i in range(src.shape[0]):
        u, t = src[i], dst[i]
        pos = _index(oo, ol, op, kpre, kdata, koff, u, t)
        if pos < 0:
            flags[i] = 0
            continue
        _remove_at(oo, ol, op, om, u, pos)
        if _index(oo, ol, op, kpre, kdata, koff, t, u) >= 0:
            flags[i] = 1
        else:
            _remove_at(uo, ul, up, um, u, _index(uo, ul, up, kpre, kdata, koff, u, t))
            _remove_at(uo, ul, up, um, t, _index(uo, ul, up, kpre, kdata, koff, t, u))
            flags[i] = 2


@numba.njit(cache=True)
def drop(
    u: int,
    nb: np.ndarray,
    declares: np.ndarray,
    uo: np.ndarray,
    ul: np.ndarray,
    up: np.ndarray,
    um: np.ndarray,
    oo: np.ndarray,
    ol: np.ndarray,
    op: np.ndarray,
    om: np.ndarray,
    kpre: np.ndarray,
    kdata: np.ndarray,
    koff: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """u stops existing: its undirected edges (to ``nb``, a copy of its block) and its
    out-block go, and u leaves the out-blocks of the neighbours declaring it
    (``declares[i] = 1`` for those)."""
    for i in range(nb.shape[0]):
        s = nb[i]
        _remove_at(uo, ul, up, um, s, _index(uo, ul, up, kpre, kdata, koff, s, u))
        pos = _index(oo, ol, op, kpre, kdata, koff, s, u)
        if pos >= 0:
            _remove_at(oo, ol, op, om, s, pos)
            declares[i] = 1
        else:
            declares[i] = 0
    um[2] -= ul[u]
    ul[u] = 0
    om[2] -= ol[u]
    ol[u] = 0


class Adjacency:
    """Per-node id-sorted blocks in one flat int32 pool (the ``Graph`` layout)."""

    __slots__ = ("cap", "len", "meta", "off", "pool")

    def __init__(self, node_cap: int) -> None:
        self.off = np.zeros(node_cap, np.int64)
        self.len = np.zeros(node_cap, np.int32)
        self.cap = np.zeros(node_cap, np.int32)
        self.pool = np.zeros(MIN_POOL_CAP, np.int32)
        # [first unused pool slot, slots abandoned by relocated blocks, sum of len]: an array
        # so the patch kernels update them in place.
        self.meta = np.zeros(3, np.int64)

    @property
    def end(self) -> int:
        return int(self.meta[0])

    @property
    def holes(self) -> int:
        return int(self.meta[1])

    @property
    def total(self) -> int:
        return int(self.meta[2])

    @classmethod
    def from_edges(
        cls,
        src: np.ndarray,
        dst: np.ndarray,
        rank: np.ndarray,
        order: np.ndarray,
        node_cap: int,
        *,
        undirected: bool,
    ) -> Adjacency:
        """Blocks, with ~25 % slack each, of the edges (src, dst) (both ways when
        ``undirected``; repeats once) over the ``len(rank)`` nodes, each block in id order
        (``rank``: each node's place in it, ``order[rank]`` the node). Linear: the edges
        grouped by node in compiled passes, each group sorted on its own, where a sort of
        every edge's key cost most of a first build's adjacency."""
        n = len(rank)
        start, ln, ranks = _grouped_ranks(
            np.ascontiguousarray(src),  # int32 or int64: each compiled for
            np.ascontiguousarray(dst),
            np.ascontiguousarray(rank, np.int64),
            n,
            undirected,
        )
        adj = cls(node_cap)
        cap = np.where(ln > 0, ln + (ln >> 2) + 2, 0)
        off = np.zeros(n, np.int64)
        np.cumsum(cap[:-1], out=off[1:])
        end = int(cap.sum())
        pool = np.zeros(max(MIN_POOL_CAP, end + end // 2), np.int32)
        _fill_blocks(start, ln, ranks, np.ascontiguousarray(order, np.int64), off, pool)
        adj.off[:n] = off
        adj.len[:n] = ln
        adj.cap[:n] = cap
        adj.pool = pool
        adj.meta[:] = (end, 0, int(ln.sum()))
        return adj

    def grow_nodes(self, n: int, new_cap: int) -> tuple[np.ndarray, ...]:
        return (
            grown(self.off, n, new_cap),
            grown(self.len, n, new_cap),
            grown(self.cap, n, new_cap),
        )

    def install_nodes(self, arrays: tuple[np.ndarray, ...]) -> None:
        self.off, self.len, self.cap = arrays

    def block(self, u: int) -> np.ndarray:
        o = int(self.off[u])
        return self.pool[o : o + int(self.len[u])]

    def ensure_room(self, u: int, v: int) -> None:
        """Room in the pool for one more entry in the blocks of u and of v each."""
        need = 2 * (int(self.cap[u]) + int(self.cap[v]) + _MIN_BLOCK_CAP)
        end = self.end
        if end + need > len(self.pool):
            self.pool = grown(self.pool, end, 2 * (end + need))

    def needs_compaction(self) -> bool:
        return self.holes > max(COMPACT_MIN_HOLES, self.end // 2)

    def compacted(self, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """A compacted copy of pool and offsets (reads only; swap in with ``install``)."""
        live = int(self.cap[:n].sum())
        new_pool = np.zeros(max(MIN_POOL_CAP, live + live // 2), np.int32)
        new_off = np.zeros(len(self.off), np.int64)
        end = compact(self.off[:n], self.len[:n], self.cap[:n], self.pool, new_off, new_pool)
        return new_pool, new_off, int(end)

    def arrays(self, cap: int) -> dict[str, np.ndarray]:
        """The arrays of the first ``cap`` nodes and the pool's used part (``from_arrays``)."""
        return {
            "off": self.off[:cap],
            "len": self.len[:cap],
            "cap": self.cap[:cap],
            "pool": self.pool[: self.end],
            "meta": self.meta,
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Adjacency:
        """The adjacency ``arrays()`` gave (mapped arrays are patched in place; ``meta`` is
        copied, as the kernels write it on every patch)."""
        adj = cls(0)
        adj.off, adj.len, adj.cap = arrays["off"], arrays["len"], arrays["cap"]
        adj.pool = arrays["pool"]
        adj.meta = np.array(arrays["meta"], np.int64)
        return adj

    def install_compacted(self, compacted: tuple[np.ndarray, np.ndarray, int]) -> None:
        self.pool, self.off, end = compacted
        self.meta[0] = end
        self.meta[1] = 0
