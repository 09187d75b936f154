"""What the follower feeds the search index: the tokenizer's fast ASCII path, re-indexing in
place, and upserts that leave title and text unchanged (no re-index)."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.projection import Projections
from kbgraph.search import SearchIndex, tokenize
from tests.kb_events import delete, upsert
from tests.reference_model import FakeStore

KB = "kb"
WORDS = ["dns", "resolver", "router", "backup", "nas", "vlan", "ups", "42", "x1"]


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(string.printable + "\x00\x1c\x1f\x7f"), max_size=80))
def test_ascii_tokens_are_the_regex_runs_of_the_lowered_text(text: str) -> None:
    assert tokenize(text) == re.findall(r"[a-z0-9]+", text.lower())


def postings(index: SearchIndex) -> dict[str, dict[int, int]]:
    return index.terms.as_dict()


doc = st.tuples(
    st.lists(st.sampled_from(WORDS), max_size=4).map(" ".join),
    st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), doc, st.booleans()), max_size=30))
def test_reindexing_in_place_equals_indexing_the_final_documents(ops) -> None:
    index = SearchIndex()
    final: dict[int, tuple[str, str]] = {}
    for node, (title, text), removing in ops:
        if removing:
            index.remove(node)
            final.pop(node, None)
        else:
            index.put(node, title, text)
            final[node] = (title, text)
    fresh = SearchIndex()
    for node, (title, text) in final.items():
        fresh.put(node, title, text)
    assert postings(index) == postings(fresh)
    assert len(index) == len(fresh)
    mask = np.ones(8, np.uint8)
    for query in WORDS:
        got = dict(zip(*(a.tolist() for a in index.search(query, mask)), strict=True))
        want = dict(zip(*(a.tolist() for a in fresh.search(query, mask)), strict=True))
        assert got == want


def test_unchanged_title_text_and_aliases_are_not_reindexed() -> None:
    calls: list[tuple] = []

    class Recorder(SearchIndex):
        def put(
            self, node: int, title: str, text: str, aliases: Sequence[str] = (), tags=(),
            analysed=None,
        ) -> None:  # fmt: skip
            calls.append(("put", node, title, text, *aliases))
            super().put(node, title, text, aliases, tags, analysed)

        def remove(self, node: int) -> None:
            calls.append(("remove", node))
            super().remove(node)

    store = FakeStore()
    store.append(KB, [upsert("a", title="A", text="alpha")])
    p = Projections(store, index_factory=Recorder)
    p.load()
    calls.clear()
    store.append(KB, [upsert("a", 2, title="A", text="alpha", links=["b"], type="Note")])
    store.append(KB, [upsert("a", 3, title="A", text="beta")])
    store.append(KB, [delete("a", 4)])
    store.append(KB, [upsert("a", 5, title="A", text="beta")])  # re-created: indexed again
    store.append(KB, [upsert("a", 6, title="A", text="beta", aliases=["Gamma"])])
    store.append(KB, [upsert("a", 7, title="A", text="beta", aliases=["Gamma"], tags=["t"])])
    p.follow_once()
    put, gamma = ("put", 0, "A", "beta"), ("put", 0, "A", "beta", "Gamma")
    assert calls == [put, ("remove", 0), put, gamma, gamma]  # tags are indexed too
    with p.get(KB).read() as snap:
        nodes, _ = snap.index.search("beta", snap.view(None).mask)
        assert nodes.tolist() == [0]
