"""Search: BM25F equal to a direct re-implementation of its formula, statistics of the visible
concepts only; stop words and stems never make an empty query match everything."""

from __future__ import annotations

import math
import re
import unicodedata

import numpy as np
import pytest
import snowballstemmer
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph import search
from kbgraph.search import (
    MAX_QUERY_TERMS,
    SNIPPET_WIDTH,
    STOP_WORDS,
    SearchIndex,
    analyze,
    first_hit,
    fold,
    query_terms,
    snippet,
    tokenize,
    top,
)

WORDS = ["dns", "resolver", "resolvers", "Router", "backups", "backup", "backing", "café"]
WORDS += ["cafe", "Zürich", "vlan", "ups", "the", "how", "Wi-Fi", "wifi", "working", "works"]
STOPS = sorted(STOP_WORDS)
_oracle_stemmer = snowballstemmer.stemmer("english")


def oracle_terms(text: str) -> list[str]:
    """The analyzer again, from its definition: NFKD, no combining marks, casefold, runs of
    letters and digits, stop words out, Snowball stems (the pure-Python snowballstemmer);
    hyphenated words joined too."""
    folded = "".join(
        ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch)
    ).casefold()
    words = re.findall(r"[^\W_]+", folded)
    words += [w.replace("-", "") for w in re.findall(r"[^\W_]+(?:-[^\W_]+)+", folded)]
    return [_oracle_stemmer.stemWord(w) for w in words if w not in STOP_WORDS]


def oracle_scores(docs: dict[int, tuple[str, str, str]], query: str) -> dict[int, float]:
    """BM25F over (title + alias, text), written out term by term, slowly."""
    fields = {
        node: (oracle_terms(title) + oracle_terms(alias), oracle_terms(text))
        for node, (title, alias, text) in docs.items()
    }
    n = len(fields)
    avg_title = sum(len(t) for t, _ in fields.values()) / n or 1.0
    avg_text = sum(len(b) for _, b in fields.values()) / n or 1.0
    scores: dict[int, float] = {}
    for term in dict.fromkeys(oracle_terms(query)):
        holders = [node for node, (t, b) in fields.items() if term in t or term in b]
        if not holders:
            continue
        idf = math.log(1 + (n - len(holders) + 0.5) / (len(holders) + 0.5))
        for node in holders:
            t, b = fields[node]
            tf = 0.0
            if t.count(term):
                norm = 1 - search.B_TITLE + search.B_TITLE * len(t) / avg_title
                tf += search.W_TITLE * t.count(term) / norm
            if b.count(term):
                tf += b.count(term) / (1 - search.B_TEXT + search.B_TEXT * len(b) / avg_text)
            part = idf * tf * (search.K1 + 1) / (tf + search.K1)
            scores[node] = scores.get(node, 0.0) + part
    return scores


def our_scores(index: SearchIndex, query: str, mask: np.ndarray) -> dict[int, float]:
    nodes, scores = index.search(query, mask)
    return dict(zip(nodes.tolist(), scores.tolist(), strict=True))


text_strategy = st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join)
docs_strategy = st.dictionaries(
    st.integers(0, 40),
    st.tuples(text_strategy, text_strategy, text_strategy),
    min_size=1,
    max_size=25,
)


def indexed(docs: dict[int, tuple[str, str, str]]) -> SearchIndex:
    index = SearchIndex()
    for node, (title, alias, text) in docs.items():
        index.put(node, title, text, [alias] if alias else [])
    return index


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
def test_bm25f_equals_the_formula(docs: dict[int, tuple[str, str, str]], query: list[str]) -> None:
    text = " ".join(query)
    ours = our_scores(indexed(docs), text, np.ones(64, dtype=np.uint8))
    oracle = oracle_scores(docs, text)
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
    docs: dict[int, tuple[str, str, str]], hidden: set[int], query: str
) -> None:
    """A mask hides documents exactly as if they had never been indexed, to the last bit."""
    mask = np.ones(64, dtype=np.uint8)
    mask[list(hidden)] = 0
    visible_only = indexed({node: doc for node, doc in docs.items() if node not in hidden})
    assert our_scores(indexed(docs), query, mask) == our_scores(
        visible_only, query, np.ones(64, dtype=np.uint8)
    )


@settings(max_examples=60, deadline=None)
@given(
    docs=docs_strategy,
    query=st.lists(
        st.tuples(st.sampled_from(STOPS), st.booleans(), st.sampled_from([" ", "? ", ", ", "'s "])),
        max_size=6,
    ).map(lambda parts: "".join((w.upper() if up else w) + sep for w, up, sep in parts)),
)
def test_a_query_of_stop_words_matches_nothing(
    docs: dict[int, tuple[str, str, str]], query: str
) -> None:
    docs = {node: (t, "how", f"{text} the what is it") for node, (t, _, text) in docs.items()}
    assert query_terms(query) == []
    assert our_scores(indexed(docs), query, np.ones(64, dtype=np.uint8)) == {}


def test_stems_and_compounds_meet() -> None:
    index = SearchIndex()
    index.put(0, "Back up your files", "")
    index.put(1, "Wi-Fi", "the access points")
    index.put(2, "Résumé", "working copies")
    mask = np.ones(3, np.uint8)
    assert set(our_scores(index, "back up all my files", mask)) == {0}
    assert set(our_scores(index, "wifi at home", mask)) == {1}
    assert set(our_scores(index, "RESUME", mask)) == {2}
    assert set(our_scores(index, "is it still works?", mask)) == {2}


def test_title_and_aliases_outweigh_the_body() -> None:
    index = SearchIndex()
    index.put(0, "Vaultwarden", "passwords for the family")
    index.put(1, "Browser", "stores nothing", ["Password manager"])
    index.put(2, "Notes", "a long text " * 20)
    scores = our_scores(index, "password", np.ones(3, np.uint8))
    assert scores[1] > scores[0] > 0


def test_put_replaces_and_remove_forgets() -> None:
    index = SearchIndex()
    mask = np.ones(8, dtype=np.uint8)
    index.put(1, "dns", "resolver", tags=["net"])
    index.put(2, "router", "")
    index.put(1, "backup", "nas")
    assert our_scores(index, "dns resolver", mask) == {}
    assert set(our_scores(index, "backup", mask)) == {1}
    assert index.tag_nodes("net").tolist() == []
    index.remove(1)
    index.remove(7)  # unknown: ignored
    assert our_scores(index, "backup", mask) == {}
    assert index.named(("backup",)) == []
    assert index.name_lengths == {1: 1}  # "router" alone
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


def test_analyzer_folds_drops_stop_words_and_stems() -> None:
    assert tokenize("Café ZÜRICH, naïve_rôle 42") == ["cafe", "zurich", "naive", "role", "42"]
    assert tokenize("ﬁle ①") == ["file", "1"]  # compatibility forms (NFKD)
    assert analyze("How do I restore the backups?") == ["restor", "backup"]
    assert query_terms("DNS dns Dns resolvers resolver") == ["dns", "resolv"]
    for text in ["the backups of Zürich", "Wi-Fi e-mail", "ﬁle naïve"]:
        assert analyze(text) == oracle_terms(text)


def test_top_breaks_ties_by_id() -> None:
    ids = ["b", "a", "c", "d"]
    nodes = np.array([0, 1, 2, 3])
    scores = np.array([1.0, 1.0, 2.0, 0.5])
    assert top(nodes, scores, ids, 2) == [(2, 2.0), (1, 1.0)]
    assert top(nodes, scores, ids, 10) == [(2, 2.0), (1, 1.0), (0, 1.0), (3, 0.5)]


def test_snippet_is_bounded_and_centred_on_a_term() -> None:
    text = "lorem " * 300 + "the DNS\n\nresolvers live here " + "ipsum " * 300
    SearchIndex().put(0, "", text)  # snippets look for the forms the index has seen
    cut = snippet(text, query_terms("resolver"))
    assert len(cut) <= SNIPPET_WIDTH
    assert "DNS resolvers" in cut
    assert cut.startswith("…") and cut.endswith("…")
    assert "Zürich" in snippet("é " * 100 + "Zürich", query_terms("zurich"))
    assert snippet("short text", ["zz"]) == "short text"
    assert len(snippet("x" * 5000, [])) == SNIPPET_WIDTH


def oracle_first_hit(text: str, terms: list[str]) -> int:
    """The first raw token (letters and digits) one of whose terms is wanted, token by token."""
    for match in re.finditer(r"[^\W_]+", text):
        if set(oracle_terms(match.group())) & set(terms):
            return match.start()
    return 0


snippet_text = st.lists(
    st.sampled_from(["dns", "DNSs", "xdns", "back", "backups", "backing", " ", ". ", "\n", "9"]),
    max_size=200,
).map("".join)
unicode_text = st.lists(
    st.sampled_from(
        ["café", "CAFE", "cafe\u0301", "ΑΣ", "ασ", "ß", "İ", "ﬁle", "é", " ", "_", "-"]
    ),
    max_size=60,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(
    text=st.one_of(snippet_text, unicode_text),
    words=st.lists(
        st.sampled_from(["dns", "backup", "back", "9", "cafe", "ασ", "ss", "file"]), max_size=4
    ),
)
def test_first_hit_equals_the_token_by_token_scan(text: str, words: list[str]) -> None:
    terms = query_terms(" ".join(words))
    assert first_hit(text, terms) == oracle_first_hit(text, terms)
    upper = text.upper()
    assert first_hit(upper, terms) == oracle_first_hit(upper, terms)


def test_query_terms_are_capped() -> None:
    query = " ".join(f"t{i}" for i in range(200)) + " t0 t1"
    assert query_terms(query) == [f"t{i}" for i in range(MAX_QUERY_TERMS)]
    index = SearchIndex()
    index.put(0, "late", f"t{MAX_QUERY_TERMS}")  # only the 33rd term: not searched
    index.put(1, "early", "t0")
    nodes, _ = index.search(query, np.ones(2, np.uint8))
    assert nodes.tolist() == [1]


def test_snippet_of_a_long_run_without_breaks_finds_the_later_word() -> None:
    text = "b" * (1 << 20) + " bb tail"
    cut = snippet(text, query_terms("bb"))  # "bb" first occurs inside the run: one scan on
    assert cut == "…" + "b" * (SNIPPET_WIDTH // 4 - 1) + " bb tail"


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["dns", "Wi-Fi", "e-mail", "the", "backups", "a-b-c", "x", "café", "-"])
        | st.text(alphabet="ab-", min_size=1, max_size=4),
        max_size=60,
    )
)
def test_query_terms_are_analyze_cut_to_the_cap(words: list[str]) -> None:
    query = " ".join(words)
    assert query_terms(query) == list(dict.fromkeys(analyze(query)))[:MAX_QUERY_TERMS]


@settings(max_examples=300)
@given(st.text(st.characters(codec="utf-8"), max_size=30))
def test_fold_drops_exactly_the_combining_marks(text: str) -> None:
    decomposed = unicodedata.normalize("NFKD", text)
    want = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()
    assert fold(text) == (text.lower() if text.isascii() else want)
