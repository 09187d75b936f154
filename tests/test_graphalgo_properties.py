"""Properties: masking equals building the induced subgraph, int relabelling changes nothing,
results are deterministic, concurrent calls do not interfere, read-only arrays work."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from graphs import make_graph, masked_view
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kbgraph.graphalgo as ga
from kbgraph.graphalgo import (
    View,
    hops_and_via,
    personalized_pagerank,
    resource_allocation,
    shortest_path,
)

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Case:
    ids: list[str]
    links: list[tuple[str, str]]
    visible: set[str]
    seeds: list[tuple[str, float]]
    pairs: list[tuple[str, str]]
    perm: list[int]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    ids = draw(
        st.lists(
            st.text(alphabet="aAzZé0/_", min_size=1, max_size=4),
            min_size=1,
            max_size=18,
            unique=True,
        )
    )
    n = len(ids)
    idx = st.integers(0, n - 1)
    raw = draw(st.lists(st.tuples(idx, idx), max_size=3 * n))
    links = [(ids[a], ids[b]) for a, b in raw]
    visible = {cid for cid in ids if draw(st.booleans()) or draw(st.booleans())}
    vis = sorted(visible)
    seeds: list[tuple[str, float]] = []
    pairs: list[tuple[str, str]] = []
    if vis:
        vidx = st.integers(0, len(vis) - 1)
        for k, w in draw(st.lists(st.tuples(vidx, st.sampled_from([1.0, 0.5, 1 / 3])), max_size=4)):
            seeds.append((vis[k], w))
        pairs = [(vis[a], vis[b]) for a, b in draw(st.lists(st.tuples(vidx, vidx), max_size=6))]
    perm = draw(st.permutations(list(range(n))))
    return Case(ids, links, visible, seeds, pairs, perm)


def results(view: View, case: Case) -> dict[str, object]:
    """Every algorithm's output, with nodes translated to ids (comparable across numberings)."""
    ids = view.graph.ids
    index = {cid: i for i, cid in enumerate(ids)}
    out: dict[str, object] = {}
    seeds = [(index[cid], w) for cid, w in case.seeds]
    nodes, p = personalized_pagerank(view, seeds, eps=1e-3)
    out["ppr"] = [(ids[u], x.hex()) for u, x in zip(nodes.tolist(), p.tolist(), strict=True)]
    seed_nodes = [index[cid] for cid, _ in case.seeds]
    targets = [index[cid] for cid in sorted(case.visible)]
    hops, via = hops_and_via(view, seed_nodes, targets)
    out["hops"] = [(h, ids[v] if v >= 0 else None) for h, v in zip(hops, via, strict=True)]
    paths = []
    for a, b in case.pairs:
        for direction in ("both", "out"):
            for mh in (1, 3, 12):
                path = shortest_path(view, index[a], index[b], direction, mh)
                paths.append(None if path is None else [ids[u] for u in path])
    out["paths"] = paths
    ra = []
    for cid in sorted(case.visible):
        for mc in (1, 2):
            for s in resource_allocation(view, index[cid], min_common=mc, limit=6):
                ra.append((cid, ids[s.node], s.score.hex(), [ids[z] for z in s.common]))
    out["ra"] = ra
    return out


def masked(case: Case, order: list[str] | None = None) -> View:
    ids = order or case.ids
    g = make_graph(ids, case.links)
    mask = np.array([1 if cid in case.visible else 0 for cid in ids], np.uint8)
    return masked_view(g, mask)


@PROPS
@given(cases())
def test_mask_equals_induced_subgraph(case: Case) -> None:
    induced_ids = [cid for cid in case.ids if cid in case.visible]
    induced_links = [(a, b) for a, b in case.links if a in case.visible and b in case.visible]
    full = make_graph(induced_ids, induced_links)
    built = masked_view(full, np.ones(full.n, np.uint8))
    assert results(masked(case), case) == results(built, case)


@PROPS
@given(cases())
def test_relabelling_changes_nothing(case: Case) -> None:
    relabelled = [case.ids[i] for i in case.perm]
    assert results(masked(case), case) == results(masked(case, relabelled), case)


@PROPS
@given(cases())
def test_deterministic_and_scratch_restored(case: Case) -> None:
    view = masked(case)
    first = results(view, case)
    assert results(view, case) == first
    # and a fresh thread (fresh scratch) agrees with this one's reused scratch
    box: list[dict[str, object]] = []
    t = threading.Thread(target=lambda: box.append(results(view, case)))
    t.start()
    t.join()
    assert box == [first]


def test_concurrent_threads_agree() -> None:
    from loadtest.synthetic import full_view, graph_from_concepts, seed_kb

    view = full_view(graph_from_concepts(seed_kb(300, seed=7)))
    seeds = [(0, 1.0), (1, 0.5)]
    expected = personalized_pagerank(view, seeds)
    exp_ra = resource_allocation(view, 0, limit=5)
    exp_path = shortest_path(view, 0, 297)
    errors: list[str] = []

    def work() -> None:
        for _ in range(30):
            nodes, p = personalized_pagerank(view, seeds)
            if nodes.tolist() != expected[0].tolist() or p.tolist() != expected[1].tolist():
                errors.append("ppr")
            if resource_allocation(view, 0, limit=5) != exp_ra:
                errors.append("ra")
            if shortest_path(view, 0, 297) != exp_path:
                errors.append("path")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def tiny_view() -> ga.View:
    """a - b - c (a -> b, b -> c) and an isolated d; the graph's arrays read-only, the view's
    mask and degrees writeable."""
    und_off = np.array([0, 1, 3, 4], np.int64)
    und_len = np.array([1, 2, 1, 0], np.int32)
    und = np.array([1, 0, 2, 1], np.int32)
    out_off = np.array([0, 1, 2, 2], np.int64)
    out_len = np.array([1, 1, 0, 0], np.int32)
    out = np.array([1, 2], np.int32)
    deg = und_len.copy()
    for a in (und_off, und_len, und, out_off, out_len, out):
        a.flags.writeable = False
    graph = ga.Graph(und_off, und_len, und, out_off, out_len, out, ["a", "b", "c", "d"])
    return ga.View(graph, np.ones(4, np.uint8), deg)


def test_read_only_arrays_and_warm_up() -> None:
    ga.warm_up()
    view = tiny_view()
    assert not view.graph.und.flags.writeable
    assert shortest_path(view, 0, 2) == [0, 1, 2]
    nodes, p = personalized_pagerank(view, [(3, 1.0)])
    assert nodes.tolist() == [3] and p.tolist() == [1.0]
    # every kernel has been compiled for the dtypes the projection uses (writeable or read-only
    # graph arrays x writeable or read-only mask/deg), and nothing else
    from kbgraph.graphalgo._kernels import (
        bfs_path,
        bfs_targets,
        bidir_path,
        ppr_push,
        ra_common,
        ra_scores,
    )

    for kernel in (ppr_push, bfs_targets, bfs_path, bidir_path, ra_scores, ra_common):
        assert len(kernel.signatures) == 4, kernel
