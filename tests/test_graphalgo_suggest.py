"""Resource allocation link suggestion: hand cases and networkx oracle."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from graphs import make_graph, masked_view, nx_graph, random_kb, view_of

from kbgraph.graphalgo import Suggestion, resource_allocation


def test_hand_case_one_third_plus_one_quarter() -> None:
    # x and v share z3 (deg 3: x, v, a) and z4 (deg 4: x, v, b, c)
    ids = ["x", "v", "z4", "z3", "a", "b", "c"]
    links = [("x", "z3"), ("v", "z3"), ("z3", "a"), ("x", "z4"), ("z4", "v")]
    links += [("b", "z4"), ("z4", "c")]
    view = view_of(ids, links)
    got = resource_allocation(view, 0, limit=5)
    assert got == [Suggestion(1, 1 / 4 + 1 / 3, [3, 2])]  # z3 < z4 by id, summed in that order
    assert got[0].score == pytest.approx(1 / 3 + 1 / 4, abs=0.0)
    # one common neighbour is not enough by default
    assert resource_allocation(view, 4, limit=5) == []
    # x and v tie at 1/3: "v" < "x"
    assert [s.node for s in resource_allocation(view, 4, limit=5, min_common=1)] == [1, 0]


def test_adjacent_candidates_are_excluded_both_directions() -> None:
    ids = ["x", "v", "w", "z1", "z2"]
    links = [("x", "z1"), ("x", "z2"), ("v", "z1"), ("v", "z2"), ("w", "z1"), ("w", "z2")]
    links += [("w", "x")]  # w links to x: not a candidate of x
    got = resource_allocation(view_of(ids, links), 0, limit=5)
    assert [s.node for s in got] == [1]


def test_ties_break_by_id_and_skip_before_limit() -> None:
    # x and each of c_i share the same two neighbours: equal scores, ranked by id
    ids = ["x", "z1", "z2", "cB", "ca", "cA", "c0"]
    links = [("x", "z1"), ("x", "z2")]
    links += [(c, z) for c in ids[3:] for z in ("z1", "z2")]
    view = view_of(ids, links)
    order = [s.node for s in resource_allocation(view, 0, limit=10)]
    assert [ids[u] for u in order] == sorted(ids[3:])  # c0 < cA < cB < ca
    skip = np.zeros(len(ids), np.uint8)
    skip[6] = 1  # c0 dropped after ranking, before the limit
    got = resource_allocation(view, 0, limit=2, skip=skip)
    assert [ids[s.node] for s in got] == ["cA", "cB"]
    assert resource_allocation(view, 0, limit=0) == []


def test_common_is_five_smallest_ids() -> None:
    zs = [f"z{i}" for i in (9, 3, 7, 1, 5, 8, 2, 6, 4, 0)]
    ids = ["x", "v", *zs]
    links = [(a, z) for a in ("x", "v") for z in zs]
    got = resource_allocation(view_of(ids, links), 0, limit=5)
    assert len(got) == 1
    assert [ids[z] for z in got[0].common] == ["z0", "z1", "z2", "z3", "z4"]
    assert got[0].score == pytest.approx(10 * 0.5)


def test_hidden_node_and_hidden_neighbours() -> None:
    ids = ["x", "v", "z1", "z2", "z3"]
    links = [(a, z) for a in ("x", "v") for z in ("z1", "z2", "z3")]
    view = view_of(ids, links, visible={"x", "v", "z1", "z3"})
    got = resource_allocation(view, 0, limit=5)
    assert got == [Suggestion(1, 1.0, [2, 4])]
    assert resource_allocation(view, 3, limit=5) == []


@pytest.mark.parametrize("seed", range(6))
def test_scores_vs_networkx(seed: int) -> None:
    rng = random.Random(seed)
    ids, links = random_kb(rng, 50, p_link=0.1)
    g = make_graph(ids, links)
    mask = np.ones(g.n, np.uint8)
    if seed % 2:
        for u in rng.sample(range(g.n), g.n // 5):
            mask[u] = 0
    view = masked_view(g, mask)
    und = nx_graph(view)
    for x in sorted(und.nodes):
        got = resource_allocation(view, x, limit=10_000)
        nbrs = set(und[x])
        cands = [v for v in und.nodes if v != x and v not in nbrs and len(nbrs & set(und[v])) >= 2]
        expected = {v: s for _, v, s in nx.resource_allocation_index(und, [(x, v) for v in cands])}
        assert {s.node: s.score for s in got} == pytest.approx(expected, rel=1e-12)
        keys = [(-s.score, ids[s.node]) for s in got]
        assert keys == sorted(keys)
        for s in got:
            common = sorted(nbrs & set(und[s.node]), key=ids.__getitem__)
            assert s.common == common[:5]
