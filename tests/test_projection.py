"""The projection against a plain reference model and against a from-scratch rebuild.

Random deliveries (duplicates, stale versions, deletes, re-creates, links to missing concepts,
self-links, reciprocal links) go through a store; the projection follows the log and must then
equal (a) a projection rebuilt from ``store.load()`` and (b) ``ReferenceKB`` fed the same log,
node for node and edge for edge (compared by ids), masks and visible degrees included, with
every block id-sorted and every ``Graph`` invariant checked.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kbgraph.projection.adjacency as adjacency
import kbgraph.projection.masks as masks_module
from kbgraph.access import Rule, RuleSet, canonical
from kbgraph.events import (
    ConceptDeleted,
    ConceptUpserted,
    DeleteData,
    Event,
    LinkAdded,
    LinkData,
    LinkRemoved,
    UpsertData,
)
from kbgraph.projection import KBProjection, Projections
from kbgraph.store import Store
from tests.kb_events import delete, link_added, link_removed, upsert
from tests.reference_model import FakeStore, ReferenceKB

KB = "kb"
IDS = ["a", "b", "infra/a", "infra/b", "infra/c/d", "net/x", "net/y", "ops/z"]
TARGETS = [*IDS, "ghost/1", "ghost"]
TYPES = ["", "Runbook", "Note"]
COLLECTIONS = ["", "infra", "net", "ghost", "zzz"]


# --- what a projection holds, by ids ----------------------------------------------------------


def check_invariants(kb: KBProjection) -> None:
    """Graph invariants: blocks of existing concepts only, once each, never u, id-sorted,
    inside their capacity and not overlapping; und symmetric; out within und."""
    with kb.read() as snap:
        g = snap.graph
        ids = snap.ids
        n = g.n
        alive = np.array([snap.node(ids[u]) == u for u in range(n)], dtype=bool)
        assert len(ids) == n
        assert np.array_equal(snap.view(None).mask.astype(bool), alive)
        for adj, off, ln, pool in (
            (kb.links.und, g.und_off, g.und_len, g.und),
            (kb.links.out, g.out_off, g.out_len, g.out),
        ):
            spans = []
            for u in range(n):
                o, k = int(off[u]), int(ln[u])
                assert 0 <= k <= int(adj.cap[u])
                if not alive[u]:
                    assert k == 0
                    continue
                block = pool[o : o + k].tolist()
                assert u not in block
                assert all(alive[v] for v in block)
                names = [ids[v] for v in block]
                assert names == sorted(set(names)), f"block of {ids[u]} not id-sorted: {names}"
                if adj.cap[u]:
                    spans.append((o, o + int(adj.cap[u])))
                assert o + int(adj.cap[u]) <= adj.end <= len(pool)
            spans.sort()
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
            assert adj.total == int(ln.sum())
        und = {(u, v) for u in range(n) for v in snap_block(g.und, g.und_off, g.und_len, u)}
        out = {(u, v) for u in range(n) for v in snap_block(g.out, g.out_off, g.out_len, u)}
        assert all((v, u) in und for u, v in und)
        assert out <= und
        assert all((u, v) in out or (v, u) in out for u, v in und)


def snap_block(pool: np.ndarray, off: np.ndarray, ln: np.ndarray, u: int) -> list[int]:
    return pool[int(off[u]) : int(off[u]) + int(ln[u])].tolist()


def dump(kb: KBProjection | None, rule_sets: list[RuleSet | None]) -> dict[str, Any] | None:
    if kb is None:
        return None
    check_invariants(kb)
    with kb.read() as snap:
        g = snap.graph
        ids = snap.ids
        alive = [u for u in range(g.n) if snap.node(ids[u]) == u]
        nodes = {
            ids[u]: (
                snap.titles[u],
                snap.types[u],
                snap.statuses[u],
                list(snap.tags[u]),
                snap.texts[u],
                snap.versions[u],
                snap.declared_links(u),
            )
            for u in alive
        }
        und = {
            frozenset((ids[u], ids[v]))
            for u in alive
            for v in snap_block(g.und, g.und_off, g.und_len, u)
        }
        out = {(ids[u], ids[v]) for u in alive for v in snap_block(g.out, g.out_off, g.out_len, u)}
        views = {}
        for rules in rule_sets:
            view = snap.view(rules)
            degrees = {ids[u]: int(view.deg[u]) for u in range(g.n) if view.mask[u]}
            assert all(snap.is_visible(snap.node(i), view) for i in degrees)
            views[rules] = (degrees, snap.counts(view))
        return {"seq": snap.seq, "nodes": nodes, "und": und, "out": out, "views": views}


def reference_dump(ref: ReferenceKB, rule_sets: list[RuleSet | None]) -> dict[str, Any]:
    und = ref.und_edges()
    nodes = {
        u: (c.title, c.type, c.status, c.tags, c.text, c.version, sorted(c.links))
        for u, c in ref.concepts.items()
    }
    views = {}
    for rules in rule_sets:
        degrees = ref.visible_degrees(rules)
        views[rules] = (degrees, (len(degrees), sum(degrees.values()) // 2))
    return {"seq": ref.seq, "nodes": nodes, "und": und, "out": ref.out_edges(), "views": views}


def reference_from_log(store: Any) -> ReferenceKB | None:
    ref = None
    for r in store.read_log(0, 1_000_000):
        if r.kb == KB:
            ref = ref or ReferenceKB()
            ref.apply(r.event, r.seq)
    return ref


# --- random deliveries ------------------------------------------------------------------------


@st.composite
def events(draw: st.DrawFn) -> Event:
    kind = draw(st.sampled_from(["up", "up", "up", "del", "add", "add", "rm"]))
    env: dict[str, Any] = {
        "specversion": "1.0",
        "id": f"e{draw(st.integers(0, 80))}",  # a small id space makes duplicates
        "source": draw(st.sampled_from(["s1", "s2"])),
        "subject": draw(st.sampled_from(IDS)),
    }
    version = draw(st.integers(0, 40))  # small versions make stale events
    if kind == "up":
        data = UpsertData(
            version=version,
            title=draw(st.sampled_from(["", "DNS", "Router"])),
            type=draw(st.sampled_from(TYPES)),
            status=draw(st.sampled_from(["", "active", "deprecated"])),
            tags=draw(st.lists(st.sampled_from(["x", "y"]), max_size=2)),
            text=draw(st.sampled_from(["", "body", "dns resolver"])),
            links=draw(st.lists(st.sampled_from(TARGETS), max_size=5)),
        )
        return ConceptUpserted(**env, data=data)
    if kind == "del":
        return ConceptDeleted(**env, data=DeleteData(version=version))
    target = draw(st.sampled_from(TARGETS))
    cls = LinkAdded if kind == "add" else LinkRemoved
    return cls(**env, data=LinkData(version=version, target=target))


rules_st = st.lists(
    st.builds(
        Rule,
        st.frozensets(st.sampled_from(COLLECTIONS), max_size=2),
        st.frozensets(st.sampled_from([*TYPES, "Other"]), max_size=2),
    ),
    min_size=1,
    max_size=3,
).map(canonical)


@st.composite
def deliveries(draw: st.DrawFn) -> list[list[Event]]:
    """Versions mostly rise with the position (so deletes, re-creates and link events apply);
    about one event in five keeps its small random version (stale when it is not greater)."""
    raw = draw(st.lists(st.lists(events(), min_size=1, max_size=4), min_size=1, max_size=30))
    out = []
    position = 0
    for delivery in raw:
        rewritten = []
        for event in delivery:
            position += 1
            if draw(st.integers(0, 4)):
                data = msgspec.structs.replace(event.data, version=event.data.version + position)
                event = msgspec.structs.replace(event, data=data)
            rewritten.append(event)
        out.append(rewritten)
    return out


deliveries_st = deliveries()


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

        def put_many(self, docs) -> None:
            for doc in docs:
                self.put(*doc)

        def remove(self, node: int) -> None:
            calls.append(("remove", node))

    store = FakeStore()
    store.append(KB, [upsert("a", title="A", text="alpha")])
    p = Projections(store, index_factory=Recorder)
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
