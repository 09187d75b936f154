"""The in-memory projection of every KB's link graph, patched per log record.

Each process builds its projections once from ``Store.load()`` (one consistent snapshot and
the global log position ``gid`` it reflects) and then follows the store's log from that
position in a single follower thread (``Projections``). The store is the source of truth; the
projection is derived state, never rebuilt per call.

Semantics of a log record (the store already decided that it applies):

- ``concept.upserted``: the concept exists afterwards with the given fields; its declared
  out-links become ``set(links) - {itself}``.
- ``concept.deleted``: the concept stops existing; its edges and its own declared out-links
  go; other concepts' declared links to it stay declared (edges again once it is re-created).
- ``link.added`` / ``link.removed``: add / remove one declared out-link of the subject.
- Nodes are the existing concepts; an undirected edge u-v (u != v) exists when u declares v or
  v declares u and both exist; a directed out-edge u->v when u declares v and v exists.

Layout (per KB, see ``kbgraph.graphalgo.graph``): every id ever mentioned (link targets too) is
interned to an int for good, with an ``alive`` flag, so a re-created concept keeps its int and a
link to a missing concept simply names a node that is not alive. Undirected and directed
adjacency live in two ``_Adjacency`` structures: one flat int32 pool each, node ``u`` owning
the block ``pool[off[u] : off[u] + cap[u]]`` of which the first ``len[u]`` entries are used,
kept sorted by concept id. An insert into a full block moves it to the pool's end with doubled
capacity; a removal shifts within the block. The patches run as small numba kernels (one call
per event and kind of change) that bisect by the ids' UTF-8 bytes (``_Keys``: 16-byte
prefixes, whole bytes on a tie), which order exactly as Python orders the strings; finding an
entry that is there (or checking that it is not) scans a block of up to 64 ints instead, as
each key a bisect probes is a cache miss at a million ids.
Declared links are held without a Python set per node: a declared link to an existing target
*is* the out-block entry; links to missing targets are kept in ``_missing_out[u]`` (targets)
and ``_pending_in[t]`` (sources), so a concept appearing turns its declared in-links into edges
in O(its degree), and a concept disappearing moves them back (its undirected neighbours that
remain after its own out-links went are exactly the concepts declaring it).

Every patch costs O(degree of the concepts it touches): bisects and shifts within blocks,
plus, per cached visibility mask, O(1) per edge and O(degree) per node whose visibility
changes. Arrays grow by doubling; the follower allocates and copies the grown arrays *before*
taking the write lock (it is the only writer, so nothing changes meanwhile) and swaps them in
under it, so requests rarely pay for a copy (only when one batch outgrows the headroom).

Compaction: relocated blocks leave holes in the pool. When the holes exceed half of the pool
the follower builds a compacted copy (numba, GIL released) without the write lock — the state
cannot change, since it is the only writer — and swaps it in under the write lock. Never on a
request path.

Consistency: each KB has a writer-preferring readers-writer lock (``kbgraph.rwlock``). The
follower applies WHOLE deliveries, in batches, under the write lock; a request holds the read
lock for its whole duration (``KBProjection.read()``), so it only ever sees states between
deliveries. A batch ends after the delivery that reaches ``MAX_BATCH_EVENTS`` (2,000) events
or ``MAX_BATCH_SECONDS`` (5 ms); a single delivery is never split. Worst-case reader wait:
the requests already holding the read lock when the follower asked for the write lock
(writer preference queues new readers behind it) plus one batch: at most 5 ms plus the apply
time of the delivery that crosses the bound. Measured (loadtest/bench_projection.py, mean
degree 16, two cached masks) at 13-45 us per event on a shared 2-core machine, so a typical
delivery of a few events adds well under 1 ms and a 1,000-event delivery 13-45 ms (a
delivery is atomic by contract, so that is its price). Releasing the write lock hands off to
every reader queued meanwhile before the follower may write again, so a backlog cannot
starve readers: they interleave with it batch by batch.

Visibility: ``Snapshot.view(rules)`` returns ``View(graph, mask, deg)``. Admin (``None``)
reads ``alive`` and the undirected block lengths directly. Each other ``RuleSet`` gets a mask
and its induced degrees, built on first use (numba, O(n + E)) and cached per KB in a bounded
LRU (64 entries, at most ``MASK_CACHE_BYTES``); every cached mask is patched by every event
under the write lock, so a cache never serves a stale mask. Readers insert into the cache
under a small mutex; evicting only drops a reference, so a reader's ``View`` stays valid.

Search: each KB keeps one ``SearchIndex`` (``kbgraph.search``) as ``index``; the follower
calls ``put`` on every upsert that creates a concept or changes its title, text or tags, and
``remove`` on every delete, under the write lock, so search sees the same delivery-whole state
as the graph.

Failure: if reading the log raises (SQLite busy, I/O), nothing was applied and the follower
retries with a growing pause (up to 1 s). If applying a record raises (a bug), the follower
logs it, stores it in ``Projections.error`` and stops following: a projection that missed an
event must not pretend to be current.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import numba
import numpy as np

from kbgraph.access import RuleSet, visible
from kbgraph.events import (
    ConceptDeleted,
    ConceptUpserted,
    DeleteData,
    Event,
    LinkAdded,
    LinkRemoved,
    UpsertData,
)
from kbgraph.graphalgo.graph import Graph, View
from kbgraph.names import collection_of
from kbgraph.rwlock import RWLock
from kbgraph.store import KBState, LogRecord, Store

try:
    from kbgraph.search import SearchIndex
except ImportError:  # pragma: no cover - until kbgraph/search.py lands

    class SearchIndex:  # type: ignore[no-redef]
        """No-op stand-in with the interface the projection calls."""

        def put(self, node: int, title: str, text: str, aliases=(), tags=()) -> None:
            pass

        def remove(self, node: int) -> None:
            pass


log = logging.getLogger(__name__)

MAX_BATCH_EVENTS: Final = 2_000
MAX_BATCH_SECONDS: Final = 0.005
MASK_CACHE_ENTRIES: Final = 64
MASK_CACHE_BYTES: Final = 256 << 20
READ_LOG_LIMIT: Final = 10_000
_MIN_NODE_CAP: Final = 64
_MIN_POOL_CAP: Final = 1024
_MIN_BLOCK_CAP: Final = 4
_SCAN_MAX: Final = 64  # blocks up to this length are scanned, not bisected, for an entry
COMPACT_MIN_HOLES = 1 << 16  # module-level so tests can force compaction


# --- numba kernels (GIL released) ---------------------------------------------------------


@numba.njit(nogil=True, cache=True)
def _masked_degrees(off, ln, pool, mask, deg):  # pragma: no cover - compiled
    for u in range(mask.shape[0]):
        if mask[u]:
            o = off[u]
            c = 0
            for i in range(ln[u]):
                c += mask[pool[o + i]]
            deg[u] = c
        else:
            deg[u] = 0


@numba.njit(nogil=True, cache=True)
def _compact(off, ln, cap, pool, new_off, new_pool):  # pragma: no cover - compiled
    pos = 0
    for u in range(off.shape[0]):
        new_off[u] = pos
        o = off[u]
        for i in range(ln[u]):
            new_pool[pos + i] = pool[o + i]
        pos += cap[u]
    return pos


# --- patch kernels (follower thread, write lock held) -------------------------------------
#
# Blocks are kept sorted by Python ``str`` order of the ids. The kernels compare ids as UTF-8
# bytes (``_Keys``): UTF-8 with surrogates passed through orders byte strings exactly as
# ``str`` orders code points, so a bisect here lands where ``bisect`` on the strings would.
# Each adjacency passes (off, len, cap, pool, meta) with meta = [end, holes, total].


@numba.njit(cache=True)
def _bytes_less(kdata, koff, a, b):  # pragma: no cover - compiled
    """ids[a] < ids[b] (a != b), comparing the whole UTF-8 bytes."""
    sa, ea, sb, eb = koff[a], koff[a + 1], koff[b], koff[b + 1]
    for i in range(min(ea - sa, eb - sb)):
        ca, cb = kdata[sa + i], kdata[sb + i]
        if ca != cb:
            return ca < cb
    return ea - sa < eb - sb


@numba.njit(cache=True, inline="always")
def _find(off, ln, pool, kpre, kdata, koff, u, v):  # pragma: no cover - compiled
    """(position of v in u's block, True) or (where v would go, False).

    The 16-byte prefixes decide a comparison unless they tie; then the whole bytes do.
    """
    o = off[u]
    v0, v1 = kpre[v, 0], kpre[v, 1]
    lo, hi = 0, np.int64(ln[u])
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
            less = w1 < v1 if w1 != v1 else _bytes_less(kdata, koff, w, v)
        if less:
            lo = mid + 1
        else:
            hi = mid
    return lo, False


@numba.njit(cache=True, inline="always")
def _index(off, ln, pool, kpre, kdata, koff, u, v):  # pragma: no cover - compiled
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
    pos, found = _find(off, ln, pool, kpre, kdata, koff, u, v)
    return pos if found else -1


@numba.njit(cache=True, inline="always")
def _room(ln, cap, u):  # pragma: no cover - compiled
    """Pool slots one more entry in u's block may take (a full block moves, doubled)."""
    c = cap[u]
    return max(_MIN_BLOCK_CAP, 2 * c) if ln[u] == c else 0


@numba.njit(cache=True, inline="always")
def _insert_at(off, ln, cap, pool, meta, u, v, pos):  # pragma: no cover - compiled
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
def _remove_at(off, ln, pool, meta, u, pos):  # pragma: no cover - compiled
    o, n = off[u], ln[u]
    for i in range(pos, n - 1):
        pool[o + i] = pool[o + i + 1]
    ln[u] = n - 1
    meta[2] -= 1


@numba.njit(cache=True)
def _declare(
    src, dst, flags, uo, ul, uc, up, um, oo, ol, oc, op, om, kpre, kdata, koff
):  # pragma: no cover - compiled
    """src[i] starts declaring dst[i] (both alive, distinct), pair by pair.

    flags[i]: 0 already declared, 1 declared (the undirected edge existed), 2 declared and a
    new undirected edge. Returns the pairs done: fewer than all when a pool lacks room for
    the next one (nothing of it done; grow the pools and call again with the rest).
    """
    for i in range(src.shape[0]):
        u, t = src[i], dst[i]
        pos, found = _find(oo, ol, op, kpre, kdata, koff, u, t)
        if found:
            flags[i] = 0
            continue
        if om[0] + _room(ol, oc, u) > op.shape[0]:
            return i
        had_edge = _index(oo, ol, op, kpre, kdata, koff, t, u) >= 0
        if not had_edge and um[0] + _room(ul, uc, u) + _room(ul, uc, t) > up.shape[0]:
            return i
        _insert_at(oo, ol, oc, op, om, u, t, pos)
        if had_edge:
            flags[i] = 1
        else:
            _insert_at(uo, ul, uc, up, um, u, t, _find(uo, ul, up, kpre, kdata, koff, u, t)[0])
            _insert_at(uo, ul, uc, up, um, t, u, _find(uo, ul, up, kpre, kdata, koff, t, u)[0])
            flags[i] = 2
    return src.shape[0]


@numba.njit(cache=True)
def _undeclare(
    src, dst, flags, uo, ul, up, um, oo, ol, op, om, kpre, kdata, koff
):  # pragma: no cover - compiled
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
def _drop(u, nb, declares, uo, ul, up, um, oo, ol, op, om, kpre, kdata, koff):  # pragma: no cover
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


@numba.njit(cache=True)
def _edge_degrees(src, dst, flags, edge_flag, step, mask, deg):  # pragma: no cover - compiled
    """deg += step at both ends of each pair with flags == edge_flag, both ends visible."""
    for i in range(src.shape[0]):
        if flags[i] == edge_flag:
            u, v = src[i], dst[i]
            if mask[u] and mask[v]:
                deg[u] += step
                deg[v] += step


@numba.njit(cache=True)
def _node_degrees(u, nb, step, mask, deg):  # pragma: no cover - compiled
    """deg += step at both ends of each edge u-nb[i] with both ends visible."""
    if mask[u]:
        for i in range(nb.shape[0]):
            v = nb[i]
            if mask[v]:
                deg[v] += step
                deg[u] += step


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct keys (np.unique's hash path is ~10x slower on millions of int64)."""
    keys.sort()
    if len(keys) < 2:
        return keys
    keep = np.empty(len(keys), dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _grown(arr: np.ndarray, size: int, new_cap: int) -> np.ndarray:
    out = np.zeros(new_cap, dtype=arr.dtype)
    out[:size] = arr[:size]
    return out


class _Adjacency:
    """Per-node id-sorted blocks in one flat int32 pool (the ``Graph`` layout)."""

    __slots__ = ("cap", "len", "meta", "off", "pool")

    def __init__(self, node_cap: int) -> None:
        self.off = np.zeros(node_cap, np.int64)
        self.len = np.zeros(node_cap, np.int32)
        self.cap = np.zeros(node_cap, np.int32)
        self.pool = np.zeros(_MIN_POOL_CAP, np.int32)
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
    def from_sorted(cls, src: np.ndarray, dst: np.ndarray, n: int, node_cap: int) -> _Adjacency:
        """Blocks from edges already sorted by (src, id of dst), with ~25 % slack each."""
        adj = cls(node_cap)
        ln = np.bincount(src, minlength=n).astype(np.int64)
        cap = np.where(ln > 0, ln + (ln >> 2) + 2, 0)
        off = np.zeros(n, np.int64)
        np.cumsum(cap[:-1], out=off[1:])
        end = int(cap.sum())
        pool = np.zeros(max(_MIN_POOL_CAP, end + end // 2), np.int32)
        starts = np.zeros(n, np.int64)
        np.cumsum(ln[:-1], out=starts[1:])
        pool[off[src] + (np.arange(len(src), dtype=np.int64) - starts[src])] = dst
        adj.off[:n] = off
        adj.len[:n] = ln
        adj.cap[:n] = cap
        adj.pool = pool
        adj.meta[:] = (end, 0, len(src))
        return adj

    def grow_nodes(self, n: int, new_cap: int) -> tuple[np.ndarray, ...]:
        return (
            _grown(self.off, n, new_cap),
            _grown(self.len, n, new_cap),
            _grown(self.cap, n, new_cap),
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
            self.pool = _grown(self.pool, end, 2 * (end + need))

    def needs_compaction(self) -> bool:
        return self.holes > max(COMPACT_MIN_HOLES, self.end // 2)

    def compacted(self, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """A compacted copy of pool and offsets (reads only; swap in with ``install``)."""
        live = int(self.cap[:n].sum())
        new_pool = np.zeros(max(_MIN_POOL_CAP, live + live // 2), np.int32)
        new_off = np.zeros(len(self.off), np.int64)
        end = _compact(self.off[:n], self.len[:n], self.cap[:n], self.pool, new_off, new_pool)
        return new_pool, new_off, int(end)

    def install_compacted(self, compacted: tuple[np.ndarray, np.ndarray, int]) -> None:
        self.pool, self.off, end = compacted
        self.meta[0] = end
        self.meta[1] = 0


class _Keys:
    """The UTF-8 bytes of every interned id, for the kernels' comparisons in ``str`` order.

    ``data[off[u] : off[u + 1]]`` is ids[u], and ``pre[u]`` its first 16 bytes (zero-padded)
    as two big-endian words, which decide most comparisons with one memory access. Ids are
    interned for good, so only appended. Follower-only (readers never look): grown in place.
    """

    __slots__ = ("data", "end", "off", "pre")

    def __init__(self, ids: list[str], node_cap: int) -> None:
        raw = [_utf8(i) for i in ids]
        n = len(raw)
        self.off = np.zeros(node_cap + 1, np.int64)
        np.cumsum(np.fromiter(map(len, raw), np.int64, n), out=self.off[1 : n + 1])
        self.end = int(self.off[n])
        self.data = np.zeros(max(_MIN_POOL_CAP, 2 * self.end), np.uint8)
        self.data[: self.end] = np.frombuffer(b"".join(raw), np.uint8)
        self.pre = np.zeros((node_cap, 2), np.uint64)
        self.pre[:n] = _prefixes(raw)

    def reserve(self, nodes: int, size: int) -> None:
        """Room for ``nodes`` ids in all and ``size`` more bytes."""
        if nodes > len(self.pre):
            cap = 2 * nodes
            self.off = _grown(self.off, len(self.off), cap + 1)
            pre = np.zeros((cap, 2), np.uint64)
            pre[: len(self.pre)] = self.pre
            self.pre = pre
        if self.end + size > len(self.data):
            self.data = _grown(self.data, self.end, 2 * (self.end + size))

    def add(self, u: int, concept_id: str) -> None:
        """Append ids[u] (u = the number of ids so far)."""
        raw = _utf8(concept_id)
        end = self.end + len(raw)
        self.reserve(u + 1, len(raw))
        self.data[self.end : end] = np.frombuffer(raw, np.uint8)
        self.off[u + 1] = end
        self.pre[u] = _prefixes([raw])[0]
        self.end = end


def _prefixes(raw: list[bytes]) -> np.ndarray:
    """uint64[len(raw), 2]: the first 16 bytes of each, zero-padded, as big-endian words."""
    padded = b"".join([r[:16].ljust(16, b"\0") for r in raw])
    return np.frombuffer(padded, ">u8").astype(np.uint64).reshape(len(raw), 2)


def _utf8(concept_id: str) -> bytes:
    # surrogatepass: a lone surrogate still encodes, at its code point's place in the order
    return concept_id.encode("utf-8", "surrogatepass")


class _Mask:
    """One cached visibility mask with its induced degrees (arrays sized to node capacity)."""

    __slots__ = ("deg", "mask", "rules")

    def __init__(self, rules: RuleSet, mask: np.ndarray, deg: np.ndarray) -> None:
        self.rules = rules
        self.mask = mask
        self.deg = deg


class Snapshot:
    """A consistent state of one KB; valid only inside ``KBProjection.read()``'s with-block."""

    __slots__ = (
        "_kb",
        "aliases",
        "graph",
        "ids",
        "index",
        "seq",
        "statuses",
        "tags",
        "texts",
        "titles",
        "types",
        "versions",
    )

    def __init__(self, kb: KBProjection) -> None:
        n = len(kb.ids)
        self._kb = kb
        self.seq: int = kb.seq
        self.graph = Graph(
            und_off=kb._und.off[:n],
            und_len=kb._und.len[:n],
            und=kb._und.pool,
            out_off=kb._out.off[:n],
            out_len=kb._out.len[:n],
            out=kb._out.pool,
            ids=kb.ids,
        )
        self.index: SearchIndex = kb.index
        self.ids: Sequence[str] = kb.ids
        self.titles: Sequence[str] = kb.titles
        self.aliases: Sequence[list[str]] = kb.aliases
        self.types: Sequence[str] = kb.types
        self.statuses: Sequence[str] = kb.statuses
        self.tags: Sequence[list[str]] = kb.tags
        self.texts: Sequence[str] = kb.texts
        self.versions: Sequence[int] = kb.versions

    def view(self, rules: RuleSet | None) -> View:
        """The subgraph visible under ``rules`` (None = admin: every existing concept)."""
        n = len(self.ids)
        kb = self._kb
        if rules is None:
            return View(self.graph, kb._alive[:n], kb._und.len[:n])
        entry = kb._mask_for(rules)
        return View(self.graph, entry.mask[:n], entry.deg[:n])

    def node(self, concept_id: str) -> int | None:
        """The int of an existing concept, else None."""
        kb = self._kb
        u = kb._index_of.get(concept_id)
        return u if u is not None and kb._alive[u] else None

    def is_visible(self, node: int, view: View) -> bool:
        return 0 <= node < len(view.mask) and bool(view.mask[node])

    def declared_links(self, node: int) -> list[str]:
        """Sorted ids of the node's declared out-links, missing targets included."""
        kb = self._kb
        ids = kb.ids
        out = [ids[t] for t in kb._out.block(node).tolist()]
        missing = kb._missing_out.get(node)
        if missing:
            out.extend(ids[t] for t in missing)
            out.sort()
        return out

    def counts(self, view: View) -> tuple[int, int]:
        """(visible concepts, visible undirected edges)."""
        nodes = int(np.count_nonzero(view.mask))
        edges = int(view.deg.sum(dtype=np.int64)) // 2
        return nodes, edges


class KBProjection:
    """One KB's projection. Mutated only by the follower thread, under the write lock."""

    def __init__(self, name: str, *, index_factory: Callable[[], SearchIndex] = SearchIndex):
        self.name = name
        self.seq = 0
        self.lock = RWLock()
        self.index = index_factory()
        self._node_cap = _MIN_NODE_CAP
        self._index_of: dict[str, int] = {}
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.aliases: list[list[str]] = []
        self.types: list[str] = []
        self.statuses: list[str] = []
        self.tags: list[list[str]] = []
        self.texts: list[str] = []
        self.versions: list[int] = []
        self.collections: list[str] = []
        self._alive = np.zeros(self._node_cap, np.uint8)
        self._cls = np.zeros(self._node_cap, np.int32)  # (collection, type) class per node
        self._classes: list[tuple[str, str]] = []
        self._class_of: dict[tuple[str, str], int] = {}
        self._collection_names: dict[str, str] = {}
        self._und = _Adjacency(self._node_cap)
        self._out = _Adjacency(self._node_cap)
        self._keys = _Keys([], self._node_cap)
        self._missing_out: dict[int, set[int]] = {}  # u -> declared targets not alive
        self._pending_in: dict[int, set[int]] = {}  # t (not alive) -> sources declaring it
        self._masks: OrderedDict[RuleSet, _Mask] = OrderedDict()
        self._masks_lock = threading.Lock()
        self._batch_hint = MAX_BATCH_EVENTS

    # --- reading ------------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Snapshot]:
        """Hold the read lock for the whole request; the snapshot is valid inside only."""
        self.lock.acquire_read()
        try:
            yield Snapshot(self)
        finally:
            self.lock.release_read()

    def _mask_for(self, rules: RuleSet) -> _Mask:
        """The cached mask for ``rules``, built on a miss (caller holds the read lock)."""
        with self._masks_lock:
            entry = self._masks.get(rules)
            if entry is not None:
                self._masks.move_to_end(rules)
                return entry
        n = len(self.ids)
        lut = np.fromiter(
            (visible(rules, c, t) for c, t in self._classes), np.uint8, len(self._classes)
        )
        mask = np.zeros(self._node_cap, np.uint8)
        deg = np.zeros(self._node_cap, np.int32)
        if n:
            mask[:n] = self._alive[:n] & lut[self._cls[:n]]
            _masked_degrees(self._und.off, self._und.len, self._und.pool, mask[:n], deg[:n])
        limit = max(1, min(MASK_CACHE_ENTRIES, MASK_CACHE_BYTES // (5 * self._node_cap)))
        with self._masks_lock:
            entry = self._masks.setdefault(rules, _Mask(rules, mask, deg))
            self._masks.move_to_end(rules)
            while len(self._masks) > limit:
                self._masks.popitem(last=False)
        return entry

    # --- building -----------------------------------------------------------------------

    def build(self, state: KBState) -> None:
        """Build from a snapshot (vectorised). Call before the projection is shared."""
        concepts = state.concepts
        n0 = len(concepts)
        ids = [c.id for c in concepts]
        index_of = dict(zip(ids, range(n0), strict=True))
        counts = np.fromiter((len(c.links) for c in concepts), np.int64, n0)
        flat = list(itertools.chain.from_iterable(c.links for c in concepts))
        for t in sorted({t for t in flat if t not in index_of}):
            index_of[t] = len(ids)
            ids.append(t)
        n = len(ids)
        node_cap = max(_MIN_NODE_CAP, 1 << (n - 1).bit_length())
        src = np.repeat(np.arange(n0, dtype=np.int64), counts)
        dst = np.fromiter(map(index_of.__getitem__, flat), np.int64, len(flat))
        del flat
        order = np.array(sorted(range(n), key=ids.__getitem__), np.int64)
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        to_alive = dst < n0
        for u, t in zip(src[~to_alive].tolist(), dst[~to_alive].tolist(), strict=True):
            self._missing_out.setdefault(u, set()).add(t)
            self._pending_in.setdefault(t, set()).add(u)
        src, dst = src[to_alive], dst[to_alive]
        okey = _sorted_unique(src * n + rank[dst])
        self._out = _Adjacency.from_sorted(okey // n, order[okey % n], n, node_cap)
        del okey
        ukey = _sorted_unique(np.concatenate((src * n + rank[dst], dst * n + rank[src])))
        del src, dst
        self._und = _Adjacency.from_sorted(ukey // n, order[ukey % n], n, node_cap)
        del ukey

        self._node_cap = node_cap
        self._index_of = index_of
        self.ids = ids
        self._keys = _Keys(ids, node_cap)
        missing = n - n0
        self.titles = [c.title for c in concepts] + [""] * missing
        self.aliases = [c.aliases for c in concepts] + [[] for _ in range(missing)]
        self.types = [c.type for c in concepts] + [""] * missing
        self.statuses = [c.status for c in concepts] + [""] * missing
        self.tags = [c.tags for c in concepts] + [[] for _ in range(missing)]
        self.texts = [c.text for c in concepts] + [""] * missing
        self.versions = [c.version for c in concepts] + [0] * missing
        self.collections = [self._collection(i) for i in ids]
        self._alive = np.zeros(node_cap, np.uint8)
        self._alive[:n0] = 1
        self._cls = np.zeros(node_cap, np.int32)
        self._cls[:n] = np.fromiter(map(self._class, self.collections, self.types), np.int32, n)
        for u, c in enumerate(concepts):
            self.index.put(u, c.title, c.text, c.aliases, c.tags)
        self.seq = state.seq

    def _collection(self, concept_id: str) -> str:
        """collection_of, one shared string per collection (a million ids, a few names)."""
        name = collection_of(concept_id)
        return self._collection_names.setdefault(name, name)

    def _class(self, collection: str, concept_type: str) -> int:
        key = (collection, concept_type)
        k = self._class_of.get(key)
        if k is None:
            k = self._class_of[key] = len(self._classes)
            self._classes.append(key)
        return k

    # --- growth and compaction (follower thread only) -----------------------------------

    def _prepare(self, records: Sequence[LogRecord]) -> Callable[[], None] | None:
        """Grow or compact outside the write lock; returns the swap to run under it."""
        n = len(self.ids)
        mentions = 0
        for r in records:
            data = r.event.data
            mentions += 2 + len(getattr(data, "links", ()))
        swaps: list[Callable[[], None]] = []
        grow_nodes = n + mentions > self._node_cap
        if grow_nodes:
            new_cap = max(2 * self._node_cap, 1 << (n + mentions - 1).bit_length())
            swaps.append(self._grow_nodes_swap(new_cap))
        self._keys.reserve(n + mentions, 32 * mentions)  # follower-only: grown in place
        for adj in (self._und, self._out):
            if not grow_nodes and adj.needs_compaction():  # both would replace ``off``
                compacted = adj.compacted(n)
                swaps.append(lambda adj=adj, c=compacted: adj.install_compacted(c))
            elif adj.end + 4 * mentions + 64 > 3 * len(adj.pool) // 4:
                pool = _grown(adj.pool, adj.end, 2 * len(adj.pool) + 8 * mentions)

                def swap(adj: _Adjacency = adj, pool: np.ndarray = pool) -> None:
                    adj.pool = pool

                swaps.append(swap)
        if not swaps:
            return None

        def run() -> None:
            for s in swaps:
                s()

        return run

    def _grow_nodes_swap(self, new_cap: int) -> Callable[[], None]:
        n = len(self.ids)
        und = self._und.grow_nodes(n, new_cap)
        out = self._out.grow_nodes(n, new_cap)
        alive = _grown(self._alive, n, new_cap)
        cls = _grown(self._cls, n, new_cap)
        with self._masks_lock:
            entries = list(self._masks.values())
        # Keyed by id() but holding the entry itself, so an id cannot be reused meanwhile.
        grown = {id(e): (e, _grown(e.mask, n, new_cap), _grown(e.deg, n, new_cap)) for e in entries}

        def swap() -> None:
            self._und.install_nodes(und)
            self._out.install_nodes(out)
            self._alive, self._cls, self._node_cap = alive, cls, new_cap
            for e in self._masks.values():  # readers may have added entries meanwhile
                prepared = grown.get(id(e))
                if prepared is not None and prepared[0] is e:
                    e.mask, e.deg = prepared[1], prepared[2]
                else:
                    e.mask, e.deg = _grown(e.mask, n, new_cap), _grown(e.deg, n, new_cap)

        return swap

    def _grow_nodes_now(self) -> None:
        self._grow_nodes_swap(2 * self._node_cap)()

    # --- applying (follower thread, write lock held) ------------------------------------

    def apply(self, deliveries: Sequence[Sequence[LogRecord]]) -> int:
        """Apply whole deliveries under the write lock until the batch bound; returns how many.

        The batch ends after the delivery that reaches MAX_BATCH_EVENTS events or
        MAX_BATCH_SECONDS; a delivery is never split. Call again with the rest.
        """
        # Prepare for about twice what the last batch managed (never scan all of them).
        head: list[LogRecord] = []
        for d in deliveries:
            head.extend(d)
            if len(head) >= self._batch_hint:
                break
        swap = self._prepare(head)
        done = 0
        apply_one = self._apply
        clock = time.perf_counter
        with self.lock.write():
            if swap is not None:
                swap()
            start = clock()
            events = 0
            for d in deliveries:
                for r in d:
                    apply_one(r.event)
                self.seq = d[-1].seq
                done += 1
                events += len(d)
                if events >= MAX_BATCH_EVENTS or clock() - start >= MAX_BATCH_SECONDS:
                    break
        self._batch_hint = min(MAX_BATCH_EVENTS, max(64, 2 * events))
        return done

    def _apply(self, event: Event) -> None:
        if isinstance(event, ConceptUpserted):
            self._upsert(event)
        elif isinstance(event, ConceptDeleted):
            self._delete(event)
        elif isinstance(event, LinkAdded | LinkRemoved):
            self._link_event(event)

    def _intern(self, concept_id: str) -> int:
        u = self._index_of.get(concept_id)
        if u is not None:
            return u
        u = len(self.ids)
        if u >= self._node_cap:
            self._grow_nodes_now()
        self._index_of[concept_id] = u
        self.ids.append(concept_id)
        self._keys.add(u, concept_id)
        collection = self._collection(concept_id)
        self.collections.append(collection)
        self.titles.append("")
        self.aliases.append([])
        self.types.append("")
        self.statuses.append("")
        self.tags.append([])
        self.texts.append("")
        self.versions.append(0)
        self._cls[u] = self._class(collection, "")
        return u

    def _upsert(self, event: ConceptUpserted) -> None:
        data = event.data
        index_of = self._index_of
        u = index_of.get(event.subject)
        if u is None:
            u = self._intern(event.subject)
        was_alive = bool(self._alive[u])
        # The declared links to existing concepts. A re-upsert mostly repeats them: resolve
        # those through their own ids first, a small dict, as at a million ids each lookup in
        # ``index_of`` costs several cache misses (its table, its entry, its key, its value).
        declared: list[int] = self._out.block(u).tolist() if was_alive else []
        ids = self.ids
        known = {ids[t]: t for t in declared}
        links: set[int] = set()
        for target in data.links:
            t = known.get(target)
            if t is None:
                t = index_of.get(target)
                if t is None:
                    t = self._intern(target)
            links.add(t)
        links.discard(u)
        alive = self._alive
        # An unchanged title, text, aliases and tags leave the search index as it is.
        reindex = (
            not was_alive
            or self.titles[u] != data.title
            or self.texts[u] != data.text
            or self.aliases[u] != data.aliases
            or self.tags[u] != data.tags
        )
        self.titles[u] = data.title
        self.aliases[u] = list(data.aliases)
        self.statuses[u] = data.status
        self.tags[u] = list(data.tags)
        self.texts[u] = data.text
        self.versions[u] = data.version
        type_changed = self.types[u] != data.type
        if type_changed:
            self.types[u] = data.type
            self._cls[u] = self._class(self.collections[u], data.type)
        src: list[int] = []
        dst: list[int] = []
        if not was_alive:
            alive[u] = 1
            self._refresh_visibility(u)  # no edges yet: only u's own mask bits
            for s in self._pending_in.pop(u, ()):
                missing = self._missing_out[s]
                missing.discard(u)
                if not missing:
                    del self._missing_out[s]
                src.append(s)
                dst.append(u)
            new = links
        else:
            if type_changed:
                self._refresh_visibility(u)
            missing = self._missing_out.get(u)
            old = set(declared)
            if missing:
                old |= missing
            if old == links:
                new = set()  # the common re-upsert: nothing to patch
            else:
                gone = [t for t in declared if t not in links]
                if gone:
                    self._undeclare_alive([u] * len(gone), gone)
                if missing:
                    for t in missing - links:
                        self._undeclare_missing(u, t)
                new = links - old
        for t in new:
            if alive[t]:
                src.append(u)
                dst.append(t)
            else:
                self._declare_missing(u, t)
        if src:
            self._declare_alive(src, dst)
        if reindex:
            self.index.put(u, data.title, data.text, data.aliases, data.tags)

    def _pools(self) -> tuple[np.ndarray, ...]:
        """The arrays the removing kernels (``_drop``, ``_undeclare``) take, in their order."""
        und, out, keys = self._und, self._out, self._keys
        return (und.off, und.len, und.pool, und.meta, out.off, out.len, out.pool, out.meta,
                keys.pre, keys.data, keys.off)  # fmt: skip

    def _delete(self, event: ConceptDeleted) -> None:
        u = self._index_of.get(event.subject)
        if u is None or not self._alive[u]:
            return
        missing = self._missing_out.get(u)
        if missing:
            for t in list(missing):
                self._undeclare_missing(u, t)
        # Every undirected edge of u goes; the neighbours declaring u go back to pending.
        nb = self._und.block(u).copy()
        declares = np.zeros(len(nb), np.int8)
        _drop(u, nb, declares, *self._pools())
        for e in self._masks.values():
            _node_degrees(u, nb, -1, e.mask, e.deg)
        declarers = nb[declares != 0].tolist()
        if declarers:
            for s in declarers:
                self._missing_out.setdefault(s, set()).add(u)
            self._pending_in[u] = set(declarers)
        self._alive[u] = 0
        self._refresh_visibility(u)
        self.versions[u] = event.data.version
        self.texts[u] = ""
        self.tags[u] = []
        self.aliases[u] = []
        self.index.remove(u)

    def _link_event(self, event: LinkAdded | LinkRemoved) -> None:
        u = self._index_of.get(event.subject)
        if u is None or not self._alive[u]:
            return  # the store never logs these; tolerate them
        t = self._intern(event.data.target)
        if t != u:
            added = isinstance(event, LinkAdded)
            if self._alive[t]:
                if added:
                    self._declare_alive([u], [t])
                else:
                    self._undeclare_alive([u], [t])
            elif added:
                self._declare_missing(u, t)
            elif t in self._missing_out.get(u, ()):
                self._undeclare_missing(u, t)
        self.versions[u] = event.data.version

    def _declare_alive(self, sources: list[int], targets: list[int]) -> None:
        """sources[i] (alive) declares targets[i] (alive, != sources[i]); already declared
        pairs are left as they are."""
        src = np.array(sources, np.int32)
        dst = np.array(targets, np.int32)
        flags = np.empty(len(src), np.int8)
        und, out, keys = self._und, self._out, self._keys
        done = 0
        while True:
            done += _declare(
                src[done:],
                dst[done:],
                flags[done:],
                und.off,
                und.len,
                und.cap,
                und.pool,
                und.meta,
                out.off,
                out.len,
                out.cap,
                out.pool,
                out.meta,
                keys.pre,
                keys.data,
                keys.off,
            )
            if done == len(src):
                break
            # Rare: the batch outgrew the headroom ``_prepare`` left.
            und.ensure_room(sources[done], targets[done])
            out.ensure_room(sources[done], targets[done])
        for e in self._masks.values():
            _edge_degrees(src, dst, flags, 2, 1, e.mask, e.deg)

    def _undeclare_alive(self, sources: list[int], targets: list[int]) -> None:
        """sources[i] (alive) stops declaring targets[i] (alive); pairs not declared are
        left as they are."""
        src = np.array(sources, np.int32)
        dst = np.array(targets, np.int32)
        flags = np.empty(len(src), np.int8)
        _undeclare(src, dst, flags, *self._pools())
        for e in self._masks.values():
            _edge_degrees(src, dst, flags, 2, -1, e.mask, e.deg)

    def _declare_missing(self, u: int, t: int) -> None:
        """u (alive) declares t (not alive)."""
        self._missing_out.setdefault(u, set()).add(t)
        self._pending_in.setdefault(t, set()).add(u)

    def _undeclare_missing(self, u: int, t: int) -> None:
        """u (alive) stops declaring t (not alive, declared)."""
        missing = self._missing_out[u]
        missing.discard(t)
        if not missing:
            del self._missing_out[u]
        pending = self._pending_in[t]
        pending.discard(u)
        if not pending:
            del self._pending_in[t]

    def _refresh_visibility(self, u: int) -> None:
        """Recompute u's bit in every cached mask, patching its visible neighbours' degrees."""
        if not self._masks:
            return
        alive = bool(self._alive[u])
        collection, concept_type = self.collections[u], self.types[u]
        nb: np.ndarray | None = None
        for e in self._masks.values():
            now = alive and visible(e.rules, collection, concept_type)
            if now == bool(e.mask[u]):
                continue
            if nb is None:
                nb = self._und.block(u)
            seen = nb[e.mask[nb] != 0]
            if now:
                e.mask[u] = 1
                e.deg[seen] += 1
                e.deg[u] = len(seen)
            else:
                e.mask[u] = 0
                e.deg[seen] -= 1
                e.deg[u] = 0


class Projections:
    """Every KB of this process, kept current by one follower thread reading the store's log."""

    def __init__(
        self,
        store: Store,
        *,
        poll_interval: float = 0.005,
        index_factory: Callable[[], SearchIndex] = SearchIndex,
    ) -> None:
        self.store = store
        self.poll_interval = poll_interval
        self.gid = 0  # global log position applied
        self.error: BaseException | None = None
        self._index_factory = index_factory
        self._kbs: dict[str, KBProjection] = {}
        self._kick = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[str, int], None]] = []
        self._waiters_lock = threading.Lock()
        self._waiters: dict[str, list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future]]] = {}

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Build every KB from one consistent snapshot, then follow the log from its gid."""
        self.load()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="kbgraph-follower", daemon=True)
        self._thread.start()

    def load(self) -> None:
        """Build every KB from ``store.load()`` without following (``start`` = load + follow).

        Tests and tools may then call ``follow_once`` themselves.
        """
        _warm_up()
        snapshot = self.store.load()
        for name, state in snapshot.kbs.items():
            kb = KBProjection(name, index_factory=self._index_factory)
            kb.build(state)
            self._kbs[name] = kb
        self.gid = snapshot.gid

    def stop(self) -> None:
        self._stopping.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def kick(self) -> None:
        """A local commit happened: follow now instead of at the next poll."""
        self._kick.set()

    def get(self, kb: str) -> KBProjection | None:
        return self._kbs.get(kb)

    def names(self) -> list[str]:
        return sorted(self._kbs)

    def seq(self, kb: str) -> int:
        """The KB's applied log position (0 if it has none)."""
        p = self._kbs.get(kb)
        return p.seq if p is not None else 0

    def add_listener(self, fn: Callable[[str, int], None]) -> None:
        """``fn(kb, seq)`` runs in the follower thread after each applied batch."""
        self._listeners.append(fn)

    async def wait_for(self, kb: str, seq: int, timeout: float) -> bool:
        """True once ``kb`` has applied ``seq``; False after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        waiter = (seq, loop, future)
        with self._waiters_lock:
            if self.seq(kb) >= seq:
                return True
            self._waiters.setdefault(kb, []).append(waiter)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return self.seq(kb) >= seq
        finally:
            with self._waiters_lock:
                waiting = self._waiters.get(kb)
                if waiting and waiter in waiting:
                    waiting.remove(waiter)
                    if not waiting:
                        del self._waiters[kb]

    # --- following ----------------------------------------------------------------------

    def follow_once(self) -> int:
        """Read and apply what the log holds after ``gid``; returns the records applied."""
        try:
            records = self.store.read_log(self.gid, READ_LOG_LIMIT)
        except Exception as exc:  # nothing applied: safe to try again
            raise _ReadFailed from exc
        if not records:
            return 0
        by_kb: dict[str, list[LogRecord]] = {}
        for r in records:
            by_kb.setdefault(r.kb, []).append(r)
        for name, recs in by_kb.items():
            kb = self._kbs.get(name)
            if kb is None:
                kb = KBProjection(name, index_factory=self._index_factory)
            deliveries = _deliveries(recs)
            while deliveries:
                done = kb.apply(deliveries)
                deliveries = deliveries[done:]
                if name not in self._kbs:
                    self._kbs[name] = kb
                self._notify(name, kb.seq)
        self.gid = records[-1].gid
        return len(records)

    def _run(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            self._kick.wait(max(self.poll_interval, backoff))
            self._kick.clear()
            if self._stopping.is_set():
                break
            try:
                while self.follow_once() >= READ_LOG_LIMIT and not self._stopping.is_set():
                    pass
                backoff = 0.0
            except _ReadFailed as exc:  # e.g. SQLite busy or I/O: retry, slower each time
                backoff = min(1.0, max(0.01, 2 * backoff))
                log.warning(
                    "reading the log failed (retrying in %.2f s): %r", backoff, exc.__cause__
                )
            except Exception as exc:
                log.exception("projection follower stopped: applying the log failed")
                self.error = exc
                return

    def _notify(self, kb: str, seq: int) -> None:
        with self._waiters_lock:
            waiting = self._waiters.get(kb, ())
            ready = [w for w in waiting if w[0] <= seq]
        for _, loop, future in ready:
            with contextlib.suppress(RuntimeError):  # the waiter's loop is closed
                loop.call_soon_threadsafe(_resolve, future)
        for fn in self._listeners:
            try:
                fn(kb, seq)
            except Exception:
                log.exception("projection listener failed")


class _ReadFailed(Exception):
    """``read_log`` raised: nothing was applied, the follower retries."""


def _warm_up() -> None:
    """Compile the numba kernels at start-up, not on the first narrowed request."""
    off = np.zeros(1, np.int64)
    ln = np.zeros(1, np.int32)
    pool = np.zeros(1, np.int32)
    _masked_degrees(off, ln, pool, np.ones(1, np.uint8), np.zeros(1, np.int32))
    _compact(off, ln, ln, pool, np.zeros(1, np.int64), np.zeros(1, np.int32))
    kb = KBProjection("warm-up")
    kb._masks[()] = _Mask((), np.ones(_MIN_NODE_CAP, np.uint8), np.zeros(_MIN_NODE_CAP, np.int32))
    kb._upsert(_warm_up_event("a", ["b"]))
    kb._upsert(_warm_up_event("b", ["a"]))
    kb._upsert(_warm_up_event("a", []))
    kb._delete(ConceptDeleted(**_WARM_UP_ENVELOPE, subject="b", data=DeleteData(version=2)))


_WARM_UP_ENVELOPE: Final = {"specversion": "1.0", "id": "warm-up", "source": "warm-up"}


def _warm_up_event(subject: str, links: list[str]) -> ConceptUpserted:
    data = UpsertData(version=1, links=links)
    return ConceptUpserted(**_WARM_UP_ENVELOPE, subject=subject, data=data)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(True)


def _deliveries(records: list[LogRecord]) -> list[list[LogRecord]]:
    """Split one KB's records into deliveries (``read_log`` returns whole deliveries only)."""
    out: list[list[LogRecord]] = []
    start = 0
    for i, r in enumerate(records):
        if r.last_in_delivery:
            out.append(records[start : i + 1])
            start = i + 1
    if start < len(records):  # an unterminated tail: read_log promises it never happens
        out.append(records[start:])
    return out
