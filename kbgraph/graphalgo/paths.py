"""Lexicographically smallest shortest paths by breadth-first search.

Definition
----------
Among all shortest paths from a source (or a set of sources) to a node, the lexicographically
smallest is the one whose sequence of concept ids, source first, is smallest in Python ``str``
order element by element. Breadth-first search whose initial queue holds the sources in
ascending id order, which visits neighbours in id order and assigns each node its parent at
first discovery, finds exactly these paths: by induction each BFS layer is dequeued in the
lexicographic order of its nodes' smallest paths, so the first node to discover ``v`` ends the
smallest path to it. Every adjacency block is id-sorted, so this is a plain BFS.

``hops_and_via`` runs it from a seed set and stops as soon as every target is discovered.
``shortest_path`` over the out-links runs it from the source and stops when the target is
discovered or the frontier reaches ``max_hops``. Over the undirected adjacency it runs a
bidirectional BFS instead (the smaller frontier expands first; on a graph of mean degree k and
distance d it touches about 2 k^(d/2) nodes instead of k^d), marks the nodes on shortest paths
back from the meeting layer, and walks from the source taking the first such neighbour in id
order at every step: the same lexicographically smallest path. All of them cost the nodes they
touch, never O(n).

References
----------
.. [1] E. F. Moore, "The shortest path through a maze", Proc. Int. Symp. Theory of Switching,
   1959, pp. 285-292.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbgraph.graphalgo._common import Scratch, out_arrays, und_arrays, with_scratch
from kbgraph.graphalgo._kernels import bfs_path, bfs_targets, bidir_path
from kbgraph.graphalgo.graph import View

__all__ = ["hops_and_via", "shortest_path"]


def _nodes(view: View, nodes: Sequence[int], what: str) -> np.ndarray:
    arr = np.asarray(nodes, dtype=np.int64).reshape(-1)
    if arr.size and (np.min(arr) < 0 or np.max(arr) >= view.graph.n):
        raise ValueError(f"{what}: node out of range")
    return arr.astype(np.int32)


def hops_and_via(
    view: View, seeds: Sequence[int], targets: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Distance from the nearest seed, and the node before each target on its smallest path.

    Parameters
    ----------
    view : View
        The visible subgraph; undirected adjacency.
    seeds : sequence of int
        The seed set (order and repeats do not matter; masked-out seeds are ignored).
    targets : sequence of int
        The nodes to explain.

    Returns
    -------
    (hops, via) : (list[int], list[int])
        Parallel to ``targets``: ``hops[i]`` is the BFS distance from the seed set and
        ``via[i]`` the node just before ``targets[i]`` on the lexicographically smallest shortest
        path from the seed set (paths compared as id sequences, seed first). A target that is a
        seed gives ``(0, -1)``; an unreachable or masked-out target gives ``(-1, -1)``.
    """
    if len(targets) == 0:
        return [], []
    ids = view.graph.ids
    seed_list = sorted(set(_nodes(view, seeds, "seeds").tolist()), key=ids.__getitem__)
    seed_arr = np.array(seed_list, np.int32)
    tgt = _nodes(view, targets, "targets")
    arrays = und_arrays(view)

    def run(s: Scratch) -> tuple[np.ndarray, np.ndarray]:
        und_off, und_len, und, mask, _deg = arrays
        return bfs_targets(und_off, und_len, und, mask, seed_arr, tgt, s.dist, s.q1, s.q0, s.b0)

    hops, via = with_scratch(view.graph.n, run)
    return hops.tolist(), via.tolist()


def shortest_path(
    view: View, source: int, target: int, direction: str = "both", max_hops: int = 6
) -> list[int] | None:
    """The lexicographically smallest shortest path from ``source`` to ``target``.

    Parameters
    ----------
    view : View
        The visible subgraph; the path runs through visible nodes only.
    source, target : int
        End points.
    direction : "both" or "out"
        ``"both"``: undirected adjacency; ``"out"``: out-links as written.
    max_hops : int
        Longest path considered, in edges.

    Returns
    -------
    list[int] or None
        The nodes of the path, source first; ``[source]`` when ``source == target`` (and it is
        visible); None when either end is not visible or no path has at most ``max_hops`` edges.
    """
    n = view.graph.n
    source = int(source)
    target = int(target)
    if not (0 <= source < n and 0 <= target < n):
        raise ValueError("source or target out of range")
    if direction == "both":
        off, length, blk, mask, _deg = und_arrays(view)
    elif direction == "out":
        off, length, blk, mask = out_arrays(view)
    else:
        raise ValueError(f"invalid direction {direction!r}: expected out or both")
    hops = max(0, int(max_hops))

    if direction == "both":

        def run(s: Scratch) -> np.ndarray:
            return bidir_path(
                off, length, blk, mask, source, target, hops, s.dist, s.c0, s.q0, s.q1, s.b0
            )
    else:

        def run(s: Scratch) -> np.ndarray:
            return bfs_path(off, length, blk, mask, source, target, hops, s.dist, s.q1, s.q0)

    path = with_scratch(n, run)
    if path.shape[0] == 0:
        return None
    nodes: list[int] = path.tolist()
    return nodes
