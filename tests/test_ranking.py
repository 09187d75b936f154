"""graph_context's ``ranked`` (kbgraph.agent.ranking): the list's invariants, the documented
rule against a slow oracle on networkx, and the hub and strong-hit cases it was built for."""

from __future__ import annotations

import random

import pytest
from graphs import nx_graph, random_kb, view_of
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.agent import ranking
from kbgraph.agent.ranking import ranked
from kbgraph.graphalgo import View, personalized_pagerank

ALPHA = 0.25


def answer(view: View, rng: random.Random, n_seeds: int, n_results: int) -> tuple:
    """A graph_context-like input: seeds with search scores, PPR from them, top results."""
    visible = [u for u in range(view.graph.n) if view.mask[u]]
    picked = rng.sample(visible, min(len(visible), n_seeds + 5))
    search = {u: rng.choice([1.0, 0.5, rng.random() + 0.01]) for u in picked}
    seeds = {u: search[u] for u in picked[:n_seeds]}
    total = sum(seeds.values())
    share = {u: w / total for u, w in seeds.items()}
    nodes, p = personalized_pagerank(view, list(seeds.items()), ALPHA)
    mass = dict(zip(nodes.tolist(), p.tolist(), strict=True))
    others = sorted((u for u in mass if u not in seeds), key=lambda u: -mass[u])[:n_results]
    results = [(u, rng.randint(1, 3), next(iter(seeds))) for u in others]
    return search, share, mass, results


def oracle(view: View, search: dict, share: dict, mass: dict, results: list) -> dict[int, float]:
    """The module docstring's rule, unrounded, with networkx's neighbours and degrees."""
    g = nx_graph(view)
    nodes = list(share) + [u for u, _, _ in results]
    best = max(search.values())
    walk = {
        v: max(mass.get(v, 0.0) - ALPHA * share.get(v, 0.0), 0.0)
        / max(g.degree(v), 1) ** ranking.WALK_DEGREE_POWER
        for v in nodes
    }
    near = {
        v: sum(
            search[u] * (g.degree(u) * g.degree(v)) ** -ranking.NEIGHBOUR_DEGREE_POWER
            for u in g.neighbors(v)
            if u in search
        )
        for v in nodes
    }
    top_walk = max(walk.values()) or 1.0
    top_near = max(near.values()) or 1.0
    full = 1.0 + ranking.WALK_WEIGHT + ranking.NEIGHBOUR_WEIGHT  # search's best hit
    return {
        v: full
        if search.get(v, 0.0) == best
        else search.get(v, 0.0) / best
        + ranking.WALK_WEIGHT * walk[v] / top_walk
        + ranking.NEIGHBOUR_WEIGHT * near[v] / top_near
        for v in nodes
    }


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_seeds=st.integers(1, 12),
    n_results=st.integers(0, 10),
    limit=st.integers(1, 30),
)
def test_the_rule_once_each_best_first(seed: int, n_seeds: int, n_results: int, limit: int) -> None:
    rng = random.Random(seed)
    ids, links = random_kb(rng, 50)
    view = view_of(ids, links, {cid for cid in ids if rng.random() < 0.8})
    search, share, mass, results = answer(view, rng, n_seeds, n_results)
    out = ranked(view, search, share, mass, results, limit, ALPHA)
    nodes = [row.node for row in out]
    assert len(nodes) == len(set(nodes)) == min(limit, len(share) + len(results))
    order = [(-row.score, row.hops, ids[row.node]) for row in out]
    assert order == sorted(order)
    want = oracle(view, search, share, mass, results)
    hops = {u: (h, b) for u, h, b in results}
    for row in out:
        assert row.score == pytest.approx(want[row.node], abs=5.1e-5)
        assert (row.hops, row.via) == ((0, None) if row.node in share else hops[row.node])
    everyone = ranked(view, search, share, mass, results, 1000, ALPHA)
    assert everyone[: len(out)] == out  # the cut keeps the best
    assert ranked(view, search, share, mass, results, limit, ALPHA) == out  # deterministic


def test_weights_leave_the_best_hit_to_search() -> None:
    """A full share of both graph signals is worth less than the best hit's own score, so the
    graph cannot put a concept search did not find above search's best."""
    assert 0.0 < ranking.WALK_WEIGHT + ranking.NEIGHBOUR_WEIGHT < 1.0


def test_a_page_several_hits_link_rises_and_a_hub_does_not() -> None:
    # hits a, b, c all link x; the hub h links every hit and twenty other pages
    others = [f"o{i:02d}" for i in range(20)]
    ids = ["a", "b", "c", "d", "h", "x", *others]
    links = [("a", "x"), ("b", "x"), ("c", "x")]
    links += [("h", t) for t in ["a", "b", "c", "d", *others]]
    view = view_of(ids, links)
    node = {cid: i for i, cid in enumerate(ids)}
    search = {node["a"]: 1.0, node["b"]: 0.9, node["c"]: 0.8, node["d"]: 0.2}
    share = {u: w / sum(search.values()) for u, w in search.items()}
    nodes, p = personalized_pagerank(view, list(search.items()), ALPHA)
    mass = dict(zip(nodes.tolist(), p.tolist(), strict=True))
    results = [(node["x"], 1, node["a"]), (node["h"], 1, node["a"])]
    out = [ids[row.node] for row in ranked(view, search, share, mass, results, 10, ALPHA)]
    assert out.index("a") == 0  # search's best stays first
    assert out.index("x") < out.index("d")  # three hits' neighbour beats a weak hit
    assert out.index("x") < out.index("h")  # the hub, linked by as many hits, does not


def test_search_best_hit_keeps_the_head_the_graph_reorders_the_rest() -> None:
    """b, a near second that three other hits link, would pass a (search's best, linked by
    none) on the sum alone; a single-answer question's best bet stays first, b comes next."""
    ids = ["a", "b", "c", "d", "e", "z"]
    links = [("c", "b"), ("d", "b"), ("e", "b"), ("a", "z")]
    view = view_of(ids, links)
    node = {cid: i for i, cid in enumerate(ids)}
    search = {node["a"]: 1.0, node["b"]: 0.95, node["c"]: 0.5, node["d"]: 0.5, node["e"]: 0.5}
    share = {u: w / sum(search.values()) for u, w in search.items()}
    nodes, p = personalized_pagerank(view, list(search.items()), ALPHA)
    mass = dict(zip(nodes.tolist(), p.tolist(), strict=True))
    out = ranked(view, search, share, mass, [(node["z"], 1, node["a"])], 10, ALPHA)
    assert [ids[row.node] for row in out[:2]] == ["a", "b"]
    by_id = {ids[row.node]: row.score for row in out}
    assert by_id["a"] == 1.0 + ranking.WALK_WEIGHT + ranking.NEIGHBOUR_WEIGHT
    # on the sum alone b would lead: its own score is above what a would have had
    assert by_id["b"] > 1.0 + ranking.WALK_WEIGHT * 1.0
