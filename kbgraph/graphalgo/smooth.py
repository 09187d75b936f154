"""One hop of score propagation: how much evidence a node's neighbours carry.

Definition
----------
Given values ``x(u)`` on some visible nodes (the sources) and a set of visible targets, the
neighbour evidence of a target ``v`` is

.. math:: h(v) = \\sum_{u \\in \\Gamma(v)} x(u) \\, (\\deg(u) \\deg(v))^{-\\gamma}

over the visible sources ``u`` adjacent to ``v`` in the undirected visible subgraph, ``deg``
counted within it. With ``γ = 1/2`` the edge weight is the symmetric normalisation of graph
filters; a larger ``γ`` discounts hubs on either end more (a tag stub or an index page linked
from everywhere passes little). A source is not its own neighbour.

Determinism: each target's terms are added smallest first, so the bits do not depend on the
ints the ids were interned as, and a narrowed view equals a graph where the
hidden nodes were never written (hidden nodes are neither sources, targets, nor counted in
``deg``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbgraph.graphalgo.graph import View

__all__ = ["neighbour_evidence"]


def neighbour_evidence(
    view: View,
    nodes: np.ndarray,
    values: np.ndarray,
    targets: Sequence[int],
    gamma: float = 0.5,
) -> np.ndarray:
    """``h`` of each target (float64, in ``targets``' order), as the module docstring defines.

    The sources are ``nodes`` with their ``values`` (parallel arrays). Sources that are
    hidden or out of range, or whose value is not > 0, add nothing; a source listed twice adds
    its values; a hidden target gets 0.
    """
    out = np.zeros(len(targets), np.float64)
    if not len(targets) or not len(nodes):
        return out
    g, mask, deg = view.graph, view.mask, view.deg
    src = np.asarray(nodes, np.int64)
    x = np.asarray(values, np.float64)
    keep = (src >= 0) & (src < g.n)
    src, x = src[keep], x[keep]
    keep = (mask[src] != 0) & (x > 0.0)
    src, again = np.unique(src[keep], return_inverse=True)
    value = np.bincount(again, weights=x[keep], minlength=len(src))  # a repeated source adds
    lens = g.und_len[src].astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return out
    starts = g.und_off[src].astype(np.int64)
    # every source's block of neighbours, one after another
    shift = np.repeat(starts - (np.cumsum(lens) - lens), lens)
    neigh = g.und[shift + np.arange(total)].astype(np.int64)
    owner = np.repeat(np.arange(len(src)), lens)
    wanted = np.asarray(targets, np.int64)
    by_node = np.unique(wanted)
    at = np.minimum(np.searchsorted(by_node, neigh), len(by_node) - 1)
    hit = (by_node[at] == neigh) & (mask[neigh] != 0)
    if not hit.any():
        return out
    neigh, owner, at = neigh[hit], owner[hit], at[hit]
    weight = (deg[src[owner]].astype(np.float64) * deg[neigh].astype(np.float64)) ** -gamma
    terms = value[owner] * weight
    # each target's terms added smallest first: the same multiset gives the same bits, whatever
    # ints the ids were interned as (bincount adds in input order)
    order = np.lexsort((terms, at))
    summed = np.bincount(at[order], weights=terms[order], minlength=len(by_node))
    return summed[np.searchsorted(by_node, wanted)]
