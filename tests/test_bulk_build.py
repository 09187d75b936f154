"""The first build in bulk (issue 26) equals what it replaced: the store read as columns is the
snapshot's concepts column by column (in the same id order, non-ASCII ids included), and a
search index built in one pass equals the same documents put one by one."""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.columns import decode_strings
from kbgraph.projection import KBProjection
from kbgraph.search import SearchIndex
from kbgraph.search import index as search_index
from kbgraph.store import Store
from kbgraph.store.load import columns_of
from kbgraph.store.model import KBColumns
from tests.kb_events import delete, upsert

IDS = ["a", "b", "notes/c", "notes/é", "Z", "ü/x", "日本", "a-b", "zz/zz", "\U0001f600"]
WORDS = ["dns", "résolveur", "the", "Backups", "wi-fi", "", "x y", "Ωmega", "E-Mail_x", "a\0b"]
texts = st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join)
words = st.lists(st.sampled_from(WORDS), max_size=3)
concept = st.tuples(
    st.sampled_from(IDS),
    texts,
    texts,
    words,
    words,
    st.lists(st.sampled_from([*IDS, "missing/1", "missing/ü"]), max_size=4),
    st.booleans(),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(concept, max_size=14))
def test_store_columns_equal_the_snapshot_and_build_alike(changes) -> None:
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "kb.db") as store:
        for version, (cid, title, text, tags, aliases, links, deleted) in enumerate(changes, 1):
            event = (
                delete(cid, version)
                if deleted
                else upsert(
                    cid, version, title=title, text=text, tags=tags, aliases=aliases, links=links
                )
            )
            store.append("kb", [event])
        snapshot = store.load()
        columns = store.load_columns()
        assert columns.gid == snapshot.gid
        assert set(columns.kbs) == set(snapshot.kbs)
        for name, state in snapshot.kbs.items():
            got, want = columns.kbs[name], columns_of(state)
            assert declared(got) == declared(want) == [c.links for c in state.concepts]
            got.links = want.links = []
            assert msgspec.to_builtins(got) == msgspec.to_builtins(want)
            bulk, one = KBProjection(name), KBProjection(name)
            bulk.build_columns(store.load_columns().kbs[name])
            one.build(state)
            assert bulk.ids == one.ids and bulk.titles == one.titles
            assert bulk.tags == one.tags and bulk.aliases == one.aliases
            for attr in ("_und", "_out"):
                a, b = getattr(bulk, attr), getattr(one, attr)
                n = len(bulk.ids)
                assert [a.block(u).tolist() for u in range(n)] == [
                    b.block(u).tolist() for u in range(n)
                ]


def declared(columns: KBColumns) -> list[list[str]]:
    """Each concept's declared targets, from the links column's chunks."""
    out: list[list[str]] = []
    for counts, blob, off in columns.links:
        targets = decode_strings(blob, off)
        at = 0
        for count in counts.tolist():
            out.append(targets[at : at + count])
            at += count
    return out


docs = st.lists(st.tuples(texts, texts, words, words), max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    docs,
    st.lists(st.sampled_from(WORDS[:5]), min_size=1, max_size=3).map(" ".join),
    st.integers(1, 5),
)
def test_put_many_equals_put_one_by_one(documents, query, chunk) -> None:
    bulk, one = SearchIndex(), SearchIndex()
    with pytest.MonkeyPatch.context() as patch:  # chunks of a few documents: ASCII and not
        patch.setattr(search_index, "BULK_CHUNK", chunk)
        bulk.put_many((2 * u, *doc) for u, doc in enumerate(documents))  # gaps: node 2u
    for u, doc in enumerate(documents):
        one.put(2 * u, *doc)
    for part in ("terms", "names", "tags"):
        assert getattr(bulk, part).as_dict() == getattr(one, part).as_dict()
    n = 2 * len(documents) + 1
    assert [bulk.doc_terms(u) for u in range(n)] == [one.doc_terms(u) for u in range(n)]
    assert [bulk.doc_tags(u) for u in range(n)] == [one.doc_tags(u) for u in range(n)]
    assert bulk.name_lengths == one.name_lengths and len(bulk) == len(one)
    mask = np.ones(n, np.uint8)
    mask[::3] = 0
    for m in (np.ones(n, np.uint8), mask):
        a, b = bulk.search(query, m), one.search(query, m)
        assert dict(zip(a[0].tolist(), a[1].tolist(), strict=True)) == dict(
            zip(b[0].tolist(), b[1].tolist(), strict=True)
        )
