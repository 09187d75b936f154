"""Personalized PageRank by forward push: hand cases and oracles (numpy solve, networkx)."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from graphs import full_view, make_graph, masked_view, nx_graph, random_kb, view_of
from networkx.algorithms.link_analysis.pagerank_alg import _pagerank_python

from kbgraph.graphalgo import View, personalized_pagerank

ALPHA = 0.25


def exact_ppr(view: View, seeds: dict[int, float], alpha: float = ALPHA) -> dict[int, float]:
    """Direct linear solve of ppr = alpha*s + (1-alpha)*ppr W on the visible subgraph
    (W = D^-1 A; an isolated node gets a self-loop, so it keeps its mass)."""
    vis = [u for u in range(view.graph.n) if view.mask[u]]
    pos = {u: i for i, u in enumerate(vis)}
    k = len(vis)
    w = np.zeros((k, k))
    g = nx_graph(view)
    for u in vis:
        nbrs = list(g.neighbors(u))
        if not nbrs:
            w[pos[u], pos[u]] = 1.0
        for v in nbrs:
            w[pos[u], pos[v]] = 1.0 / len(nbrs)
    s = np.zeros(k)
    total = sum(seeds.values())
    for u, x in seeds.items():
        s[pos[u]] += x / total
    x = np.linalg.solve((np.eye(k) - (1 - alpha) * w).T, alpha * s)
    return {u: float(x[pos[u]]) for u in vis}


def nx_ppr(view: View, seeds: dict[int, float], alpha: float = ALPHA) -> dict[int, float]:
    """networkx's power iteration, damping 1 - alpha, self-loops on isolated nodes."""
    g = nx_graph(view)
    for u in list(g.nodes):
        if g.degree(u) == 0:
            g.add_edge(u, u)
    pers = {u: seeds.get(u, 0.0) for u in g.nodes}
    # nx.pagerank needs scipy; the pure Python power iteration is the same algorithm
    try:
        import scipy  # noqa: F401

        pagerank = nx.pagerank
    except ImportError:
        pagerank = _pagerank_python
    return pagerank(g, alpha=1 - alpha, personalization=pers, tol=1e-15, max_iter=100_000)


def as_dict(view: View, seeds: list[tuple[int, float]], eps: float) -> dict[int, float]:
    nodes, p = personalized_pagerank(view, seeds, eps=eps)
    return dict(zip(nodes.tolist(), p.tolist(), strict=True))


def test_path_hand_computation() -> None:
    # a - b - c, seed a. With eps = 0.1 the pushes are a, b, a, c, b, a, c, b (see the trace
    # below); all values are dyadic, so they are exact in floating point.
    view = view_of(["a", "b", "c"], [("a", "b"), ("c", "b")])
    p = as_dict(view, [(0, 1.0)], eps=0.1)
    assert p == {0: 0.35986328125, 1: 0.352294921875, 2: 0.10986328125}
    # the exact values are 23/56, 3/7, 9/56; at eps = 1e-4 each is within eps*deg below them
    p = as_dict(view, [(0, 1.0)], eps=1e-4)
    exact = {0: 23 / 56, 1: 3 / 7, 2: 9 / 56}
    for u, d in ((0, 1), (1, 2), (2, 1)):
        assert 0 <= exact[u] - p[u] <= 1e-4 * d
    assert exact == pytest.approx(exact_ppr(view, {0: 1.0}), abs=1e-12)


def test_isolated_seed_keeps_its_mass() -> None:
    view = view_of(["a", "b", "c", "lonely"], [("a", "b"), ("b", "c")])
    nodes, p = personalized_pagerank(view, [(0, 1.0), (3, 1.0)])
    got = dict(zip(nodes.tolist(), p.tolist(), strict=True))
    assert got[3] == 0.5
    assert sum(v for u, v in got.items() if u != 3) <= 0.5


def test_repeated_seed_weights_add_and_normalise() -> None:
    view = view_of(["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "d")])
    one = personalized_pagerank(view, [(0, 1.0), (3, 1.0), (0, 1.0)])
    two = personalized_pagerank(view, [(3, 0.5), (0, 1.0)])
    assert one[0].tolist() == two[0].tolist()
    assert one[1].tolist() == two[1].tolist()


def test_output_in_id_order_and_positive() -> None:
    ids = ["b/2", "a", "Z", "é", "b/10"]
    view = view_of(ids, [(ids[i], ids[j]) for i in range(5) for j in range(i + 1, 5)])
    nodes, p = personalized_pagerank(view, [(0, 1.0)])
    assert [ids[u] for u in nodes.tolist()] == sorted(ids)
    assert nodes.dtype == np.int32 and p.dtype == np.float64
    assert (p > 0).all()


def test_no_seed_and_bad_seeds() -> None:
    view = view_of(["a", "b"], [("a", "b")], visible={"a"})
    nodes, p = personalized_pagerank(view, [])
    assert nodes.shape == (0,) and p.shape == (0,)
    with pytest.raises(ValueError):
        personalized_pagerank(view, [(1, 1.0)])  # hidden
    with pytest.raises(ValueError):
        personalized_pagerank(view, [(0, 0.0)])
    with pytest.raises(ValueError):
        personalized_pagerank(view, [(5, 1.0)])


@pytest.mark.parametrize("seed", range(6))
def test_forward_push_bounds_vs_oracles(seed: int) -> None:
    rng = random.Random(seed)
    ids, links = random_kb(rng, 60)
    g = make_graph(ids, links)
    mask = np.ones(g.n, np.uint8)
    if seed % 2:  # narrowed caller: hide a fifth of the nodes
        for u in rng.sample(range(g.n), g.n // 5):
            mask[u] = 0
    view = masked_view(g, mask)
    vis = [u for u in range(g.n) if mask[u]]
    picks = rng.sample(vis, 3)
    seeds = [(picks[0], 1.0), (picks[1], 0.5), (picks[2], 0.25), (picks[0], 1.0)]
    agg: dict[int, float] = {}
    for u, w in seeds:
        agg[u] = agg.get(u, 0.0) + w
    exact = exact_ppr(view, agg)
    nxp = nx_ppr(view, agg)
    assert max(abs(exact[u] - nxp[u]) for u in vis) < 1e-10
    deg = view.deg
    for eps in (1e-4, 1e-5):
        p = as_dict(view, seeds, eps)
        assert all(mask[u] for u in p)
        for u in vis:
            gap = exact[u] - p.get(u, 0.0)
            assert -1e-12 <= gap <= eps * deg[u] + 1e-12, (u, gap, eps * deg[u])
        l1 = sum(exact[u] - p.get(u, 0.0) for u in vis)
        assert l1 <= eps * sum(int(deg[u]) for u in vis) + 1e-12
    p = as_dict(view, seeds, 1e-6)
    assert sum(exact[u] - p.get(u, 0.0) for u in vis) <= 1e-3


def test_hub_graph_mass_conservation() -> None:
    # a star plus a tail: the sum of p + residual is 1, so sum(p) is within eps*sum(deg) of 1
    ids = [f"n{i:02d}" for i in range(30)]
    links = [("n00", f"n{i:02d}") for i in range(1, 25)] + [("n24", "n25"), ("n25", "n26")]
    view = full_view(make_graph(ids, links))
    nodes, p = personalized_pagerank(view, [(5, 1.0)], eps=1e-5)
    assert 1.0 - 1e-5 * int(view.deg.sum()) <= p.sum() <= 1.0 + 1e-12
    assert set(nodes.tolist()) <= set(range(27))
