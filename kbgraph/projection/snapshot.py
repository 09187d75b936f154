"""The consistent state of one KB that a request reads, under the KB's read lock."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from kbgraph.access import RuleSet
from kbgraph.graphalgo.graph import Graph, View
from kbgraph.projection.links import Links
from kbgraph.projection.masks import Mask
from kbgraph.projection.mentions import Mentions
from kbgraph.projection.nodes import Nodes
from kbgraph.projection.vectors import Vectors
from kbgraph.search import SearchIndex


class Snapshot:
    """A consistent state of one KB; valid only inside ``KBProjection.read()``'s with-block."""

    __slots__ = (
        "_links",
        "_mask",
        "_nodes",
        "aliases",
        "graph",
        "ids",
        "index",
        "mentions",
        "seq",
        "statuses",
        "tags",
        "texts",
        "titles",
        "types",
        "vectors",
        "versions",
    )

    def __init__(
        self,
        seq: int,
        nodes: Nodes,
        links: Links,
        index: SearchIndex,
        vectors: Vectors | None,
        mentions: Mentions | None,
        mask: Callable[[RuleSet], Mask],
    ) -> None:
        """The KB's parts as they are under its read lock; ``mask`` gives the cached
        visibility mask of a set of rules (``KBProjection.mask``)."""
        n = len(nodes)
        self._nodes, self._links, self._mask = nodes, links, mask
        self.seq = seq
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
        self.index = index
        self.ids: Sequence[str] = nodes.ids
        self.titles: Sequence[str] = nodes.titles
        self.aliases: Sequence[list[str]] = nodes.aliases
        self.types: Sequence[str] = nodes.types
        self.statuses: Sequence[str] = nodes.statuses
        self.tags: Sequence[list[str]] = nodes.tags
        self.texts: Sequence[str] = nodes.texts
        self.versions: Sequence[int] = nodes.versions
        self.vectors = vectors  # None: no provider
        self.mentions = mentions  # None: mentions off for this KB

    def view(self, rules: RuleSet | None) -> View:
        """The subgraph visible under ``rules`` (None = admin: every existing concept)."""
        n = len(self.ids)
        if rules is None:
            return View(self.graph, self._nodes.alive[:n], self._links.und.len[:n])
        entry = self._mask(rules)
        return View(self.graph, entry.mask[:n], entry.deg[:n])

    def node(self, concept_id: str) -> int | None:
        """The int of an existing concept, else None. Ingest stores ids in NFC, so an id not
        found as spelled is looked up in NFC too: an NFD spelling (a macOS file name) finds the
        same concept, while an id stored before normalisation still finds itself."""
        nodes = self._nodes
        u = nodes.find(concept_id)
        if u is None and not concept_id.isascii():
            u = nodes.find(unicodedata.normalize("NFC", concept_id))
        return u if u is not None and nodes.alive[u] else None

    def is_visible(self, node: int, view: View) -> bool:
        return 0 <= node < len(view.mask) and bool(view.mask[node])

    def declared_links(self, node: int) -> list[str]:
        """Sorted ids of the node's declared out-links, missing targets included."""
        ids = self.ids
        return sorted(ids[t] for t in self._links.declared(node))

    def counts(self, view: View) -> tuple[int, int]:
        """(visible concepts, visible undirected edges)."""
        nodes = int(np.count_nonzero(view.mask))
        edges = int(view.deg.sum(dtype=np.int64)) // 2
        return nodes, edges
