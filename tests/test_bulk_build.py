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

from kbgraph.projection import KBProjection, Projections
from kbgraph.projection import nodes as nodes_module
from kbgraph.projection.adjacency import Adjacency
from kbgraph.search import SearchIndex
from kbgraph.search import index as search_index
from kbgraph.store import Store, load
from kbgraph.store.columns import decode_strings
from kbgraph.store.load import columns_of
from kbgraph.store.model import KBColumns
from tests.bulk_histories import WORDS, by_id, concept, history_event, history_events, texts, words
from tests.kb_events import delete, upsert


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
            for cols in (got, want):  # encoded columns, compared as the strings they hold
                cols.ids, cols.titles, cols.texts = map(list, (cols.ids, cols.titles, cols.texts))
            assert msgspec.to_builtins(got) == msgspec.to_builtins(want)
            bulk, one = KBProjection(name), KBProjection(name)
            bulk.build_columns(store.load_columns().kbs[name])
            one.build(state)
            got_nodes, want_nodes = bulk.nodes, one.nodes
            assert list(got_nodes.ids) == list(want_nodes.ids)
            assert list(got_nodes.titles) == list(want_nodes.titles)
            assert list(got_nodes.texts) == list(want_nodes.texts)
            assert got_nodes.tags == want_nodes.tags and got_nodes.aliases == want_nodes.aliases
            for attr in ("und", "out"):
                a, b = getattr(bulk.links, attr), getattr(one.links, attr)
                n = len(got_nodes)
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


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 24).flatmap(
        lambda n: st.tuples(
            st.permutations(range(n)),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=120),
        )
    ),
    st.sampled_from([np.int32, np.int64]),
)
def test_blocks_from_edges_hold_each_neighbour_once_in_id_order(case, dtype) -> None:
    """A first build's adjacency (neighbours grouped per node, small groups sorted by
    insertion and large ones by a sort, repeated edges once): each node's block is its
    distinct neighbours by rank, out-edges only or both ways, as a set and a sort give."""
    rank = np.array(case[0], np.int64)
    order = np.argsort(rank)
    n, edges = len(rank), case[1]
    src = np.array([s for s, _ in edges], dtype)
    dst = np.array([d for _, d in edges], dtype)
    for undirected in (False, True):
        adj = Adjacency.from_edges(src, dst, rank, order, 64, undirected=undirected)
        want: dict[int, set[int]] = {u: set() for u in range(n)}
        for s, d in edges:
            want[s].add(d)
            if undirected:
                want[d].add(s)
        for u in range(n):
            assert adj.block(u).tolist() == sorted(want[u], key=lambda v: rank[v])
        assert adj.total == sum(map(len, want.values()))


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


@settings(max_examples=40, deadline=None)
@given(
    st.lists(history_event, max_size=16),
    st.integers(1, 4),
    st.lists(history_event, max_size=8),
    st.sampled_from([0, nodes_module.DICT_IDS]),
    st.integers(1, 8),
)
def test_a_build_from_the_store_equals_the_events_applied_one_by_one(
    steps, chunk, later, dict_ids, delivery
) -> None:
    """Random histories (deletes, re-creations, links to concepts that appear later, type
    changes, link events): a first build from the store's columns (in chunks of a few rows
    and documents) answers as the projection that applied every event as it came, and goes
    on doing so as both follow more events, ``delivery`` at a time (the build's encoded
    columns then changed); its ids found by a dict or, as past ``DICT_IDS`` ids, by a
    ``KeyIndex`` (and then a batch's ids found ahead, ``Nodes.find_ahead``, ids interned
    within the batch among them)."""
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "kb.db") as store:
        live = Projections(store)
        live.load()
        events = history_events(steps + later)
        for event in events[: len(steps)]:
            store.append("kb", [event])
            live.follow_once()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(load, "FETCH_ROWS", chunk)
            patch.setattr(search_index, "BULK_CHUNK", chunk)
            patch.setattr(nodes_module, "DICT_IDS", dict_ids)
            built = Projections(store)
            built.load()
        a, b = live.get("kb"), built.get("kb")
        assert (a is None) == (b is None)
        if a is not None:
            assert by_id(b) == by_id(a)
        rest = events[len(steps) :]
        for at in range(0, len(rest), delivery):
            store.append("kb", rest[at : at + delivery])
            live.follow_once()
            built.follow_once()
        a, b = live.get("kb"), built.get("kb")
        assert (a is None) == (b is None)
        if a is not None:
            assert by_id(b) == by_id(a)


def test_ids_found_ahead_include_the_targets_a_first_build_added() -> None:
    """Past ``DICT_IDS``, a first build appends the link targets that are no concept after
    the store's ids (its column's tail, not its encoded rows): a batch naming them finds
    them ahead as the nodes they are, never interning them twice."""
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "kb.db") as store:
        store.append("kb", [upsert("a", links=["m", "n"]), upsert("b", links=["a"])])
        live = Projections(store)
        live.load()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(nodes_module, "DICT_IDS", 0)
            built = Projections(store)
            built.load()
        store.append("kb", [upsert("c", links=["m"]), upsert("m", links=["a", "n"])])
        store.append("kb", [upsert("n", links=["c"]), delete("a", 2)])
        for p in (live, built):
            while p.follow_once():
                pass
        a, b = live.get("kb"), built.get("kb")
        assert a is not None and b is not None
        assert len(b.nodes) == len(a.nodes) == 5
        assert by_id(b) == by_id(a)
