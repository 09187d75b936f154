"""Full-text search over a KB's visible concepts, made for questions: BM25F, stems, snippets.

Along its jobs: ``analysis`` (text and questions into terms), ``index`` (``SearchIndex``: the
flat postings of one KB and BM25F over the visible concepts), ``snippets`` (ranking hits, the
text a result shows).
"""

from kbgraph.search.analysis import (
    MAX_QUERY_TERMS,
    STOP_WORDS,
    analyze,
    fold,
    query_terms,
    term,
    tokenize,
    tokens_with_offsets,
)
from kbgraph.search.index import B_TEXT, B_TITLE, K1, W_TITLE, SearchIndex, warm_up
from kbgraph.search.snippets import SNIPPET_WIDTH, first_hit, snippet, snippet_at, top

__all__ = [
    "B_TEXT",
    "B_TITLE",
    "K1",
    "MAX_QUERY_TERMS",
    "SNIPPET_WIDTH",
    "STOP_WORDS",
    "W_TITLE",
    "SearchIndex",
    "analyze",
    "first_hit",
    "fold",
    "query_terms",
    "snippet",
    "snippet_at",
    "term",
    "tokenize",
    "tokens_with_offsets",
    "top",
    "warm_up",
]
