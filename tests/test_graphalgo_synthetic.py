"""The synthetic KB generator and the direct Graph builder keep the projection's invariants."""

from __future__ import annotations

import numpy as np
from graphs import build_graph, make_graph, masked_view

from kbgraph.graphalgo.graph import Graph
from loadtest.synthetic import (
    COLLECTIONS,
    concept_id,
    graph_from_concepts,
    hub_kb,
    kb_ids,
    seed_kb,
    seed_links,
)


def check_invariants(g: Graph) -> None:
    ids = g.ids
    und_sets = []
    for off, length, blk in ((g.und_off, g.und_len, g.und), (g.out_off, g.out_len, g.out)):
        for u in range(g.n):
            block = blk[off[u] : off[u] + length[u]].tolist()
            assert u not in block
            assert len(set(block)) == len(block)
            assert [ids[v] for v in block] == sorted(ids[v] for v in block)
            if blk is g.und:
                und_sets.append(set(block))
    for u in range(g.n):
        for v in und_sets[u]:
            assert u in und_sets[v]
        s = int(g.out_off[u])
        assert set(g.out[s : s + int(g.out_len[u])].tolist()) <= und_sets[u]


def test_seed_kb_shape() -> None:
    kb = seed_kb(1000)
    assert len(kb) == 1000
    assert kb[0]["id"] == "infra/c0000" and kb[1]["id"] == "apps/c0001"
    assert kb[997]["id"] == "ops/c0997"
    ids = {c["id"] for c in kb}
    links = [t for c in kb for t in c["links"]]
    assert all(len(c["links"]) == 8 and c["title"] and c["type"] for c in kb)
    missing = sum(t not in ids for t in links) / len(links)
    assert 0.03 < missing < 0.07
    assert seed_kb(1000) == kb  # deterministic
    assert concept_id(7, 20_000) == "ops/c0000007"
    assert {cid.split("/")[0] for cid in ids} == set(COLLECTIONS)


def test_graph_from_concepts_invariants_and_vectorised_builder_agree() -> None:
    kb = seed_kb(300, seed=3)
    g = graph_from_concepts(kb)
    check_invariants(g)
    src, dst = seed_links(300, seed=3)
    g2 = build_graph(kb_ids(300), src, dst)
    for a, b in zip(
        (g.und_off, g.und_len, g.und, g.out_off, g.out_len, g.out),
        (g2.und_off, g2.und_len, g2.und, g2.out_off, g2.out_len, g2.out),
        strict=True,
    ):
        assert np.array_equal(a, b)


def test_hub_kb_has_hubs() -> None:
    g = graph_from_concepts(hub_kb(1000))
    check_invariants(g)
    deg = np.sort(g.und_len)[::-1]
    assert deg[0] > 8 * np.median(deg)


def test_masked_view_degrees() -> None:
    g = make_graph(["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")])
    check_invariants(g)
    view = masked_view(g, np.array([1, 1, 0, 1], np.uint8))
    assert view.deg.tolist()[:2] == [2, 1] and view.deg[3] == 1
