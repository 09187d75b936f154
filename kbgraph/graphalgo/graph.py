"""The int-indexed graph the algorithms read: flat arrays owned by the projection.

Node ``u`` is an int in ``range(n)``. Its undirected neighbours are
``und[und_off[u] : und_off[u] + und_len[u]]`` and its directed out-links (to existing concepts)
``out[out_off[u] : out_off[u] + out_len[u]]``. Invariants the projection keeps:

- every neighbour block holds existing concepts only, each once, never ``u`` itself;
- every block is sorted by concept id (``ids``), so a loop over a block runs in id order and
  results never depend on the order in which ids were interned as ints;
- a ``View`` narrows the graph to a subgraph without building it: ``mask[u] == 1`` for the
  nodes in it, and ``deg[u]`` is u's undirected degree counted within the subgraph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Graph:
    und_off: np.ndarray  # int64[n]
    und_len: np.ndarray  # int32[n]
    und: np.ndarray  # int32[pool]
    out_off: np.ndarray  # int64[n]
    out_len: np.ndarray  # int32[n]
    out: np.ndarray  # int32[pool]
    ids: Sequence[str]  # ids[u]: every tie-break compares these, never the ints

    @property
    def n(self) -> int:
        return len(self.und_len)


@dataclass(frozen=True, slots=True)
class View:
    """The subgraph induced by ``mask`` (uint8[n]), with ``deg`` (int32[n]) its degrees."""

    graph: Graph
    mask: np.ndarray
    deg: np.ndarray
