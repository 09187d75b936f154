"""Search: BM25 equal to SQLite FTS5's bm25(), statistics of the visible concepts only."""

from __future__ import annotations

import re
import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.search import (
    MAX_QUERY_TERMS,
    SNIPPET_WIDTH,
    SearchIndex,
    _fold,
    query_terms,
    snippet,
    tokenize,
    top,
)

WORDS = ["dns", "resolver", "router", "backup", "nas", "café", "cafe", "Zürich", "vlan", "ups"]


def fts5_scores(
    docs: dict[int, tuple[str, str]],
    terms: list[str],
    aliases: dict[int, list[str]] | None = None,
) -> dict[int, float]:
    """The oracle: SQLite's own FTS5 bm25(title 10, aliases 10, text 1), sign flipped (higher
    is better), aliases one per line in their column as the store indexes them."""
    aliases = aliases or {}
    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE VIRTUAL TABLE f USING fts5(title, aliases, text,"
        " tokenize='unicode61 remove_diacritics 2')"
    )
    db.executemany("INSERT INTO f(rowid, title, aliases, text) VALUES (?, ?, ?, ?)", [
        (node, title, "\n".join(aliases.get(node, [])), text)
        for node, (title, text) in docs.items()])  # fmt: skip
    match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
    rows = db.execute("SELECT rowid, -bm25(f, 10.0, 10.0, 1.0) FROM f WHERE f MATCH ?", (match,))
    return dict(rows.fetchall())


def our_scores(index: SearchIndex, query: str, mask: np.ndarray) -> dict[int, float]:
    nodes, scores = index.search(query, mask)
    return dict(zip(nodes.tolist(), scores.tolist(), strict=True))


text_strategy = st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join)
docs_strategy = st.dictionaries(
    st.integers(0, 40), st.tuples(text_strategy, text_strategy), min_size=1, max_size=25
)


@settings(max_examples=60, deadline=None)
@given(
    docs=docs_strategy,
    aliases=st.dictionaries(st.integers(0, 40), st.lists(text_strategy, max_size=3)),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
)
def test_bm25_equals_fts5(
    docs: dict[int, tuple[str, str]], aliases: dict[int, list[str]], query: list[str]
) -> None:
    index = SearchIndex()
    for node, (title, text) in docs.items():
        index.put(node, title, text, aliases.get(node, []))
    mask = np.ones(64, dtype=np.uint8)
    text = " ".join(query)
    ours = our_scores(index, text, mask)
    oracle = fts5_scores(docs, query_terms(text), aliases)
    assert ours.keys() == oracle.keys()
    for node, score in ours.items():
        assert score == pytest.approx(oracle[node], rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    docs=docs_strategy,
    hidden=st.sets(st.integers(0, 40)),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
)
def test_narrowed_search_equals_hidden_never_written(
    docs: dict[int, tuple[str, str]], hidden: set[int], query: str
) -> None:
    """A mask hides documents exactly as if they had never been indexed, to the last bit."""
    everything = SearchIndex()
    visible_only = SearchIndex()
    mask = np.ones(64, dtype=np.uint8)
    for node, (title, text) in docs.items():
        everything.put(node, title, text)
        if node in hidden:
            mask[node] = 0
        else:
            visible_only.put(node, title, text)
    assert our_scores(everything, query, mask) == our_scores(
        visible_only, query, np.ones(64, dtype=np.uint8)
    )


def test_put_replaces_and_remove_forgets() -> None:
    index = SearchIndex()
    mask = np.ones(8, dtype=np.uint8)
    index.put(1, "dns", "resolver")
    index.put(2, "router", "")
    index.put(1, "backup", "nas")
    assert our_scores(index, "dns resolver", mask) == {}
    assert set(our_scores(index, "backup", mask)) == {1}
    index.remove(1)
    index.remove(7)  # unknown: ignored
    assert our_scores(index, "backup", mask) == {}
    assert len(index) == 1
    rebuilt = SearchIndex()
    rebuilt.put(2, "router", "")
    assert our_scores(index, "router", mask) == our_scores(rebuilt, "router", mask)


@pytest.mark.parametrize(
    "query",
    ['"unbalanced', "a AND b", "x NEAR(y z)", "dns*", "(((", "🙂🙃", "title:dns", "-dns", "^", ""],
)
def test_any_string_is_a_query(query: str) -> None:
    index = SearchIndex()
    index.put(0, "dns resolver", "the dns answers")
    nodes, _ = index.search(query, np.ones(1, dtype=np.uint8))
    assert nodes.tolist() == ([0] if "dns" in query.lower() else [])


def test_tokenizer_folds_case_and_diacritics() -> None:
    assert tokenize("Café ZÜRICH, naïve_rôle 42") == ["cafe", "zurich", "naive", "role", "42"]
    assert query_terms("DNS dns Dns resolver") == ["dns", "resolver"]


def test_top_breaks_ties_by_id() -> None:
    ids = ["b", "a", "c", "d"]
    nodes = np.array([0, 1, 2, 3])
    scores = np.array([1.0, 1.0, 2.0, 0.5])
    assert top(nodes, scores, ids, 2) == [(2, 2.0), (1, 1.0)]
    assert top(nodes, scores, ids, 10) == [(2, 2.0), (1, 1.0), (0, 1.0), (3, 0.5)]


def test_snippet_is_bounded_and_centred_on_a_term() -> None:
    text = "lorem " * 300 + "the DNS\n\nresolver lives here " + "ipsum " * 300
    cut = snippet(text, ["resolver"])
    assert len(cut) <= SNIPPET_WIDTH
    assert "DNS resolver" in cut
    assert cut.startswith("…") and cut.endswith("…")
    assert snippet("short text", ["zz"]) == "short text"
    assert len(snippet("x" * 5000, [])) == SNIPPET_WIDTH


def _first_hit_before_issue_10(text: str, terms: tuple[str, ...]) -> int:
    """The oracle: the first-hit scan snippets used before issue 10 (quadratic on ASCII
    text, one fold per token on other text)."""
    if not terms:
        return 0
    if not text.isascii():
        for match in re.finditer(r"[^\W_]+", text):
            if _fold(match.group()) in terms:
                return match.start()
        return 0
    lowered, best = text.lower(), -1
    for term in terms:
        at = lowered.find(term)
        while at >= 0 and (best < 0 or at < best):
            end = at + len(term)
            if (at == 0 or not lowered[at - 1].isalnum()) and (
                end == len(lowered) or not lowered[end].isalnum()
            ):
                best = at
                break
            at = lowered.find(term, at + 1)
    return max(best, 0)


def _old_snippet(text: str, terms: list[str]) -> str:
    hit = _first_hit_before_issue_10(text, tuple(terms))
    start = max(0, hit - SNIPPET_WIDTH // 4)
    end = start + 2 * SNIPPET_WIDTH
    prefix = "…" if start > 0 else ""
    body = " ".join(text[start:end].split())
    room = SNIPPET_WIDTH - len(prefix)
    if len(body) > room or end < len(text):
        body = body[: room - 1].rstrip() + "…"
    return prefix + body


snippet_text = st.lists(
    st.sampled_from(["dns", "dnsx", "xdns", "a", "aa", "ab", "b", "ba", " ", ". ", "\n", "9"]),
    max_size=300,
).map("".join)
unicode_text = st.lists(
    st.sampled_from(["café", "CAFE", "cafe\u0301", "ΑΣ", "ασ", "ß", "İ", "a", "é", " ", "_", "-"]),
    max_size=100,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=snippet_text,
    terms=st.lists(st.sampled_from(["dns", "a", "aa", "ab", "b", "9", "zz"]), max_size=5),
)
def test_snippet_equals_the_old_scan(text: str, terms: list[str]) -> None:
    terms = list(dict.fromkeys(terms))
    assert snippet(text, terms) == _old_snippet(text, terms)
    upper = text.upper()
    assert snippet(upper, terms) == _old_snippet(upper, terms)


@settings(max_examples=300, deadline=None)
@given(
    text=unicode_text,
    terms=st.lists(st.sampled_from(["cafe", "ασ", "ας", "ss", "ß", "a", "e", "i̇"]), max_size=4),
)
def test_non_ascii_snippet_equals_the_old_scan(text: str, terms: list[str]) -> None:
    terms = list(dict.fromkeys(terms))
    assert snippet(text + "é", terms) == _old_snippet(text + "é", terms)


def test_query_terms_are_capped() -> None:
    query = " ".join(f"t{i}" for i in range(200)) + " t0 t1"
    assert query_terms(query) == [f"t{i}" for i in range(MAX_QUERY_TERMS)]
    index = SearchIndex()
    index.put(0, "late", f"t{MAX_QUERY_TERMS}")  # only the 33rd term: not searched
    index.put(1, "early", "t0")
    nodes, _ = index.search(query, np.ones(2, np.uint8))
    assert nodes.tolist() == [1]


def test_snippet_of_a_long_run_without_breaks_finds_the_later_word() -> None:
    text = "a" * (1 << 20) + " a tail"
    terms = [("a" * n) for n in range(1, MAX_QUERY_TERMS + 1)]
    cut = snippet(text, terms)  # the old scan took ~0.2 s per term here
    assert cut == "…" + "a" * (SNIPPET_WIDTH // 4 - 1) + " a tail"  # the lone "a" is the hit
    assert snippet(text, ["tail"]) == _old_snippet(text, ["tail"])


def test_folding_never_shortens_a_token_character() -> None:
    """What lets snippets skip folding tokens longer than every query term."""
    token_chars = (chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert all(len(_fold(ch)) >= 1 for ch in token_chars if re.fullmatch(r"[^\W_]", ch))
