"""graph_context's ``ranked``: the one list an agent reads, seeds and results blended.

``seeds`` carry the question's evidence (their weights, from the search scores) and their own
PPR estimate; ``results`` carry the walk's mass. ``ranked`` puts every seed and every result
at most once in one order:

    score = (1 - GRAPH_SHARE) * weight / best_weight + GRAPH_SHARE * ppr / best_ppr

(a result's weight is 0; ``best_ppr`` over seeds and results together), rounded to 4
decimals, then by hops ascending (a seed's are 0), then id; cut to the limit. It reads only
the rounded figures the response already shows, so it is deterministic and sees exactly
what ``seeds`` and ``results`` see: the visible subgraph. The share was chosen on the tune
questions of several corpora with two embedding models (docs/retrieval-quality.md).
"""

from __future__ import annotations

from typing import Final

from kbgraph.agent.shapes import ContextResult, RankedResult, Seed

GRAPH_SHARE: Final = 0.1


def ranked(
    seeds: list[Seed],
    results: list[ContextResult],
    limit: int,
) -> list[RankedResult]:
    """Seeds and results in one list, best first, at most ``limit`` of them."""
    best_weight = max((s.weight for s in seeds), default=0.0) or 1.0
    masses = [s.score for s in seeds] + [r.score for r in results]
    best_mass = max(masses, default=0.0) or 1.0
    graph_share = GRAPH_SHARE
    evidence = 1.0 - graph_share
    rows: list[RankedResult] = [
        RankedResult(
            id=s.id,
            title=s.title,
            score=round(evidence * s.weight / best_weight + graph_share * s.score / best_mass, 4),
            hops=0,
            snippet=s.snippet,
        )
        for s in seeds
    ]
    rows += [
        RankedResult(
            id=r.id,
            title=r.title,
            score=round(graph_share * r.score / best_mass, 4),
            hops=r.hops,
            via=r.via,
            snippet=r.snippet,
        )
        for r in results
    ]
    rows.sort(key=lambda row: (-row.score, row.hops, row.id))
    return rows[:limit]
