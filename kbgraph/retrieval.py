"""Ranked hits by words, by meaning, or both: ``search``'s modes and ``graph_context``'s seeds.

- ``lexical``: BM25F over the visible concepts (``kbgraph.search``).
- ``vector``: cosine between the query's vector and the visible concepts' vectors
  (``kbgraph.graphalgo.vectors``: every visible vector is scanned, none other is read).
- ``hybrid``: reciprocal-rank fusion of the two lists, each cut to ``FUSE_DEPTH``:
  ``score = sum over lists of weight / (RRF_K + rank)``, rank from 1. Ties by id. The words
  anchor it: a query whose words match no visible concept gets no hybrid hit (and no seed),
  since every concept has *some* nearest vector (a static model's cosines of unrelated and of
  right answers overlap: 0.09-0.20 for nonsense, 0.19-0.6 for the right notes on the example
  vault); ``mode=vector`` gives the nearest vectors whatever the words.

The query's vector comes from the KB's provider (cached per query text). A provider that
cannot answer leaves hybrid with the lexical list alone; vector mode then answers 503.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

import numpy as np

from kbgraph.embeddings import EmbeddingUnavailable
from kbgraph.graphalgo import View
from kbgraph.graphalgo.vectors import nearest
from kbgraph.projection.snapshot import Snapshot
from kbgraph.projection.vectors import Vectors
from kbgraph.search import top

MODES: Final = ("lexical", "vector", "hybrid")
RRF_K: Final = 60
FUSE_DEPTH: Final = 50
VECTOR_WEIGHT: Final = 1.0  # hybrid: the vector list's weight (the lexical list's is 1)
QUERY_CACHE: Final = 1024


class Unavailable(Exception):
    """The KB has no vectors (409) or its provider cannot embed the query now (503)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
_cache_lock = threading.Lock()


def query_vector(vectors: Vectors, query: str) -> np.ndarray:
    """The query's unit vector from the KB's provider; raises EmbeddingUnavailable."""
    key = (vectors.model, query)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    vector = vectors.embedder.embed([query])[0]
    with _cache_lock:
        _cache[key] = vector
        while len(_cache) > QUERY_CACHE:
            _cache.popitem(last=False)
    return vector


def default_mode(snap: Snapshot) -> str:
    return "hybrid" if snap.vectors is not None else "lexical"


def lexical(snap: Snapshot, view: View, query: str, limit: int) -> list[tuple[int, float]]:
    nodes, scores = snap.index.search(query, view.mask)
    return top(nodes, scores, snap.ids, limit)


def vector(snap: Snapshot, view: View, query: str, limit: int) -> list[tuple[int, float]]:
    """The visible concepts nearest the query by cosine, ties by id; raises Unavailable."""
    vectors = snap.vectors
    if vectors is None:
        raise Unavailable(
            409, 'this KB has no vectors: set [embeddings] provider = "local" or "openai"'
        )
    if vectors.cap == 0:
        return []
    try:
        q = query_vector(vectors, query)
    except EmbeddingUnavailable as exc:
        raise Unavailable(503, f"the embeddings provider is unavailable: {exc}") from None
    rows, scores = nearest(
        vectors.q8, vectors.scale, vectors.codes, vectors.searchable(view.mask), q, limit=limit
    )
    return top(rows, np.round(scores.astype(np.float64), 6), snap.ids, limit)


def fuse(
    lists: list[tuple[list[tuple[int, float]], float]], ids: list[str] | object, limit: int
) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion of ranked lists, each with its weight; ties by id."""
    scores: dict[int, float] = {}
    for ranked, weight in lists:
        for rank, (node, _) in enumerate(ranked, 1):
            scores[node] = scores.get(node, 0.0) + weight / (RRF_K + rank)
    ordered = sorted(scores.items(), key=lambda h: (-h[1], ids[h[0]]))  # type: ignore[index]
    return ordered[:limit]


def hybrid(
    snap: Snapshot,
    view: View,
    query: str,
    limit: int,
    vector_weight: float = VECTOR_WEIGHT,
    depth: int = FUSE_DEPTH,
) -> list[tuple[int, float]]:
    words = lexical(snap, view, query, depth)
    if not words:
        return []
    try:
        meaning = vector(snap, view, query, depth)
    except Unavailable:
        meaning = []  # text search serves meanwhile
    return fuse([(words, 1.0), (meaning, vector_weight)], snap.ids, limit)


def by_score(
    snap: Snapshot, view: View, query: str, limit: int, vector_weight: float, depth: int
) -> list[tuple[int, float]]:
    """graph_context's seeds: the lexical and vector lists (each cut to ``depth``) fused by
    their scores, ``bm25 / best + vector_weight * (cos - lowest) / (best - lowest)``: unlike
    ranks, scores keep a clear winner ahead of a near tie. Ties by id; no words, no hits; a
    fused score of 0 is no hit."""
    words = lexical(snap, view, query, depth)
    if not words:
        return []
    try:
        meaning = vector(snap, view, query, depth)
    except Unavailable:
        meaning = []  # text search serves meanwhile
    best = words[0][1]
    scores = {node: score / best for node, score in words}
    if meaning:
        high, low = meaning[0][1], meaning[-1][1]
        span = (high - low) or 1.0
        for node, score in meaning:
            scores[node] = scores.get(node, 0.0) + vector_weight * (score - low) / span
    ranked = sorted(scores.items(), key=lambda h: (-h[1], snap.ids[h[0]]))
    return [hit for hit in ranked if hit[1] > 0.0][:limit]  # the vector list's last adds 0


def hits(snap: Snapshot, view: View, query: str, limit: int, mode: str) -> list[tuple[int, float]]:
    if mode == "vector":
        return vector(snap, view, query, limit)
    if mode == "hybrid":
        if snap.vectors is None:
            return lexical(snap, view, query, limit)
        return hybrid(snap, view, query, limit)
    return lexical(snap, view, query, limit)
