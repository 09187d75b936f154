"""One KB's projection: the semantics of each log record, applied as patches.

Semantics of a log record (the store already decided that it applies):

- ``concept.upserted``: the concept exists afterwards with the given fields; its declared
  out-links become ``set(links) - {itself}``.
- ``concept.deleted``: the concept stops existing; its edges and its own declared out-links
  go; other concepts' declared links to it stay declared (edges again once it is re-created).
- ``link.added`` / ``link.removed``: add / remove one declared out-link of the subject.
- Nodes are the existing concepts; an undirected edge u-v (u != v) exists when u declares v or
  v declares u and both exist; a directed out-edge u->v when u declares v and v exists.

Declared links are held without a Python set per node: a declared link to an existing target
*is* the out-block entry (``kbgraph.projection.adjacency``); links to missing targets are kept
in ``_missing_out[u]`` (targets) and ``_pending_in[t]`` (sources), so a concept appearing turns
its declared in-links into edges in O(its degree), and a concept disappearing moves them back
(its undirected neighbours that remain after its own out-links went are exactly the concepts
declaring it).

Arrays grow by doubling; the follower allocates and copies the grown arrays *before* taking
the write lock (it is the only writer, so nothing changes meanwhile) and swaps them in under
it, so requests rarely pay for a copy (only when one batch outgrows the headroom).

Visibility: ``Snapshot.view(rules)`` returns ``View(graph, mask, deg)``. Admin (``None``)
reads ``alive`` and the undirected block lengths directly. Each other ``RuleSet`` gets a mask
and its induced degrees (``kbgraph.projection.masks``), built on first use (numba, O(n + E))
and cached per KB in a bounded LRU (64 entries, at most ``MASK_CACHE_BYTES``); every cached
mask is patched by every event under the write lock. Readers insert into the cache under a
small mutex; evicting only drops a reference, so a reader's ``View`` stays valid.

Search: each KB keeps one ``SearchIndex`` (``kbgraph.search``) as ``index``; ``put`` on every
upsert that creates a concept or changes its title, text, aliases or tags, ``remove`` on every
delete, under the write lock, so search sees the same delivery-whole state as the graph.

(Over 500 lines: one class whose patch methods share its private state; splitting it would
only spread that state across modules.)
"""

from __future__ import annotations

import bisect
import gc
import itertools
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import numpy as np
from numba import njit

from kbgraph.access import RuleSet, visible
from kbgraph.embeddings import Embedder, concept_text, text_hash
from kbgraph.events import (
    ConceptDeleted,
    ConceptUpserted,
    Event,
    LinkAdded,
    LinkRemoved,
)
from kbgraph.names import collection_of
from kbgraph.projection.adjacency import Adjacency, declare, drop, undeclare
from kbgraph.projection.arrays import grown, sorted_unique
from kbgraph.projection.keys import Keys
from kbgraph.projection.masks import Mask, edge_degrees, masked_degrees, node_degrees
from kbgraph.projection.rwlock import RWLock
from kbgraph.projection.snapshot import Snapshot
from kbgraph.projection.vectors import Vectors
from kbgraph.search import SearchIndex
from kbgraph.search.document import Analysed
from kbgraph.store import KBState, LogRecord
from kbgraph.store.columns import KeyIndex, StringColumn, StringTable, process_hashes, strings_at
from kbgraph.store.load import columns_of
from kbgraph.store.model import KBColumns

MAX_BATCH_EVENTS: Final = 2_000
MAX_BATCH_SECONDS: Final = 0.005
MASK_CACHE_ENTRIES: Final = 64
MASK_CACHE_BYTES: Final = 256 << 20
MIN_NODE_CAP: Final = 64
DICT_IDS: Final = 250_000  # a first build finds up to this many ids by a dict


class KBProjection:
    """One KB's projection. Mutated only by the follower thread, under the write lock."""

    def __init__(self, name: str, *, index_factory: Callable[[], SearchIndex] = SearchIndex):
        self.name = name
        self.seq = 0
        self.lock = RWLock()
        self.index = index_factory()
        self._node_cap = MIN_NODE_CAP
        self._index_of: dict[str, int] | KeyIndex = {}
        self.ids: list[str] | StringColumn = []
        self.titles: list[str] | StringColumn = []
        self.aliases: list[list[str]] = []
        self.types: list[str] = []
        self.statuses: list[str] = []
        self.tags: list[list[str]] = []
        self.texts: list[str] | StringColumn = []
        self.versions: list[int] = []
        self.collections: list[str] = []
        self._alive = np.zeros(self._node_cap, np.uint8)
        self._cls = np.zeros(self._node_cap, np.int32)  # (collection, type) class per node
        self._classes: list[tuple[str, str]] = []
        self._class_of: dict[tuple[str, str], int] = {}
        self._collection_names: dict[str, str] = {}
        self._und = Adjacency(self._node_cap)
        self._out = Adjacency(self._node_cap)
        self._keys = Keys([], self._node_cap)
        self._missing_out: dict[int, set[int]] = {}  # u -> declared targets not alive
        self._pending_in: dict[int, set[int]] = {}  # t (not alive) -> sources declaring it
        self._masks: OrderedDict[RuleSet, Mask] = OrderedDict()
        self._masks_lock = threading.Lock()
        self._batch_hint = MAX_BATCH_EVENTS
        self.vectors: Vectors | None = None  # kbgraph.projection.vectors; None: no provider
        self.saved_vectors: tuple[str, int, dict[str, np.ndarray]] | None = None  # checkpoint's

    # --- reading ------------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Snapshot]:
        """Hold the read lock for the whole request; the snapshot is valid inside only."""
        self.lock.acquire_read()
        try:
            yield Snapshot(self)
        finally:
            self.lock.release_read()

    def _mask_for(self, rules: RuleSet) -> Mask:
        """The cached mask for ``rules``, built on a miss (caller holds the read lock)."""
        with self._masks_lock:
            entry = self._masks.get(rules)
            if entry is not None:
                self._masks.move_to_end(rules)
                return entry
        n = len(self.ids)
        lut = np.fromiter(
            (visible(rules, c, t) for c, t in self._classes), np.uint8, len(self._classes)
        )
        mask = np.zeros(self._node_cap, np.uint8)
        deg = np.zeros(self._node_cap, np.int32)
        if n:
            mask[:n] = self._alive[:n] & lut[self._cls[:n]]
            masked_degrees(self._und.off, self._und.len, self._und.pool, mask[:n], deg[:n])
        limit = max(1, min(MASK_CACHE_ENTRIES, MASK_CACHE_BYTES // (5 * self._node_cap)))
        with self._masks_lock:
            entry = self._masks.setdefault(rules, Mask(rules, mask, deg))
            self._masks.move_to_end(rules)
            while len(self._masks) > limit:
                self._masks.popitem(last=False)
        return entry

    # --- building -----------------------------------------------------------------------

    def build(self, state: KBState) -> None:
        """Build from a snapshot (``build_columns`` of its columns). Call before the
        projection is shared."""
        self.build_columns(columns_of(state))

    def build_columns(self, cols: KBColumns) -> None:
        """Build from a KB's columns (vectorised, no object per concept). Call before the
        projection is shared. The projection takes the column lists it is given."""
        n0 = len(cols.ids)
        ids: StringColumn = cols.ids
        encoded = ids.encoded
        src, dst, missing_src, missing_names = _link_columns(cols.links, StringTable(*encoded))
        cols.links = []  # the targets' bytes are no longer needed: free them now
        added: dict[str, int] = {}  # the missing targets, after the store's ids
        for t in sorted(set(missing_names)):
            added[t] = len(ids)
            ids.append(t)
        dst[missing_src] = np.fromiter(map(added.__getitem__, missing_names), np.int64)
        del missing_src, missing_names
        n = len(ids)
        # Up to DICT_IDS a dict (~100 bytes an id; a look-up 0.6 µs, the follower's ~9 an
        # upsert); beyond, as a checkpoint load finds them, by the ids' sorted hashes (Python's
        # own here: never stored), no dict of strings (a look-up ~2.8 µs)
        if n <= DICT_IDS:
            index_of: dict[str, int] | KeyIndex = dict(zip(ids, range(n), strict=True))
        else:
            index_of = KeyIndex(ids, *process_hashes(ids), hasher=hash)
        node_cap = max(MIN_NODE_CAP, 1 << (n - 1).bit_length())
        order = _id_order(ids, n0)
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        to_alive = dst < n0
        for u, t in zip(src[~to_alive].tolist(), dst[~to_alive].tolist(), strict=True):
            self._missing_out.setdefault(u, set()).add(t)
            self._pending_in.setdefault(t, set()).add(u)
        src, dst = src[to_alive], dst[to_alive]
        m = len(src)
        keys = np.empty(2 * m, np.int64)  # out-edge keys, then the reverse edges' for und
        np.multiply(src, n, out=keys[:m])
        keys[:m] += rank[dst]
        np.multiply(dst, n, out=keys[m:])
        keys[m:] += rank[src]
        del src, dst, rank
        self._out = Adjacency.from_keys(sorted_unique(keys[:m].copy()), n, order, node_cap)
        self._und = Adjacency.from_keys(sorted_unique(keys), n, order, node_cap)
        del keys, order

        self._node_cap = node_cap
        self._index_of = index_of
        self.ids = ids
        self._keys = Keys.from_encoded(*encoded, node_cap)
        del encoded
        for t, u in added.items():
            self._keys.add(u, t)
        missing = n - n0
        self.titles, self.texts = cols.titles, cols.texts  # encoded columns, read lazily
        for _ in range(missing):
            self.titles.append("")
            self.texts.append("")
        self.aliases = cols.aliases + [[] for _ in range(missing)]
        self.types = cols.types + [""] * missing
        self.statuses = cols.statuses + [""] * missing
        self.tags = cols.tags + [[] for _ in range(missing)]
        self.versions = cols.versions + [0] * missing
        self.collections = self._collections_of(ids, n0)
        self._alive = np.zeros(node_cap, np.uint8)
        self._alive[:n0] = 1
        self._cls = np.zeros(node_cap, np.int32)
        self._cls[:n] = self._classes_of(self.collections, self.types)
        docs = zip(range(n0), cols.titles, cols.texts, cols.aliases, cols.tags, strict=False)
        self.index.put_many(docs)
        self.seq = cols.seq

    def _collections_of(self, ids: StringColumn, n0: int) -> list[str]:
        """``collection_of`` of every id, one shared string per collection: the store's ids
        (sorted, so an id prefix's rows are runs) split at their first "/" in one compiled
        pass, a string made per run; then the missing targets one by one."""
        blob, off = ids.encoded
        run_row, run_start, run_end = _prefix_runs(blob, off[: n0 + 1])
        lengths = np.diff(np.append(run_row, n0)).tolist()
        out: list[str] = []
        shared = self._collection_names
        for length, start, end in zip(lengths, run_start.tolist(), run_end.tolist(), strict=True):
            name = blob[start:end].tobytes().decode("utf-8", "surrogatepass")
            out.extend(itertools.repeat(shared.setdefault(name, name), length))
        out.extend(self._collection(ids[u]) for u in range(n0, len(ids)))
        return out

    def _classes_of(self, collections: list[str], types: list[str]) -> np.ndarray:
        """The (collection, type) class of every node, classes made in order of first
        appearance: pairs coded as numbers (few distinct strings), not a million tuples."""
        n = len(collections)
        codes: dict[str, int] = {}  # each string -> the row it first appears at
        column = np.fromiter(map(codes.setdefault, collections, itertools.count()), np.int64, n)
        codes = {}
        kind = np.fromiter(map(codes.setdefault, types, itertools.count()), np.int64, n)
        _, first, inverse = np.unique(column * n + kind, return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int32)
        for j in np.argsort(first).tolist():  # in order of first appearance
            row = int(first[j])
            rank[j] = self._class(collections[row], types[row])
        return rank[inverse.reshape(-1)]

    def _collection(self, concept_id: str) -> str:
        """collection_of, one shared string per collection (a million ids, a few names)."""
        name = collection_of(concept_id)
        return self._collection_names.setdefault(name, name)

    def _class(self, collection: str, concept_type: str) -> int:
        key = (collection, concept_type)
        k = self._class_of.get(key)
        if k is None:
            k = self._class_of[key] = len(self._classes)
            self._classes.append(key)
        return k

    # --- vectors (kbgraph.projection.filler settles them, from its own thread) ------------

    def attach_vectors(self, embedder: Embedder | None) -> None:
        """Keep vectors with ``embedder`` (a checkpoint's of the same model are reused); every
        concept without one waits for the filler. Before the KB is shared."""
        if embedder is None:
            self.vectors = None
        elif self.saved_vectors is not None:
            model, dim, arrays = self.saved_vectors
            self.vectors = Vectors.from_arrays(embedder, model, dim, arrays)
        else:
            self.vectors = Vectors(embedder)
        self.saved_vectors = None
        if self.vectors is not None:
            self.vectors.mark_missing(self._alive, len(self.ids))

    def _vector_text(self, u: int, max_chars: int) -> str:
        return concept_text(self.titles[u], self.aliases[u], self.tags[u], self.texts[u])[
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
            dirty = vectors.dirty
            return [(u, self.ids[u], self._vector_text(u, max_chars)) for u in rows if u in dirty]

    def settle_vectors(
        self, results: list[tuple[int, bytes, np.ndarray | None]], max_chars: int
    ) -> int:
        """Install each (row, hash of the text embedded, vector or None: refused) whose row
        still waits with that text (write lock taken here); returns how many."""
        vectors = self.vectors
        if vectors is None or not results:
            return 0
        with self.lock.write():
            rows, got, refused = [], [], []
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
        """Grow or compact outside the write lock; returns the swap to run under it."""
        n = len(self.ids)
        mentions = 0
        for r in records:
            data = r.event.data
            mentions += 2 + len(getattr(data, "links", ()))
        swaps: list[Callable[[], None]] = []
        grow_nodes = n + mentions > self._node_cap
        if grow_nodes:
            new_cap = max(2 * self._node_cap, 1 << (n + mentions - 1).bit_length())
            swaps.append(self._grow_nodes_swap(new_cap))
        self._keys.reserve(n + mentions, 32 * mentions)  # follower-only: grown in place
        for adj in (self._und, self._out):
            if not grow_nodes and adj.needs_compaction():  # both would replace ``off``
                compacted = adj.compacted(n)
                swaps.append(lambda adj=adj, c=compacted: adj.install_compacted(c))
            elif adj.end + 4 * mentions + 64 > 3 * len(adj.pool) // 4:
                pool = grown(adj.pool, adj.end, 2 * len(adj.pool) + 8 * mentions)

                def swap(adj: Adjacency = adj, pool: np.ndarray = pool) -> None:
                    adj.pool = pool

                swaps.append(swap)
        if not swaps:
            return None

        def run() -> None:
            for s in swaps:
                s()

        return run

    def _grow_nodes_swap(self, new_cap: int) -> Callable[[], None]:
        n = len(self.ids)
        und = self._und.grow_nodes(n, new_cap)
        out = self._out.grow_nodes(n, new_cap)
        alive = grown(self._alive, n, new_cap)
        cls = grown(self._cls, n, new_cap)
        with self._masks_lock:
            entries = list(self._masks.values())
        # Keyed by id() but holding the entry itself, so an id cannot be reused meanwhile.
        prepared_masks = {
            id(e): (e, grown(e.mask, n, new_cap), grown(e.deg, n, new_cap)) for e in entries
        }

        def swap() -> None:
            self._und.install_nodes(und)
            self._out.install_nodes(out)
            self._alive, self._cls, self._node_cap = alive, cls, new_cap
            for e in self._masks.values():  # readers may have added entries meanwhile
                prepared = prepared_masks.get(id(e))
                if prepared is not None and prepared[0] is e:
                    e.mask, e.deg = prepared[1], prepared[2]
                else:
                    e.mask, e.deg = grown(e.mask, n, new_cap), grown(e.deg, n, new_cap)

        return swap

    def _grow_nodes_now(self) -> None:
        self._grow_nodes_swap(2 * self._node_cap)()

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
        apply_one = self._apply
        clock = time.perf_counter
        with self.lock.write():
            if swap is not None:
                swap()
            start = clock()
            events = 0
            bounded = False
            for d in deliveries[:taken]:
                for r in d:
                    apply_one(r.event, r.analysis)
                self.seq = d[-1].seq
                done += 1
                events += len(d)
                if events >= MAX_BATCH_EVENTS or clock() - start >= MAX_BATCH_SECONDS:
                    bounded = True
                    break
        # Only a batch that ran out of head before its bounds asks for more: one ended by them
        # asks for what it managed, so the head is not prepared twice as often as it is used.
        self._batch_hint = min(MAX_BATCH_EVENTS, max(64, events if bounded else 2 * events))
        return done

    def _apply(self, event: Event, analysis: Analysed | None = None) -> None:
        """One event's patches; ``analysis`` is its text's, when the log carried it."""
        if isinstance(event, ConceptUpserted):
            self._upsert(event, analysis)
        elif isinstance(event, ConceptDeleted):
            self._delete(event)
        elif isinstance(event, LinkAdded | LinkRemoved):
            self._link_event(event)

    def _intern(self, concept_id: str) -> int:
        u = self._index_of.get(concept_id)
        if u is not None:
            return u
        u = len(self.ids)
        if u >= self._node_cap:
            self._grow_nodes_now()
        self._index_of[concept_id] = u
        self.ids.append(concept_id)
        self._keys.add(u, concept_id)
        collection = self._collection(concept_id)
        self.collections.append(collection)
        self.titles.append("")
        self.aliases.append([])
        self.types.append("")
        self.statuses.append("")
        self.tags.append([])
        self.texts.append("")
        self.versions.append(0)
        self._cls[u] = self._class(collection, "")
        return u

    def _upsert(self, event: ConceptUpserted, analysis: Analysed | None = None) -> None:
        data = event.data
        index_of = self._index_of
        u = index_of.get(event.subject)
        if u is None:
            u = self._intern(event.subject)
        was_alive = bool(self._alive[u])
        # The declared links to existing concepts. A re-upsert mostly repeats them: resolve
        # those through their own ids first, a small dict, as at a million ids each lookup in
        # ``index_of`` costs several cache misses (its table, its entry, its key, its value).
        declared: list[int] = self._out.block(u).tolist() if was_alive else []
        ids = self.ids
        known = {ids[t]: t for t in declared}
        links: set[int] = set()
        for target in data.links:
            t = known.get(target)
            if t is None:
                t = index_of.get(target)
                if t is None:
                    t = self._intern(target)
            links.add(t)
        links.discard(u)
        alive = self._alive
        # An unchanged title, text, aliases and tags leave the search index as it is.
        reindex = (
            not was_alive
            or self.titles[u] != data.title
            or self.texts[u] != data.text
            or self.aliases[u] != data.aliases
            or self.tags[u] != data.tags
        )
        self.titles[u] = data.title
        self.aliases[u] = list(data.aliases)
        self.statuses[u] = data.status
        self.tags[u] = list(data.tags)
        self.texts[u] = data.text
        self.versions[u] = data.version
        type_changed = self.types[u] != data.type
        if type_changed:
            self.types[u] = data.type
            self._cls[u] = self._class(self.collections[u], data.type)
        src: list[int] = []
        dst: list[int] = []
        if not was_alive:
            alive[u] = 1
            self._refresh_visibility(u)  # no edges yet: only u's own mask bits
            for s in self._pending_in.pop(u, ()):
                missing = self._missing_out[s]
                missing.discard(u)
                if not missing:
                    del self._missing_out[s]
                src.append(s)
                dst.append(u)
            new = links
        else:
            if type_changed:
                self._refresh_visibility(u)
            missing = self._missing_out.get(u)
            old = set(declared)
            if missing:
                old |= missing
            if old == links:
                new = set()  # the common re-upsert: nothing to patch
            else:
                gone = [t for t in declared if t not in links]
                if gone:
                    self._undeclare_alive([u] * len(gone), gone)
                if missing:
                    for t in missing - links:
                        self._undeclare_missing(u, t)
                new = links - old
        for t in new:
            if alive[t]:
                src.append(u)
                dst.append(t)
            else:
                self._declare_missing(u, t)
        if src:
            self._declare_alive(src, dst)
        if reindex:
            self.index.put(u, data.title, data.text, data.aliases, data.tags, analysed=analysis)
            if self.vectors is not None:
                self.vectors.changed(u)

    def _pools(self) -> tuple[np.ndarray, ...]:
        """The arrays the removing kernels (``_drop``, ``_undeclare``) take, in their order."""
        und, out, keys = self._und, self._out, self._keys
        return (und.off, und.len, und.pool, und.meta, out.off, out.len, out.pool, out.meta,
                keys.pre, keys.data, keys.off)  # fmt: skip

    def _delete(self, event: ConceptDeleted) -> None:
        u = self._index_of.get(event.subject)
        if u is None or not self._alive[u]:
            return
        missing = self._missing_out.get(u)
        if missing:
            for t in list(missing):
                self._undeclare_missing(u, t)
        # Every undirected edge of u goes; the neighbours declaring u go back to pending.
        nb = self._und.block(u).copy()
        declares = np.zeros(len(nb), np.int8)
        drop(u, nb, declares, *self._pools())
        for e in self._masks.values():
            node_degrees(u, nb, -1, e.mask, e.deg)
        declarers = nb[declares != 0].tolist()
        if declarers:
            for s in declarers:
                self._missing_out.setdefault(s, set()).add(u)
            self._pending_in[u] = set(declarers)
        self._alive[u] = 0
        self._refresh_visibility(u)
        self.versions[u] = event.data.version
        self.texts[u] = ""
        self.tags[u] = []
        self.aliases[u] = []
        self.index.remove(u)
        if self.vectors is not None:
            self.vectors.remove(u)

    def _link_event(self, event: LinkAdded | LinkRemoved) -> None:
        u = self._index_of.get(event.subject)
        if u is None or not self._alive[u]:
            return  # the store never logs these; tolerate them
        t = self._intern(event.data.target)
        if t != u:
            added = isinstance(event, LinkAdded)
            if self._alive[t]:
                if added:
                    self._declare_alive([u], [t])
                else:
                    self._undeclare_alive([u], [t])
            elif added:
                self._declare_missing(u, t)
            elif t in self._missing_out.get(u, ()):
                self._undeclare_missing(u, t)
        self.versions[u] = event.data.version

    def _declare_alive(self, sources: list[int], targets: list[int]) -> None:
        """sources[i] (alive) declares targets[i] (alive, != sources[i]); already declared
        pairs are left as they are."""
        src = np.array(sources, np.int32)
        dst = np.array(targets, np.int32)
        flags = np.empty(len(src), np.int8)
        und, out, keys = self._und, self._out, self._keys
        done = 0
        while True:
            done += declare(
                src[done:],
                dst[done:],
                flags[done:],
                und.off,
                und.len,
                und.cap,
                und.pool,
                und.meta,
                out.off,
                out.len,
                out.cap,
                out.pool,
                out.meta,
                keys.pre,
                keys.data,
                keys.off,
            )
            if done == len(src):
                break
            # Rare: the batch outgrew the headroom ``_prepare`` left.
            und.ensure_room(sources[done], targets[done])
            out.ensure_room(sources[done], targets[done])
        for e in self._masks.values():
            edge_degrees(src, dst, flags, 2, 1, e.mask, e.deg)

    def _undeclare_alive(self, sources: list[int], targets: list[int]) -> None:
        """sources[i] (alive) stops declaring targets[i] (alive); pairs not declared are
        left as they are."""
        src = np.array(sources, np.int32)
        dst = np.array(targets, np.int32)
        flags = np.empty(len(src), np.int8)
        undeclare(src, dst, flags, *self._pools())
        for e in self._masks.values():
            edge_degrees(src, dst, flags, 2, -1, e.mask, e.deg)

    def _declare_missing(self, u: int, t: int) -> None:
        """u (alive) declares t (not alive)."""
        self._missing_out.setdefault(u, set()).add(t)
        self._pending_in.setdefault(t, set()).add(u)

    def _undeclare_missing(self, u: int, t: int) -> None:
        """u (alive) stops declaring t (not alive, declared)."""
        missing = self._missing_out[u]
        missing.discard(t)
        if not missing:
            del self._missing_out[u]
        pending = self._pending_in[t]
        pending.discard(u)
        if not pending:
            del self._pending_in[t]

    def _refresh_visibility(self, u: int) -> None:
        """Recompute u's bit in every cached mask, patching its visible neighbours' degrees."""
        if not self._masks:
            return
        alive = bool(self._alive[u])
        collection, concept_type = self.collections[u], self.types[u]
        nb: np.ndarray | None = None
        for e in self._masks.values():
            now = alive and visible(e.rules, collection, concept_type)
            if now == bool(e.mask[u]):
                continue
            if nb is None:
                nb = self._und.block(u)
            seen = nb[e.mask[nb] != 0]
            if now:
                e.mask[u] = 1
                e.deg[seen] += 1
                e.deg[u] = len(seen)
            else:
                e.mask[u] = 0
                e.deg[seen] -= 1
                e.deg[u] = 0


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk build (it would walk every container the
    build makes, over and over, and find no cycle), on again after, as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@njit(cache=True, nogil=True)
def _prefix_runs(blob, off):  # pragma: no cover - compiled
    """(first row, prefix start, prefix end) of each run of rows whose ids share the part
    before their first "/" (empty: no "/"), in UTF-8 bytes (no multi-byte character holds
    the byte of "/")."""
    n = len(off) - 1
    rows = np.empty(n, np.int64)
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    runs = 0
    for r in range(n):
        start, stop = off[r], off[r + 1] - 1
        end = start
        while end < stop and blob[end] != 47:
            end += 1
        if end == stop:  # no "/": the empty collection
            end = start
        if runs > 0 and end - start == ends[runs - 1] - starts[runs - 1]:
            same = True
            for i in range(end - start):
                if blob[start + i] != blob[starts[runs - 1] + i]:
                    same = False
                    break
            if same:
                continue
        rows[runs], starts[runs], ends[runs] = r, start, end
        runs += 1
    return rows[:runs], starts[:runs], ends[:runs]


def _link_columns(
    links: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], table: StringTable
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(src, dst, rows of dst still to resolve, their target ids) of every declared link
    (``links``: ``KBColumns.links``, chunk by chunk), the targets found by ``table`` (of the
    ids); a target that is no concept gets dst -1 and is listed for the caller to intern."""
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    missing_rows: list[np.ndarray] = []
    missing_names: list[str] = []
    first = done = 0
    for counts, blob, off in links:
        dst = table.find_all(blob, off)
        gone = np.flatnonzero(dst < 0)
        if len(gone):
            missing_rows.append(gone + done)
            missing_names.extend(strings_at(blob, off, gone.tolist()))
        srcs.append(np.repeat(np.arange(first, first + len(counts), dtype=np.int64), counts))
        dsts.append(dst)
        first += len(counts)
        done += len(dst)
    empty = np.zeros(0, np.int64)
    return (
        np.concatenate(srcs) if srcs else empty,
        np.concatenate(dsts) if dsts else empty,
        np.concatenate(missing_rows) if missing_rows else empty,
        missing_names,
    )


def _id_order(ids: Sequence[str], n0: int) -> np.ndarray:
    """The rows of ``ids`` in id order, when ``ids[:n0]`` (the store's, by id) and the rest
    (the missing targets, sorted) are each sorted: the two merged by a bisection per missing
    target, not a sort of a million strings. Otherwise sorted."""
    n = len(ids)
    tail = [ids[i] for i in range(n0, n)]
    if not (_ascending(itertools.islice(ids, n0)) and _ascending(tail)):
        return np.array(sorted(range(n), key=ids.__getitem__), np.int64)
    below = np.array([bisect.bisect_left(ids, t, 0, n0) for t in tail], np.int64)  # rows < t
    rank = np.empty(n, np.int64)
    rank[:n0] = np.arange(n0, dtype=np.int64) + np.searchsorted(below, np.arange(n0), "right")
    rank[n0:] = below + np.arange(n - n0, dtype=np.int64)
    order = np.empty(n, np.int64)
    order[rank] = np.arange(n, dtype=np.int64)
    return order


def _ascending(values: Iterable[str]) -> bool:
    first, second = itertools.tee(values)
    next(second, None)
    return all(map(operator.lt, first, second))
