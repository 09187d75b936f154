"""Test helpers: build ``Graph`` / ``View`` objects from id-level link lists, and oracles.

A test KB is ``(ids, links)``: ``ids`` the concepts in interning order, ``links`` directed
``(source_id, target_id)`` pairs as written (duplicates and self-links allowed; a target outside
``ids`` is a missing concept).
"""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import networkx as nx
import numpy as np

from kbgraph.graphalgo.graph import Graph, View

try:
    from loadtest.synthetic import build_graph, full_view, masked_view
except ImportError:  # pytest started from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from loadtest.synthetic import build_graph, full_view, masked_view

__all__ = [
    "build_graph",
    "full_view",
    "make_graph",
    "masked_view",
    "nx_digraph",
    "nx_graph",
    "random_kb",
    "view_of",
]

Link = tuple[str, str]


def make_graph(ids: Sequence[str], links: Iterable[Link]) -> Graph:
    """The projection of ``links`` over the concepts ``ids`` (interned in the order given)."""
    index = {cid: i for i, cid in enumerate(ids)}
    src: list[int] = []
    dst: list[int] = []
    for a, b in links:
        if a in index and b in index:
            src.append(index[a])
            dst.append(index[b])
    return build_graph(list(ids), np.array(src, np.int64), np.array(dst, np.int64))


def view_of(ids: Sequence[str], links: Iterable[Link], visible: set[str] | None = None) -> View:
    """A view of the KB showing ``visible`` (default: everything)."""
    g = make_graph(ids, links)
    if visible is None:
        return full_view(g)
    mask = np.array([1 if cid in visible else 0 for cid in ids], np.uint8)
    return masked_view(g, mask)


def nx_graph(view: View) -> nx.Graph:
    """The visible undirected subgraph as a networkx graph on the ints."""
    g = view.graph
    out = nx.Graph()
    vis = [u for u in range(g.n) if view.mask[u]]
    out.add_nodes_from(vis)
    for u in vis:
        s = int(g.und_off[u])
        for v in g.und[s : s + int(g.und_len[u])].tolist():
            if view.mask[v]:
                out.add_edge(u, v)
    return out


def nx_digraph(view: View) -> nx.DiGraph:
    """The visible out-link subgraph as a networkx digraph on the ints."""
    g = view.graph
    out = nx.DiGraph()
    vis = [u for u in range(g.n) if view.mask[u]]
    out.add_nodes_from(vis)
    for u in vis:
        s = int(g.out_off[u])
        for v in g.out[s : s + int(g.out_len[u])].tolist():
            if view.mask[v]:
                out.add_edge(u, v)
    return out


_ALPHABET = "abAZé0/_-"


def random_ids(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct ids over an alphabet that makes code-point order differ from naive order."""
    seen: set[str] = set()
    while len(seen) < n:
        k = rng.randint(1, 4)
        seen.add("".join(rng.choice("abAZé0_-") for _ in range(k)) + f"/{rng.randint(0, 99)}")
    ids = sorted(seen)
    rng.shuffle(ids)
    return ids


def random_kb(rng: random.Random, n: int, *, p_link: float = 0.08) -> tuple[list[str], list[Link]]:
    """A KB with several components, hubs, isolated nodes, reciprocal and duplicate links."""
    ids = random_ids(rng, n)
    n_iso = max(1, n // 10)
    isolated = set(ids[:n_iso])
    rest = ids[n_iso:]
    comps: list[list[str]] = [[], [], []]
    for cid in rest:
        comps[rng.randrange(3)].append(cid)
    links: list[Link] = []
    for comp in comps:
        if len(comp) < 2:
            continue
        hubs = comp[: max(1, len(comp) // 15)]
        for a in comp:
            for b in comp:
                if a != b and rng.random() < p_link:
                    links.append((a, b))
            for h in hubs:
                if h != a and rng.random() < 0.6:
                    links.append((a, h) if rng.random() < 0.5 else (h, a))
        # a spanning chain keeps most of the component connected
        for a, b in itertools.pairwise(comp):
            if rng.random() < 0.7:
                links.append((a, b))
    # noise: duplicates, self-links, missing targets
    links += links[: len(links) // 10]
    links += [(a, a) for a in rest[:3]]
    links += [(a, "zz/missing") for a in rest[:3]]
    assert not any(a in isolated or b in isolated for a, b in links)
    return ids, links
