"""One KB's projection: the semantics of each log record, applied as patches.

Semantics of a log record (the store already decided that it applies):

- ``concept.upserted``: the concept exists afterwards with the given fields; its declared
  out-links become ``set(links) - {itself}``.
- ``concept.deleted``: the concept stops existing; its edges and its own declared out-links
  go; other concepts' declared links to it stay declared (edges again once it is re-created).
- ``link.added`` / ``link.removed``: add / remove one declared out-link of the subject.
- Nodes are the existing concepts; an undirected edge u-v (u != v) exists when u declares v or
  v declares u and both exist; a directed out-edge u->v when u declares v and v exists.

A KB is three parts with their own faces, patched together here: ``nodes``
(``kbgraph.projection.nodes``: the per-node columns, existence and classes), ``links``
(``kbgraph.projection.links``: adjacency, the ids' bytes, links to missing concepts) and
``masks`` (``kbgraph.projection.masks``: the cached visibility masks, patched by every event
under the write lock); plus the search ``index`` and the ``vectors``.

Arrays grow by doubling; the follower allocates and copies the grown arrays *before* taking
the write lock (it is the only writer, so nothing changes meanwhile) and swaps them in under
it, so requests rarely pay for a copy (only when one batch outgrows the headroom).

Visibility: ``Snapshot.view(rules)`` returns ``View(graph, mask, deg)``. Admin (``None``)
reads ``alive`` and the undirected block lengths directly; each other ``RuleSet`` gets a
cached mask and its induced degrees (``mask``).

Search: each KB keeps one ``SearchIndex`` (``kbgraph.search``) as ``index``; ``put`` on every
upsert that creates a concept or changes its title, text, aliases or tags, ``remove`` on every
delete, under the write lock, so search sees the same delivery-whole state as the graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import numpy as np

from kbgraph.access import RuleSet
from kbgraph.embeddings import Embedder, concept_text, text_hash
from kbgraph.events import (
    ConceptDeleted,
    ConceptUpserted,
    Event,
    LinkAdded,
    LinkRemoved,
)
from kbgraph.projection.ahead import Ahead
from kbgraph.projection.arrays import MIN_NODE_CAP
from kbgraph.projection.bulk import gc_paused, parts_of
from kbgraph.projection.links import Links
from kbgraph.projection.masks import Mask, MaskCache
from kbgraph.projection.mentions import Mentions, Saved
from kbgraph.projection.nodes import Nodes
from kbgraph.projection.rwlock import RWLock
from kbgraph.projection.snapshot import Snapshot
from kbgraph.projection.vectors import Vectors
from kbgraph.search import SearchIndex
from kbgraph.search.document import Analysed
from kbgraph.store import KBState, LogRecord
from kbgraph.store.columns import KeyIndex, StringColumn
from kbgraph.store.load import columns_of
from kbgraph.store.model import KBColumns

MAX_BATCH_EVENTS: Final = 2_000
MAX_BATCH_SECONDS: Final = 0.005


class KBProjection:
    """One KB's projection. Mutated only by the follower thread, under the write lock."""

    def __init__(self, name: str, *, index_factory: Callable[[], SearchIndex] = SearchIndex):
        self.name = name
        self.seq = 0
        self.lock = RWLock()
        self.index = index_factory()
        self.nodes = Nodes(MIN_NODE_CAP)
        self.links = Links.empty(MIN_NODE_CAP)
        self.masks = MaskCache()
        self._batch_hint = MAX_BATCH_EVENTS
        self.vectors: Vectors | None = None  # kbgraph.projection.vectors; None: no provider
        self.saved_vectors: tuple[str, int, dict[str, np.ndarray]] | None = None  # checkpoint's
        self.mentions: Mentions | None = None  # kbgraph.projection.mentions; None: off
        self.saved_mentions: Saved | None = None  # a checkpoint's, restored when attached
        self._vocabularies: dict[str, Ahead] = {}  # the index's parts found ahead, by name
        # links declared between existing concepts, gathered until ``_declare_gathered``
        self._gathered: tuple[list[int], list[int]] = ([], [])

    # --- reading ------------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Snapshot]:
        """Hold the read lock for the whole request; the snapshot is valid inside only."""
        self.lock.acquire_read()
        try:
            yield Snapshot(
                self.seq,
                self.nodes,
                self.links,
                self.index,
                self.vectors,
                self.mentions,
                self.mask,
            )
        finally:
            self.lock.release_read()

    def mask(self, rules: RuleSet) -> Mask:
        """The cached mask for ``rules``, built on a miss (caller holds the read lock)."""
        return self.masks.get(rules, self.nodes, self.links.und)

    # --- building -----------------------------------------------------------------------

    def build(self, state: KBState) -> None:
        """Build from a snapshot (``build_columns`` of its columns). Call before the
        projection is shared."""
        self.build_columns(columns_of(state))

    def build_columns(self, cols: KBColumns) -> None:
        """Build from a KB's columns (vectorised, no object per concept; ``bulk``). Call before
        the projection is shared. The projection takes the column lists it is given."""
        n0 = len(cols.ids)
        self.nodes, self.links = parts_of(cols)
        self.index.put_columns(n0, cols.titles, cols.texts, cols.aliases, cols.tags)
        self.seq = cols.seq

    # --- mentions -------------------------------------------------------------------------

    def attach_mentions(self, on: bool) -> None:
        """Keep mention edges (``on``), or none. Restored from the checkpoint's occurrences
        where it carries them, else built now from every text. Before the KB is shared."""
        saved, self.saved_mentions = self.saved_mentions, None
        if not on:
            self.mentions = None
            return
        # the KB's parts, not the KB: a closure over ``self`` made the KB a reference cycle,
        # freed only by a full collection, and never once ``settle_heap`` had frozen it
        nodes = self.nodes
        self.mentions = Mentions(self.index, lambda u: nodes.texts[u], self.links.declared)
        with gc_paused():  # as the KB's own build: many containers made, no cycle
            if saved is not None:
                self.mentions.restore(saved)
            else:
                self.mentions.build(np.flatnonzero(self.nodes.alive[: len(self.nodes)]).tolist())

    # --- vectors (kbgraph.projection.filler settles them, from its own thread) ------------

    def attach_vectors(self, embedder: Embedder | None, carried_key: str = "") -> None:
        """Keep vectors with ``embedder`` (a checkpoint's of the same model are reused); every
        concept without one waits for the filler. ``carried_key``: log rows carrying a
        vector under that key have it installed (``Vectors.changed``). Before the KB is
        shared."""
        if embedder is None:
            self.vectors = None
        elif self.saved_vectors is not None:
            model, dim, arrays = self.saved_vectors
            self.vectors = Vectors.from_arrays(embedder, model, dim, arrays, carried_key)
        else:
            self.vectors = Vectors(embedder, carried_key=carried_key)
        self.saved_vectors = None
        if self.vectors is not None:
            self.vectors.mark_missing(self.nodes.alive, len(self.nodes))

    def _vector_text(self, u: int, max_chars: int) -> str:
        nodes = self.nodes
        return concept_text(nodes.titles[u], nodes.aliases[u], nodes.tags[u], nodes.texts[u])[
            :max_chars
        ]

    def vector_pending(self) -> list[int]:
        """The rows waiting for their vector (read lock taken here)."""
        if self.vectors is None:
            return []
        with self.lock.read():
            return self.vectors.pending()

    def vector_texts(self, rows: list[int], max_chars: int) -> list[tuple[int, str, str]]:
        """(row, id, text embedded) of those of ``rows`` still waiting (read lock taken here)."""
        vectors = self.vectors
        if vectors is None:
            return []
        with self.lock.read():
            dirty, ids = vectors.dirty, self.nodes.ids
            return [(u, ids[u], self._vector_text(u, max_chars)) for u in rows if u in dirty]

    def settle_vectors(
        self, results: list[tuple[int, bytes, np.ndarray | None]], max_chars: int
    ) -> int:
        """Install each (row, hash of the text embedded, vector or None: refused) whose row
        still waits with that text (write lock taken here); returns how many."""
        vectors = self.vectors
        if vectors is None or not results:
            return 0
        with self.lock.write():
            rows: list[int] = []
            got: list[np.ndarray] = []
            refused: list[int] = []
            for u, digest, vector in results:
                if u not in vectors.dirty or text_hash(self._vector_text(u, max_chars)) != digest:
                    continue  # deleted or changed meanwhile: the next round takes it
                if vector is None:
                    refused.append(u)
                else:
                    rows.append(u)
                    got.append(vector)
            if rows:
                vectors.install(rows, np.stack(got))
            vectors.refuse(refused)
        return len(rows) + len(refused)

    # --- growth and compaction (follower thread only) -----------------------------------

    def _prepare(self, records: Sequence[LogRecord]) -> Callable[[], None] | None:
        """Grow or compact outside the write lock, and find the batch's ids ahead (past
        ``DICT_IDS`` ids); returns the swap to run under it."""
        n = len(self.nodes)
        mentions = 0
        for r in records:
            data = r.event.data
            mentions += 2 + len(getattr(data, "links", ()))
        if self.nodes.found_by_hash:  # the batch's ids found at once, not one by one
            self.nodes.find_ahead(_ids_of(records))
        self._find_keys_ahead(records)
        swaps: list[Callable[[], None]] = []
        cap = self.nodes.cap
        grow_nodes = n + mentions > cap
        if grow_nodes:
            swaps.extend(self._grown(max(2 * cap, 1 << (n + mentions - 1).bit_length())))
        swaps.extend(self.links.prepared(n, mentions, grow_nodes))
        if not swaps:
            return None

        def run() -> None:
            for s in swaps:
                s()

        return run

    def _find_keys_ahead(self, records: Sequence[LogRecord]) -> None:
        """The keys the batch's carried analyses name, found at once in each part of the
        search index whose vocabulary is a checkpoint's column (``kbgraph.projection.ahead``:
        its ``key_id`` hashes each key with blake2b and decodes a candidate, ~3 µs a look-up
        and ~25 look-ups an upsert)."""
        index = self.index
        if not isinstance(index, SearchIndex):  # a test's stand-in (``index_factory``)
            return
        analyses: list[Analysed] | None = None
        for part, postings in (
            ("terms", index.terms),
            ("names", index.names),
            ("tags", index.tags),
        ):
            column, key_id = postings.keys, postings.key_id
            if not isinstance(column, StringColumn) or not isinstance(key_id, KeyIndex):
                continue
            ahead = self._vocabularies.get(part)
            if ahead is None or ahead.column is not column:
                ahead = self._vocabularies[part] = Ahead(column)
            if analyses is None:
                analyses = [r.analysis for r in records if r.analysis is not None]
            found = ahead.found(key for analysis in analyses for key in getattr(analysis, part))
            for key in [key for key, k in found.items() if k < 0]:  # interned since, or new
                k = key_id.added(key)
                if k is not None:
                    found[key] = k
            postings.found = found

    def _grown(self, new_cap: int) -> list[Callable[[], None]]:
        """Every part's node arrays grown to ``new_cap``, as swaps."""
        n = len(self.nodes)
        return [part.grown(n, new_cap) for part in (self.links, self.nodes, self.masks)]

    # --- applying (follower thread, write lock held) ------------------------------------

    def apply(self, deliveries: Sequence[Sequence[LogRecord]]) -> int:
        """Apply whole deliveries under the write lock until the batch bound; returns how many.

        The batch is the head prepared for it (grown outside the lock: what the
        last batch managed, twice that after a batch that ran out of head first), and it ends
        early after the delivery that reaches MAX_BATCH_EVENTS events or
        MAX_BATCH_SECONDS; a delivery is never split. Call again with the rest.
        """
        head: list[LogRecord] = []
        taken = 0
        for d in deliveries:
            head.extend(d)
            taken += 1
            if len(head) >= self._batch_hint:
                break
        swap = self._prepare(head)
        done = 0
        apply_one = self._apply_event
        clock = time.perf_counter
        with self.lock.write():
            if swap is not None:
                swap()
            start = clock()
            events = 0
            bounded = False
            try:
                for d in deliveries[:taken]:
                    for r in d:
                        apply_one(r.event, r.analysis)
                    self.seq = d[-1].seq
                    done += 1
                    events += len(d)
                    if events >= MAX_BATCH_EVENTS or clock() - start >= MAX_BATCH_SECONDS:
                        bounded = True
                        break
            finally:  # what was applied, even before a failure, gets its vectors and mentions
                self._settle()
                if self.vectors is not None:
                    self.vectors.install_carried()
                if self.mentions is not None:
                    self.mentions.flush()  # the batch's mention patches, at once
        # Only a batch that ran out of head before its bounds asks for more: one ended by them
        # asks for what it managed, so the head is not prepared twice as often as it is used.
        self._batch_hint = min(MAX_BATCH_EVENTS, max(64, events if bounded else 2 * events))
        return done

    def apply_event(self, event: Event, analysis: Analysed | None = None) -> None:
        """One event's patches (write lock held, or the KB not shared yet); ``analysis`` is
        its text's, when the log carried it."""
        self._apply_event(event, analysis)
        self._settle()
        if self.mentions is not None:
            self.mentions.flush()

    def _settle(self) -> None:
        """The patches gathered over a batch, made at once: the links declared
        (``_declare_gathered``) and the name trie's new names (``SearchIndex.settle``)."""
        self._declare_gathered()
        if isinstance(self.index, SearchIndex):  # not a test's stand-in (``index_factory``)
            self.index.settle()

    def _declare_gathered(self) -> None:
        """The links gathered since the last call, declared in one compiled call (one per
        event cost ~5 µs, most of it the call's 16 array arguments). Gathering is safe while
        the batch's events are upserts creating their concept: a pair gathered joins two
        concepts that existed then, and such an upsert reads and changes none of their
        blocks or mask bits; every other event declares what was gathered first."""
        src, dst = self._gathered
        if src:
            self._gathered = ([], [])
            self.masks.edges_changed(*self.links.declare(src, dst), 1)

    def _apply_event(self, event: Event, analysis: Analysed | None) -> None:
        """``apply_event`` but the mentions' patches, noted for ``Mentions.flush``."""
        if isinstance(event, ConceptUpserted):
            self._upsert(event, analysis)
        elif isinstance(event, ConceptDeleted):
            self._delete(event)
        elif isinstance(event, LinkAdded | LinkRemoved):
            self._link_event(event)
        if self.mentions is not None:
            self.mentions.gen += 1  # visibility may have changed: cached views are stale

    def _intern(self, concept_id: str) -> int:
        nodes = self.nodes
        u = nodes.find(concept_id)
        if u is not None:
            return u
        if len(nodes) >= nodes.cap:
            for swap in self._grown(2 * nodes.cap):
                swap()
        u = nodes.add(concept_id)
        self.links.keys.add(u, concept_id)
        return u

    def _upsert(self, event: ConceptUpserted, analysis: Analysed | None = None) -> None:
        data = event.data
        nodes, links = self.nodes, self.links
        u = nodes.find(event.subject)
        if u is None:
            u = self._intern(event.subject)
        alive = nodes.alive
        was_alive = bool(alive[u])
        if was_alive:  # its blocks and mask bits are read below: gathered links first
            self._declare_gathered()
        # The declared links to existing concepts. A re-upsert mostly repeats them: resolve
        # those through their own ids first, a small dict, as at a million ids each lookup in
        # the id index costs several cache misses (its table, its entry, its key, its value).
        declared: list[int] = links.out.block(u).tolist() if was_alive else []
        ids = nodes.ids
        known = {ids[t]: t for t in declared}
        targets: set[int] = set()
        for target in data.links:
            t = known.get(target)
            if t is None:
                t = nodes.find(target)
                if t is None:
                    t = self._intern(target)
            targets.add(t)
        targets.discard(u)
        alive = nodes.alive  # interning may have grown it
        old_text = nodes.texts[u] if was_alive else None
        reindex, type_changed = nodes.update(u, data, was_alive)
        src: list[int] = []
        dst: list[int] = []
        new: set[int]
        relinked = True
        if not was_alive:
            alive[u] = 1
            self.masks.refresh(u, nodes, links.und)  # no edges yet: only u's own mask bits
            for s in links.take_pending(u):
                src.append(s)
                dst.append(u)
            new = targets
        else:
            if type_changed:
                self.masks.refresh(u, nodes, links.und)
            missing = links.missing_out.get(u)
            old = set(declared)
            if missing:
                old |= missing
            relinked = old != targets
            if not relinked:
                new = set()  # the common re-upsert: nothing to patch
            else:
                gone = [t for t in declared if t not in targets]
                if gone:
                    self.masks.edges_changed(*links.undeclare([u] * len(gone), gone), -1)
                if missing:
                    for t in missing - targets:
                        links.undeclare_missing(u, t)
                new = targets - old
        for t in new:
            if alive[t]:
                src.append(u)
                dst.append(t)
            else:
                links.declare_missing(u, t)
        if src:  # declared at the next ``_declare_gathered``, with the batch's next ones
            gathered_src, gathered_dst = self._gathered
            gathered_src += src
            gathered_dst += dst
        mentions = self.mentions
        if reindex:
            old_names = self.index.names.node_keys_of(u) if mentions is not None else []
            self.index.put(u, data.title, data.text, data.aliases, data.tags, analysed=analysis)
            if self.vectors is not None:
                self.vectors.changed(u, analysis)
            if mentions is not None:
                scanned = old_text != data.text
                if scanned:
                    mentions.text_changed(u)
                mentions.names_changed(u, old_names, self.index.names.node_keys_of(u))
                if not scanned and relinked:
                    mentions.links_changed(u)
        elif mentions is not None and relinked:
            mentions.links_changed(u)

    def _delete(self, event: ConceptDeleted) -> None:
        self._declare_gathered()
        nodes = self.nodes
        u = nodes.find(event.subject)
        if u is None or not nodes.alive[u]:
            return
        # Every undirected edge of u goes; the neighbours declaring u go back to pending.
        nb = self.links.drop(u)
        self.masks.node_dropped(u, nb)
        nodes.clear(u, event.data.version)
        self.masks.refresh(u, nodes, self.links.und)
        mentions = self.mentions
        old_names = self.index.names.node_keys_of(u) if mentions is not None else []
        self.index.remove(u)
        if mentions is not None:
            mentions.dropped(u)
            mentions.names_changed(u, old_names, [])
        if self.vectors is not None:
            self.vectors.remove(u)

    def _link_event(self, event: LinkAdded | LinkRemoved) -> None:
        self._declare_gathered()
        nodes, links = self.nodes, self.links
        u = nodes.find(event.subject)
        if u is None or not nodes.alive[u]:
            return  # the store never logs these; tolerate them
        t = self._intern(event.data.target)
        if t != u:
            added = isinstance(event, LinkAdded)
            if nodes.alive[t]:
                if added:
                    self.masks.edges_changed(*links.declare([u], [t]), 1)
                else:
                    self.masks.edges_changed(*links.undeclare([u], [t]), -1)
            elif added:
                links.declare_missing(u, t)
            elif t in links.missing_out.get(u, ()):
                links.undeclare_missing(u, t)
            if self.mentions is not None:
                self.mentions.links_changed(u)
        nodes.versions[u] = event.data.version


def _ids_of(records: Sequence[LogRecord]) -> Iterator[str]:
    """Every concept id the records name: subjects, declared links, link targets."""
    for r in records:
        event = r.event
        yield event.subject
        if isinstance(event, ConceptUpserted):
            yield from event.data.links
        elif isinstance(event, LinkAdded | LinkRemoved):
            yield event.data.target
