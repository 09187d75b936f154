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

rounded to 4 decimals, then hops ascending (a seed's are 0), then id; cut to the limit. Search's
own strong hits keep their place unless the graph's evidence for another is strong: a full
graph share is worth less than the best hit's search score. Every figure is computed on the
visible subgraph, its sums in an order fixed by the figures themselves (never by how ids were
interned), so the list is deterministic and a narrowed caller gets exactly what an admin gets
where the hidden concepts were never written. The
weights were chosen on the tune questions of several corpora with two embedding models
(docs/retrieval-quality.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

import numpy as np

from kbgraph.graphalgo import View
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


def ranked(
    view: View,
    search: Mapping[int, float],
    seeds: Mapping[int, float],
    mass: Mapping[int, float],
    results: Sequence[tuple[int, int, int]],
    limit: int,
    alpha: float,
) -> list[Row]:
    """Seeds and results in one list, best first, at most ``limit`` of them.

    ``search``: the search score of every hit (seeds' and beyond); ``seeds``: each seed's
    normalised weight; ``mass``: the PPR estimate of each seed and result; ``results``:
    (node, hops, via) of each result; ``alpha``: the walk's restart.
    """
    nodes = [*seeds, *(node for node, _, _ in results)]
    if not nodes:
        return []
    best = max(search.values(), default=0.0) or 1.0
    degrees = view.deg[np.array(nodes, np.int64)].tolist()
    walk = [
        max(mass.get(v, 0.0) - alpha * seeds.get(v, 0.0), 0.0) / max(d, 1) ** WALK_DEGREE_POWER
        for v, d in zip(nodes, degrees, strict=True)
    ]
    hits = np.fromiter(search.keys(), np.int64, len(search))
    scores = np.fromiter(search.values(), np.float64, len(search))
    near = neighbour_evidence(view, hits, scores, nodes, NEIGHBOUR_DEGREE_POWER).tolist()
    top_walk, top_near = max(walk) or 1.0, max(near) or 1.0
    hops_of = {v: (h, b) for v, h, b in results}
    rows = [
        Row(
            v,
            round(
                search.get(v, 0.0) / best
                + WALK_WEIGHT * (w / top_walk)
                + NEIGHBOUR_WEIGHT * (h / top_near),
                4,
            ),
            *hops_of.get(v, (0, None)),
        )
        for v, w, h in zip(nodes, walk, near, strict=True)
    ]
    ids = view.graph.ids
    rows.sort(key=lambda row: (-row.score, row.hops, ids[row.node]))
    return rows[:limit]
