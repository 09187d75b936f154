"""What the checkpoint tests share: a filled store and its projection, the checkpoint written
of it, and what readers see of a projection (``everything``), to compare a restart with a build."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kbgraph.access import RuleSet
from kbgraph.projection import Projections
from kbgraph.store import Store
from tests.histories import KB, dump
from tests.kb_events import upsert

QUERIES = ["dns", "resolver body", "router", "x", "y"]


def everything(p: Projections, rule_sets: list[RuleSet | None]) -> dict[str, Any] | None:
    """The projection (``dump``) and its search index as readers see them."""
    kb = p.get(KB)
    graph = dump(kb, rule_sets)
    if kb is None:
        return graph
    with kb.read() as snap:
        mask = snap.view(None).mask
        n = len(snap.ids)
        index = snap.index
        search = {}
        for query in QUERIES:
            nodes, scores = index.search(query, mask)
            search[query] = sorted(
                (snap.ids[u], round(s, 9))
                for u, s in zip(nodes.tolist(), scores.tolist(), strict=True)
            )
        docs = {
            snap.ids[u]: (index.doc_terms(u), index.doc_tags(u), list(snap.aliases[u]))
            for u in range(n)
            if mask[u]
        }
        named = {t: sorted(snap.ids[u] for u in index.named((t,))) for t in ("dns", "router")}
        stats = index.visible_stats(mask)
        mentions = None
        if kb.mentions is not None:
            seen = kb.mentions.view(mask)
            mentions = sorted((snap.ids[u], snap.ids[v]) for u in range(n) for v in seen.out(u))
    return {
        "graph": graph,
        "search": search,
        "docs": docs,
        "named": named,
        "stats": stats,
        "mentions": mentions,
    }


def projections(store: Store, folder: Path, **kwargs: Any) -> Projections:
    p = Projections(store, checkpoints=folder, **kwargs)
    p.load()
    return p


def reap(p: Projections, seconds: float, why: str) -> None:
    """Wait, within ``seconds``, until the forked checkpoint writer is reaped (``why`` says
    what missing the deadline means)."""
    deadline = time.monotonic() + seconds
    while p.reap_checkpoint():
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def filled(tmp: Path, count: int = 30) -> tuple[Store, Projections]:
    store = Store(tmp / "kb.db")
    for i in range(count):
        store.append(KB, [upsert(f"c{i}", title=f"DNS {i}", text="resolver", links=["c0"])])
    return store, projections(store, tmp / "ckpt", log_retain=0)


def written(tmp: Path) -> tuple[Store, Path, dict[str, Any] | None]:
    """A filled store, the checkpoint written of it, and what a build from it answers."""
    store, p = filled(tmp)
    path = p.write_checkpoint()
    assert path is not None
    fresh = Projections(store)
    fresh.load()
    return store, path, everything(fresh, [None])
