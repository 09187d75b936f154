"""The projection against a plain reference model and against a from-scratch rebuild.

Random deliveries (duplicates, stale versions, deletes, re-creates, links to missing concepts,
self-links, reciprocal links) go through a store; the projection follows the log and must then
equal (a) a projection rebuilt from ``store.load()`` and (b) ``ReferenceKB`` fed the same log,
node for node and edge for edge (compared by ids), masks and visible degrees included, with
every block id-sorted and every ``Graph`` invariant checked.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kbgraph.projection.adjacency as adjacency
import kbgraph.projection.masks as masks_module
from kbgraph.access import Rule, RuleSet, canonical
from kbgraph.events import (
    Event,
)
from kbgraph.projection import Projections
from kbgraph.store import Store
from tests.histories import KB, deliveries_st, dump, reference_dump, reference_from_log, rules_st
from tests.kb_events import delete, link_added, link_removed, upsert
from tests.reference_model import FakeStore

# --- what a projection holds, by ids ----------------------------------------------------------


# --- random deliveries ------------------------------------------------------------------------


def run_differential(
    store: Any, deliveries: list[list[Event]], split: int, rule_sets: list[RuleSet]
) -> None:
    """First ``split`` deliveries before the first build, the rest followed one by one."""
    all_views: list[RuleSet | None] = [None, *rule_sets]
    for delivery in deliveries[:split]:
        store.append(KB, delivery)
    live = Projections(store)
    live.load()
    cached = False
    for delivery in deliveries[split:]:
        kb = live.get(KB)
        if kb is not None and not cached:  # masks cached BEFORE the remaining events
            dump(kb, all_views)
            cached = True
        store.append(KB, delivery)
        live.follow_once()
    kb = live.get(KB)
    if cached:
        assert set(kb.masks) == set(rule_sets)
    fresh = Projections(store)
    fresh.load()
    got = dump(kb, all_views)
    assert got == dump(fresh.get(KB), all_views)
    ref = reference_from_log(store)
    assert got == (reference_dump(ref, all_views) if ref is not None else None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries_st, st.data(), st.lists(rules_st, max_size=3, unique=True))
def test_matches_reference_and_rebuild_fake_store(deliveries, data, rule_sets) -> None:
    split = data.draw(st.integers(0, len(deliveries)))
    run_differential(FakeStore(), deliveries, split, rule_sets)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries_st, st.data(), st.lists(rules_st, max_size=3, unique=True))
def test_matches_reference_with_compaction_every_batch(deliveries, data, rule_sets) -> None:
    split = data.draw(st.integers(0, len(deliveries)))
    saved = adjacency.COMPACT_MIN_HOLES
    adjacency.COMPACT_MIN_HOLES = 0
    try:
        run_differential(FakeStore(), deliveries, split, rule_sets)
    finally:
        adjacency.COMPACT_MIN_HOLES = saved


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries_st, st.data(), st.lists(rules_st, max_size=3, unique=True))
def test_matches_reference_and_rebuild_real_store(deliveries, data, rule_sets) -> None:
    split = data.draw(st.integers(0, len(deliveries)))
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "kb.db") as store:
        run_differential(store, deliveries, split, rule_sets)


# --- targeted cases ---------------------------------------------------------------------------


def started(store: Any) -> Projections:
    p = Projections(store)
    p.load()
    return p


def test_links_to_missing_concepts_become_edges_when_they_appear() -> None:
    store = FakeStore()
    store.append(KB, [upsert("a", links=["b", "c", "a"]), upsert("c", links=["b"])])
    p = started(store)
    kb = p.get(KB)
    with kb.read() as snap:
        a = snap.node("a")
        assert snap.node("b") is None
        assert snap.declared_links(a) == ["b", "c"]
        assert snap.counts(snap.view(None)) == (2, 1)
    store.append(KB, [upsert("b")])
    p.follow_once()
    with kb.read() as snap:
        assert snap.counts(snap.view(None)) == (3, 3)
        assert snap.node("b") is not None
    store.append(KB, [delete("b", 2)])
    p.follow_once()
    with kb.read() as snap:
        assert snap.node("b") is None
        assert snap.declared_links(snap.node("a")) == ["b", "c"]  # others' links stay declared
        assert snap.counts(snap.view(None)) == (2, 1)
        old_int = snap.ids.index("b")
    store.append(KB, [upsert("b", 3)])
    p.follow_once()
    with kb.read() as snap:
        assert snap.node("b") == old_int  # a re-created concept keeps its int
        assert snap.counts(snap.view(None)) == (3, 3)


def test_reciprocal_links_are_one_edge_and_link_events_patch() -> None:
    store = FakeStore()
    store.append(KB, [upsert("x/a", links=["x/b"]), upsert("x/b", links=["x/a"])])
    p = started(store)
    kb = p.get(KB)
    with kb.read() as snap:
        assert snap.counts(snap.view(None)) == (2, 1)
    store.append(KB, [link_removed("x/a", "x/b", 2)])
    p.follow_once()
    with kb.read() as snap:
        assert snap.counts(snap.view(None)) == (2, 1)  # x/b still links to x/a
        assert snap.versions[snap.node("x/a")] == 2
    store.append(KB, [link_removed("x/b", "x/a", 2)])
    p.follow_once()
    with kb.read() as snap:
        assert snap.counts(snap.view(None)) == (2, 0)
    store.append(KB, [link_added("x/a", "x/a", 3)])  # a self-link declares nothing
    p.follow_once()
    with kb.read() as snap:
        assert snap.declared_links(snap.node("x/a")) == []
        assert snap.versions[snap.node("x/a")] == 3


def test_cached_mask_follows_type_changes_and_deletes() -> None:
    store = FakeStore()
    store.append(
        KB,
        [
            upsert("infra/a", links=["infra/b", "net/c"]),
            upsert("infra/b", links=["net/c"]),
            upsert("net/c", type="Runbook"),
        ],
    )
    p = started(store)
    kb = p.get(KB)
    runbooks = canonical([Rule(frozenset(), frozenset({"Runbook"}))])
    infra_or_runbooks = canonical(
        [Rule(frozenset({"infra"}), frozenset()), Rule(frozenset(), frozenset({"Runbook"}))]
    )
    with kb.read() as snap:
        assert snap.counts(snap.view(runbooks)) == (1, 0)
        assert snap.counts(snap.view(infra_or_runbooks)) == (3, 3)
    store.append(KB, [upsert("net/c", 2, type="Note")])
    p.follow_once()
    with kb.read() as snap:
        assert snap.counts(snap.view(runbooks)) == (0, 0)
        view = snap.view(infra_or_runbooks)
        assert snap.counts(view) == (2, 1)
        assert not snap.is_visible(snap.node("net/c"), view)
        assert view.deg[snap.node("infra/a")] == 1
    store.append(KB, [delete("infra/b", 2)])
    p.follow_once()
    with kb.read() as snap:
        assert snap.counts(snap.view(infra_or_runbooks)) == (1, 0)


def test_mask_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masks_module, "MASK_CACHE_ENTRIES", 3)
    store = FakeStore()
    store.append(KB, [upsert(f"c{i}/x", type=f"T{i}") for i in range(6)])
    kb = started(store).get(KB)
    with kb.read() as snap:
        for i in range(6):
            view = snap.view(canonical([Rule(frozenset(), frozenset({f"T{i}"}))]))
            assert snap.counts(view) == (1, 0)
    assert len(kb.masks) == 3


def test_search_index_receives_puts_and_removes() -> None:
    calls: list[tuple] = []

    class Recorder:
        def put(self, node: int, title: str, text: str, aliases: list[str], tags: list,
                analysed: object = None) -> None:  # fmt: skip
            assert aliases == [] and tags == []
            calls.append(("put", node, title, text))

        def put_columns(self, n: int, titles, texts, aliases, tags) -> None:  # a first build
            for u in range(n):
                self.put(u, titles[u], texts[u], aliases[u], tags[u])

        def remove(self, node: int) -> None:
            calls.append(("remove", node))

    store = FakeStore()
    store.append(KB, [upsert("a", title="A", text="alpha")])
    p = Projections(store, index_factory=Recorder, mentions=lambda kb: False)  # no name trie
    p.load()
    store.append(KB, [upsert("b", title="B", text="beta"), delete("a", 2)])
    p.follow_once()
    assert calls == [("put", 0, "A", "alpha"), ("put", 1, "B", "beta"), ("remove", 0)]


def test_real_search_index_is_kept_per_kb() -> None:
    store = FakeStore()
    store.append(KB, [upsert("a", title="Resolver", text="dns")])
    kb = started(store).get(KB)
    with kb.read() as snap:
        nodes, _ = snap.index.search("dns", snap.view(None).mask)
        assert [snap.ids[u] for u in nodes] == ["a"]


def test_growth_keeps_everything_consistent() -> None:
    """Many more nodes and block relocations than the initial capacities hold."""
    store = FakeStore()
    store.append(KB, [upsert("hub")])
    p = started(store)
    kb = p.get(KB)
    rules = canonical([Rule(frozenset({"g"}), frozenset())])
    with kb.read() as snap:
        snap.view(rules)
    for batch in range(10):
        store.append(
            KB,
            [
                upsert(f"g/n{batch:02d}{i:02d}", links=["hub", f"g/n{batch:02d}{i - 1:02d}"])
                for i in range(40)
            ],
        )
        p.follow_once()
    store.append(KB, [upsert("hub", 2, links=[f"g/n05{i:02d}" for i in range(40)])])
    p.follow_once()
    ref = reference_from_log(store)
    views = [None, rules]
    assert dump(kb, views) == reference_dump(ref, views)
    fresh = started(store)
    assert dump(fresh.get(KB), views) == dump(kb, views)


def test_unknown_kb_is_none_until_its_first_applied_event() -> None:
    store = FakeStore()
    p = started(store)
    assert p.get("other") is None
    store.append("other", [link_added("nobody", "x", 1)])  # ignored: nothing applied
    p.follow_once()
    assert p.get("other") is None
    store.append("other", [upsert("x")])
    p.follow_once()
    assert p.get("other") is not None and p.seq("other") == 1
