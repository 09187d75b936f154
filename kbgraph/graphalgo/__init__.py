"""Pure graph algorithms over the int-indexed projection (no I/O, no store, no web).

Every function takes a ``View``: the subgraph induced by ``view.mask`` is computed on through
the mask, never built. Every loop runs in id order (blocks are id-sorted), so results are
deterministic and independent of how ids were interned as ints.

- ``personalized_pagerank``: forward push (Andersen, Chung, Lang 2006), see ``ppr``.
- ``hops_and_via``, ``shortest_path``: lexicographically smallest shortest paths, see ``paths``.
- ``resource_allocation`` (and its unranked scores, ``common_neighbours``): link suggestion
  (Zhou, Lü, Zhang 2009), see ``suggest``.
- ``neighbour_evidence``: one hop of score propagation, hubs discounted, see ``smooth``.
- ``warm_up``: compile every kernel once at start-up so that no request compiles.
"""

from __future__ import annotations

import numpy as np

from kbgraph.graphalgo.graph import Graph, View
from kbgraph.graphalgo.paths import hops_and_via, shortest_path
from kbgraph.graphalgo.ppr import personalized_pagerank
from kbgraph.graphalgo.smooth import neighbour_evidence
from kbgraph.graphalgo.suggest import (
    Suggestion,
    common_neighbours,
    resource_allocation,
    resource_allocation_scores,
)

__all__ = [
    "Graph",
    "Suggestion",
    "View",
    "common_neighbours",
    "hops_and_via",
    "neighbour_evidence",
    "personalized_pagerank",
    "resource_allocation",
    "resource_allocation_scores",
    "shortest_path",
    "warm_up",
]


def _tiny_view(readonly: bool, readonly_view: bool | None = None) -> View:
    """a - b - c (a -> b, b -> c) and an isolated d; arrays optionally read-only."""
    und_off = np.array([0, 1, 3, 4], np.int64)
    und_len = np.array([1, 2, 1, 0], np.int32)
    und = np.array([1, 0, 2, 1], np.int32)
    out_off = np.array([0, 1, 2, 2], np.int64)
    out_len = np.array([1, 1, 0, 0], np.int32)
    out = np.array([1, 2], np.int32)
    mask = np.ones(4, np.uint8)
    deg = und_len.copy()
    if readonly:
        for a in (und_off, und_len, und, out_off, out_len, out):
            a.flags.writeable = False
    if readonly if readonly_view is None else readonly_view:
        mask.flags.writeable = False
        deg.flags.writeable = False
    g = Graph(und_off, und_len, und, out_off, out_len, out, ["a", "b", "c", "d"])
    return View(g, mask, deg)


def warm_up() -> None:
    """Compile (or load from the on-disk cache) every kernel, so that no request ever compiles.

    numba types a read-only array apart from a writeable one, so this covers the graph's arrays
    and the view's mask/deg each writeable or read-only (4 variants). Other dtypes than those
    of ``graph.py`` are converted per call (a copy: avoid). Call once at service start-up.
    """
    for readonly_graph in (False, True):
        for readonly_view in (False, True):
            view = _tiny_view(readonly_graph, readonly_view)
            personalized_pagerank(view, [(0, 1.0), (3, 1.0)])
            hops_and_via(view, [0], [2, 3])
            shortest_path(view, 0, 2, "both")
            shortest_path(view, 0, 2, "out")
            resource_allocation(view, 0, limit=5, min_common=1)
            neighbour_evidence(view, np.array([0, 3]), np.array([1.0, 0.5]), [1, 2])
