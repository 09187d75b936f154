"""Lexicographically smallest shortest paths and hops/via, against networkx and brute force."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from graphs import make_graph, masked_view, nx_digraph, nx_graph, random_kb, view_of

from kbgraph.graphalgo import View, hops_and_via, shortest_path


def lex_min_path(g: nx.Graph | nx.DiGraph, ids: list[str], s: int, t: int) -> list[int]:
    return min(nx.all_shortest_paths(g, s, t), key=lambda path: [ids[u] for u in path])


def random_view(seed: int, n: int = 40, hide: bool = True) -> tuple[View, list[str]]:
    rng = random.Random(seed)
    ids, links = random_kb(rng, n, p_link=0.06)
    g = make_graph(ids, links)
    mask = np.ones(g.n, np.uint8)
    if hide:
        for u in rng.sample(range(g.n), g.n // 6):
            mask[u] = 0
    return masked_view(g, mask), ids


def test_lexicographic_tie_break_by_id_not_int() -> None:
    # two shortest paths s-x-t and s-y-t; "B" < "a" in code point order although interned later
    ids = ["s", "a", "t", "B"]
    view = view_of(ids, [("s", "a"), ("a", "t"), ("s", "B"), ("B", "t")])
    assert shortest_path(view, 0, 2) == [0, 3, 2]
    assert hops_and_via(view, [0], [2]) == ([2], [3])
    # hiding B leaves the other path
    view = view_of(ids, [("s", "a"), ("a", "t"), ("s", "B"), ("B", "t")], visible={"s", "a", "t"})
    assert shortest_path(view, 0, 2) == [0, 1, 2]
    assert hops_and_via(view, [0], [2, 3]) == ([2, -1], [1, -1])


def test_path_edge_cases() -> None:
    ids = ["a", "b", "c", "d", "e"]
    view = view_of(ids, [("a", "b"), ("b", "c"), ("c", "d")], visible={"a", "b", "c", "d"})
    assert shortest_path(view, 0, 0) == [0]
    assert shortest_path(view, 0, 3, max_hops=3) == [0, 1, 2, 3]
    assert shortest_path(view, 0, 3, max_hops=2) is None
    assert shortest_path(view, 0, 4) is None  # hidden
    assert shortest_path(view, 3, 0, "out") is None  # against the links
    assert shortest_path(view, 0, 3, "out") == [0, 1, 2, 3]
    assert hops_and_via(view, [0, 3], [0, 1, 2, 4]) == ([0, 1, 1, -1], [-1, 0, 3, -1])
    assert hops_and_via(view, [0], []) == ([], [])
    with pytest.raises(ValueError):
        shortest_path(view, 0, 1, "in")


@pytest.mark.parametrize("seed", range(5))
def test_paths_vs_networkx_and_brute_force(seed: int) -> None:
    view, ids = random_view(seed)
    und = nx_graph(view)
    dig = nx_digraph(view)
    vis = sorted(und.nodes)
    rng = random.Random(seed)
    pairs = [(rng.choice(vis), rng.choice(vis)) for _ in range(150)]
    for s, t in pairs:
        for direction, g in (("both", und), ("out", dig)):
            for max_hops in (2, 6):
                got = shortest_path(view, s, t, direction, max_hops)
                try:
                    d = nx.shortest_path_length(g, s, t)
                except nx.NetworkXNoPath:
                    d = None
                if d is None or d > max_hops:
                    assert got is None, (s, t, direction)
                else:
                    assert got is not None and len(got) == d + 1
                    assert got == lex_min_path(g, ids, s, t)
    hidden = [u for u in range(view.graph.n) if not view.mask[u]]
    if hidden and vis:
        assert shortest_path(view, vis[0], hidden[0]) is None
        assert shortest_path(view, hidden[0], hidden[0]) is None


@pytest.mark.parametrize("seed", range(5))
def test_hops_and_via_vs_brute_force(seed: int) -> None:
    view, ids = random_view(seed + 100)
    und = nx_graph(view)
    vis = sorted(und.nodes)
    rng = random.Random(seed)
    for _ in range(8):
        seeds = rng.sample(vis, rng.randint(1, 3))
        targets = [u for u in range(view.graph.n) if u not in seeds]
        hops, via = hops_and_via(view, seeds + seeds[:1], targets)
        dist = nx.multi_source_dijkstra_path_length(und, set(seeds))
        for t, h, v in zip(targets, hops, via, strict=True):
            if t not in dist:
                assert (h, v) == (-1, -1)
                continue
            assert h == dist[t]
            best = min(
                (
                    path
                    for s in seeds
                    if nx.has_path(und, s, t) and nx.shortest_path_length(und, s, t) == h
                    for path in nx.all_shortest_paths(und, s, t)
                ),
                key=lambda path: [ids[u] for u in path],
            )
            assert v == best[-2]


def test_hops_stop_early_leaves_scratch_clean() -> None:
    # a long chain: the BFS stops at the target; a later query must not see stale distances
    ids = [f"n{i:03d}" for i in range(200)]
    view = view_of(ids, [(ids[i], ids[i + 1]) for i in range(199)])
    assert hops_and_via(view, [0], [3]) == ([3], [2])
    assert hops_and_via(view, [199], [0, 150]) == ([199, 49], [1, 151])
    assert shortest_path(view, 0, 10, max_hops=12) == list(range(11))
    assert shortest_path(view, 5, 0) == [5, 4, 3, 2, 1, 0]


@pytest.mark.parametrize("hide", [False, True])
def test_bidirectional_equals_one_sided_bfs(hide: bool) -> None:
    # "both" runs a bidirectional BFS; it must give the one-sided BFS's path, bound included
    from kbgraph.graphalgo._common import Scratch, thread_scratch, und_arrays
    from kbgraph.graphalgo._kernels import bfs_path
    from loadtest.synthetic import graph_from_concepts, seed_kb

    g = graph_from_concepts(seed_kb(1500, seed=11))
    rng = random.Random(5)
    mask = np.ones(g.n, np.uint8)
    if hide:
        mask[rng.sample(range(g.n), g.n // 2)] = 0
    view = masked_view(g, mask)
    off, length, blk, m, _ = und_arrays(view)
    s = Scratch(g.n)
    vis = [u for u in range(g.n) if mask[u]]
    for _ in range(300):
        a, b = rng.choice(vis), rng.choice(vis)
        for max_hops in (1, 2, 3, 6):
            one = bfs_path(off, length, blk, m, a, b, max_hops, s.dist, s.q0, s.q1).tolist()
            assert shortest_path(view, a, b, "both", max_hops) == (one or None)
    assert (s.dist == -1).all()
    rest = thread_scratch()  # this thread's scratch is back at rest after every call
    assert rest is not None
    assert (rest.dist == -1).all() and not rest.c0.any() and not rest.b0.any()
    assert not rest.f0.any() and not rest.f1.any() and not rest.b1.any()
