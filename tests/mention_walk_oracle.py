"""The oracle of ``ranked``'s walk over links and mentions: the walk as it was written first,
in plain Python over a dict of each node's weighted neighbours, with no cache and no array.

``ranked(adjacency, ids, named, into, ...)`` gives what ``kbgraph.agent.mentioned.ranked``
must give: the same rows, scores, hops, via and by. ``adjacency`` is the visible union of links
(weight 1) and mentions (``mentioned.MENTION_WEIGHT`` where no link joins the two), built by the
test from the concepts' texts and links, not from the projection's mention views.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from kbgraph.agent import mentioned, ranking
from kbgraph.search import STOP_WORDS, tokenize

Adjacency = Mapping[int, Mapping[int, float]]  # node -> neighbour -> weight (1.0: a link)


def weighted_ppr(
    adjacency: Adjacency,
    key: Callable[[int], str],
    seeds: Mapping[int, float],
    alpha: float,
    eps: float,
) -> dict[int, float]:
    """Forward push in rounds, each round's nodes by id, edge weights as given."""
    total = math.fsum(seeds.values())
    if total <= 0.0:
        return {}
    residual = {u: w / total for u, w in seeds.items() if w > 0.0}
    p: dict[int, float] = {}

    def degree(u: int) -> float:
        return sum(w for _, w in sorted(adjacency.get(u, {}).items()))

    frontier = sorted(residual, key=key)
    while frontier:
        touched: set[int] = set()
        for u in frontier:
            r = residual[u]
            d = degree(u)
            if r < eps * d or r == 0.0:
                continue
            residual[u] = 0.0
            if d == 0.0:
                p[u] = p.get(u, 0.0) + r
                continue
            p[u] = p.get(u, 0.0) + alpha * r
            share = (1.0 - alpha) * r / d
            for v, w in adjacency[u].items():
                residual[v] = residual.get(v, 0.0) + share * w
                touched.add(v)
        frontier = sorted(
            (v for v in touched if residual[v] > 0.0 and residual[v] >= eps * degree(v)),
            key=key,
        )
    return p


def hops_and_via(
    adjacency: Adjacency, key: Callable[[int], str], seeds: Iterable[int], targets: Sequence[int]
) -> dict[int, tuple[int, int | None]]:
    """BFS by layers, each layer ordered by its nodes' smallest paths (parent's rank, id)."""
    wanted = set(targets)
    layer = sorted(set(seeds), key=key)
    parent: dict[int, int | None] = dict.fromkeys(layer)
    hops = dict.fromkeys(layer, 0)
    depth = 0
    while layer and not wanted <= parent.keys():
        depth += 1
        rank = {u: i for i, u in enumerate(layer)}
        found: dict[int, int] = {}
        for u in layer:
            for v in adjacency.get(u, {}):
                if v not in parent and v not in found:
                    found[v] = u
        parent.update(found)
        hops.update(dict.fromkeys(found, depth))
        layer = sorted(found, key=lambda v: (rank[found[v]], key(v)))
    return {t: (hops[t], parent[t]) for t in targets if t in parent}


def ranked(
    adjacency: Adjacency,
    ids: Callable[[int], str],
    named: Iterable[int],
    into: Callable[[int], int],
    weights: Mapping[int, float],
    search: Mapping[int, float],
    limit: int,
    alpha: float,
) -> list[tuple[int, float, int, int | None, str | None]]:
    """(node, score, hops, via, by) of each row. ``named``: the concepts the question names;
    ``into(v)``: how many visible texts mention v."""
    seeds = dict(weights)
    best = max(search.values(), default=0.0) or 1.0
    scores = dict(search)
    for v in sorted(named, key=ids):
        specific = (1.0 + into(v)) ** -mentioned.NAMED_SPECIFICITY
        seeds[v] = seeds.get(v, 0.0) + mentioned.NAMED_WEIGHT * specific
        scores[v] = max(scores.get(v, 0.0), mentioned.NAMED_SEARCH * best * specific)
    mass = weighted_ppr(adjacency, ids, seeds, alpha, mentioned.WALK_EPS)
    total = sum(seeds[v] for v in sorted(seeds, key=ids))
    share = {v: seeds[v] / total for v in sorted(seeds, key=ids)}
    reached = sorted(
        (v for v in mass if v not in seeds and round(mass[v], 4) > 0.0),
        key=lambda v: (-mass[v], ids(v)),
    )[: mentioned.CANDIDATES]
    paths = hops_and_via(adjacency, ids, share, reached)
    results = [(v, *paths[v]) for v in reached if v in paths]

    def degree(u: int) -> float:
        return sum(w for _, w in sorted(adjacency.get(u, {}).items()))

    nodes = [*share, *(v for v, _, via in results if via is not None)]
    walk = [
        max(mass.get(v, 0.0) - alpha * share.get(v, 0.0), 0.0)
        / max(degree(v), 1) ** ranking.WALK_DEGREE_POWER
        for v in nodes
    ]
    gamma = ranking.NEIGHBOUR_DEGREE_POWER
    near = [
        sum(
            sorted(
                scores[u] * w * (degree(u) * degree(v)) ** -gamma
                for u, w in adjacency.get(v, {}).items()
                if scores.get(u, 0.0) > 0.0 and u != v
            )
        )
        for v in nodes
    ]
    top_walk, top_near = max(walk) or 1.0, max(near) or 1.0
    best = max(scores.values(), default=0.0) or 1.0  # a named concept's score counts too
    hops_of = {v: (h, b) for v, h, b in results}
    rows = []
    for v, w, h in zip(nodes, walk, near, strict=True):
        score = ranking.score_of(
            scores.get(v, 0.0) / best,
            w / top_walk,
            h / top_near,
            mentioned.RANK_WALK_WEIGHT,
            mentioned.RANK_NEIGHBOUR_WEIGHT,
        )
        hop, via = hops_of.get(v, (0, None))
        by = None if via is None else ("link" if adjacency[via][v] == 1.0 else "mention")
        rows.append((v, round(score, 4), hop, via, by))
    rows.sort(key=lambda row: (-row[1], row[2], ids(row[0])))
    return rows[:limit]


def mention_edges(
    texts: Mapping[str, str], names: Mapping[str, str], links: Mapping[str, set[str]]
) -> set[tuple[str, str]]:
    """(source, target) of every mention among the visible concepts (``texts`` and ``names``
    theirs alone): a plain longest-match scan of the folded tokens, left to right."""
    holders: dict[tuple[str, ...], set[str]] = {}
    for i, name in names.items():
        tokens = tuple(tokenize(name))
        if any(t not in STOP_WORDS for t in tokens):
            holders.setdefault(tokens, set()).add(i)
    longest = max((len(n) for n in holders), default=0)
    edges = set()
    for i, text in texts.items():
        tokens = tokenize(text)
        at = 0
        while at < len(tokens):
            for size in range(min(longest, len(tokens) - at), 0, -1):
                found = holders.get(tuple(tokens[at : at + size]))
                if found:
                    edges |= {(i, v) for v in found if v != i and v not in links[i]}
                    at += size
                    break
            else:
                at += 1
    return edges
