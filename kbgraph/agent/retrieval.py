"""Ranked hits by words, by meaning, or both: ``search``'s modes and ``graph_context``'s seeds.

- ``lexical``: BM25F over the visible concepts (``kbgraph.search``).
- ``vector``: cosine between the query's vector and the visible concepts' vectors
  (``kbgraph.graphalgo.nearest``: every visible vector is scanned, none other is read).
- ``hybrid``: reciprocal-rank fusion of the two lists, each cut to ``FUSE_DEPTH``:
  ``score = sum over lists of weight / (RRF_K + rank)``, rank from 1. Ties by id. The words
  anchor it: a query whose words match no visible concept gets no hybrid hit (and no seed),
  since every concept has *some* nearest vector (a static model's cosines of unrelated and of
  right answers overlap: 0.09-0.20 for nonsense, 0.19-0.6 for the right notes on the example
  vault); ``mode=vector`` gives the nearest vectors whatever the words.

The query's vector (a ``Meaning``) is embedded before the request takes a tool thread or the
KB's lock (``embed_meaning``, in its own threads, a remote provider's with ``[embeddings]
query_timeout_seconds``):
a slow question waits for its own provider call, never behind another's, and never holds a
lock a writer waits for. A provider that does not answer in time leaves hybrid with the
lexical list alone (the response's ``mode`` then says ``lexical``); vector mode answers 503
"embedding provider unavailable" (the provider's address and error go to the log only). No
query vector is cached: a cache shared between callers would tell one what another asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import numpy as np

from kbgraph.embeddings import EmbeddingUnavailable
from kbgraph.events import Refused
from kbgraph.graphalgo import View
from kbgraph.graphalgo.nearest import nearest
from kbgraph.projection.snapshot import Snapshot
from kbgraph.projection.vectors import Vectors
from kbgraph.search import top

MODES: Final = ("lexical", "vector", "hybrid")
RRF_K: Final = 60
FUSE_DEPTH: Final = 50
VECTOR_WEIGHT: Final = 1.0  # hybrid: the vector list's weight (the lexical list's is 1)
QUERY_THREADS: Final = 4  # questions embedded at once per process (the rest queue, in time)
UNAVAILABLE: Final = "embedding provider unavailable"

log = logging.getLogger(__name__)
_embedding = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="kbgraph-query-embed")


class Unavailable(Refused):
    """The KB has no vectors (409) or its provider cannot embed the query now (503)."""


@dataclass(frozen=True, slots=True)
class Meaning:
    """A question's unit vector, or None: the KB has no vectors, or the provider did not
    answer in time."""

    vector: np.ndarray | None = None


def embed_now(vectors: Vectors | None, query: str) -> Meaning:
    """The question's vector from the KB's provider, here and now (``embed_meaning`` for
    requests); None when it cannot answer (logged)."""
    if vectors is None:
        return Meaning()
    try:
        return Meaning(vectors.embedder.embed([query])[0])
    except EmbeddingUnavailable as exc:
        log.warning("embedding a question failed: %s", exc)
        return Meaning()


async def embed_meaning(vectors: Vectors | None, query: str | None, seconds: float) -> Meaning:
    """``embed_now`` in this module's threads, before any tool thread or lock is taken; a
    remote provider's answer is given up after ``seconds`` (the call goes on in its thread, its
    answer dropped). The local model is waited for: it cannot hang, and a cut that depended on
    the machine's load would make answers at one seq differ."""
    if vectors is None or query is None:
        return Meaning()
    work = asyncio.wrap_future(_embedding.submit(embed_now, vectors, query))
    try:
        return await asyncio.wait_for(work, seconds if vectors.embedder.remote else None)
    except TimeoutError:
        log.warning("embedding a question took over %.2f s: answered by its words", seconds)
        return Meaning()


def default_mode(snap: Snapshot) -> str:
    return "hybrid" if snap.vectors is not None else "lexical"


def lexical(snap: Snapshot, view: View, query: str, limit: int) -> list[tuple[int, float]]:
    nodes, scores = snap.index.search(query, view.mask)
    return top(nodes, scores, snap.ids, limit)


def vector(snap: Snapshot, view: View, meaning: Meaning, limit: int) -> list[tuple[int, float]]:
    """The visible concepts nearest the query by cosine, ties by id; raises Unavailable."""
    vectors = snap.vectors
    if vectors is None:
        raise Unavailable(
            409, 'this KB has no vectors: set [embeddings] provider = "local" or "openai"'
        )
    if meaning.vector is None:
        raise Unavailable(503, UNAVAILABLE)
    if vectors.cap == 0:
        return []
    rows, scores = nearest(
        vectors.q8,
        vectors.scale,
        vectors.codes,
        vectors.searchable(view.mask),
        meaning.vector,
        limit=limit,
    )
    return top(rows, np.round(scores.astype(np.float64), 6), snap.ids, limit)


def fuse(
    lists: list[tuple[list[tuple[int, float]], float]], ids: Sequence[str], limit: int
) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion of ranked lists, each with its weight; ties by id."""
    scores: dict[int, float] = {}
    for ranked, weight in lists:
        for rank, (node, _) in enumerate(ranked, 1):
            scores[node] = scores.get(node, 0.0) + weight / (RRF_K + rank)
    ordered = sorted(scores.items(), key=lambda h: (-h[1], ids[h[0]]))
    return ordered[:limit]


def hybrid(
    snap: Snapshot,
    view: View,
    query: str,
    meaning: Meaning,
    limit: int,
    vector_weight: float = VECTOR_WEIGHT,
    depth: int = FUSE_DEPTH,
) -> tuple[list[tuple[int, float]], str]:
    """The fused hits and the mode they were ranked by: ``lexical`` alone when the KB has no
    vectors or the question has none (its provider did not answer in time)."""
    if snap.vectors is None or meaning.vector is None:
        return lexical(snap, view, query, limit), "lexical"
    words = lexical(snap, view, query, depth)
    if not words:
        return [], "hybrid"
    meaning_hits = vector(snap, view, meaning, depth)
    return fuse([(words, 1.0), (meaning_hits, vector_weight)], snap.ids, limit), "hybrid"


def by_score(
    snap: Snapshot,
    view: View,
    query: str,
    meaning: Meaning,
    limit: int,
    vector_weight: float,
    depth: int,
) -> list[tuple[int, float]]:
    """graph_context's seeds: the lexical and vector lists (each cut to ``depth``) fused by
    their scores, ``bm25 / best + vector_weight * (cos - lowest) / (best - lowest)``: unlike
    ranks, scores keep a clear winner ahead of a near tie. Ties by id; no words, no hits; a
    fused score of 0 is no hit."""
    words = lexical(snap, view, query, depth)
    if not words:
        return []
    # no vector for the question (its provider did not answer in time): words alone
    nearest = vector(snap, view, meaning, depth) if meaning.vector is not None else []
    best = words[0][1]
    scores = {node: score / best for node, score in words}
    if nearest:
        high, low = nearest[0][1], nearest[-1][1]
        span = (high - low) or 1.0
        for node, score in nearest:
            scores[node] = scores.get(node, 0.0) + vector_weight * (score - low) / span
    ranked = sorted(scores.items(), key=lambda h: (-h[1], snap.ids[h[0]]))
    return [hit for hit in ranked if hit[1] > 0.0][:limit]  # the vector list's last adds 0


def needs_meaning(mode: str | None) -> bool:
    """Whether a search in ``mode`` (None: the default) embeds its query."""
    return mode in (None, "vector", "hybrid")


def hits(
    snap: Snapshot, view: View, query: str, limit: int, mode: str, meaning: Meaning
) -> tuple[list[tuple[int, float]], str]:
    """The ranked hits and the mode actually used."""
    if mode == "vector":
        return vector(snap, view, meaning, limit), "vector"
    if mode == "hybrid":
        return hybrid(snap, view, query, meaning, limit)
    return lexical(snap, view, query, limit), "lexical"
