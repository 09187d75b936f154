"""Visibility masks and the undirected degrees they induce, patched with the graph.

A narrowed caller's view is the subgraph induced by the concepts its rules let it see: a
``uint8`` mask over the nodes and the degree of each node within the mask (what PPR divides
by). A KB's ``MaskCache`` keeps one ``Mask`` per ``RuleSet``, built on first use (numba,
O(n + E)), in a bounded LRU (``MASK_CACHE_ENTRIES``, at most ``MASK_CACHE_BYTES``), and the
projection patches every cached one on every event under the write lock, so a cache never
serves a stale mask. Readers insert under a small mutex; evicting only drops a reference, so
a reader's ``View`` stays valid.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import numba
import numpy as np

from kbgraph.access import RuleSet, visible
from kbgraph.projection.arrays import grown

if TYPE_CHECKING:
    from kbgraph.projection.adjacency import Adjacency
    from kbgraph.projection.nodes import Nodes

MASK_CACHE_ENTRIES: Final = 64
MASK_CACHE_BYTES: Final = 256 << 20


@numba.njit(nogil=True, cache=True)
def masked_degrees(
    off: np.ndarray, ln: np.ndarray, pool: np.ndarray, mask: np.ndarray, deg: np.ndarray
) -> None:  # pragma: no cover - compiled
    for u in range(mask.shape[0]):
        if mask[u]:
            o = off[u]
            c = 0
            for i in range(ln[u]):
                c += mask[pool[o + i]]
            deg[u] = c
        else:
            deg[u] = 0


@numba.njit(cache=True)
def edge_degrees(
    src: np.ndarray,
    dst: np.ndarray,
    flags: np.ndarray,
    edge_flag: int,
    step: int,
    mask: np.ndarray,
    deg: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """deg += step at both ends of each pair with flags == edge_flag, both ends visible."""
    for i in range(src.shape[0]):
        if flags[i] == edge_flag:
            u, v = src[i], dst[i]
            if mask[u] and mask[v]:
                deg[u] += step
                deg[v] += step


@numba.njit(cache=True)
def node_degrees(
    u: int, nb: np.ndarray, step: int, mask: np.ndarray, deg: np.ndarray
) -> None:  # pragma: no cover - compiled
    """deg += step at both ends of each edge u-nb[i] with both ends visible."""
    if mask[u]:
        for i in range(nb.shape[0]):
            v = nb[i]
            if mask[v]:
                deg[v] += step


class Mask:
    """One cached visibility mask with its induced degrees (arrays sized to node capacity)."""

    __slots__ = ("deg", "mask", "rules")

    def __init__(self, rules: RuleSet, mask: np.ndarray, deg: np.ndarray) -> None:
        self.rules = rules
        self.mask = mask
        self.deg = deg


class MaskCache:
    """One KB's cached masks by ``RuleSet``: read by requests (``get``, read lock held),
    patched by the follower (the other methods, write lock held)."""

    __slots__ = ("_entries", "_lock")

    def __init__(self) -> None:
        self._entries: OrderedDict[RuleSet, Mask] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[RuleSet]:
        return iter(list(self._entries))

    def get(self, rules: RuleSet, nodes: Nodes, und: Adjacency) -> Mask:
        """The cached mask for ``rules``, built on a miss (caller holds the read lock)."""
        with self._lock:
            entry = self._entries.get(rules)
            if entry is not None:
                self._entries.move_to_end(rules)
                return entry
        n, cap = len(nodes), nodes.cap
        mask = np.zeros(cap, np.uint8)
        deg = np.zeros(cap, np.int32)
        if n:
            mask[:n] = nodes.visible(rules)
            masked_degrees(und.off, und.len, und.pool, mask[:n], deg[:n])
        limit = max(1, min(MASK_CACHE_ENTRIES, MASK_CACHE_BYTES // (5 * cap)))
        with self._lock:
            entry = self._entries.setdefault(rules, Mask(rules, mask, deg))
            self._entries.move_to_end(rules)
            while len(self._entries) > limit:
                self._entries.popitem(last=False)
        return entry

    # --- patches (follower thread, write lock held) ---------------------------------------

    def edges_changed(self, src: np.ndarray, dst: np.ndarray, flags: np.ndarray, step: int) -> None:
        """The undirected edges src[i]-dst[i] with flags[i] == 2 were added (step 1) or
        removed (step -1): their visible ends' degrees follow."""
        for e in self._entries.values():
            edge_degrees(src, dst, flags, 2, step, e.mask, e.deg)

    def node_dropped(self, u: int, nb: np.ndarray) -> None:
        """u lost its undirected edges to ``nb``."""
        for e in self._entries.values():
            node_degrees(u, nb, -1, e.mask, e.deg)

    def refresh(self, u: int, nodes: Nodes, und: Adjacency) -> None:
        """Recompute u's bit in every cached mask (after u appeared, went or changed type),
        patching its visible neighbours' degrees."""
        if not self._entries:
            return
        alive = bool(nodes.alive[u])
        collection, concept_type = nodes.collections[u], nodes.types[u]
        nb: np.ndarray | None = None
        for e in self._entries.values():
            now = alive and visible(e.rules, collection, concept_type)
            if now == bool(e.mask[u]):
                continue
            if nb is None:
                nb = und.block(u)
            seen = nb[e.mask[nb] != 0]
            if now:
                e.mask[u] = 1
                e.deg[seen] += 1
                e.deg[u] = len(seen)
            else:
                e.mask[u] = 0
                e.deg[seen] -= 1
                e.deg[u] = 0

    def grown(self, n: int, new_cap: int) -> Callable[[], None]:
        """Grow every mask to ``new_cap`` nodes: copies made now (outside the write lock),
        the returned swap installs them (under it)."""
        with self._lock:
            entries = list(self._entries.values())
        # Keyed by id() but holding the entry itself, so an id cannot be reused meanwhile.
        prepared = {
            id(e): (e, grown(e.mask, n, new_cap), grown(e.deg, n, new_cap)) for e in entries
        }

        def swap() -> None:
            for e in self._entries.values():  # readers may have added entries meanwhile
                ready = prepared.get(id(e))
                if ready is not None and ready[0] is e:
                    e.mask, e.deg = ready[1], ready[2]
                else:
                    e.mask, e.deg = grown(e.mask, n, new_cap), grown(e.deg, n, new_cap)

        return swap
