"""Random histories of a KB for the projection tests, and what a projection holds, by ids.

``deliveries_st`` draws deliveries with duplicates, stale versions, deletes, re-creates, links
to missing concepts, self-links and reciprocal links; ``rules_st`` draws token rules. ``dump``
reads a projection by concept id (node numbers differ between builds), checking every ``Graph``
invariant on the way; ``reference_dump`` reads ``ReferenceKB`` the same way, so the two compare.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import numpy as np
from hypothesis import strategies as st

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
from kbgraph.projection import KBProjection
from kbgraph.store import LogRecord
from tests.reference_model import ReferenceKB

KB = "kb"


IDS = ["a", "b", "infra/a", "infra/b", "infra/c/d", "net/x", "net/y", "ops/z"]


TARGETS = [*IDS, "ghost/1", "ghost"]


TYPES = ["", "Runbook", "Note"]


COLLECTIONS = ["", "infra", "net", "ghost", "zzz"]


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


def apply_in_deliveries(records: list[LogRecord], sizes: list[int], kb: KBProjection) -> None:
    """``records`` applied by ``KBProjection.apply``, in deliveries of ``sizes`` (the rest in
    one more)."""
    deliveries = []
    for size in [*sizes, len(records)]:
        if records:
            deliveries.append(records[:size])
            records = records[size:]
    while deliveries:
        deliveries = deliveries[kb.apply(deliveries) :]
