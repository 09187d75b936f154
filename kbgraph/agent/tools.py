"""The agent tools of docs/api.md, as plain functions over a projection snapshot.

Their request and response types live in ``kbgraph.agent.shapes``.

Each tool takes a ``Snapshot`` (read-locked, delivery-whole) and the caller's ``View`` (the
visible subgraph) and returns a response struct; no HTTP here. Hidden concepts are never
looked at: ids resolve through the view, search ranks with the view's statistics, and the
algorithms run on the masked graph, so a narrowed caller gets exactly the bytes an admin gets
on a KB where the hidden concepts were never written.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from kbgraph import graphalgo
from kbgraph.agent import evidence, mentioned, ranking, retrieval
from kbgraph.agent.shapes import (
    CONTEXT_LIMIT,
    FAILED_NAMED,
    MAX_IDS,
    PATH_HOPS,
    SEARCH_LIMIT,
    SUGGEST_LIMIT,
    Candidate,
    ConceptResponse,
    ContextResult,
    GraphContextRequest,
    GraphContextResponse,
    GraphPathRequest,
    GraphPathResponse,
    LinkSuggestRequest,
    LinkSuggestResponse,
    PathStep,
    RankedResult,
    SearchHit,
    SearchResponse,
    Seed,
    StatusResponse,
)
from kbgraph.events import ECHO_CHARS, Refused
from kbgraph.graphalgo import union
from kbgraph.graphalgo.graph import View
from kbgraph.projection import Snapshot, mentions
from kbgraph.search import query_terms, snippet, snippet_at, top

SEARCH_SEEDS: Final = 5
PPR_ALPHA: Final = 0.25  # the walk's restart (docs/api.md)
# With vectors (docs/retrieval-quality.md, issue 36): the seeds are the top FUSED_SEEDS of the
# lexical and vector lists (each SEED_DEPTH long) fused by their scores
# (kbgraph.agent.retrieval.by_score, the vector list weighted SEED_VECTOR_WEIGHT), each weighing
# (fused / best) ** FUSED_SEED_POWER. Chosen on the tune questions of three corpora, two models.
FUSED_SEEDS: Final = 10
SEED_VECTOR_WEIGHT: Final = 0.25
FUSED_SEED_POWER: Final = 4.0
SEED_DEPTH: Final = 50  # each list's length before fusing (50 beat 20 and 10 on the tune half)
# Seeding from search scores without vectors (docs/retrieval-rules.md, "The rules"): of the
# top SEARCH_SEEDS hits, those scoring at least SEED_CUT of the best add
# (score / best) ** SEED_POWER.
SEED_CUT: Final = 0.5
SEED_POWER: Final = 2.0
RETIRED: Final = frozenset({"deprecated", "superseded"})
METHODS: Final = ("hybrid", "structure")
EDGES: Final = ("links", "all")
# link_suggest hybrid: structure's resource allocation plus weighted text evidence.
SUGGEST_MENTION_WEIGHT: Final = 2.0
TERMS_WEIGHT: Final = 4.0
TAGS_WEIGHT: Final = 1.0
# ... + SUGGEST_WALK_WEIGHT * the walk's mass from x (PPR, restart PPR_ALPHA) over its best:
# several hops of structure where resource allocation sees two (issue 36, tune links).
SUGGEST_WALK_WEIGHT: Final = 2.0
Req = TypeVar("Req")


class ToolError(Refused):
    """A tool request refused."""


def invalid_choice(field: str, value: str, expected: str) -> ToolError:
    """``422 invalid <field> "<value>": expected <expected>``, the value cut to ECHO_CHARS."""
    shown = value if len(value) <= ECHO_CHARS else value[:ECHO_CHARS] + "…"
    return ToolError(422, f'invalid {field} "{shown}": expected {expected}')


def decode_request(body: bytes, request_type: type[Req]) -> Req:
    """A request body as its struct; 422 naming the field (``limit: Expected int, got str``),
    400 for malformed JSON. An empty body counts as ``{}``."""
    try:
        return msgspec.json.decode(body or b"{}", type=request_type)
    except msgspec.ValidationError as exc:
        # msgspec's "Expected `int`, got `str` - at `$.limit`" as "limit: Expected int, got str"
        text, _, path = str(exc).replace("`", "").partition(" - at $")
        path = path.lstrip(".")
        raise ToolError(422, f"{path}: {text}" if path else f"request: {text}") from None
    except msgspec.DecodeError as exc:
        raise ToolError(400, f"malformed JSON: {exc}") from None


def visible_node(snap: Snapshot, view: View, concept_id: str) -> int:
    """The node of a concept the caller may see; hidden and missing fail alike."""
    node = snap.node(concept_id)
    if node is None or not snap.is_visible(node, view):
        raise ToolError(404, f"not found: {concept_id}")
    return node


# --- the tools -----------------------------------------------------------------------------


def seed_weights(
    hits: list[tuple[int, float]], cut: float = SEED_CUT, power: float = SEED_POWER
) -> list[tuple[int, float]]:
    """The seed weight of each ranked search hit: a clear winner outweighs a near tie."""
    if not hits:
        return []
    best = hits[0][1]
    return [(node, (score / best) ** power) for node, score in hits if score >= cut * best]


def query_seeds(
    snap: Snapshot, view: View, query: str, meaning: retrieval.Meaning
) -> tuple[list[tuple[int, float]], str, dict[int, float]]:
    """The query's weighted seeds, the mode used, and the search score of every hit (the
    seeds' and the deeper ones', for ``ranked``): from lexical hits alone (the KB has no
    vectors, or the question's vector did not come in time), or from lexical and vector hits
    fused by score."""
    if snap.vectors is None or meaning.vector is None:
        words = retrieval.lexical(snap, view, query, SEED_DEPTH)
        return seed_weights(words[:SEARCH_SEEDS]), "lexical", dict(words)
    fused = retrieval.by_score(
        snap, view, query, meaning, 2 * SEED_DEPTH, SEED_VECTOR_WEIGHT, SEED_DEPTH
    )
    return seed_weights(fused[:FUSED_SEEDS], 0.0, FUSED_SEED_POWER), "hybrid", dict(fused)


def graph_context(
    snap: Snapshot, view: View, req: GraphContextRequest, meaning: retrieval.Meaning | None = None
) -> GraphContextResponse:
    """Personalized PageRank seeded from the given ids and the query's top visible hits
    (``meaning``: the query's vector, embedded before the lock; None: embedded here)."""
    ids = req.ids or []
    if len(ids) > MAX_IDS:
        raise ToolError(422, f"'ids' takes at most {MAX_IDS} concepts")
    if req.query is None and not ids:
        raise ToolError(422, "'query' or 'ids' is required")
    limit = CONTEXT_LIMIT.clamp(req.limit)

    weights: dict[int, float] = {}
    ids_nodes: list[int] = []
    for concept_id in ids:
        node = visible_node(snap, view, concept_id)
        weights[node] = weights.get(node, 0.0) + 1.0
        ids_nodes.append(node)
    terms: list[str] = []
    mode: str | UnsetType = UNSET
    found_by: dict[int, float] = {}  # every search hit's score, for ranked
    if req.query is not None:
        terms = query_terms(req.query)
        if meaning is None:
            meaning = retrieval.embed_now(snap.vectors, req.query)
        found, mode, found_by = query_seeds(snap, view, req.query, meaning)
        for node, weight in found:
            weights[node] = weights.get(node, 0.0) + weight

    response = GraphContextResponse(
        query=UNSET if req.query is None else req.query,
        ids=UNSET if req.ids is None else req.ids,
        ranked=[],
        seeds=[],
        results=[],
        count=0,
        mode=mode,
    )
    if not weights:
        response.note = "no seed matched the query"
        return response

    nodes, p = graphalgo.personalized_pagerank(
        view, list(weights.items()), PPR_ALPHA, ordered=False
    )
    rounded = np.round(p, 4)
    own: dict[int, float] = {}
    mass: dict[int, float] = {}  # unrounded, of the seeds and the results: for ranked
    for seed in weights:  # seeds carry their own score and never come back as results
        at = nodes == seed
        own[seed] = float(rounded[at][0]) if at.any() else 0.0
        mass[seed] = float(p[at][0]) if at.any() else 0.0
        rounded[at] = 0.0

    total = sum(weights.values())
    seeds = [(node, round(weight / total, 4)) for node, weight in weights.items()]
    seeds.sort(key=lambda s: (-s[1], snap.ids[s[0]]))
    response.seeds = [
        Seed(
            snap.ids[node],
            snap.titles[node],
            weight,
            own[node],
            snippet(snap.texts[node], terms),
        )
        for node, weight in seeds
    ]
    keep = rounded > 0
    cand_nodes, cand_scores, cand_mass = nodes[keep], rounded[keep], p[keep]
    if len(cand_nodes) > limit:
        # Only the limit-th best rounded score and above can make the cut; hops break its ties.
        cut = np.partition(cand_scores, len(cand_scores) - limit)[len(cand_scores) - limit]
        keep = cand_scores >= cut
        cand_nodes, cand_scores, cand_mass = cand_nodes[keep], cand_scores[keep], cand_mass[keep]
    targets = cand_nodes.tolist()
    mass |= zip(targets, cand_mass.tolist(), strict=True)
    seed_nodes = sorted(weights, key=snap.ids.__getitem__)
    hops, via = graphalgo.hops_and_via(view, seed_nodes, targets)
    rows = sorted(
        zip(targets, cand_scores.tolist(), hops, via, strict=True),
        key=lambda row: (-row[1], row[2], snap.ids[row[0]]),
    )[:limit]
    response.results = [
        ContextResult(
            id=snap.ids[node],
            title=snap.titles[node],
            score=score,
            hops=hop,
            via=snap.ids[before],
            snippet=snippet(snap.texts[node], terms),  # no query: the text's start
        )
        for node, score, hop, before in rows
    ]
    response.count = len(response.results)
    best = max(found_by.values(), default=1.0)
    search = found_by | {node: best for node in ids_nodes}  # an id asked for: the best match
    shown = {row.id: row.snippet for row in response.seeds + response.results}
    if snap.mentions is None or not mentioned.walks_mentions(*snap.counts(view)):
        share = {node: weight / total for node, weight in weights.items()}
        links = [(v, h, b) for v, _, h, b in rows]
        order = [
            (row, None if row.via is None else "link")
            for row in ranking.ranked(view, search, share, mass, links, limit, PPR_ALPHA)
        ]
    else:
        order = mentioned.ranked(view, snap.mentions, req.query, weights, search, limit, PPR_ALPHA)
    response.ranked = [
        RankedResult(
            id=snap.ids[row.node],
            title=snap.titles[row.node],
            score=row.score,
            hops=row.hops,
            via=UNSET if row.via is None else snap.ids[row.via],
            by=UNSET if by is None else by,
            snippet=shown.get(snap.ids[row.node]) or snippet(snap.texts[row.node], terms),
        )
        for row, by in order
    ]
    return response


def link_suggest(snap: Snapshot, view: View, req: LinkSuggestRequest) -> LinkSuggestResponse:
    """Missing links by resource allocation (``structure``), plus text evidence (``hybrid``);
    retired candidates skipped before the limit."""
    method = "hybrid" if req.method is None else req.method
    if method not in METHODS:
        raise invalid_choice("method", method, "hybrid or structure")
    limit = SUGGEST_LIMIT.clamp(req.limit)
    node = visible_node(snap, view, req.id)
    if method == "hybrid":
        candidates = _hybrid(snap, view, node, limit)
    else:
        candidates = _structure(snap, view, node, limit)
    return LinkSuggestResponse(
        id=req.id, method=method, candidates=candidates, count=len(candidates)
    )


def _structure(snap: Snapshot, view: View, node: int, limit: int) -> list[Candidate]:
    """The seed's rule: resource allocation over candidates with 2 or more common neighbours."""
    wanted = limit * 2
    while True:
        ranked = graphalgo.resource_allocation(view, node, min_common=2, limit=wanted)
        kept = [s for s in ranked if snap.statuses[s.node] not in RETIRED]
        if len(kept) >= limit or len(ranked) < wanted:
            break
        wanted *= 4
    return [
        Candidate(
            id=snap.ids[s.node],
            title=snap.titles[s.node],
            score=round(s.score, 4),
            common=[snap.ids[z] for z in s.common],
        )
        for s in kept[:limit]
    ]


def _hybrid(snap: Snapshot, view: View, node: int, limit: int) -> list[Candidate]:
    """Resource allocation (one common neighbour is enough) plus the text's evidence.

    score = RA + SUGGEST_MENTION_WEIGHT * mention + TERMS_WEIGHT * terms + TAGS_WEIGHT * tags
            + SUGGEST_WALK_WEIGHT * walk
    (``kbgraph.agent.evidence``; ``walk``: the PPR mass from ``node`` over the best of it,
    ``node`` left out), over the visible concepts not linked with ``node`` either way; a
    candidate needs some evidence of one kind or another.
    """
    g, mask = view.graph, view.mask
    start, length = int(g.out_off[node]), int(g.out_len[node])
    outs = g.out[start : start + length]
    if snap.mentions is not None:
        mention = snap.mentions.first_offsets(node, mask)
    else:  # the same rule, u's text scanned now
        mention = mentions.unlinked(snap.index, snap.texts[node], node, mask, outs.tolist())
    n_visible = snap.index.visible_stats(mask)[0]
    found = evidence.gather(snap.index, mention, mask, node, n_visible, g.n)
    total = np.zeros(g.n, np.float64)
    cands, ra = graphalgo.resource_allocation_scores(view, node, min_common=1)
    total[cands] = ra
    if found.mention:
        total[list(found.mention)] += SUGGEST_MENTION_WEIGHT
    total += TERMS_WEIGHT * found.terms
    total += TAGS_WEIGHT * found.tags
    reached, mass = graphalgo.personalized_pagerank(view, [(node, 1.0)], PPR_ALPHA, ordered=False)
    mass[reached == node] = 0.0
    if mass.size and mass.max() > 0.0:
        total[reached] += SUGGEST_WALK_WEIGHT * mass / mass.max()
    start, length = int(g.und_off[node]), int(g.und_len[node])
    total[g.und[start : start + length]] = 0.0  # linked either way: never a candidate
    total[node] = 0.0
    nodes = np.flatnonzero(total > 0.0)
    wanted = limit * 2
    while True:
        ranked = top(nodes, total[nodes], snap.ids, wanted)
        kept = [(v, score) for v, score in ranked if snap.statuses[v] not in RETIRED]
        if len(kept) >= limit or len(ranked) < wanted:
            break
        wanted *= 4
    kept = kept[:limit]
    common = graphalgo.common_neighbours(view, node, [v for v, _ in kept])
    text = snap.texts[node]
    return [
        Candidate(
            id=snap.ids[v],
            title=snap.titles[v],
            score=round(score, 4),
            common=[snap.ids[z] for z in shared],
            mention=snippet_at(text, found.mention[v]) if v in found.mention else UNSET,
        )
        for (v, score), shared in zip(kept, common, strict=True)
    ]


def graph_path(snap: Snapshot, view: View, req: GraphPathRequest) -> GraphPathResponse:
    """The lexicographically smallest shortest chain between two concepts."""
    direction = "both" if req.direction is None else req.direction
    if direction not in ("out", "both"):
        raise invalid_choice("direction", direction, "out or both")
    edges = "links" if req.edges is None else req.edges
    if edges not in EDGES:
        raise invalid_choice("edges", edges, "links or all")
    max_hops = PATH_HOPS.clamp(req.max_hops)
    source = visible_node(snap, view, req.source)
    target = visible_node(snap, view, req.target)
    if edges == "all" and snap.mentions is not None:
        both = mentioned.Both(view, snap.mentions.view(view.mask), 1.0)
        nexts = both.nexts if direction == "both" else both.outs
        path = union.shortest_path(nexts, both.key, source, target, max_hops)
    else:  # a KB without mentions: its links are all its edges
        path = graphalgo.shortest_path(view, source, target, direction=direction, max_hops=max_hops)
    if path is None:
        return GraphPathResponse(
            source=req.source,
            target=req.target,
            hops=0,
            path=[],
            note=f"no path within {max_hops} hops",
        )
    steps = [PathStep(snap.ids[node], snap.titles[node]) for node in path]
    return GraphPathResponse(source=req.source, target=req.target, hops=len(path) - 1, path=steps)


def search(
    snap: Snapshot,
    view: View,
    query: str,
    limit: int,
    mode: str | None = None,
    meaning: retrieval.Meaning | None = None,
) -> SearchResponse:
    """The best visible hits for ``query`` by words (BM25), meaning (vectors) or both
    (``meaning``: the query's vector, embedded before the lock; None: embedded here)."""
    limit = SEARCH_LIMIT.clamp(limit)
    if mode is None:
        mode = retrieval.default_mode(snap)
    elif mode not in retrieval.MODES:
        raise invalid_choice("mode", mode, "lexical, vector or hybrid")
    if meaning is None:
        meaning = retrieval.embed_now(None if mode == "lexical" else snap.vectors, query)
    try:
        ranked, used = retrieval.hits(snap, view, query, limit, mode, meaning)
    except retrieval.Unavailable as exc:
        raise ToolError(exc.status, exc.message) from None
    terms = query_terms(query)
    hits = [
        SearchHit(
            snap.ids[node], snap.titles[node], round(score, 4), snippet(snap.texts[node], terms)
        )
        for node, score in ranked
    ]
    return SearchResponse(query=query, hits=hits, count=len(hits), mode=used)


def concept(snap: Snapshot, view: View, concept_id: str) -> ConceptResponse:
    """A visible concept with its declared links to, and backlinks from, visible concepts."""
    node = visible_node(snap, view, concept_id)
    links = []
    for target_id in snap.declared_links(node):
        target = snap.node(target_id)
        if target is not None and snap.is_visible(target, view):
            links.append(target_id)
    return ConceptResponse(
        id=snap.ids[node],  # the stored (NFC) spelling
        title=snap.titles[node],
        aliases=list(snap.aliases[node]),
        type=snap.types[node],
        status=snap.statuses[node],
        tags=list(snap.tags[node]),
        text=snap.texts[node],
        version=snap.versions[node],
        links=links,
        backlinks=backlinks(snap, view, node),
    )


def backlinks(snap: Snapshot, view: View, node: int) -> list[str]:
    """Ids of the visible concepts that link to ``node``, ascending.

    A concept linking to ``node`` is one of its undirected neighbours (both exist), so only
    those are checked, each by a look into its out-link block.
    """
    g = view.graph
    start = int(g.und_off[node])
    sources = []
    for v in g.und[start : start + int(g.und_len[node])].tolist():
        if view.mask[v]:
            out_start = int(g.out_off[v])
            if node in g.out[out_start : out_start + int(g.out_len[v])]:
                sources.append(snap.ids[v])
    return sorted(sources)


def status(snap: Snapshot, view: View, kb: str) -> StatusResponse:
    concepts, links = snap.counts(view)
    vectors = snap.vectors
    if vectors is None:
        return StatusResponse(kb=kb, concepts=concepts, links=links)
    # the visible rows alone: what a hidden concept waits for or was refused never shows
    refused = vectors.refused(view.mask)
    missing = concepts - int(np.count_nonzero(vectors.searchable(view.mask))) - len(refused)
    named = sorted(snap.ids[u] for u in refused.tolist())[:FAILED_NAMED]
    return StatusResponse(
        kb=kb,
        concepts=concepts,
        links=links,
        vectors="filling" if missing else "complete",
        vectors_missing=missing,
        vectors_failed=len(refused) if named else UNSET,
        vectors_failed_ids=named if named else UNSET,
    )
