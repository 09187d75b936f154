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

    The sources are ``nodes`` (distinct) with their ``values`` (parallel arrays). Sources that
    are hidden, or whose value is not > 0, add nothing; a hidden target gets 0; a target listed
    twice gets the same sum twice. Raises ValueError for a node out of range or a source listed
    twice.
    """
    src = np.asarray(nodes, np.int64)
    wanted = np.asarray(targets, np.int64)
    out = np.zeros(wanted.shape[0], np.float64)
    if not wanted.size or not src.size:
        return out
    x = np.asarray(values, np.float64)
    arrays = und_arrays(view)

    def run(s: Scratch) -> int:
        return int(neighbour_sum(*arrays, src, x, wanted, float(gamma), s.dist, s.c0, out))

    if with_scratch(view.graph.n, run):
        raise ValueError("a node is out of range, or a source is listed twice")
    return out
