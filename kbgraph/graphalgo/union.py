"""Walks and paths over a graph given by its neighbours: the links and the mentions together.

The link graph has flat arrays and numba kernels (``ppr``, ``paths``, ``smooth``); the union of
links and mention edges (``kbgraph.projection.mentions``) is read node by node instead, through
a ``Weighted``: ``neighbours(u)`` gives u's visible neighbours and the weight of each edge (each
neighbour once, in any order), ``degree(u)`` the sum of those weights (read without the list
where the caller can: a hub's degree is all a walk asks of it), ``key(u)`` u's id. Every loop
below orders nodes by ``key`` and no sum depends on the order of a node's neighbours, so the
results never depend on how ids were interned as ints, and a caller who passes the visible
subgraph's neighbours gets what a graph without the hidden nodes gives.

- ``weighted_ppr``: personalized PageRank by forward push (Andersen, Chung, Lang, "Local graph
  partitioning using PageRank vectors", FOCS 2006) on a weighted undirected graph: a push of
  u adds ``alpha r(u)`` to ``p(u)`` and shares ``(1 - alpha) r(u)`` among u's neighbours in
  proportion to the edges' weights; u is pushed while ``r(u) >= eps * d(u)``, ``d(u)`` the sum
  of its edges' weights; an isolated node keeps its residual. Pushes run in rounds, each round's
  nodes in id order, so every sum is made in an order fixed by the ids. A node's degree is read
  only once its residual reaches ``eps`` times the heaviest edge that brought it some (``d(u)``
  is at least that edge's weight, so below it no degree makes u pushable): most nodes a walk
  touches, a hub many texts name among them, are never read.
- ``hops_and_via``: breadth-first search from a seed set (E. F. Moore, 1959) giving each
  target its distance and the node before it on the lexicographically smallest shortest path
  (paths compared as id sequences, seed first): each layer is ordered by its nodes' smallest
  paths (their parent's rank, then their id), and a node's parent is the first node of the
  layer before it that reaches it.
- ``shortest_path``: the same search from one source, up to a bound, the path itself.
- ``neighbour_evidence``: ``kbgraph.graphalgo.smooth``'s one hop of scores with weighted
  degrees: ``h(v) = sum over sources u of x(u) w(u, v) (d(u) d(v)) ** -gamma``, the terms
  added smallest first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, Protocol

UNBOUNDED: Final = 1 << 30  # hops: as far as the graph goes
Key = Callable[[int], str]

__all__ = ["Weighted", "hops_and_via", "neighbour_evidence", "shortest_path", "weighted_ppr"]


class Weighted(Protocol):
    """A weighted undirected graph, read node by node (the module docstring)."""

    def neighbours(self, u: int) -> tuple[Sequence[int], Sequence[float]]: ...

    def degree(self, u: int) -> float: ...

    def key(self, u: int) -> str: ...


def weighted_ppr(
    graph: Weighted, seeds: Mapping[int, float], alpha: float, eps: float
) -> dict[int, float]:
    """The PPR estimate ``p`` of every node it reaches, seeds' weights normalised to 1."""
    total = math.fsum(seeds.values())  # exact: the seeds' order does not matter
    if total <= 0.0:
        return {}
    residual = {u: w / total for u, w in seeds.items() if w > 0.0}
    p: dict[int, float] = {}
    degree, key = graph.degree, graph.key
    heaviest: dict[int, float] = {}  # a node's heaviest edge that brought it residual
    frontier = sorted(residual, key=key)
    while frontier:
        touched: set[int] = set()
        for u in frontier:
            r = residual[u]
            d = degree(u)
            if r < eps * d or r == 0.0:
                continue  # an earlier push this round is no reason to push it twice
            residual[u] = 0.0
            if d == 0.0:
                p[u] = p.get(u, 0.0) + r
                continue
            p[u] = p.get(u, 0.0) + alpha * r
            share = (1.0 - alpha) * r / d
            nodes, weights = graph.neighbours(u)
            for v, w in zip(nodes, weights, strict=True):
                residual[v] = residual.get(v, 0.0) + share * w
                if w > heaviest.get(v, 0.0):
                    heaviest[v] = w
            touched.update(nodes)
        frontier = sorted(
            (
                v
                for v in touched
                if (r := residual[v]) > 0.0 and r >= eps * heaviest[v] and r >= eps * degree(v)
            ),
            key=key,
        )
    return p


def _layers(
    nexts: Callable[[int], Iterable[int]],
    key: Key,
    sources: Iterable[int],
    stop: Callable[[dict[int, int | None]], bool],
    max_hops: int,
) -> tuple[dict[int, int | None], dict[int, int]]:
    """BFS by layers from ``sources``: (parent of each node reached, its hops)."""
    layer = sorted(set(sources), key=key)
    parent: dict[int, int | None] = dict.fromkeys(layer)
    hops = dict.fromkeys(layer, 0)
    depth = 0
    while layer and not stop(parent) and depth < max_hops:
        depth += 1
        rank = {u: i for i, u in enumerate(layer)}
        found: dict[int, int] = {}
        for u in layer:
            for v in nexts(u):
                if v not in parent and v not in found:
                    found[v] = u
        parent.update(found)
        hops.update(dict.fromkeys(found, depth))
        if stop(parent) or depth == max_hops:
            break  # the last layer's order is needed by no one: not sorted (a hub's is long)
        layer = sorted(found, key=lambda v: (rank[found[v]], key(v)))
    return parent, hops


def hops_and_via(
    nexts: Callable[[int], Iterable[int]],
    key: Key,
    seeds: Iterable[int],
    targets: Sequence[int],
) -> dict[int, tuple[int, int | None]]:
    """(hops, node before it) of each target reached from ``seeds`` (a seed's: (0, None))."""
    wanted = set(targets)
    parent, hops = _layers(nexts, key, seeds, lambda seen: wanted <= seen.keys(), UNBOUNDED)
    return {t: (hops[t], parent[t]) for t in targets if t in parent}


def shortest_path(
    nexts: Callable[[int], Iterable[int]], key: Key, source: int, target: int, max_hops: int
) -> list[int] | None:
    """The lexicographically smallest shortest path from ``source`` to ``target`` within
    ``max_hops`` edges, or None."""
    parent, _ = _layers(nexts, key, [source], lambda seen: target in seen, max_hops)
    if target not in parent:
        return None
    path = [target]
    while (before := parent[path[-1]]) is not None:
        path.append(before)
    return path[::-1]


def neighbour_evidence(
    graph: Weighted, sources: Mapping[int, float], targets: Sequence[int], gamma: float
) -> list[float]:
    """``h`` of each target, in ``targets``' order (module docstring)."""
    degree = graph.degree
    out = []
    for v in targets:
        nodes, weights = graph.neighbours(v)
        terms = [
            sources[u] * w * (degree(u) * degree(v)) ** -gamma
            for u, w in zip(nodes, weights, strict=True)
            if sources.get(u, 0.0) > 0.0 and u != v
        ]
        out.append(sum(sorted(terms)))
    return out
