"""The search index of one KB and its BM25F scoring, over the visible concepts only.

Why in memory, not SQLite's FTS5: ``bm25()`` takes its statistics (row count, average length,
document frequencies) from the whole table, so a narrowed caller's ranking would carry the
concepts it may not see. Here the statistics are recomputed for the visible subset at query
time, and the index is patched in the same write-locked step as the graph, so the hits that
seed ``graph_context`` come from the very snapshot the graph does.

Scoring is BM25F (Robertson, Zaragoza, Taylor, "Simple BM25 extension to multiple weighted
fields", 2004) over two fields, the title with the aliases and the body text, with N, the
average field lengths and df those of the visible concepts::

    tf(t, d)  = W_TITLE * title_hits / (1 - B_TITLE + B_TITLE * |title_d| / avg|title|)
              +           text_hits  / (1 - B_TEXT  + B_TEXT  * |text_d|  / avg|text|)
    idf(t)    = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    score(d)  = sum over the query's distinct terms t of idf(t) * tf * (K1 + 1) / (tf + K1)

Headings are not a field of their own: telling them apart needs the markup parsed, and a
concept's text is whatever its KB sent.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

import numpy as np
from numba import njit

from kbgraph.search import nametrie
from kbgraph.search.analysis import query_terms
from kbgraph.search.bulk import FIELD, BulkAnalyzer
from kbgraph.search.document import Analysed, parts
from kbgraph.search.nametrie import NAME_SEP, NameTrie
from kbgraph.search.postings import KeyIds, KeyList, Postings, PostingsBuilder

W_TITLE: Final = 12.0
B_TITLE: Final = 0.3
B_TEXT: Final = 0.75
K1: Final = 4.0


@njit(cache=True, nogil=True)
def _bm25f(
    term_off: np.ndarray,
    nodes: np.ndarray,
    tf_title: np.ndarray,
    tf_text: np.ndarray,
    title_len: np.ndarray,
    text_len: np.ndarray,
    mask: np.ndarray,
    n_docs: int,
    avg_title: float,
    avg_text: float,
    params: np.ndarray,
    acc: np.ndarray,
    seen: np.ndarray,
    touched: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """Sum each visible document's BM25F parts, term by term (so in query-term order).

    ``nodes[term_off[t]:term_off[t + 1]]`` are term t's postings with their field hits.
    Scratch ``acc`` (zeros), ``seen`` (zeros) and ``touched`` are restored.
    """
    w_title, b_title, b_text, k1 = params[0], params[1], params[2], params[3]
    nt = 0
    for t in range(term_off.shape[0] - 1):
        start, end = term_off[t], term_off[t + 1]
        df = 0
        for j in range(start, end):
            if mask[nodes[j]] != 0:
                df += 1
        if df == 0:
            continue
        idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
        for j in range(start, end):
            u = nodes[j]
            if mask[u] == 0:
                continue
            tf = 0.0
            if tf_title[j] > 0.0:
                tf += w_title * tf_title[j] / (1.0 - b_title + b_title * title_len[u] / avg_title)
            if tf_text[j] > 0.0:
                tf += tf_text[j] / (1.0 - b_text + b_text * text_len[u] / avg_text)
            acc[u] += idf * tf * (k1 + 1.0) / (tf + k1)
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
    """Per-thread accumulator arrays for ``_bm25f``, grown on demand, always left clean."""

    def __init__(self) -> None:
        self.grow(1024)

    def grow(self, size: int) -> None:
        self.acc = np.zeros(size, np.float64)
        self.seen = np.zeros(size, np.uint8)
        self.touched = np.zeros(size, np.int64)


_scratch = _Scratch()
_FIELD = FIELD  # a posting's hits packed as title_hits * _FIELD + text_hits
BULK_CHUNK: Final = 1 << 15  # documents analysed at once by put_many and put_columns
# a chunk of documents: nodes (int64, ascending), titles, texts, aliases, tags
_Chunk = tuple[
    np.ndarray, Sequence[str], Sequence[str], Sequence[Sequence[str]], Sequence[Sequence[str]]
]


class Strings(Protocol):
    """A column of strings read a range at a time (``kbgraph.store.columns.StringColumn``)."""

    def strings(self, start: int, stop: int) -> list[str]: ...


_NAME_SEP = NAME_SEP


class SearchIndex:
    """An inverted index of one KB, patched per concept (``put``/``remove``): the terms of
    titles, aliases and texts, the concepts' names as token sequences (for mentions) and their
    tags (for link evidence), each a ``kbgraph.search.postings.Postings`` (flat arrays and a small
    overlay of changes).

    Not thread-safe by itself: the projection calls ``put``/``remove`` under its write lock
    and the readers under its read lock.
    """

    def __init__(self) -> None:
        self.terms = Postings()  # hits packed title_hits * _FIELD + text_hits
        self.names = Postings()  # a name's tokens joined by _NAME_SEP
        self.tags = Postings()  # folded tags
        self.name_lengths: Counter[int] = Counter()  # how many names have each token count
        self._title_len = np.zeros(1024, dtype=np.float64)
        self._text_len = np.zeros(1024, dtype=np.float64)
        self._present = np.zeros(1024, dtype=np.uint8)  # 1 where a document is indexed
        self._stats: dict[tuple[int, int], tuple[np.ndarray, int, float, float]] = {}
        self._trie: NameTrie | None = None  # the names as a trie, built on first use
        self._trie_building = threading.Lock()  # readers build it once between them
        # names put since the last ``settle``, counted: added to the trie there, at once
        self._trie_added: Counter[str] = Counter()

    def put(
        self,
        node: int,
        title: str,
        text: str,
        aliases: Sequence[str] = (),
        tags: Sequence[str] = (),
        analysed: Analysed | None = None,
    ) -> None:
        """Index (or re-index) ``node`` with its current title, text, aliases and tags;
        ``analysed``, when the log carried it, is their analysis (``kbgraph.search.document``),
        used instead of analysing them here."""
        tag_keys: Sequence[str]
        if analysed is None:
            freq, name_keys, tag_keys, title_len, text_len = parts(title, text, aliases, tags)
            term_hits: Iterable[tuple[str, int]] = freq.items()
        else:
            name_keys, tag_keys = analysed.names, analysed.tags
            title_len, text_len = analysed.title_len, analysed.text_len
            term_hits = zip(analysed.terms, analysed.hits, strict=True)
        kept = self._forget(node, name_keys) or set()  # lengths set below: postings go
        self.terms.add(node, term_hits)
        self.names.add(node, [(key, 1) for key in name_keys])
        for key in name_keys:
            self.name_lengths[key.count(_NAME_SEP) + 1] += 1
            if self._trie is not None and key not in kept:
                self._trie_added[key] += 1
        self.tags.add(node, [(key, 1) for key in tag_keys])
        self._set_lengths(node, title_len, text_len)

    def put_many(self, docs: Iterable[tuple[int, str, str, Sequence[str], Sequence[str]]]) -> None:
        """Index an empty index's documents (node, title, text, aliases, tags; nodes
        ascending) in bulk (``_put_chunks``), ``BULK_CHUNK`` at a time."""
        docs = iter(docs)

        def chunks() -> Iterator[_Chunk]:
            while chunk := list(itertools.islice(docs, BULK_CHUNK)):
                node, titles, texts, aliases, doc_tags = zip(*chunk, strict=True)
                del chunk
                yield np.array(node, np.int64), titles, texts, aliases, doc_tags

        self._put_chunks(chunks())

    def put_columns(
        self,
        n: int,
        titles: Strings,
        texts: Strings,
        aliases: Sequence[Sequence[str]],
        tags: Sequence[Sequence[str]],
    ) -> None:
        """``put_many`` of the documents 0 to ``n - 1`` given as columns (a first build's),
        each chunk sliced from them: no tuple per document."""

        def chunks() -> Iterator[_Chunk]:
            for start in range(0, n, BULK_CHUNK):
                stop = min(start + BULK_CHUNK, n)
                yield (
                    np.arange(start, stop, dtype=np.int64),
                    titles.strings(start, stop),
                    texts.strings(start, stop),
                    aliases[start:stop],
                    tags[start:stop],
                )

        self._put_chunks(chunks())

    def _put_chunks(self, chunks: Iterable[_Chunk]) -> None:
        """Index an empty index's documents in bulk, as flat arrays (``put`` one by one would
        hold them in the overlay): analysed a chunk at a time (``kbgraph.search.bulk``), each
        part built in one sort."""
        assert self.terms.count == 0, "a bulk put builds an empty index"
        terms, names, tags = PostingsBuilder(), PostingsBuilder(), PostingsBuilder()
        analyzer = BulkAnalyzer(terms, names, tags)
        nodes: list[np.ndarray] = []
        title_lens: list[np.ndarray] = []
        text_lens: list[np.ndarray] = []
        for at, titles, texts, aliases, doc_tags in chunks:
            title_len, text_len = analyzer.add(at, titles, texts, aliases, doc_tags)
            nodes.append(at)
            title_lens.append(title_len)
            text_lens.append(text_len)
        self.terms, self.names, self.tags = terms.build(), names.build(), tags.build()
        self.name_lengths.update(analyzer.name_lengths)
        if nodes:
            at = np.concatenate(nodes)
            self._set_lengths(int(np.max(at)), 0, 0)  # grown to hold the largest node
            self._title_len[at] = np.concatenate(title_lens)
            self._text_len[at] = np.concatenate(text_lens)
            self._present[at] = 1

    def _set_lengths(self, node: int, title_len: int, text_len: int) -> None:
        if node >= len(self._present):
            size = max(node + 1, 2 * len(self._present))
            self._title_len = _grown(self._title_len, size)
            self._text_len = _grown(self._text_len, size)
            self._present = _grown(self._present, size)
        self._title_len[node] = title_len
        self._text_len[node] = text_len
        self._present[node] = 1
        self._stats.clear()

    def remove(self, node: int) -> None:
        """Forget ``node`` (a deleted concept). Unknown nodes are ignored."""
        if self._forget(node) is not None:
            self._title_len[node] = self._text_len[node] = 0
            self._present[node] = 0
            self._stats.clear()

    def _forget(self, node: int, keeps: Sequence[str] = ()) -> set[str] | None:
        """Drop ``node``'s postings (the three hold the same nodes); None if not held, else
        its names among ``keeps`` (a put's new names): the name trie keeps their counts (a
        text edit leaves the trie as it was)."""
        if not self.terms.remove(node):
            return None
        kept = set()
        for key in self.names.node_keys_of(node):
            length = key.count(_NAME_SEP) + 1
            self.name_lengths[length] -= 1
            if not self.name_lengths[length]:
                del self.name_lengths[length]
            if key in keeps:
                kept.add(key)
            elif self._trie is not None:
                self._trie_discard(key)
        self.names.remove(node)
        self.tags.remove(node)
        return kept

    def _trie_discard(self, key: str) -> None:
        """One count of ``key`` less in the trie: of those waiting for ``settle`` first."""
        added = self._trie_added
        if added.get(key):
            added[key] -= 1
            if not added[key]:
                del added[key]
        else:
            assert self._trie is not None
            self._trie.discard(key)

    def settle(self) -> None:
        """The names put since the last call, added to the name trie in one compiled pass
        (``NameTrie.add``, a name at a time, cost ~6 µs an upsert). The projection calls it
        at the end of each batch, under its write lock: readers find nothing waiting."""
        if self._trie_added:
            assert self._trie is not None
            added, self._trie_added = self._trie_added, Counter()
            self._trie.add_many(added.elements())

    def __len__(self) -> int:
        return self.terms.count

    def doc_terms(self, node: int) -> list[str]:
        """The distinct terms of ``node``, its text's in text order first."""
        return self.terms.node_keys_of(node)

    def lengths(self, node: int) -> tuple[float, float]:
        """(title length, text length) of ``node`` as BM25F weighs them."""
        return float(self._title_len[node]), float(self._text_len[node])

    def doc_tags(self, node: int) -> list[str]:
        return self.tags.node_keys_of(node)

    def visible_stats(self, mask: np.ndarray) -> tuple[int, float, float]:
        """(N, average title length, average text length) of the documents ``mask`` shows."""
        key = (id(mask), len(mask))
        cached = self._stats.get(key)
        if cached is not None and cached[0] is mask:
            return cached[1], cached[2], cached[3]
        size = min(len(mask), len(self._present))
        visible = (mask[:size] != 0) & (self._present[:size] != 0)
        count = int(np.count_nonzero(visible))
        avg_title = float(self._title_len[:size][visible].sum()) / max(count, 1)
        avg_text = float(self._text_len[:size][visible].sum()) / max(count, 1)
        stats = (count, avg_title or 1.0, avg_text or 1.0)
        self._stats[key] = (mask, *stats)
        return stats

    def term_nodes(self, t: str) -> np.ndarray:
        """The documents holding term ``t`` (visible or not)."""
        return self.terms.holders(t)[0]

    def tag_nodes(self, tag: str) -> np.ndarray:
        return self.tags.holders(tag)[0]

    def name_trie(self) -> NameTrie:
        """Every name key (once per concept holding it) as a ``NameTrie``. Built on first use
        (seconds at a million names), once: readers share the read lock, and a second one
        waits for the first's build rather than doing it again."""
        if self._trie is None:
            with self._trie_building:
                if self._trie is None:
                    self._trie = NameTrie(
                        key for key, count in self.names.counts().items() for _ in range(count)
                    )
        self.settle()  # a caller putting without the projection (tools, tests)
        return self._trie

    def built_trie(self) -> NameTrie | None:
        """``name_trie`` if it was built (or adopted), else None: it is not built here."""
        return self._trie

    def adopt_trie(self, trie: NameTrie) -> None:
        """Take ``trie`` (a checkpoint's, saved with these very names) as ``name_trie``."""
        self._trie = trie

    def named_key(self, key: str) -> list[int]:
        """The documents with the name of key ``key`` (from ``name_trie``)."""
        nodes: list[int] = self.names.holders(key)[0].tolist()
        return nodes

    def named(self, tokens: tuple[str, ...]) -> list[int]:
        """The documents with a name (title or alias) of exactly these folded tokens."""
        nodes: list[int] = self.names.holders(_NAME_SEP.join(tokens))[0].tolist()
        return nodes

    def search(self, query: str, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """BM25F scores of every visible document matching a term of ``query``.

        Returns (nodes int64[k], scores float64[k]) in no particular order; rank them with
        ``top``. Statistics are those of the documents with ``mask[node] == 1``.
        """
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
        postings = [self.terms.holders(t) for t in query_terms(query)]
        # hidden holders dropped first, in numpy: the work after this is the visible's only
        # (a term many hidden concepts hold costs about what an absent one does)
        postings = [(n[keep], h[keep]) for n, h in postings if len(n) for keep in [mask[n] != 0]]
        postings = [p for p in postings if len(p[0])]
        if not postings:
            return empty
        n_docs, avg_title, avg_text = self.visible_stats(mask)
        if n_docs == 0:
            return empty
        term_off = np.zeros(len(postings) + 1, np.int64)
        np.cumsum([len(p[0]) for p in postings], out=term_off[1:])
        hits = np.concatenate([p[1] for p in postings])
        size = len(mask)
        if _scratch.acc.shape[0] < size:
            _scratch.grow(size + size // 8)
        return _bm25f(
            term_off,
            np.concatenate([p[0] for p in postings]),
            (hits >> 32).astype(np.float64),
            (hits & 0xFFFFFFFF).astype(np.float64),
            self._title_len,
            self._text_len,
            mask,
            n_docs,
            avg_title,
            avg_text,
            np.array([W_TITLE, B_TITLE, B_TEXT, K1]),
            _scratch.acc,
            _scratch.seen,
            _scratch.touched,
        )

    # --- as arrays (checkpoints) ------------------------------------------------------------

    def arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(keys and counts, arrays) to store; ``from_arrays`` makes the same index again.
        The first maps "name_lengths" to (token count, names) pairs and each part (terms,
        names, tags) to its keys."""
        meta: dict[str, Any] = {"name_lengths": sorted(self.name_lengths.items())}
        out: dict[str, np.ndarray] = {
            "title_len": self._title_len,
            "text_len": self._text_len,
            "present": self._present,
        }
        for part in ("terms", "names", "tags"):
            keys, arrays = getattr(self, part).arrays()
            meta[part] = keys
            out.update({f"{part}.{name}": a for name, a in arrays.items()})
        return meta, out

    @classmethod
    def from_arrays(
        cls,
        meta: Mapping[str, Any],
        vocabularies: Mapping[str, tuple[KeyList, KeyIds]],
        arrays: Mapping[str, np.ndarray],
    ) -> SearchIndex:
        """The index ``arrays`` gave; ``vocabularies``: per part (terms, names, tags) its keys
        and the map finding each key's position."""
        index = cls()
        index.name_lengths = Counter({int(k): int(v) for k, v in meta["name_lengths"]})
        index._title_len = np.array(arrays["title_len"], np.float64)
        index._text_len = np.array(arrays["text_len"], np.float64)
        index._present = np.array(arrays["present"], np.uint8)
        for part in ("terms", "names", "tags"):
            prefix = f"{part}."
            own = {k[len(prefix) :]: a for k, a in arrays.items() if k.startswith(prefix)}
            setattr(index, part, Postings.from_arrays(*vocabularies[part], own))
        return index


def _grown(arr: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([arr, np.zeros(size - len(arr), arr.dtype)])


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the BM25F and name trie kernels, before
    serving."""
    nametrie.warm_up()
    index = SearchIndex()
    index.put(0, "warm", "up")
    for writeable in (True, False):
        mask = np.ones(1, np.uint8)
        mask.flags.writeable = writeable
        index.search("warm", mask)
