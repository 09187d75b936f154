"""The tools' graph of links and mentions: ``ranked``'s walk and ``graph_path`` ``edges: all``.

``ranked`` walks mentions where links are sparse: fewer than ``SPARSE_LINKS`` visible links
per visible concept (``walks_mentions``). Measured on tune halves, the mention walk lifts a
collection without links (2WikiMultihopQA: +0.26 recall@5) and lowers documentation written
with links (Dendron, SilverBullet), where main's walk over links stays.

A view's undirected links (weight 1) and its mention edges (``kbgraph.projection.mentions``,
either direction, weight ``MENTION_WEIGHT`` where no link joins the two) as the neighbour
functions ``kbgraph.graphalgo.union`` reads. ``ranked`` with mentions:

- the walk's seeds are the seeds' rule's (search hits and ids) plus every visible concept the
  question names (its title or an alias, found in the question as in a text), as HippoRAG
  seeds its walk from a question's entities: each adds ``NAMED_WEIGHT * specific``, where
  ``specific = (1 + the texts mentioning it) ** -NAMED_SPECIFICITY`` (HippoRAG's node
  specificity: a name many texts hold, "Dendron" in Dendron's docs, says little);
- a named concept also counts as a search hit of ``NAMED_SEARCH * specific`` of the best hit's
  score: a name no text holds ("Blind Shaft", asked "which came out first, Blind Shaft or ...")
  is as good as search's best hit, so it is pinned at the head with it;
- the walk is PPR over links and mentions (``union.weighted_ppr``, restart ``PPR_ALPHA``,
  threshold ``WALK_EPS``); its ``CANDIDATES`` best non-seeds are ranked with the seeds by
  ``kbgraph.agent.ranking``'s rule with this walk's weights (``RANK_WALK_WEIGHT``,
  ``RANK_NEIGHBOUR_WEIGHT``), its degrees and neighbour evidence those of this weighted graph;
- ``hops`` and ``via`` are the smallest shortest path's over the same graph, and ``by`` says
  whether the edge from ``via`` is a link or a mention.

The constants were chosen on the tune halves of 2WikiMultihopQA and of two doc corpora with
links (docs/retrieval-quality.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from kbgraph.agent import ranking
from kbgraph.graphalgo import View, union
from kbgraph.projection.mentions import Mentions, MentionView

MENTION_WEIGHT: Final = 0.5
NAMED_WEIGHT: Final = 3.0
NAMED_SEARCH: Final = 1.0
WALK_EPS: Final = 1e-3  # 1e-4 and 3e-3 ranked the tune half alike; 1e-3 walks ~2.5x less
CANDIDATES: Final = 30
NAMED_SPECIFICITY: Final = 2.0
RANK_WALK_WEIGHT: Final = 1.0  # ranking's walk and neighbour weights for this walk
RANK_NEIGHBOUR_WEIGHT: Final = 0.4
SPARSE_LINKS: Final = 0.5


def walks_mentions(concepts: int, links: int) -> bool:
    """Does ``ranked`` walk mentions in a view of ``concepts`` visible concepts joined by
    ``links`` visible links? Only where links are sparse."""
    return links < SPARSE_LINKS * concepts


class Both:
    """A view's links and mentions (a ``union.Weighted``), each node's neighbours read once:
    its links (weight 1) first, then the mentions no link doubles (``weight``)."""

    def __init__(self, view: View, mentions: MentionView, weight: float) -> None:
        self.view, self.mentions, self.weight = view, mentions, weight
        self.ids = view.graph.ids
        self._near: dict[int, tuple[list[int], list[float], int]] = {}  # nodes, weights, links
        self._keys: dict[int, str] = {}  # ids read once (a checkpoint's decode each read)

    def key(self, u: int) -> str:
        found = self._keys.get(u)
        if found is None:
            found = self._keys[u] = self.ids[u]
        return found

    def _read(self, u: int) -> tuple[list[int], list[float], int]:
        found = self._near.get(u)
        if found is None:
            g, mask = self.view.graph, self.view.mask
            size = int(g.und_len[u])
            links: list[int] = []
            if size and mask[u]:
                start = int(g.und_off[u])
                block = g.und[start : start + size]
                links = list(set(block[mask[block] != 0].tolist()))
            mentioned = self.mentions.both(u)
            if links:
                mentioned.difference_update(links)
            weights = [1.0] * len(links) + [self.weight] * len(mentioned)
            found = self._near[u] = ([*links, *mentioned], weights, len(links))
        return found

    def neighbours(self, u: int) -> tuple[list[int], list[float]]:
        nodes, weights, _ = self._read(u)
        return nodes, weights

    def degree(self, u: int) -> float:
        """The sum of u's edges' weights: its links, and its other mentions' ``weight`` each
        (exact, as a sum edge by edge is, for the weights used: halves and ones)."""
        nodes, _, links = self._read(u)
        return links + self.weight * (len(nodes) - links)

    def nexts(self, u: int) -> list[int]:
        return self._read(u)[0]

    def outs(self, u: int) -> list[int]:
        """u's out-links (visible) and the concepts its text mentions."""
        g, mask = self.view.graph, self.view.mask
        start = int(g.out_off[u])
        block = g.out[start : start + int(g.out_len[u])]
        return [*block[mask[block] != 0].tolist(), *self.mentions.out(u)]

    def by(self, u: int, v: int) -> str:
        nodes, _, links = self._read(u)
        return "link" if v in nodes[:links] else "mention"


def ranked(
    view: View,
    mentions: Mentions,
    query: str | None,
    weights: Mapping[int, float],
    search: Mapping[int, float],
    limit: int,
    alpha: float,
) -> list[tuple[ranking.Row, str | None]]:
    """``ranked``'s rows over links and mentions, each with its ``by`` (None for a seed).

    ``weights``: the seeds' rule's weights; ``search``: every search hit's score (an id asked
    for counts as the best)."""
    both = Both(view, mentions.view(view.mask), MENTION_WEIGHT)
    seeds = dict(weights)
    named = sorted(mentions.named(query, view.mask), key=both.key) if query else []
    best = max(search.values(), default=0.0) or 1.0
    scores = dict(search)
    for v in named:
        # a name many texts hold says little (HippoRAG's node specificity)
        specific = (1.0 + len(both.mentions.into(v))) ** -NAMED_SPECIFICITY
        seeds[v] = seeds.get(v, 0.0) + NAMED_WEIGHT * specific
        if NAMED_SEARCH:
            scores[v] = max(scores.get(v, 0.0), NAMED_SEARCH * best * specific)
    mass = union.weighted_ppr(both, seeds, alpha, WALK_EPS)
    total = sum(seeds[v] for v in sorted(seeds, key=both.key))
    share = {v: seeds[v] / total for v in sorted(seeds, key=both.key)}
    reached = sorted(
        (v for v in mass if v not in seeds and round(mass[v], 4) > 0.0),
        key=lambda v: (-mass[v], both.key(v)),
    )[:CANDIDATES]
    paths = union.hops_and_via(both.nexts, both.key, share, reached)
    results = [(v, *paths[v]) for v in reached if v in paths]
    rows = ranking.ranked(
        view,
        scores,
        share,
        {v: mass.get(v, 0.0) for v in [*share, *reached]},
        [(v, hops, via) for v, hops, via in results if via is not None],
        limit,
        alpha,
        both,
        (RANK_WALK_WEIGHT, RANK_NEIGHBOUR_WEIGHT),
    )
    return [(row, None if row.via is None else both.by(row.via, row.node)) for row in rows]
