"""Personalized PageRank by forward push (Andersen, Chung, Lang).

Definition
----------
The personalized PageRank vector ``ppr`` with restart probability ``alpha`` and seed
distribution ``s`` is the stationary distribution of the walk that, at every step, restarts at
a node drawn from ``s`` with probability ``alpha`` and otherwise moves to a uniformly chosen
neighbour; on the undirected graph ``ppr = alpha * s + (1 - alpha) * ppr @ D^-1 A``. An isolated
node keeps its walk (a self-loop), so an isolated seed keeps its whole seed mass.

Forward push keeps an estimate ``p`` and a residual ``r`` (initially ``r = s``) with the
invariant ``ppr = p + ppr_r``; while some node has ``r(u) >= eps * deg(u)`` it pushes ``u``:
``p(u) += alpha * r(u)``, each visible neighbour gets ``(1 - alpha) * r(u) / deg(u)``, and
``r(u) = 0`` (an isolated node moves its whole residual to ``p``). On an undirected graph the
result satisfies ``0 <= ppr(u) - p(u) <= eps * deg(u)`` for every node ``u``, and the work is
``O(1 / (eps * alpha))`` pushes' worth of edges, independent of the graph size.

Determinism: seeds are processed in ascending id order, the queue is FIFO, neighbours are visited
in block (= id) order, so every floating point sum runs in an order fixed by the ids alone: the
same input gives the same bits, whichever ints the ids were interned as.

References
----------
.. [1] R. Andersen, F. Chung, K. Lang, "Local graph partitioning using PageRank vectors",
   Proc. 47th IEEE FOCS, 2006, pp. 475-486.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbgraph.graphalgo._common import Scratch, und_arrays, with_scratch
from kbgraph.graphalgo._kernels import ppr_push
from kbgraph.graphalgo.graph import View

__all__ = ["personalized_pagerank", "sort_by_id"]


def sort_by_id(view: View, nodes: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, ...]:
    """``nodes`` (and the parallel ``values``) reordered by ascending id (Python ``str`` order)."""
    if nodes.shape[0] < 2:
        return (nodes, *values)
    k = nodes.shape[0]
    keys = list(map(view.graph.ids.__getitem__, nodes.tolist()))
    order = sorted(zip(keys, range(k), strict=True))  # ties (a repeated node) keep their order
    perm = np.fromiter((i for _, i in order), np.intp, k)
    return (nodes[perm], *(v[perm] for v in values))


def personalized_pagerank(
    view: View,
    seeds: Sequence[tuple[int, float]],
    alpha: float = 0.25,
    eps: float = 1e-4,
    *,
    ordered: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Personalized PageRank of the visible subgraph by forward push.

    Parameters
    ----------
    view : View
        The graph and the visible subgraph (``mask``, ``deg``); computed on the undirected
        adjacency, skipping masked-out nodes.
    seeds : sequence of (node, weight)
        Visible nodes with weights > 0; a repeated node adds its weights. The weights are
        normalised to sum 1.
    alpha : float
        Restart probability, in (0, 1].
    eps : float
        Push threshold: ``u`` is pushed while ``r(u) >= eps * deg(u)``; the result satisfies
        ``0 <= ppr(u) - p(u) <= eps * deg(u)``.
    ordered : bool
        Return the nodes in ascending id order (a sort of every touched id). False keeps the
        push's first-touch order, itself fixed by the ids: for callers that rank anyway.

    Returns
    -------
    (nodes, p) : (int32[k], float64[k])
        Every node with ``p > 0``, in ascending id order (see ``ordered``). Empty when there
        is no seed.

    Raises
    ------
    ValueError
        A seed out of range, not visible, or with a weight that is not > 0; alpha or eps out
        of range.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    if not eps > 0.0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    g = view.graph
    n = g.n
    mask = view.mask
    agg: dict[int, float] = {}
    for u, w in seeds:
        u = int(u)
        w = float(w)
        if not 0 <= u < n or not mask[u]:
            raise ValueError(f"seed {u} is not a visible node")
        if not w > 0.0:
            raise ValueError(f"seed {u} has weight {w!r}: weights must be > 0")
        agg[u] = agg.get(u, 0.0) + w
    if not agg:
        return np.empty(0, np.int32), np.empty(0, np.float64)
    ids = g.ids
    order = sorted(agg, key=ids.__getitem__) if len(agg) > 1 else list(agg)
    total = 0.0
    for u in order:
        total += agg[u]
    seed_nodes = np.array(order, np.int32)
    seed_w = np.array([agg[u] / total for u in order], np.float64)
    arrays = und_arrays(view)

    def run(s: Scratch) -> tuple[np.ndarray, np.ndarray]:
        return ppr_push(
            *arrays,
            seed_nodes,
            seed_w,
            float(alpha),
            float(eps),
            s.f0,
            s.f1,
            s.b0,
            s.b1,
            s.q0,
            s.q1,
        )

    nodes, p = with_scratch(n, run)
    if ordered:
        nodes, p = sort_by_id(view, nodes, p)
    return nodes, p
