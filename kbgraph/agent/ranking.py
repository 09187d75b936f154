"""graph_context's ``ranked``: the one list an agent reads, seeds and results blended.

Every seed and every result is ranked once by three kinds of evidence, each scaled to its best
in the list:

- ``search``: the concept's fused search score over the best one (the seeds' rule's scores,
  ``kbgraph.agent.retrieval.by_score``; a concept given by id counts as the best; a result
  found by neither search list has 0);
- ``walk``: the walk's mass the concept receives beyond its own restart (``p - alpha * s``,
  ``s`` its seed weight), over ``deg ** WALK_DEGREE_POWER``: PPR's mass grows with a node's
  degree, and hubs (index pages, tag stubs) would otherwise gather it whatever the question;
- ``neighbours``: one hop of the search scores, ``sum of search(u) * (deg(u) deg(v)) ** -gamma``
  over the concept's neighbours ``u`` among the search hits
  (``kbgraph.graphalgo.smooth.neighbour_evidence``): a page that several hits link is likely
  needed with them.

    score = search + WALK_WEIGHT * walk / best_walk + NEIGHBOUR_WEIGHT * neighbours / best

except that search's best hit (``search`` = 1: the fused list's top, or a concept given by id)
is credited with a full graph share, ``1 + WALK_WEIGHT + NEIGHBOUR_WEIGHT``: it stays first, as
a single-answer question's best bet, and the graph reorders the rest. Rounded to 4 decimals,
then hops ascending (a seed's are 0), then id; cut to the limit. A full graph share is worth
less than the best hit's search score, so a concept search did not find never comes first
either. Every figure is computed on the visible subgraph, its sums in an order fixed by the
figures themselves (never by how ids were interned), so the list is deterministic and a
narrowed caller gets exactly what an admin gets where the hidden concepts were never written.
The weights were chosen on the tune questions of several corpora with two embedding models
(docs/retrieval-quality.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

import numpy as np

from kbgraph.graphalgo import View, union
from kbgraph.graphalgo.smooth import neighbour_evidence

WALK_WEIGHT: Final = 0.1
WALK_DEGREE_POWER: Final = 1.0
NEIGHBOUR_WEIGHT: Final = 0.4
NEIGHBOUR_DEGREE_POWER: Final = 0.5


class Row(NamedTuple):
    node: int
    score: float
    hops: int
    via: int | None


def score_of(
    search: float,
    walk: float,
    neighbours: float,
    walk_weight: float = WALK_WEIGHT,
    neighbour_weight: float = NEIGHBOUR_WEIGHT,
) -> float:
    """The rule, each input over its best in the list; search's best hit keeps the head."""
    if search >= 1.0:
        return 1.0 + walk_weight + neighbour_weight
    return search + walk_weight * walk + neighbour_weight * neighbours


def ranked(
    view: View,
    search: Mapping[int, float],
    seeds: Mapping[int, float],
    mass: Mapping[int, float],
    results: Sequence[tuple[int, int, int]],
    limit: int,
    alpha: float,
    graph: union.Weighted | None = None,
    weights: tuple[float, float] = (WALK_WEIGHT, NEIGHBOUR_WEIGHT),
) -> list[Row]:
    """Seeds and results in one list, best first, at most ``limit`` of them.

    ``search``: the search score of every hit (seeds' and beyond); ``seeds``: each seed's
    normalised weight; ``mass``: the PPR estimate of each seed and result; ``results``:
    (node, hops, via) of each result; ``alpha``: the walk's restart; ``graph``: the
    weighted graph walked (links and mentions, ``kbgraph.agent.mentioned``), else the links;
    ``weights``: the walk's and the neighbours' (the links' rule's unless given).
    """
    nodes = [*seeds, *(node for node, _, _ in results)]
    if not nodes:
        return []
    best = max(search.values(), default=0.0) or 1.0
    if graph is None:
        degrees = view.deg[np.array(nodes, np.int64)].tolist()
    else:
        degrees = [graph.degree(v) for v in nodes]
    walk = [
        max(mass.get(v, 0.0) - alpha * seeds.get(v, 0.0), 0.0) / max(d, 1) ** WALK_DEGREE_POWER
        for v, d in zip(nodes, degrees, strict=True)
    ]
    if graph is None:
        hits = np.fromiter(search.keys(), np.int64, len(search))
        scores = np.fromiter(search.values(), np.float64, len(search))
        near = neighbour_evidence(view, hits, scores, nodes, NEIGHBOUR_DEGREE_POWER).tolist()
    else:
        near = union.neighbour_evidence(graph, search, nodes, NEIGHBOUR_DEGREE_POWER)
    top_walk, top_near = max(walk) or 1.0, max(near) or 1.0
    hops_of = {v: (h, b) for v, h, b in results}
    rows = []
    for v, w, h in zip(nodes, walk, near, strict=True):
        score = score_of(search.get(v, 0.0) / best, w / top_walk, h / top_near, *weights)
        rows.append(Row(v, round(score, 4), *hops_of.get(v, (0, None))))
    ids = view.graph.ids
    rows.sort(key=lambda row: (-row.score, row.hops, ids[row.node]))
    return rows[:limit]
