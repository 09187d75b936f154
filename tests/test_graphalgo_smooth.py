"""One hop of score propagation (kbgraph.graphalgo.smooth): hand case, networkx oracle,
interning order and the narrowed-equals-never-written property."""

from __future__ import annotations

import random

import numpy as np
import pytest
from graphs import nx_graph, random_kb, view_of
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.graphalgo import View
from kbgraph.graphalgo.smooth import neighbour_evidence


def oracle(view: View, sources: dict[int, float], targets: list[int], gamma: float) -> list[float]:
    """The definition, summed over networkx's visible neighbours."""
    g = nx_graph(view)
    out = []
    for v in targets:
        if v not in g:
            out.append(0.0)
            continue
        total = 0.0
        for u in g.neighbors(v):
            if sources.get(u, 0.0) > 0.0:
                total += sources[u] * (g.degree(u) * g.degree(v)) ** -gamma
        out.append(total)
    return out


def test_hand_case_hub_passes_less() -> None:
    # a - x, b - x, h - x, h - y1, h - y2, h - y3: x hears from a, b (degree 1) and the hub h
    links = [("a", "x"), ("b", "x"), ("h", "x"), ("h", "y1"), ("h", "y2"), ("h", "y3")]
    ids = ["a", "b", "h", "x", "y1", "y2", "y3"]
    view = view_of(ids, links)
    node = {cid: i for i, cid in enumerate(ids)}
    sources = np.array([node["a"], node["b"], node["h"]]), np.array([1.0, 0.5, 1.0])
    x, y1, a = neighbour_evidence(view, *sources, [node["x"], node["y1"], node["a"]], 0.5)
    assert x == pytest.approx((1.0 + 0.5) / 3**0.5 + 1.0 / (4 * 3) ** 0.5)
    assert y1 == pytest.approx(1.0 / 4**0.5)  # only the hub, split four ways
    assert a == 0.0  # a source is not its own neighbour; a's one neighbour x is no source
    # every node as a target: more adjacency to walk than from the sources, so the edges are
    # found from the sources' side; the same sums
    every = neighbour_evidence(view, *sources, list(range(7)), 0.5)
    assert every[node["x"]] == x and every[node["y1"]] == y1 and every[node["a"]] == a
    # a larger gamma discounts the hub's share more than the leaves'
    x1, y11 = neighbour_evidence(view, *sources, [node["x"], node["y1"]], 1.0)
    assert x1 == pytest.approx(1.5 / 3 + 1.0 / 12) and y11 == pytest.approx(0.25)


def test_nothing_in_nothing_out() -> None:
    view = view_of(["a", "b"], [("a", "b")])
    none, one = np.array([], np.int64), np.array([0])
    assert neighbour_evidence(view, none, np.array([]), [0, 1]).tolist() == [0.0, 0.0]
    assert neighbour_evidence(view, one, np.array([1.0]), []).tolist() == []
    assert neighbour_evidence(view, one, np.array([0.0]), [1]).tolist() == [0.0]  # no value
    with pytest.raises(ValueError):  # a source listed twice
        neighbour_evidence(view, np.array([0, 0]), np.array([1.0, 2.0]), [1])
    with pytest.raises(ValueError):  # out of range
        neighbour_evidence(view, one, np.array([1.0]), [2])
    # a target listed twice gets its sum twice; the scratch is left clean after a refusal
    twice = neighbour_evidence(view, one, np.array([1.0]), [1, 1])
    assert twice.tolist() == [1.0, 1.0]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    gamma=st.sampled_from([0.0, 0.5, 1.0]),
    hide=st.floats(0.0, 0.5),
)
def test_matches_the_oracle_and_ignores_hidden_and_interning(
    seed: int, gamma: float, hide: float
) -> None:
    rng = random.Random(seed)
    ids, links = random_kb(rng, 40)
    visible = {cid for cid in ids if rng.random() >= hide}
    view = view_of(ids, links, visible)
    node = {cid: i for i, cid in enumerate(ids)}
    picked = rng.sample(ids, 12)
    sources = {cid: rng.choice([0.0, 0.25, 1.0, rng.random()]) for cid in picked}
    targets = [cid for cid in rng.sample(ids, 15) if cid in visible]
    got = neighbour_evidence(
        view,
        np.array([node[c] for c in sources]),
        np.array(list(sources.values())),
        [node[t] for t in targets],
        gamma,
    )
    shown = {node[c]: x for c, x in sources.items() if c in visible}
    want = oracle(view, shown, [node[t] for t in targets], gamma)
    assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)

    # the hidden concepts never written, and the rest interned in another order: same bits
    order = sorted(visible, key=lambda c: rng.random())
    seen = [(a, b) for a, b in links if a in visible and b in visible]
    alone = view_of(order, seen)
    at = {cid: i for i, cid in enumerate(order)}
    kept = [c for c in sources if c in visible]
    again = neighbour_evidence(
        alone,
        np.array([at[c] for c in kept], np.int64),
        np.array([sources[c] for c in kept]),
        [at[t] for t in targets],
        gamma,
    )
    assert again.tolist() == got.tolist()
