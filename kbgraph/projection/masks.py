"""Visibility masks and the undirected degrees they induce, patched with the graph.

A narrowed caller's view is the subgraph induced by the concepts its rules let it see: a
``uint8`` mask over the nodes and the degree of each node within the mask (what PPR divides
by). ``KBProjection`` caches one ``Mask`` per ``RuleSet`` and patches every cached one on every
event, so a cache never serves a stale mask.
"""

from __future__ import annotations

import numba
import numpy as np

from kbgraph.access import RuleSet


@numba.njit(nogil=True, cache=True)
def masked_degrees(off, ln, pool, mask, deg):  # pragma: no cover - compiled
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
def edge_degrees(src, dst, flags, edge_flag, step, mask, deg):  # pragma: no cover - compiled
    """deg += step at both ends of each pair with flags == edge_flag, both ends visible."""
    for i in range(src.shape[0]):
        if flags[i] == edge_flag:
            u, v = src[i], dst[i]
            if mask[u] and mask[v]:
                deg[u] += step
                deg[v] += step


@numba.njit(cache=True)
def node_degrees(u, nb, step, mask, deg):  # pragma: no cover - compiled
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
