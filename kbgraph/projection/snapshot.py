"""The consistent state of one KB that a request reads, under the KB's read lock."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kbgraph.access import RuleSet
from kbgraph.graphalgo.graph import Graph, View
from kbgraph.search import SearchIndex

if TYPE_CHECKING:
    from kbgraph.projection.kb import KBProjection


class Snapshot:
    """A consistent state of one KB; valid only inside ``KBProjection.read()``'s with-block."""

    __slots__ = (
        "_kb",
        "aliases",
        "graph",
        "ids",
        "index",
        "seq",
        "statuses",
        "tags",
        "texts",
        "titles",
        "types",
        "vectors",
        "versions",
    )

    def __init__(self, kb: KBProjection) -> None:
        nodes, links = kb.nodes, kb.links
        n = len(nodes)
        self._kb = kb
        self.seq: int = kb.seq
        und, out = links.und, links.out
        self.graph = Graph(
            und_off=und.off[:n],
            und_len=und.len[:n],
            und=und.pool,
            out_off=out.off[:n],
            out_len=out.len[:n],
            out=out.pool,
            ids=nodes.ids,
        )
        self.index: SearchIndex = kb.index
        self.ids: Sequence[str] = nodes.ids
        self.titles: Sequence[str] = nodes.titles
        self.aliases: Sequence[list[str]] = nodes.aliases
        self.types: Sequence[str] = nodes.types
        self.statuses: Sequence[str] = nodes.statuses
        self.tags: Sequence[list[str]] = nodes.tags
        self.texts: Sequence[str] = nodes.texts
        self.versions: Sequence[int] = nodes.versions
        self.vectors = kb.vectors  # kbgraph.projection.vectors.Vectors, or None

    def view(self, rules: RuleSet | None) -> View:
        """The subgraph visible under ``rules`` (None = admin: every existing concept)."""
        n = len(self.ids)
        kb = self._kb
        if rules is None:
            return View(self.graph, kb.nodes.alive[:n], kb.links.und.len[:n])
        entry = kb.mask(rules)
        return View(self.graph, entry.mask[:n], entry.deg[:n])

    def node(self, concept_id: str) -> int | None:
        """The int of an existing concept, else None. Ingest stores ids in NFC, so an id not
        found as spelled is looked up in NFC too: an NFD spelling (a macOS file name) finds the
        same concept, while an id stored before normalisation still finds itself."""
        nodes = self._kb.nodes
        u = nodes.find(concept_id)
        if u is None and not concept_id.isascii():
            u = nodes.find(unicodedata.normalize("NFC", concept_id))
        return u if u is not None and nodes.alive[u] else None

    def is_visible(self, node: int, view: View) -> bool:
        return 0 <= node < len(view.mask) and bool(view.mask[node])

    def declared_links(self, node: int) -> list[str]:
        """Sorted ids of the node's declared out-links, missing targets included."""
        ids = self.ids
        return sorted(ids[t] for t in self._kb.links.declared(node))

    def counts(self, view: View) -> tuple[int, int]:
        """(visible concepts, visible undirected edges)."""
        nodes = int(np.count_nonzero(view.mask))
        edges = int(view.deg.sum(dtype=np.int64)) // 2
        return nodes, edges
