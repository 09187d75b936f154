"""The concepts' names (titles, aliases) as a trie of token ids in flat arrays, for mentions.

Mentions (``kbgraph.projection.mentions``) look for every name in a text. Trying each
distinct name length at each token costs the text's length times the number of lengths
(names of 1 to 200 words made one call take seconds); walking a trie from each token stops at
the first token no name continues with, so a text that repeats no name costs about its length.

The trie is arrays a compiled kernel walks (a Python dict per node cost ~1 µs a token, most of
a follower's mention scan): a token is the FNV-1a hash of its bytes, computed in the kernel
that walks the text's folded bytes (no lookup, where a dict from tokens to ids cost a cold
lookup per token of every text, and no Python string per token), a node is an int, and
the edges are one open-addressing hash table keyed by (node, token), one 32-byte row each.
Names whose tokens hash alike share a node and every match is checked against the text's
tokens, so a collision can neither add nor hide a name. Adding a name
inserts the edges its path lacks; discarding one lowers the counts along its path and leaves
the edges (a node no name passes through any more ends no name, so it matches nothing), and
when such dead nodes outnumber the live ones the trie is built again from its names. Only
mentionable names are held: a name of stop words alone ("The Who") names nothing.

A checkpoint carries the trie as it is (``saved``, ``from_arrays``): the arrays mapped and
the nodes' keys read lazily, so a restart walks and patches it without building it again.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final, Protocol

import numpy as np
from numba import njit

from kbgraph.search.analysis import STOP_WORDS

NAME_SEP: Final = "\x1f"  # joins a name's tokens into one key (tokens are letters and digits)
TOKEN_HASH_MASK = -1  # the bits of a token's hash kept as its id (a test collides them)
FNV_OFFSET: Final = 0xCBF29CE484222325  # FNV-1a, 64 bits: a token's hash (``_token``)
FNV_PRIME: Final = 0x100000001B3
MIN_DEAD_REBUILD: Final = 1 << 12  # dead nodes tolerated before a rebuild, at least


@functools.lru_cache(maxsize=1 << 16)
def mentionable(key: str) -> bool:
    """A name of stop words alone ("The Who", "Of The") names nothing."""
    return any(token and token not in STOP_WORDS for token in key.split(NAME_SEP))


FROM, TOKEN, TO, ENDS = 0, 1, 2, 3  # an edge's row: its node, token, child, names ending
SAVED_ARRAYS: Final = ("meta", "edges", "through", "shared_node", "shared_count")  # ``saved``


class NodeKeys(Protocol):
    """Node -> the one key ending there ("" for none): a list, or a checkpoint's column (read
    lazily, changed and appended to in memory)."""

    def __len__(self) -> int: ...
    def __getitem__(self, node: int, /) -> str: ...
    def __setitem__(self, node: int, key: str, /) -> None: ...
    def __iter__(self) -> Iterator[str]: ...
    def append(self, key: str, /) -> None: ...


@njit(cache=True, nogil=True, inline="always")
def _slot(edges: np.ndarray, node: int, token: int) -> np.int64:
    """The row of edge (node, token), or of the empty row where it would go."""
    mask = np.uint64(len(edges) - 1)
    h = (np.uint64(node) * np.uint64(0x9E3779B97F4A7C15)) ^ (
        np.uint64(token) * np.uint64(0xC2B2AE3D27D4EB4F)
    )
    at = (h ^ (h >> np.uint64(29))) & mask
    while edges[at, FROM] >= 0 and (edges[at, FROM] != node or edges[at, TOKEN] != token):
        at = (at + np.uint64(1)) & mask
    return np.int64(at)


@njit(cache=True, nogil=True)
def _insert(
    edges: np.ndarray, through: np.ndarray, ids: np.ndarray, nodes: int
) -> tuple[int, int, int]:
    """Add one count of the name ``ids`` (room for ``len(ids)`` more nodes and edges checked
    by the caller): (the row of its last edge, nodes now, dead nodes it made live again)."""
    node = 0
    at = np.int64(-1)
    revived = 0
    for t in ids:
        at = _slot(edges, node, t)
        if edges[at, FROM] < 0:
            edges[at, FROM] = node
            edges[at, TOKEN] = t
            edges[at, TO] = nodes
            edges[at, ENDS] = 0
            nodes += 1
        elif through[edges[at, TO]] == 0:
            revived += 1
        node = edges[at, TO]
        through[node] += 1
    edges[at, ENDS] += 1
    return int(at), nodes, revived


@njit(cache=True, nogil=True)
def _insert_many(
    edges: np.ndarray,
    through: np.ndarray,
    ids: np.ndarray,
    bounds: np.ndarray,
    nodes: int,
    last: np.ndarray,
) -> tuple[int, int]:
    """``_insert`` of each name ``ids[bounds[k]:bounds[k + 1]]``, the row of its last edge
    in ``last[k]``: (nodes now, dead nodes made live again)."""
    revived = 0
    for k in range(len(bounds) - 1):
        at, nodes, again = _insert(edges, through, ids[bounds[k] : bounds[k + 1]], nodes)
        last[k] = at
        revived += again
    return nodes, revived


@njit(cache=True, nogil=True)
def _find(edges: np.ndarray, ids: np.ndarray) -> int:
    """The row of the last edge of the name ``ids``, or -1."""
    node = 0
    at = np.int64(-1)
    for t in ids:
        at = _slot(edges, node, t)
        if edges[at, FROM] < 0:
            return -1
        node = edges[at, TO]
    return int(at)


@njit(cache=True, nogil=True)
def _lower(edges: np.ndarray, through: np.ndarray, ids: np.ndarray) -> int:
    """One count of the held name ``ids`` less along its path: the nodes it left dead."""
    node = 0
    dead = 0
    for t in ids:
        node = edges[_slot(edges, node, t), TO]
        through[node] -= 1
        if through[node] == 0:
            dead += 1
    return dead


@njit(cache=True, nogil=True)
def _rehash(edges: np.ndarray, new: np.ndarray) -> None:
    for at in range(len(edges)):
        if edges[at, FROM] >= 0:
            new[_slot(new, edges[at, FROM], edges[at, TOKEN])] = edges[at]


@njit(cache=True, nogil=True, inline="always")
def _token(buf: np.ndarray, i: int, stop: int, mask: int) -> tuple[np.int64, int]:
    """The id of the token starting at ``buf[i]`` (a token is a run of bytes above the space,
    so spaces and ``NAME_SEP`` part them): its FNV-1a hash ``& mask``; and where it ends.
    Both kernels that hash tokens (``_hashes``, ``match``) take their ids here, so a name's
    ids and a text's are the same function of the bytes."""
    h = np.uint64(FNV_OFFSET)
    while i < stop and buf[i] > 32:
        h = (h ^ np.uint64(buf[i])) * np.uint64(FNV_PRIME)
        i += 1
    return np.int64(h) & np.int64(mask), i


@njit(cache=True, nogil=True)
def _hashes(buf: np.ndarray, mask: int) -> np.ndarray:
    """The id of each token of ``buf`` (UTF-8), as ``_token`` gives it."""
    out = np.empty(len(buf) // 2 + 1, np.int64)
    n = 0
    i = 0
    while i < len(buf):
        if buf[i] <= 32:
            i += 1
            continue
        out[n], i = _token(buf, i, len(buf), mask)
        n += 1
    return out[:n]


@njit(cache=True, nogil=True)
def match(
    buf: np.ndarray, bounds: np.ndarray, edges: np.ndarray, mask: int, out: np.ndarray
) -> tuple[int, int]:
    """Every (text, first token, end token, node, first byte, end byte) where a name ends,
    texts ``buf[bounds[k]:bounds[k + 1]]`` (folded UTF-8, tokens parted by spaces: each
    token's id from ``_token``), by text, first token, end; written to ``out``
    (rows of 6) while it has room. Returns (matches, edges looked up): a caller whose
    ``out`` was short calls again. An edge is one row: a step of the walk reads one cache
    line."""
    longest = 0
    for k in range(len(bounds) - 1):
        longest = max(longest, bounds[k + 1] - bounds[k])
    ids = np.empty(longest // 2 + 1, np.int64)
    starts = np.empty(longest // 2 + 1, np.int64)
    ends = np.empty(longest // 2 + 1, np.int64)
    found = 0
    lookups = 0
    for k in range(len(bounds) - 1):
        n = 0
        i = bounds[k]
        stop = bounds[k + 1]
        while i < stop:
            if buf[i] <= 32:
                i += 1
                continue
            starts[n] = i
            ids[n], i = _token(buf, i, stop, mask)
            ends[n] = i
            n += 1
        for a in range(n):
            node = 0
            j = a
            while j < n:
                lookups += 1
                at = _slot(edges, node, ids[j])
                if edges[at, FROM] < 0:
                    break
                node = edges[at, TO]
                j += 1
                if edges[at, ENDS] > 0:
                    if found < len(out):
                        out[found, 0] = k
                        out[found, 1] = a
                        out[found, 2] = j
                        out[found, 3] = node
                        out[found, 4] = starts[a]
                        out[found, 5] = ends[j - 1]
                    found += 1
    return found, lookups


class NameTrie:
    """Mentionable name keys (tokens joined by ``NAME_SEP``), counted: added and discarded
    as concepts are indexed and forgotten. A token is walked by its hash (``_token``),
    computed from its bytes alone (a dict from tokens to ids was a cold lookup per token of
    every text scanned): two names whose tokens' hashes all agree share a node, which then
    holds both keys, and every match is checked against the text's tokens, so a hash
    collision can neither add nor hide a name."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self.lookups = 0  # edges the matches looked up (a statistic: readers add unlocked)
        self._fill(keys)

    def _fill(self, keys: Iterable[str]) -> None:
        """Empty, then ``keys`` added: the arrays sized for them at once (a trie of a few
        new names, as ``Mentions.flush`` makes, costs no more than they need)."""
        held = [key for key in keys if mentionable(key)]
        nodes = 1 + sum(key.count(NAME_SEP) + 1 for key in held)
        self._node_key: NodeKeys = [""]  # node -> the one key ending there ("" for none)
        self._shared: dict[int, dict[str, int]] = {}  # node -> its keys and counts, if two+
        self._through = np.zeros(nodes, np.int32)  # node -> names (counted) passing there
        rows = 1 << (2 * nodes - 1).bit_length()  # the table at most half full
        self._edges = np.zeros((rows, 4), np.int64)  # rows FROM, TOKEN, TO, ENDS
        self._edges[:, FROM] = -1  # an empty row
        self._dead = 0
        self._add_many(held)

    def __len__(self) -> int:
        """Nodes, the root's included."""
        return len(self._node_key)

    def _grow(self, nodes: int) -> None:
        """Keys ("" for none) for the nodes up to ``nodes``."""
        keys = self._node_key
        if isinstance(keys, list):
            keys.extend([""] * (nodes - len(keys)))
        else:
            for _ in range(nodes - len(keys)):
                keys.append("")

    def saved(self) -> tuple[list[str], list[str], dict[str, np.ndarray]]:
        """(each node's key, the shared nodes' keys, arrays): the trie as it is, for a
        checkpoint (``from_arrays``); the same trie gives the same bytes. The edge table is
        saved at the size its nodes need (a build sizes it for every name's tokens, as many
        as twice the nodes a KB's shared prefixes make)."""
        nodes = len(self)
        edges = self._edges
        rows = 1 << (2 * nodes - 1).bit_length()  # as ``_fill`` sizes it: at most half full
        if len(edges) > rows:
            edges = np.zeros((rows, 4), np.int64)
            edges[:, FROM] = -1
            _rehash(self._edges, edges)
        shared = sorted(
            (node, key, count) for node, s in self._shared.items() for key, count in s.items()
        )
        arrays: dict[str, np.ndarray] = {
            "meta": np.array([nodes, self._dead, TOKEN_HASH_MASK], np.int64),
            "edges": edges,
            "through": self._through[:nodes],
            "shared_node": np.array([node for node, _, _ in shared], np.int64),
            "shared_count": np.array([count for _, _, count in shared], np.int64),
        }
        return list(self._node_key), [key for _, key, _ in shared], arrays

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, np.ndarray], node_keys: NodeKeys, shared_keys: Sequence[str]
    ) -> NameTrie:
        """The trie ``saved`` gave, over its arrays as they are (a checkpoint maps them
        copy-on-write: patches make private pages). ``ValueError`` when they do not make
        a trie this code walks safely."""
        missing = sorted(set(SAVED_ARRAYS) - arrays.keys())
        if missing:
            raise ValueError(f"name trie: no {', '.join(missing)}")
        meta, edges, through = arrays["meta"], arrays["edges"], arrays["through"]
        owners, counts = arrays["shared_node"], arrays["shared_count"]
        if meta.shape != (3,) or edges.dtype != np.int64 or through.dtype != np.int32:
            raise ValueError("name trie: arrays of another layout")
        nodes, dead, mask = (int(v) for v in meta)
        rows = len(edges)
        if mask != TOKEN_HASH_MASK:
            raise ValueError(f"name trie: token hash mask {mask}, this kbgraph's {TOKEN_HASH_MASK}")
        if edges.ndim != 2 or edges.shape[1] != 4 or rows & (rows - 1) or 2 * nodes > rows:
            raise ValueError(f"name trie: an edge table {edges.shape} for {nodes} nodes")
        if not (len(through) == len(node_keys) == nodes >= 1 and 0 <= dead < nodes):
            raise ValueError(
                f"name trie: {nodes} nodes, {len(through)} counts, {len(node_keys)} keys"
            )
        if not len(owners) == len(counts) == len(shared_keys) or (
            len(owners) and not (owners.min() > 0 and owners.max() < nodes and counts.min() > 0)
        ):
            raise ValueError("name trie: shared nodes out of range")
        trie = cls.__new__(cls)
        trie.lookups = 0
        trie._node_key, trie._edges, trie._through, trie._dead = node_keys, edges, through, dead
        trie._shared = {}
        for node, key, count in zip(owners.tolist(), shared_keys, counts.tolist(), strict=True):
            trie._shared.setdefault(node, {})[key] = count
        return trie

    def _held(self, node: int, key: str, ends: int) -> None:
        """One more count of ``key`` at ``node``, which now ends ``ends`` names."""
        shared = self._shared.get(node)
        if shared is not None:
            shared[key] = shared.get(key, 0) + 1
            return
        own = self._node_key[node]
        if not own or own == key:
            self._node_key[node] = key
        else:  # a second key whose tokens hash alike
            self._shared[node] = {own: ends - 1, key: 1}
            self._node_key[node] = ""

    def _add_many(self, held: list[str]) -> None:
        """``add`` of each of ``held`` (mentionable keys) in one compiled pass."""
        if not held:
            return
        ids = self.ids(" ".join(held))
        bounds = np.zeros(len(held) + 1, np.int64)
        np.cumsum([key.count(NAME_SEP) + 1 for key in held], out=bounds[1:])
        self._room(len(ids))
        last = np.empty(len(held), np.int64)
        nodes, revived = _insert_many(self._edges, self._through, ids, bounds, len(self), last)
        self._dead -= revived
        self._grow(nodes)
        rows = self._edges[last]
        ends_at = rows[:, TO].tolist()
        added = Counter(ends_at)  # names this call put at each node
        seen: Counter[int] = Counter()
        for key, node, total in zip(held, ends_at, rows[:, ENDS].tolist(), strict=True):
            seen[node] += 1
            self._held(node, key, total - added[node] + seen[node])

    def add_many(self, keys: Iterable[str]) -> None:
        """``add`` of each of ``keys`` in one compiled pass (two compiled calls a key, one by
        one)."""
        self._add_many([key for key in keys if mentionable(key)])

    def add(self, key: str) -> None:
        if not mentionable(key):
            return
        ids = self.ids(key)
        self._room(len(ids))
        before = len(self)
        at, nodes, revived = _insert(self._edges, self._through, ids, before)
        self._dead -= revived
        self._grow(nodes)
        node = nodes - 1 if nodes > before else int(self._edges[at, TO])
        self._held(node, key, int(self._edges[at, ENDS]))

    def discard(self, key: str) -> None:
        """Forget one count of ``key``; a key not held is ignored."""
        if not mentionable(key):
            return
        ids = self.ids(key)
        at = _find(self._edges, ids)
        if at < 0:
            return
        node = int(self._edges[at, TO])
        shared = self._shared.get(node)
        if shared is not None:
            if key not in shared:
                return
            shared[key] -= 1
            if not shared[key]:
                del shared[key]
            if len(shared) == 1:
                (self._node_key[node],) = shared
                del self._shared[node]
        elif self._node_key[node] != key:
            return
        self._edges[at, ENDS] -= 1
        if not self._edges[at, ENDS]:
            self._node_key[node] = ""
        self._dead += _lower(self._edges, self._through, ids)
        if self._dead > max(MIN_DEAD_REBUILD, len(self) - self._dead):
            self._rebuild()

    def _room(self, more: int) -> None:
        """Capacity for ``more`` nodes and edges (the table kept at most half full)."""
        need = len(self) + more
        if need > len(self._through):
            grown = np.zeros(max(need, 2 * len(self._through)), np.int32)
            grown[: len(self._through)] = self._through
            self._through = grown
        if 2 * need > len(self._edges):  # every node but the root ends one edge
            size = len(self._edges)
            while 2 * need > size:
                size *= 2
            new = np.zeros((size, 4), np.int64)
            new[:, FROM] = -1
            _rehash(self._edges, new)
            self._edges = new

    def _rebuild(self) -> None:
        """The trie of the names held now, without the dead nodes."""
        edges = self._edges
        rows = np.flatnonzero((edges[:, FROM] >= 0) & (edges[:, ENDS] > 0))
        held: list[str] = []
        for node, count in edges[rows][:, [TO, ENDS]].tolist():
            own = self._node_key[node]
            if own:
                held += [own] * count
            else:
                for key, n in self._shared[node].items():
                    held += [key] * n
        self._fill(held)

    def ids(self, names: str) -> np.ndarray:
        """The token ids of ``names`` (name keys, or tokens, parted by spaces)."""
        return _hashes(np.frombuffer(names.encode(), np.uint8), TOKEN_HASH_MASK)

    def match_texts(self, texts: Sequence[bytes]) -> list[tuple[int, int, int, str]]:
        """Every (text, first token, end token, key) where a name occurs in ``texts`` (each
        its folded tokens in UTF-8 parted by spaces, ``kbgraph.search.analysis.folded``), by
        text, first token, then end. One compiled call hashes and walks every text's tokens:
        no token is a Python object."""
        if len(self) == 1 or not texts:
            return []
        data = b"".join(texts)
        bounds = np.zeros(len(texts) + 1, np.int64)
        np.cumsum([len(text) for text in texts], out=bounds[1:])
        buf = np.frombuffer(data, np.uint8)
        out = np.empty((max(16, len(data) // 16), 6), np.int64)
        while True:
            found, lookups = match(buf, bounds, self._edges, TOKEN_HASH_MASK, out)
            if found <= len(out):
                break
            out = np.empty((found, 6), np.int64)
        self.lookups += lookups
        keys, shared = self._node_key, self._shared
        result = []
        for k, i, j, node, first, end in out[:found].tolist():
            name = NAME_SEP.join(data[first:end].decode().split())
            key = keys[node]
            if key == name or (not key and name in shared.get(node, ())):
                result.append((k, i, j, name))
        return result


def warm_up() -> None:
    """Compile (or load from the on-disk cache) every kernel of the trie, growth included, so
    that no build or event pays it."""
    trie = NameTrie(["warm"])  # _insert_many
    trie.add(NAME_SEP.join(["warm", "up"]))  # _insert
    trie.match_texts([b"warm up"])  # match
    trie.discard("warm")  # _find, _lower
    trie.add(NAME_SEP.join(str(i) for i in range(len(trie._edges))))  # _rehash
