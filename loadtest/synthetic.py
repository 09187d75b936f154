"""Synthetic knowledge bases for load tests and benchmarks, and a direct ``Graph`` builder.

- ``seed_kb(n, seed)``: the seed's KB, the one ``kbgraph demo`` serves (``kbgraph.sources.demokb``,
  re-exported here with its id scheme and words): concept ``i`` is ``f"{col}/c{i:04d}"``
  (``c%07d`` when n > 10,000) with ``col = COLLECTIONS[i % 9]``, 8 out-links to uniform
  random other concepts, 5% of them to concepts that never exist.
- ``hub_kb(n, seed)``: the same id scheme, links by preferential attachment (Barabási–Albert
  like): concept ``i`` links to 8 earlier concepts picked in proportion to their degree, so a
  few hubs gather most links.
- ``graph_from_concepts(concepts)`` / ``build_graph(ids, src, dst)``: the projection's
  ``Graph`` (undirected and out blocks sorted by id), built in one vectorised pass, for
  benchmarks and tests that do not need the real projection.

Everything is deterministic for a given ``(n, seed)``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from kbgraph.graphalgo.graph import Graph, View
from kbgraph.sources.demokb import (
    COLLECTIONS,
    LINKS_PER_CONCEPT,
    MISSING_SHARE,
    TYPES,
    WORDS,
    concept_id,
    concepts_from_links,
    kb_ids,
    missing_id,
    seed_kb,
    seed_links,
)

__all__ = [
    "COLLECTIONS",
    "LINKS_PER_CONCEPT",
    "MISSING_SHARE",
    "TYPES",
    "WORDS",
    "build_graph",
    "concept_id",
    "full_view",
    "graph_from_concepts",
    "hub_kb",
    "hub_links",
    "kb_ids",
    "masked_view",
    "missing_id",
    "seed_kb",
    "seed_links",
]


def hub_links(n: int, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """Preferential attachment links ``(src, dst)`` (``dst == -1``: a missing target)."""
    rng = random.Random(seed)
    m = LINKS_PER_CONCEPT
    src: list[int] = []
    dst: list[int] = []
    ends: list[int] = []  # every edge end once: sampling from it is degree-proportional
    for i in range(n):
        if i == 0:
            continue
        picks: set[int] = set()
        want = min(m, i)
        while len(picks) < want:
            if ends and rng.random() < 0.9:
                picks.add(ends[rng.randrange(len(ends))])
            else:
                picks.add(rng.randrange(i))
        for t in sorted(picks):
            src.append(i)
            dst.append(t)
            ends.append(i)
            ends.append(t)
    # the first concepts also link forward, so that every concept has out-links
    for i in range(min(m, n)):
        for t in range(i + 1, min(m + 1, n)):
            src.append(i)
            dst.append(t)
    s = np.array(src, np.int64)
    d = np.array(dst, np.int64)
    nprng = np.random.default_rng(seed)
    d[nprng.random(d.shape[0]) < MISSING_SHARE] = -1
    return s, d


def hub_kb(n: int = 1000, seed: int = 42) -> list[dict[str, Any]]:
    """A hub-heavy (preferential attachment) KB with the same id scheme as ``seed_kb``."""
    src, dst = hub_links(n, seed)
    return concepts_from_links(n, src, dst, seed)


def build_graph(ids: Sequence[str], src: np.ndarray, dst: np.ndarray) -> Graph:
    """The projection's ``Graph`` from directed links ``src[k] -> dst[k]`` (ints into ``ids``).

    Links with ``dst < 0`` (missing targets), self-links and duplicates are dropped; an
    undirected edge joins u != v when either links to the other; every block is sorted by id.
    Node ``u`` is ``ids[u]`` (the caller's interning order).
    """
    n = len(ids)
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    keep = (dst >= 0) & (src != dst)
    src, dst = src[keep], dst[keep]
    order = sorted(range(n), key=ids.__getitem__)
    rank = np.empty(n, np.int64)
    rank[np.array(order, np.int64)] = np.arange(n, dtype=np.int64)
    by_rank = np.array(order, np.int64)

    def blocks(s: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        key = np.sort(s * n + rank[d])  # by (source, id of target); np.unique is slow here
        if key.shape[0]:
            fresh = np.empty(key.shape[0], bool)
            fresh[0] = True
            np.not_equal(key[1:], key[:-1], out=fresh[1:])
            key = key[fresh]
        s2 = key // n
        d2 = by_rank[key % n]
        length = np.bincount(s2, minlength=n).astype(np.int32)
        off = np.zeros(n, np.int64)
        if n:
            off[1:] = np.cumsum(length, dtype=np.int64)[:-1]
        return off, length, d2.astype(np.int32)

    out_off, out_len, out = blocks(src, dst)
    und_off, und_len, und = blocks(np.concatenate([src, dst]), np.concatenate([dst, src]))
    return Graph(und_off, und_len, und, out_off, out_len, out, list(ids))


def graph_from_concepts(concepts: Sequence[dict[str, Any]]) -> Graph:
    """``build_graph`` for a concept list (interned in list order; missing targets dropped)."""
    ids = [c["id"] for c in concepts]
    index = {cid: i for i, cid in enumerate(ids)}
    src: list[int] = []
    dst: list[int] = []
    for i, c in enumerate(concepts):
        for t in c.get("links", ()):
            j = index.get(t)
            if j is not None:
                src.append(i)
                dst.append(j)
    return build_graph(ids, np.array(src, np.int64), np.array(dst, np.int64))


def full_view(graph: Graph) -> View:
    """The view that shows every node."""
    return View(graph, np.ones(graph.n, np.uint8), graph.und_len.astype(np.int32))


def masked_view(graph: Graph, mask: np.ndarray) -> View:
    """The view of the subgraph induced by ``mask`` with its degrees (O(edges), vectorised)."""
    mask = np.ascontiguousarray(mask, np.uint8)
    owner = np.repeat(np.arange(graph.n), graph.und_len)
    vis = mask[graph.und].astype(np.int32) if graph.und.shape[0] else np.zeros(0, np.int32)
    deg = np.bincount(owner, weights=vis, minlength=graph.n).astype(np.int32)
    return View(graph, mask, deg)
