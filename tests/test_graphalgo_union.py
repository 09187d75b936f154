"""kbgraph.graphalgo.union against independent oracles: PPR by power iteration (the push's
bound), lexicographically smallest shortest paths by enumerating every shortest path
(networkx), and the invariance under a renumbering of the nodes."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.graphalgo import union

IDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[int, dict[int, dict[int, float]]]:
    n = draw(st.integers(1, len(IDS)))
    adj: dict[int, dict[int, float]] = {u: {} for u in range(n)}
    for u, v, w in draw(
        st.lists(
            st.tuples(
                st.integers(0, n - 1), st.integers(0, n - 1), st.sampled_from([1.0, 0.5, 0.25])
            )
        )
    ):
        if u != v:
            adj[u][v] = adj[v][u] = w
    return n, adj


class Dict:
    """A ``union.Weighted`` over a dict of dicts: degrees summed edge by edge."""

    def __init__(self, adj: dict[int, dict[int, float]], ids: list[str]) -> None:
        self.adj, self.key = adj, ids.__getitem__

    def neighbours(self, u: int) -> tuple[list[int], list[float]]:
        near = sorted(self.adj[u].items())
        return [v for v, _ in near], [w for _, w in near]

    def degree(self, u: int) -> float:
        return sum(w for _, w in sorted(self.adj[u].items()))


def power_ppr(n: int, adj: dict[int, dict[int, float]], seeds: dict[int, float], alpha: float):
    s = np.zeros(n)
    for u, w in seeds.items():
        s[u] += w
    s /= s.sum()
    p = s.copy()
    for _ in range(3000):
        nxt = alpha * s
        for u in range(n):
            d = sum(adj[u].values())
            if d == 0:
                nxt[u] += (1 - alpha) * p[u]  # an isolated node keeps its mass
                continue
            for v, w in adj[u].items():
                nxt[v] += (1 - alpha) * p[u] * w / d
        p = nxt
    return p


@settings(max_examples=80)
@given(graphs(), st.data())
def test_weighted_ppr_is_within_the_push_bound(graph, data) -> None:
    n, adj = graph
    seeds = data.draw(
        st.dictionaries(st.integers(0, n - 1), st.sampled_from([1.0, 0.5]), min_size=1)
    )
    eps = 1e-4
    p = union.weighted_ppr(Dict(adj, IDS), seeds, 0.25, eps)
    exact = power_ppr(n, adj, seeds, 0.25)
    for u in range(n):
        gap = exact[u] - p.get(u, 0.0)
        assert -1e-9 <= gap <= eps * max(sum(adj[u].values()), 1.0) + 1e-9


def smallest_path(g: nx.Graph, sources: list[int], target: int, ids: list[str]):
    best = None
    for s in sources:
        if not nx.has_path(g, s, target):
            continue
        for path in nx.all_shortest_paths(g, s, target):
            named = (len(path), [ids[u] for u in path])
            if best is None or named < best[0]:
                best = (named, path)
    return None if best is None else best[1]


@settings(max_examples=100)
@given(graphs(), st.data())
def test_paths_are_the_smallest_shortest(graph, data) -> None:
    n, adj = graph
    ids = data.draw(st.permutations(IDS[:n]))  # ids in no relation to the ints
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((u, v) for u in adj for v in adj[u])
    graph = Dict(adj, ids)
    key = graph.key

    def nexts(u: int) -> list[int]:
        return graph.neighbours(u)[0]

    seeds = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
    targets = list(range(n))
    found = union.hops_and_via(nexts, key, seeds, targets)
    for t in targets:
        path = smallest_path(g, sorted(set(seeds)), t, ids)
        if path is None:
            assert t not in found
        else:
            assert found[t] == (len(path) - 1, path[-2] if len(path) > 1 else None)
    source, target = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
    bound = data.draw(st.integers(1, 4))
    path = smallest_path(g, [source], target, ids)
    expected = path if path is not None and len(path) - 1 <= bound else None
    assert union.shortest_path(nexts, key, source, target, bound) == expected


@settings(max_examples=60)
@given(graphs(), st.data())
def test_results_do_not_depend_on_the_numbering(graph, data) -> None:
    n, adj = graph
    perm = data.draw(st.permutations(range(n)))
    moved = {perm[u]: {perm[v]: w for v, w in adj[u].items()} for u in adj}
    ids = IDS[:n]
    moved_ids = [ids[perm.index(i)] for i in range(n)]
    seeds = {0: 1.0, n - 1: 0.5}
    near, near2 = Dict(adj, ids), Dict(moved, moved_ids)
    p = union.weighted_ppr(near, seeds, 0.25, 1e-4)
    p2 = union.weighted_ppr(near2, {perm[u]: w for u, w in seeds.items()}, 0.25, 1e-4)
    assert {ids[u]: x for u, x in p.items()} == {moved_ids[u]: x for u, x in p2.items()}
    values = {u: 1.0 / (1 + u) for u in range(n)}
    h = union.neighbour_evidence(near, values, list(range(n)), 0.5)
    h2 = union.neighbour_evidence(
        near2, {perm[u]: x for u, x in values.items()}, [perm[u] for u in range(n)], 0.5
    )
    assert h == h2
    for v in range(n):
        d = lambda u: sum(adj[u].values())  # noqa: E731
        want = math.fsum(values[u] * w * (d(u) * d(v)) ** -0.5 for u, w in adj[v].items())
        assert math.isclose(h[v], want, rel_tol=1e-12, abs_tol=1e-15)
