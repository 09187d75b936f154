"""Link suggestion by the resource allocation index (Zhou, Lü, Zhang).

Definition
----------
The resource allocation index of two nodes ``x`` and ``v`` is

.. math:: s(x, v) = \\sum_{z \\in \\Gamma(x) \\cap \\Gamma(v)} \\frac{1}{\\deg(z)}

where ``Γ(u)`` is the set of neighbours of ``u``: each common neighbour ``z`` passes one unit of
resource from ``x``, split evenly over its ``deg(z)`` links, so a hub contributes little. Here it
is computed on the visible subgraph (``deg`` counted within it), over the candidates that are
visible, not ``x``, not adjacent to ``x`` and share at least ``min_common`` neighbours with it.
The sum runs over the common neighbours in id order, so the score bits do not depend on the
ints the ids were interned as. The cost is the size of ``x``'s two-hop neighbourhood.

References
----------
.. [1] T. Zhou, L. Lü, Y.-C. Zhang, "Predicting missing links via local information",
   Eur. Phys. J. B 71 (2009) 623-630.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kbgraph.graphalgo._common import Scratch, und_arrays, with_scratch
from kbgraph.graphalgo._kernels import ra_common, ra_scores
from kbgraph.graphalgo.graph import View

__all__ = ["Suggestion", "common_neighbours", "resource_allocation", "resource_allocation_scores"]

COMMON_SHOWN = 5


class Suggestion(NamedTuple):
    node: int
    score: float
    common: list[int]


def resource_allocation(
    view: View,
    node: int,
    *,
    min_common: int = 2,
    limit: int,
    skip: np.ndarray | None = None,
) -> list[Suggestion]:
    """Rank link candidates for ``node`` by resource allocation.

    Parameters
    ----------
    view : View
        The visible subgraph; undirected adjacency and ``deg``.
    node : int
        A visible node (a masked-out node has no candidates).
    min_common : int
        Fewest common visible neighbours a candidate needs.
    limit : int
        Most suggestions returned.
    skip : uint8/bool array of size n, optional
        Candidates with ``skip[v]`` set are dropped after ranking, before the limit.

    Returns
    -------
    list[Suggestion]
        Ranked by unrounded score descending, then id (Python ``str`` order). ``common`` holds
        the (at most) 5 smallest-id common neighbours, ascending by id.
    """
    g = view.graph
    n = g.n
    node = int(node)
    if not 0 <= node < n:
        raise ValueError(f"node {node} out of range")
    if limit <= 0 or not view.mask[node]:
        return []
    und_off, und_len, und, mask, deg = und_arrays(view)
    mc = max(1, int(min_common))

    def run(s: Scratch) -> tuple[np.ndarray, np.ndarray]:
        return ra_scores(und_off, und_len, und, mask, deg, node, mc, s.f0, s.c0, s.b0, s.q0)

    cands, scores = with_scratch(n, run)
    m = cands.shape[0]
    if m == 0:
        return []
    ids = g.ids
    chosen: list[int] = []
    chosen_scores: list[float] = []
    cand_list = cands.tolist()
    score_list = scores.tolist()
    i = 0
    while i < m and len(chosen) < limit:
        sc = score_list[i]
        j = i + 1
        while j < m and score_list[j] == sc:
            j += 1
        group = cand_list[i:j]
        if j - i > 1:
            group.sort(key=ids.__getitem__)
        for v in group:
            if skip is not None and skip[v]:
                continue
            chosen.append(v)
            chosen_scores.append(sc)
            if len(chosen) == limit:
                break
        i = j
    if not chosen:
        return []
    sel = np.array(chosen, np.int32)

    def run_common(s: Scratch) -> np.ndarray:
        return ra_common(und_off, und_len, und, mask, node, sel, COMMON_SHOWN, s.b0)

    common = with_scratch(n, run_common).tolist()
    return [
        Suggestion(v, sc, [z for z in row if z >= 0])
        for v, sc, row in zip(chosen, chosen_scores, common, strict=True)
    ]


def resource_allocation_scores(
    view: View, node: int, *, min_common: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Every candidate of ``node`` (as ``resource_allocation`` defines them) with its score,
    unranked: (nodes int32[k], scores float64[k]). For callers that add other evidence."""
    g = view.graph
    node = int(node)
    if not 0 <= node < g.n:
        raise ValueError(f"node {node} out of range")
    if not view.mask[node]:
        return np.empty(0, np.int32), np.empty(0, np.float64)
    und_off, und_len, und, mask, deg = und_arrays(view)
    mc = max(1, int(min_common))

    def run(s: Scratch) -> tuple[np.ndarray, np.ndarray]:
        return ra_scores(und_off, und_len, und, mask, deg, node, mc, s.f0, s.c0, s.b0, s.q0)

    return with_scratch(g.n, run)


def common_neighbours(view: View, node: int, targets: list[int]) -> list[list[int]]:
    """For each target, the (at most 5) smallest-id visible neighbours it shares with ``node``."""
    if not targets:
        return []
    und_off, und_len, und, mask, _ = und_arrays(view)
    sel = np.array(targets, np.int32)

    def run(s: Scratch) -> np.ndarray:
        return ra_common(und_off, und_len, und, mask, int(node), sel, COMMON_SHOWN, s.b0)

    rows = with_scratch(view.graph.n, run).tolist()
    return [[z for z in row if z >= 0] for row in rows]
