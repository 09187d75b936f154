"""Text evidence for ``link_suggest`` ``hybrid`` (docs/api.md): mentions, rare terms, tags.

For a concept x and each visible candidate v (not x, not linked to x either way):

- **mention**: x's text mentions v (``kbgraph.projection.mentions``: v's title or an alias as
  whole folded tokens, longest name first, so "restic" inside "Backup with restic", which x
  links to, is that link's and no mention of ``restic``). 1 when there is one.
- **terms**: the share of x's rare-term weight that v holds too. A term of x is rare when at
  most ``RARE_SHARE`` of the visible concepts (and at least 2, x included) hold it; its weight
  is ``ln(N / df)``. In [0, 1].
- **tags**: the same share over x's tags, each weighted ``ln(N / df)`` (a tag on every
  concept weighs 0). In [0, 1].

Everything is counted among the visible concepts (N, df, names, links), and every sum runs in
x's own term or tag order, so the floats do not depend on hidden concepts or interning order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numba import njit

from kbgraph.search import SearchIndex

RARE_SHARE: Final = 0.1


@dataclass(slots=True)
class Evidence:
    """``mention``: candidate node -> offset of its first unlinked mention in x's text;
    ``terms``, ``tags``: float64[n], each node's share (0 for none, and for x itself)."""

    mention: dict[int, int]
    terms: np.ndarray
    tags: np.ndarray


@njit(cache=True, nogil=True)
def _share_kernel(  # pragma: no cover - compiled
    off: np.ndarray,
    nodes: np.ndarray,
    mask: np.ndarray,
    n_visible: float,
    max_df: float,
    node: int,
    acc: np.ndarray,
) -> None:
    """``shares`` over key k's holders ``nodes[off[k]:off[k + 1]]``, keys in order."""
    total = 0.0
    for k in range(off.shape[0] - 1):
        df = 0
        for j in range(off[k], off[k + 1]):
            if mask[nodes[j]] != 0:
                df += 1
        if df < 2 or df > max_df:
            continue
        weight = math.log(n_visible / df)
        total += weight
        for j in range(off[k], off[k + 1]):
            if mask[nodes[j]] != 0:
                acc[nodes[j]] += weight
    acc[node] = 0.0
    if total > 0.0:
        for v in range(acc.shape[0]):
            acc[v] /= total


def shares(
    keys: Sequence[str],
    nodes_of: Callable[[str], np.ndarray],
    mask: np.ndarray,
    node: int,
    n_visible: int,
    max_df: float,
    size: int,
) -> np.ndarray:
    """float64[size]: for each visible v != node, the share of ``node``'s key weight
    (ln(N/df) per key with 2 <= df <= max_df) that v holds too."""
    acc = np.zeros(size, np.float64)
    holders = [nodes_of(key) for key in keys]
    if holders:
        off = np.zeros(len(holders) + 1, np.int64)
        np.cumsum([len(h) for h in holders], out=off[1:])
        nodes = np.concatenate(holders)
        _share_kernel(off, nodes, mask, float(n_visible), float(max_df), int(node), acc)
    return acc


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the shares kernel, before serving."""
    index = SearchIndex()
    index.put(0, "warm", "up")
    index.put(1, "warm", "up")
    for writeable in (True, False):
        mask = np.ones(2, np.uint8)
        mask.flags.writeable = writeable
        shares(["warm"], index.term_nodes, mask, 0, 2, 2.0, 2)


def gather(
    index: SearchIndex,
    mention: dict[int, int],
    mask: np.ndarray,
    node: int,
    n_visible: int,
    size: int,
) -> Evidence:
    """Every piece of text evidence for links from ``node`` (arrays of ``size`` nodes);
    ``mention``: the concepts its text mentions, each with its first mention's offset."""
    rare = max(2.0, RARE_SHARE * n_visible)
    terms = index.doc_terms(node)
    tags = index.doc_tags(node)
    return Evidence(
        mention=mention,
        terms=shares(terms, index.term_nodes, mask, node, n_visible, rare, size),
        tags=shares(tags, index.tag_nodes, mask, node, n_visible, n_visible, size),
    )
