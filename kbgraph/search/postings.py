"""Inverted lists in flat arrays: a read-only base in CSR form, plus an overlay of changes.

A million concepts' postings as Python objects (a dict per key, an int object per posting)
cost about a gigabyte and seconds to build; as arrays they are 16 bytes a posting, placed by
key in one compiled counting pass, and a checkpoint loads them by mapping its file. The base
never changes in place: re-indexing or removing a node the base holds clears its
``base_live`` flag (its base postings are skipped from then on), and every node put after the
base lives in the overlay, a dict per key. ``arrays`` folds the overlay into a new base, in
the form ``from_arrays`` takes back (what a checkpoint stores). A reader gets a key's holders
as arrays, cached until the key changes.

Keys are interned to ints for good (``keys``, ``key_id``), as concept ids are.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, Protocol, overload

import numpy as np
from numba import njit

_EMPTY: Final = (np.empty(0, np.int64), np.empty(0, np.int64))
ARRAY_NAMES: Final = ("key_off", "post_node", "post_hits", "node_off", "node_keys", "base_live")


class KeyList(Protocol):
    """The interned keys by id: a list, or a checkpoint's column (appended to in memory)."""

    def __len__(self) -> int: ...
    def __getitem__(self, k: int, /) -> str: ...
    def __iter__(self) -> Iterator[str]: ...
    def append(self, key: str, /) -> None: ...


class KeyIds(Protocol):
    """key -> id of a ``KeyList``: a dict, or a checkpoint's hashed index of its column."""

    @overload
    def get(self, key: str, /) -> int | None: ...
    @overload
    def get(self, key: str, default: int, /) -> int: ...
    def __setitem__(self, key: str, value: int, /) -> None: ...


@njit(cache=True, nogil=True)
def _live_holders(
    nodes: np.ndarray,
    hits: np.ndarray,
    live: np.ndarray,
    mask: int,
    extra: np.ndarray,
    extra_hits: np.ndarray,
) -> np.ndarray:
    """A key's holders with hits ``& mask`` nonzero, ascending: its base postings (``nodes``
    ascending) still live, and the overlay's ``extra`` (a node is in one or the other)."""
    more = np.empty(len(extra), np.int64)
    m = 0
    for i in range(len(extra)):
        if (extra_hits[i] & mask) != 0:
            more[m] = extra[i]
            m += 1
    more = np.sort(more[:m])
    out = np.empty(len(nodes) + m, np.int64)
    n = j = 0
    for i in range(len(nodes)):
        u = np.int64(nodes[i])
        if live[u] == 0 or (hits[i] & mask) == 0:
            continue
        while j < m and more[j] < u:
            out[n] = more[j]
            n += 1
            j += 1
        out[n] = u
        n += 1
    out[n : n + m - j] = more[j:]
    return out[: n + m - j]


@njit(cache=True, nogil=True)
def _intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The values of both ascending, distinct arrays."""
    out = np.empty(min(len(a), len(b)), np.int64)
    n = i = j = 0
    while i < len(a) and j < len(b):
        if a[i] < b[j]:
            i += 1
        elif a[i] > b[j]:
            j += 1
        else:
            out[n] = a[i]
            n += 1
            i += 1
            j += 1
    return out[:n]


class Postings:
    """Which nodes hold each key, with a count of hits (``int64``, the caller's packing)."""

    def __init__(self, keys: KeyList | None = None, key_id: KeyIds | None = None) -> None:
        """``keys`` and ``key_id`` (both or neither): the keys interned so far; none when
        not given."""
        self.keys: KeyList = [] if keys is None else keys
        self.key_id: KeyIds = {} if key_id is None else key_id
        # The base. Key k's postings: post_node/post_hits[key_off[k]:key_off[k + 1]], by node.
        # Node u's keys, in the order put: node_keys[node_off[u]:node_off[u + 1]].
        self.key_off = np.zeros(1, np.int64)
        self.post_node = np.zeros(0, np.int32)
        self.post_hits = np.zeros(0, np.int64)
        self.node_off = np.zeros(1, np.int64)
        self.node_keys = np.zeros(0, np.int32)
        self.base_live = np.zeros(0, np.uint8)  # 1: the node's postings are the base's
        # The overlay: nodes put after the base.
        self._added: dict[int, dict[int, int]] = {}  # key -> node -> hits
        self._node_added: dict[int, tuple[int, ...]] = {}  # node -> keys, in the order put
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.count = 0  # nodes held
        # Keys found ahead (a batch's, by the follower: ``kbgraph.projection.kb``), tried
        # before ``key_id``, which costs microseconds a look-up when it is a checkpoint's:
        # each key's id, or -1 for a key not interned yet.
        self.found: dict[str, int] = {}

    # --- changing ---------------------------------------------------------------------------

    def _intern(self, key: str) -> int:
        k = self.key_id.get(key)
        if k is None:
            k = self.key_id[key] = len(self.keys)
            self.keys.append(key)
        return k

    def _intern_new(self, key: str) -> int:
        """``_intern`` of a key ``found`` says is in no vocabulary yet: interned without a
        look-up, and ``found`` from then on."""
        k = self.key_id[key] = self.found[key] = len(self.keys)
        self.keys.append(key)
        return k

    def put(self, node: int, items: Iterable[tuple[str, int]]) -> None:
        """Hold ``node`` with these (key, hits) pairs (distinct keys), replacing what it had."""
        self.remove(node)
        self.add(node, items)

    def add(self, node: int, items: Iterable[tuple[str, int]]) -> None:
        """``put`` of a node not held (its caller has just removed it)."""
        ids = []
        added, intern = self._added, self._intern
        get = self.found.get if self.found else self.key_id.get
        for key, hits in items:  # the follower's hot loop: ~20 keys per concept
            k = get(key)
            if k is None:
                k = intern(key)
            elif k < 0:  # found ahead as a key not interned yet
                k = self._intern_new(key)
            holders = added.get(k)
            if holders is None:
                added[k] = {node: hits}
            else:
                holders[node] = hits
            ids.append(k)
        self._uncache(ids)
        self._node_added[node] = tuple(ids)
        self.count += 1

    def remove(self, node: int) -> bool:
        """Forget ``node``; False when it was not held."""
        base_live = self.base_live
        if node < len(base_live) and base_live[node]:
            base_live[node] = 0
            if self._cache:  # its keys read only then: two more scattered reads at 1M nodes
                start, end = self.node_off[node], self.node_off[node + 1]
                self._uncache(self.node_keys[start:end].tolist())
            self.count -= 1
            return True
        ids = self._node_added.pop(node, None)
        if ids is None:
            return False
        added = self._added
        for k in ids:
            holders = added[k]
            del holders[node]
            if not holders:
                del added[k]
        self._uncache(ids)
        self.count -= 1
        return True

    def _uncache(self, ids: Iterable[int]) -> None:
        """Drop the cached holders of ``ids``: those cached found by one set intersection (in
        C), not a lookup per key."""
        cache = self._cache
        if cache:
            for k in cache.keys() & ids:
                del cache[k]

    @classmethod
    def built(cls, nodes: Iterable[tuple[int, Iterable[tuple[str, int]]]]) -> Postings:
        """Postings of these (node, items) made in one pass: all base, no overlay."""
        builder = PostingsBuilder()
        for node, items in nodes:
            builder.add(node, items)
        return builder.build()

    def _install(
        self, held: np.ndarray, node_off: np.ndarray, key: np.ndarray, hits: np.ndarray
    ) -> None:
        """The base from the nodes ``held`` (ascending) and rows (key int32, hits) grouped by
        node, node u's at ``node_off[u]:node_off[u + 1]`` in its key order: each key's
        postings placed by one compiled counting pass (no sort, no int64 index per row)."""
        size = len(node_off) - 1
        self.base_live = np.zeros(size, np.uint8)
        self.base_live[held] = 1
        self.count = len(held)
        self.node_off = node_off
        self.node_keys = np.ascontiguousarray(key, np.int32)
        self.key_off = np.zeros(len(self.keys) + 1, np.int64)
        np.cumsum(np.bincount(self.node_keys, minlength=len(self.keys)), out=self.key_off[1:])
        self.post_node = np.empty(len(key), np.int32)
        self.post_hits = np.empty(len(key), np.int64)
        _place_by_key(node_off, self.node_keys, hits, self.key_off, self.post_node, self.post_hits)

    # --- reading ----------------------------------------------------------------------------

    def holders(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(nodes int64, hits int64) of the nodes holding ``key``; read-only, cached."""
        k = self.key_id.get(key)
        if k is None:
            return _EMPTY
        cached = self._cache.get(k)
        if cached is not None:
            return cached
        nodes_parts = []
        hits_parts = []
        if k + 1 < len(self.key_off):
            start, end = self.key_off[k], self.key_off[k + 1]
            nodes = self.post_node[start:end]
            live = self.base_live[nodes] != 0
            nodes_parts.append(nodes[live].astype(np.int64))
            hits_parts.append(self.post_hits[start:end][live])
        added = self._added.get(k)
        if added:
            nodes_parts.append(np.fromiter(added, np.int64, len(added)))
            hits_parts.append(np.fromiter(added.values(), np.int64, len(added)))
        if not nodes_parts:
            return _EMPTY
        arrays = (np.concatenate(nodes_parts), np.concatenate(hits_parts))
        for a in arrays:
            a.flags.writeable = False
        self._cache[k] = arrays
        return arrays

    def held_by(self, key: str) -> int:
        """How many nodes hold ``key`` (``holders``' count, without making or caching its
        arrays: a writer's look-up, as ``holding_all``)."""
        k = self.found.get(key, -1) if self.found else -1
        if k < 0:
            found = self.key_id.get(key)
            if found is None:
                return 0
            k = found
        count = len(self._added.get(k, ()))
        if k + 1 < len(self.key_off):
            start, end = self.key_off[k], self.key_off[k + 1]
            if start < end:
                count += int(np.count_nonzero(self.base_live[self.post_node[start:end]]))
        return count

    def holding_all(self, keys: Iterable[str], mask: int) -> np.ndarray:
        """The nodes holding every one of ``keys`` with hits ``& mask`` nonzero, ascending:
        the keys with the fewest postings first, so that a rare key ends it early. Not cached
        (``holders`` is): a writer's look-up, whose cached arrays every later put of one of
        these keys would have to drop."""
        spans = []
        for key in keys:
            k = self.key_id.get(key)
            if k is None:
                return _EMPTY[0]
            start, end = self.key_off[k : k + 2] if k + 1 < len(self.key_off) else (0, 0)
            added = self._added.get(k, {})
            spans.append((end - start + len(added), start, end, added))
        spans.sort(key=lambda span: span[0])
        found: np.ndarray | None = None
        for _, start, end, added in spans:
            extra, extra_hits = _EMPTY
            if added:
                extra = np.fromiter(added.keys(), np.int64, len(added))
                extra_hits = np.fromiter(added.values(), np.int64, len(added))
            held = _live_holders(
                self.post_node[start:end],
                self.post_hits[start:end],
                self.base_live,
                mask,
                extra,
                extra_hits,
            )
            found = held if found is None else _intersect(found, held)
            if not found.size:
                break
        return _EMPTY[0] if found is None else found

    def node_keys_of(self, node: int) -> list[str]:
        """The keys ``node`` holds, in the order they were put."""
        if node < len(self.base_live) and self.base_live[node]:
            ids: Iterable[int] = self.node_keys[
                self.node_off[node] : self.node_off[node + 1]
            ].tolist()
        else:
            ids = self._node_added.get(node, ())
        keys = self.keys
        return [keys[k] for k in ids]

    def holds(self, node: int) -> bool:
        return bool(node < len(self.base_live) and self.base_live[node]) or (
            node in self._node_added
        )

    def counts(self) -> dict[str, int]:
        """key -> how many nodes hold it, of every key held (counted in numpy: a first use
        of the name trie after a build reads every name)."""
        rows = np.repeat(self.base_live, np.diff(self.node_off)) != 0
        found = np.bincount(self.node_keys[rows], minlength=len(self.keys))
        for k, holders in self._added.items():
            found[k] += len(holders)
        keys = self.keys
        return {
            keys[k]: n
            for k, n in zip(np.flatnonzero(found).tolist(), found[found > 0].tolist(), strict=True)
        }

    def as_dict(self) -> dict[str, dict[int, int]]:
        """key -> node -> hits of every key held by some node (for inspection and tests)."""
        out: dict[str, dict[int, int]] = {}
        for key in self.keys:
            nodes, hits = self.holders(key)
            if len(nodes):
                out[key] = dict(zip(nodes.tolist(), hits.tolist(), strict=True))
        return out

    # --- the base as arrays (checkpoints) ---------------------------------------------------

    def arrays(self) -> tuple[KeyList, dict[str, np.ndarray]]:
        """(keys, arrays): base and overlay folded into one base, for ``from_arrays``."""
        size = max(len(self.base_live), max(self._node_added, default=-1) + 1)
        live = np.zeros(size, np.uint8)
        live[: len(self.base_live)] = self.base_live
        counts = np.diff(self.node_off)
        base_rows = np.repeat(live[: len(counts)], counts) != 0
        base_node = np.repeat(np.arange(len(counts), dtype=np.int64), counts)[base_rows]
        base_key = self.node_keys[base_rows].astype(np.int64)
        # each base row's hits, looked up in the postings (sorted by key, then node)
        key_of_post = np.repeat(
            np.arange(len(self.key_off) - 1, dtype=np.int64), np.diff(self.key_off)
        )
        post_rank = key_of_post * max(size, 1) + self.post_node
        want = base_key * max(size, 1) + base_node
        base_hits = self.post_hits[np.searchsorted(post_rank, want)] if len(want) else want
        over = sorted(self._node_added.items())
        over_node = np.array([u for u, ids in over for _ in ids], np.int64)
        over_key = np.array([k for _, ids in over for k in ids], np.int64)
        over_hits = np.array([self._added[k][u] for u, ids in over for k in ids], np.int64)
        held = np.flatnonzero(live[: len(self.base_live)]).tolist() + [u for u, _ in over]
        node = np.concatenate([base_node, over_node])
        key = np.concatenate([base_key, over_key])
        hits = np.concatenate([base_hits, over_hits])
        order = np.argsort(node, kind="stable")  # node by node, each in its key order
        held_nodes = np.array(sorted(held), np.int64)
        size = int(held_nodes[-1]) + 1 if len(held_nodes) else 0
        node_off = np.zeros(size + 1, np.int64)
        np.cumsum(np.bincount(node, minlength=size), out=node_off[1:])
        folded = Postings()
        folded.keys, folded.key_id = self.keys, self.key_id
        folded._install(held_nodes, node_off, key[order], hits[order])
        return self.keys, {name: getattr(folded, name) for name in ARRAY_NAMES}

    @classmethod
    def from_arrays(
        cls,
        keys: KeyList,
        key_id: KeyIds | None,
        arrays: Mapping[str, np.ndarray],
    ) -> Postings:
        """A base from ``arrays()`` (the arrays may be read-only maps of a file: ``base_live``
        is copied, the rest only read); ``key_id`` finds each of ``keys`` (built when None)."""
        if key_id is None:
            key_id = dict(zip(keys, range(len(keys)), strict=True))
        postings = cls(keys, key_id)
        for name in ARRAY_NAMES:
            setattr(postings, name, arrays[name])
        postings.base_live = np.array(arrays["base_live"], np.uint8)
        postings.count = int(np.count_nonzero(postings.base_live))
        return postings


class PostingsBuilder:
    """Rows (key, hits) of each node gathered as flat machine integers (int32 keys, the nodes
    apart: each held node once, with its row count), then one ``Postings`` base in one
    compiled pass: what ``Postings.built`` does, without a Python object per posting."""

    def __init__(self) -> None:
        self._keys: list[str] = []  # the postings' own: extended here many at a time
        self._key_id: dict[str, int] = {}
        self.postings = Postings(self._keys, self._key_id)
        self._held = array("i")  # the nodes held, ascending
        self._rows = array("i")  # how many rows each of them has
        self._key = array("i")
        self._hits = array("q")

    def add(self, node: int, items: Iterable[tuple[str, int]]) -> None:
        """Hold ``node`` (after every node added before) with these (key, hits) pairs
        (distinct keys, in the order to keep)."""
        key_id, intern = self.postings.key_id, self.postings._intern
        rows = 0
        key_col, hits_col = self._key, self._hits
        for key, hits in items:
            k = key_id.get(key)
            key_col.append(intern(key) if k is None else k)
            hits_col.append(hits)
            rows += 1
        self._held.append(node)
        self._rows.append(rows)

    def intern_all(self, keys: list[str]) -> np.ndarray:
        """int64 id of each key, new keys interned in order of first appearance."""
        key_id = self._key_id
        ids = np.fromiter(map(key_id.get, keys, itertools.repeat(-1)), np.int64, len(keys))
        unknown = np.flatnonzero(ids < 0).tolist()
        if unknown:
            new = list(dict.fromkeys([keys[i] for i in unknown]))
            known = self._keys
            first = len(known)
            key_id.update(zip(new, range(first, first + len(new)), strict=True))
            known.extend(new)
            if len(new) == len(unknown):  # each new key once: numbered in their order
                ids[unknown] = np.arange(first, first + len(new), dtype=np.int64)
            else:
                ids[unknown] = np.fromiter(map(key_id.__getitem__, [keys[i] for i in unknown]),
                                           np.int64, len(unknown))  # fmt: skip
        return ids

    def add_rows(
        self, held: np.ndarray, node: np.ndarray, key: np.ndarray, hits: np.ndarray
    ) -> None:
        """Hold the nodes ``held`` (ascending, after every node added before) with the rows
        (node, key id, hits): grouped by node, each node's in the order to keep."""
        rows = np.bincount(np.searchsorted(held, node), minlength=len(held))
        self._held.frombytes(np.ascontiguousarray(held, np.int32).tobytes())
        self._rows.frombytes(rows.astype(np.int32).tobytes())
        self._key.frombytes(np.ascontiguousarray(key, np.int32).tobytes())
        self._hits.frombytes(np.ascontiguousarray(hits, np.int64).tobytes())

    def build(self) -> Postings:
        held = np.frombuffer(self._held, np.int32)
        size = int(held[-1]) + 1 if len(held) else 0
        node_off = np.zeros(size + 1, np.int64)
        node_off[held + 1] = np.frombuffer(self._rows, np.int32)
        np.cumsum(node_off, out=node_off)
        postings = self.postings
        postings._install(
            held, node_off, np.frombuffer(self._key, np.int32), np.frombuffer(self._hits, np.int64)
        )
        self._held, self._rows, self._key, self._hits = (array("i"), array("i"), array("i"),
                                                         array("q"))  # fmt: skip
        return postings


@njit(cache=True, nogil=True)
def _place_by_key(  # pragma: no cover
    node_off: np.ndarray,
    node_keys: np.ndarray,
    hits: np.ndarray,
    key_off: np.ndarray,
    post_node: np.ndarray,
    post_hits: np.ndarray,
) -> None:
    """Every row (node u, key k, hits) put in key k's postings, nodes ascending in each."""
    at = key_off[:-1].copy()
    for u in range(len(node_off) - 1):
        for r in range(node_off[u], node_off[u + 1]):
            k = node_keys[r]
            p = at[k]
            post_node[p] = u
            post_hits[p] = hits[r]
            at[k] = p + 1


def warm_up() -> None:
    """Compile (or load from the on-disk cache) ``holding_all``'s kernels, for postings as
    built and as a checkpoint maps them (read-only), so that no event pays it."""
    for writeable in (True, False):
        nodes = np.zeros(1, np.int32)
        hits = np.ones(1, np.int64)
        nodes.flags.writeable = hits.flags.writeable = writeable
        held = _live_holders(nodes, hits, np.ones(1, np.uint8), 1, *_EMPTY)
        _intersect(held, held)
