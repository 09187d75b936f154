"""Full-text search over a KB's visible concepts: BM25 on title, aliases and text, snippets.

Why in memory, beside the store's FTS5 index: SQLite's ``bm25()`` takes its statistics (row
count, average length, document frequencies) from the whole table, so a narrowed caller's
ranking would carry the concepts it may not see. Here the statistics are recomputed for the
visible subset at query time, and the index is patched in the same write-locked step as the
graph, so the hits that seed ``graph_context`` come from the very snapshot the graph does.

Scoring is FTS5's ``bm25(fts, 10.0, 10.0, 1.0)`` to the letter (title and aliases weighted
10, text 1), with N, avgdl and df those of the visible concepts (Robertson & Zaragoza, "The
Probabilistic Relevance Framework: BM25 and Beyond", 2009)::

    f(t, d)   = 10 * hits of t in d's title and aliases + hits of t in d's text
    idf(t)    = max(1e-6, ln((N - df(t) + 0.5) / (df(t) + 0.5)))
    score(d)  = sum over terms t of idf(t) * f * (k1 + 1) / (f + k1 * (1 - b + b * |d| / avgdl))

with k1 = 1.2, b = 0.75 and |d| the token count of title, aliases and text. The tokenizer mirrors
FTS5's ``unicode61 remove_diacritics 2``: case folded, diacritics stripped, tokens are runs of
letters and digits. A query is only ever split into terms, so no character in it is syntax.
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np
from numba import njit

TITLE_WEIGHT = 10
K1 = 1.2
B = 0.75
SNIPPET_WIDTH = 160

MAX_QUERY_TERMS = 32  # distinct terms of a query used for ranking and snippets; the rest ignored

_ASCII_TOKEN = re.compile(r"[a-z0-9]+")
_ASCII_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_TOKEN = re.compile(r"[^\W_]+")


@njit(cache=True, nogil=True)
def _bm25(
    term_off, nodes, freqs, doc_len, mask, n_docs, avgdl, acc, seen, touched
):  # pragma: no cover - compiled
    """Sum each visible document's BM25 parts, term by term (so in query-term order).

    ``nodes[term_off[t]:term_off[t + 1]]`` are term t's postings with their weighted
    frequencies. Scratch ``acc`` (zeros), ``seen`` (zeros) and ``touched`` are restored.
    """
    nt = 0
    for t in range(term_off.shape[0] - 1):
        start, end = term_off[t], term_off[t + 1]
        df = 0
        for j in range(start, end):
            if mask[nodes[j]] != 0:
                df += 1
        if df == 0:
            continue
        idf = math.log((n_docs - df + 0.5) / (df + 0.5))
        if idf <= 0.0:
            idf = 1e-6
        for j in range(start, end):
            u = nodes[j]
            if mask[u] == 0:
                continue
            f = freqs[j]
            norm = K1 * (1.0 - B + B * doc_len[u] / avgdl)
            acc[u] += idf * (f * (K1 + 1.0)) / (f + norm)
            if seen[u] == 0:
                seen[u] = 1
                touched[nt] = u
                nt += 1
    out_nodes = touched[:nt].copy()
    out_scores = np.empty(nt, np.float64)
    for i in range(nt):
        u = out_nodes[i]
        out_scores[i] = acc[u]
        acc[u] = 0.0
        seen[u] = 0
    return out_nodes, out_scores


class _Scratch(threading.local):
    """Per-thread accumulator arrays for ``_bm25``, grown on demand, always left clean."""

    def __init__(self) -> None:
        self.grow(1024)

    def grow(self, size: int) -> None:
        self.acc = np.zeros(size, np.float64)
        self.seen = np.zeros(size, np.uint8)
        self.touched = np.zeros(size, np.int64)


_scratch = _Scratch()


def _fold(text: str) -> str:
    """Lower-case and strip diacritics (NFD, then drop the combining marks)."""
    if text.isascii():
        return text.lower()
    decomposed = unicodedata.normalize("NFD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return stripped.lower()


# ASCII text, as bytes: letters to lower case, digits kept, every other byte a space (the
# upper half is never used, bytes.translate wants 256 entries); then
# ``str.split`` finds exactly the runs ``[a-z0-9]+`` of the lower-cased text, ~2x faster.
_ASCII_FOLD = bytes(ord(chr(c).lower()) if chr(c).isalnum() else 32 for c in range(128)) * 2


def tokenize(text: str) -> list[str]:
    """The terms of ``text``, in order, as FTS5's unicode61 tokenizer would produce them."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_FOLD).decode("ascii").split()
    folded = _fold(text)
    if folded.isascii():
        return _ASCII_TOKEN.findall(folded)
    return _TOKEN.findall(folded)


def query_terms(query: str) -> list[str]:
    """The first ``MAX_QUERY_TERMS`` distinct terms of a query, in order of first appearance
    (bounding the work of one query: BM25 postings and snippet scans are per term)."""
    return list(dict.fromkeys(tokenize(query)))[:MAX_QUERY_TERMS]


class _Postings:
    """One term's postings: ``freq`` node -> 10 * title and alias hits + text hits;
    ``arrays`` (nodes, freqs) built on demand by ``search`` and dropped when ``freq`` changes."""

    __slots__ = ("arrays", "freq")

    def __init__(self, node: int, count: int) -> None:
        self.freq: dict[int, int] = {node: count}
        self.arrays: tuple[np.ndarray, np.ndarray] | None = None


class SearchIndex:
    """An inverted index of one KB, patched per concept (``put``/``remove``).

    Not thread-safe by itself: the projection calls ``put``/``remove`` under its write lock
    and ``search`` under its read lock.
    """

    def __init__(self) -> None:
        self._postings: dict[str, _Postings] = {}
        self._doc_terms: dict[int, tuple[str, ...]] = {}
        self._doc_len = np.zeros(1024, dtype=np.int64)
        self._present = np.zeros(1024, dtype=np.uint8)  # 1 where a document is indexed
        self.version = 0  # bumped on every change; keys the cached visible statistics
        self._stats: dict[tuple[int, int], tuple[np.ndarray, int, int]] = {}

    def put(self, node: int, title: str, text: str, aliases: Sequence[str] = ()) -> None:
        """Index (or re-index) ``node`` with its current title, text and aliases."""
        title_terms = tokenize(title)
        for alias in aliases:  # weighed as the title: other names of the concept
            title_terms.extend(tokenize(alias))
        text_terms = tokenize(text)
        freq: dict[str, int] = {}
        get = freq.get
        for term in text_terms:
            freq[term] = get(term, 0) + 1
        for term in title_terms:
            freq[term] = get(term, 0) + TITLE_WEIGHT
        all_postings = self._postings
        old = self._doc_terms.get(node)
        if old is not None:  # re-indexing: only the terms it no longer has leave
            self._forget(node, [term for term in old if term not in freq])
        for term, count in freq.items():
            postings = all_postings.get(term)
            if postings is None:
                all_postings[term] = _Postings(node, count)
            else:
                postings.freq[node] = count
                postings.arrays = None
        self._doc_terms[node] = tuple(freq)
        if node >= len(self._doc_len):
            size = max(node + 1, 2 * len(self._doc_len))
            self._doc_len = np.concatenate(
                [self._doc_len, np.zeros(size - len(self._doc_len), np.int64)]
            )
            self._present = np.concatenate(
                [self._present, np.zeros(size - len(self._present), np.uint8)]
            )
        self._doc_len[node] = len(title_terms) + len(text_terms)
        self._present[node] = 1
        self._changed()

    def remove(self, node: int) -> None:
        """Forget ``node`` (a deleted concept). Unknown nodes are ignored."""
        terms = self._doc_terms.pop(node, None)
        if terms is None:
            return
        self._forget(node, terms)
        self._doc_len[node] = 0
        self._present[node] = 0
        self._changed()

    def _forget(self, node: int, terms: Iterable[str]) -> None:
        """Drop ``node`` from the postings of ``terms`` (each holding it)."""
        all_postings = self._postings
        for term in terms:
            postings = all_postings[term]
            del postings.freq[node]
            if postings.freq:
                postings.arrays = None
            else:
                del all_postings[term]

    def _changed(self) -> None:
        self.version += 1
        self._stats.clear()

    def __len__(self) -> int:
        return len(self._doc_terms)

    def _visible_stats(self, mask: np.ndarray) -> tuple[int, int]:
        """(N, total length) of the indexed documents with ``mask[node] == 1``."""
        key = (id(mask), len(mask))
        cached = self._stats.get(key)
        if cached is not None and cached[0] is mask:
            return cached[1], cached[2]
        size = min(len(mask), len(self._doc_len))
        visible = (mask[:size] != 0) & (self._present[:size] != 0)
        count, total = int(np.count_nonzero(visible)), int(self._doc_len[:size][visible].sum())
        self._stats[key] = (mask, count, total)
        return count, total

    def _arrays(self, postings: _Postings) -> tuple[np.ndarray, np.ndarray]:
        if postings.arrays is None:
            nodes = np.fromiter(postings.freq, dtype=np.int64, count=len(postings.freq))
            freqs = np.fromiter(postings.freq.values(), dtype=np.float64, count=len(nodes))
            postings.arrays = (nodes, freqs)
        return postings.arrays

    def search(self, query: str, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """BM25 scores of every visible document matching a term of ``query``.

        Returns (nodes int64[k], scores float64[k]) in no particular order; rank them with
        ``top``. Statistics are those of the documents with ``mask[node] == 1``.
        """
        terms = query_terms(query)
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
        if not terms:
            return empty
        n_docs, total_len = self._visible_stats(mask)
        if n_docs == 0:
            return empty
        avgdl = total_len / n_docs
        term_nodes: list[np.ndarray] = []
        term_freqs: list[np.ndarray] = []
        for term in terms:
            postings = self._postings.get(term)
            if postings is not None:
                nodes, freqs = self._arrays(postings)
                term_nodes.append(nodes)
                term_freqs.append(freqs)
        if not term_nodes:
            return empty
        term_off = np.zeros(len(term_nodes) + 1, np.int64)
        np.cumsum([len(nodes) for nodes in term_nodes], out=term_off[1:])
        size = len(mask)
        if _scratch.acc.shape[0] < size:
            _scratch.grow(size + size // 8)
        return _bm25(
            term_off,
            np.concatenate(term_nodes),
            np.concatenate(term_freqs),
            self._doc_len,
            mask,
            n_docs,
            avgdl,
            _scratch.acc,
            _scratch.seen,
            _scratch.touched,
        )


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the BM25 kernel, before serving."""
    index = SearchIndex()
    index.put(0, "warm", "up")
    for writeable in (True, False):
        mask = np.ones(1, np.uint8)
        mask.flags.writeable = writeable
        index.search("warm", mask)


def top(
    nodes: np.ndarray, scores: np.ndarray, ids: list[str], limit: int
) -> list[tuple[int, float]]:
    """The ``limit`` best (node, score) pairs: score descending, then id ascending."""
    if len(nodes) == 0 or limit <= 0:
        return []
    if len(nodes) > limit:
        # Everything scoring at least the limit-th best score, ties included, then exact order.
        cut = np.partition(scores, len(scores) - limit)[len(scores) - limit]
        keep = scores >= cut
        nodes, scores = nodes[keep], scores[keep]
    ranked = sorted(
        zip(nodes.tolist(), scores.tolist(), strict=True), key=lambda h: (-h[1], ids[h[0]])
    )
    return ranked[:limit]


def _first_ascii_hit(lowered: str, terms: tuple[str, ...]) -> int:
    """``_first_hit`` on lower-cased ASCII text, in time linear in the text.

    ``str.find`` gives each term's first raw occurrence (a C scan per term, at most
    ``MAX_QUERY_TERMS`` of them); tokens are then matched one by one from the start of the
    token holding the earliest occurrence, so no position is looked at twice.
    """
    first = min((at for term in terms if (at := lowered.find(term)) >= 0), default=-1)
    if first < 0:
        return 0
    start = len(lowered[:first].rstrip(_ASCII_ALNUM))  # the start of the token holding it
    wanted = set(terms)
    for match in _ASCII_TOKEN.finditer(lowered, start):
        if match.group() in wanted:
            return match.start()
    return 0


def _first_hit(text: str, terms: tuple[str, ...]) -> int:
    """Where the first token of ``text`` that is one of ``terms`` starts (0 when none is).

    Linear in the text: ASCII text see ``_first_ascii_hit``; non-ASCII text folds each
    distinct token once (in one batch), then walks the tokens only when one of them matches.
    """
    if not terms:
        return 0
    if text.isascii():
        return _first_ascii_hit(text.lower(), terms)
    # Folding never shortens a token (every letter or digit keeps at least its base
    # character), so a token longer than every term cannot match and is never folded.
    longest = max(len(term) for term in terms)
    distinct = [token for token in set(_TOKEN.findall(text)) if len(token) <= longest]
    if not distinct:
        return 0
    folded = _fold("\n".join(distinct)).split("\n")  # a token never holds a newline
    wanted = set(terms)
    hits = {token for token, fold in zip(distinct, folded, strict=True) if fold in wanted}
    if hits:
        for match in _TOKEN.finditer(text):
            if match.group() in hits:
                return match.start()
    return 0


def snippet(text: str, terms: list[str], width: int = SNIPPET_WIDTH) -> str:
    """At most ``width`` characters of ``text`` around the first occurrence of a query term.

    The window opens a quarter width before the hit; whitespace runs collapse to one space and
    an ellipsis (counted in the width) marks each cut. Without an occurrence: the text's start.
    """
    hit = _first_hit(text, tuple(terms))
    start = max(0, hit - width // 4)
    end = start + 2 * width  # enough raw text to fill the width after collapsing whitespace
    prefix = "…" if start > 0 else ""
    body = " ".join(text[start:end].split())
    room = width - len(prefix)
    if len(body) > room or end < len(text):
        body = body[: room - 1].rstrip() + "…"
    return prefix + body
