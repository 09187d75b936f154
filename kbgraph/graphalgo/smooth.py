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

Determinism: each target's terms are added smallest first, so the bits depend on the terms
alone, not on the sources' order or the ints the ids were interned as; and a narrowed view
equals a graph where the hidden nodes were never written (hidden nodes are neither sources,
targets, nor counted in ``deg``). The sum runs in ``kbgraph.graphalgo._kernels``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbgraph.graphalgo._common import Scratch, und_arrays, with_scratch
from kbgraph.graphalgo._kernels import neighbour_sum
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
    hidden, or whose value is not > 0, add nothing; a source listed twice adds its values; a
    hidden target gets 0. Raises ValueError for a node out of range.
    """
    g = view.graph
    src = np.asarray(nodes, np.int64)
    wanted = np.asarray(targets, np.int64)
    for array in (src, wanted):
        if array.size and (int(array.min()) < 0 or int(array.max()) >= g.n):
            raise ValueError("a node is out of range")
    out = np.zeros(wanted.shape[0], np.float64)
    if not wanted.size or not src.size:
        return out
    x = np.asarray(values, np.float64)
    if np.unique(src).shape[0] < src.shape[0]:  # a repeated source adds its values, in order
        src, again = np.unique(src, return_inverse=True)
        x = np.bincount(again, weights=x, minlength=src.shape[0]).astype(np.float64)
    arrays = und_arrays(view)

    def run(s: Scratch) -> None:
        neighbour_sum(*arrays, src, x, wanted, float(gamma), s.dist, s.c0, out)

    with_scratch(g.n, run)
    first: dict[int, int] = {}  # a repeated target: the sum at its first place
    for i, v in enumerate(wanted.tolist()):
        if first.setdefault(v, i) != i:
            out[i] = out[first[v]]
    return out
