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
        n = len(kb.ids)
        self._kb = kb
        self.seq: int = kb.seq
        self.graph = Graph(
            und_off=kb._und.off[:n],
            und_len=kb._und.len[:n],
            und=kb._und.pool,
            out_off=kb._out.off[:n],
            out_len=kb._out.len[:n],
            out=kb._out.pool,
            ids=kb.ids,
        )
        self.index: SearchIndex = kb.index
        self.ids: Sequence[str] = kb.ids
        self.titles: Sequence[str] = kb.titles
        self.aliases: Sequence[list[str]] = kb.aliases
        self.types: Sequence[str] = kb.types
        self.statuses: Sequence[str] = kb.statuses
        self.tags: Sequence[list[str]] = kb.tags
        self.texts: Sequence[str] = kb.texts
        self.versions: Sequence[int] = kb.versions
        self.vectors = kb.vectors  # kbgraph.projection.vectors.Vectors, or None

    def view(self, rules: RuleSet | None) -> View:
        """The subgraph visible under ``rules`` (None = admin: every existing concept)."""
        n = len(self.ids)
        kb = self._kb
        if rules is None:
            return View(self.graph, kb._alive[:n], kb._und.len[:n])
        entry = kb._mask_for(rules)
        return View(self.graph, entry.mask[:n], entry.deg[:n])

    def node(self, concept_id: str) -> int | None:
        """The int of an existing concept, else None. Ingest stores ids in NFC, so an id not
        found as spelled is looked up in NFC too: an NFD spelling (a macOS file name) finds the
        same concept, while an id stored before normalisation still finds itself."""
        kb = self._kb
        u = kb._index_of.get(concept_id)
        if u is None and not concept_id.isascii():
            u = kb._index_of.get(unicodedata.normalize("NFC", concept_id))
        return u if u is not None and kb._alive[u] else None

    def is_visible(self, node: int, view: View) -> bool:
        return 0 <= node < len(view.mask) and bool(view.mask[node])

    def declared_links(self, node: int) -> list[str]:
        """Sorted ids of the node's declared out-links, missing targets included."""
        kb = self._kb
        ids = kb.ids
        out = [ids[t] for t in kb._out.block(node).tolist()]
        missing = kb._missing_out.get(node)
        if missing:
            out.extend(ids[t] for t in missing)
            out.sort()
        return out

    def counts(self, view: View) -> tuple[int, int]:
        """(visible concepts, visible undirected edges)."""
        nodes = int(np.count_nonzero(view.mask))
        edges = int(view.deg.sum(dtype=np.int64)) // 2
        return nodes, edges
