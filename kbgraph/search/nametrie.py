"""The concepts' names (titles, aliases) as a trie of token ids in flat arrays, for mentions.

Mentions (``kbgraph.projection.mentions``) look for every name in a text. Trying each
distinct name length at each token costs the text's length times the number of lengths
(names of 1 to 200 words made one call take seconds); walking a trie from each token stops at
the first token no name continues with, so a text that repeats no name costs about its length.

The trie is arrays a compiled kernel walks (a Python dict per node cost ~1 µs a token, most of
a follower's mention scan): each token of a name is interned to an int once, a node is an
int, and the edges are one open-addressing hash table keyed by (node, token id). Adding a name
inserts the edges its path lacks; discarding one lowers the counts along its path and leaves
the edges (a node no name passes through any more ends no name, so it matches nothing), and
when such dead nodes outnumber the live ones the trie is built again from its names. Only
mentionable names are held: a name of stop words alone ("The Who") names nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Final, cast

import numpy as np
from numba import njit

from kbgraph.search.analysis import STOP_WORDS

NAME_SEP: Final = "\x1f"  # joins a name's tokens into one key (tokens are letters and digits)
NO_TOKEN: Final = -1  # a text's token that no name holds
MIN_DEAD_REBUILD: Final = 1 << 12  # dead nodes tolerated before a rebuild, at least
_EMPTY = np.empty(0, np.int32)


@functools.lru_cache(maxsize=1 << 16)
def mentionable(key: str) -> bool:
    """A name of stop words alone ("The Who", "Of The") names nothing."""
    return any(token not in STOP_WORDS for token in key.split(NAME_SEP))


@njit(cache=True, nogil=True, inline="always")
def _slot(edge_from: np.ndarray, edge_token: np.ndarray, node: int, token: int) -> np.int64:
    """The slot of edge (node, token), or of the empty slot where it would go."""
    mask = np.uint64(len(edge_from) - 1)
    h = (np.uint64(node) * np.uint64(0x9E3779B97F4A7C15)) ^ (
        np.uint64(token) * np.uint64(0xC2B2AE3D27D4EB4F)
    )
    at = np.int64((h ^ (h >> np.uint64(29))) & mask)
    while edge_from[at] >= 0 and (edge_from[at] != node or edge_token[at] != token):
        at = (at + 1) & np.int64(mask)
    return at


@njit(cache=True, nogil=True)
def _insert(
    edge_from: np.ndarray,
    edge_token: np.ndarray,
    edge_to: np.ndarray,
    through: np.ndarray,
    ids: np.ndarray,
    nodes: int,
) -> tuple[int, int, int]:
    """Add one count of the name ``ids`` (capacity for ``len(ids)`` more nodes and edges
    checked by the caller): (its last node, nodes now, dead nodes it made live again)."""
    node = 0
    revived = 0
    for t in ids:
        at = _slot(edge_from, edge_token, node, t)
        if edge_from[at] < 0:
            edge_from[at] = node
            edge_token[at] = t
            edge_to[at] = nodes
            nodes += 1
        elif through[edge_to[at]] == 0:
            revived += 1
        node = edge_to[at]
        through[node] += 1
    return node, nodes, revived


@njit(cache=True, nogil=True)
def _insert_many(
    edge_from: np.ndarray,
    edge_token: np.ndarray,
    edge_to: np.ndarray,
    through: np.ndarray,
    ids: np.ndarray,
    bounds: np.ndarray,
    nodes: int,
    last: np.ndarray,
) -> int:
    """``_insert`` of each name ``ids[bounds[k]:bounds[k + 1]]``, its last node in
    ``last[k]``: nodes now."""
    for k in range(len(bounds) - 1):
        last[k], nodes, _ = _insert(
            edge_from, edge_token, edge_to, through, ids[bounds[k] : bounds[k + 1]], nodes
        )
    return nodes


@njit(cache=True, nogil=True)
def _find(
    edge_from: np.ndarray, edge_token: np.ndarray, edge_to: np.ndarray, ids: np.ndarray
) -> int:
    """The node the name ``ids`` ends at, or -1."""
    node = 0
    for t in ids:
        at = _slot(edge_from, edge_token, node, t)
        if edge_from[at] < 0:
            return -1
        node = edge_to[at]
    return node


@njit(cache=True, nogil=True)
def _lower(
    edge_from: np.ndarray, edge_token: np.ndarray, edge_to: np.ndarray, through: np.ndarray,
    ids: np.ndarray,
) -> int:  # fmt: skip
    """One count of the held name ``ids`` less along its path: the nodes it left dead."""
    node = 0
    dead = 0
    for t in ids:
        node = edge_to[_slot(edge_from, edge_token, node, t)]
        through[node] -= 1
        if through[node] == 0:
            dead += 1
    return dead


@njit(cache=True, nogil=True)
def _rehash(
    edge_from: np.ndarray, edge_token: np.ndarray, edge_to: np.ndarray,
    new_from: np.ndarray, new_token: np.ndarray, new_to: np.ndarray,
) -> None:  # fmt: skip
    for at in range(len(edge_from)):
        if edge_from[at] >= 0:
            to = _slot(new_from, new_token, edge_from[at], edge_token[at])
            new_from[to], new_token[to], new_to[to] = edge_from[at], edge_token[at], edge_to[at]


@njit(cache=True, nogil=True)
def match(
    ids: np.ndarray,
    bounds: np.ndarray,
    edge_from: np.ndarray,
    edge_token: np.ndarray,
    edge_to: np.ndarray,
    ends: np.ndarray,
    out: np.ndarray,
) -> tuple[int, int]:
    """Every (text, first token, end token, node) where a name ends, texts ``ids[bounds[k]:
    bounds[k + 1]]``, by text, first token, end; written to ``out`` (rows of 4) while it has
    room. Returns (matches, edges looked up): a caller whose ``out`` was short calls again."""
    found = 0
    lookups = 0
    for k in range(len(bounds) - 1):
        start, stop = bounds[k], bounds[k + 1]
        for i in range(start, stop):
            node = 0
            j = i
            while j < stop and ids[j] >= 0:
                lookups += 1
                at = _slot(edge_from, edge_token, node, ids[j])
                if edge_from[at] < 0:
                    break
                node = edge_to[at]
                j += 1
                if ends[node] > 0:
                    if found < len(out):
                        out[found, 0] = k
                        out[found, 1] = i - start
                        out[found, 2] = j - start
                        out[found, 3] = node
                    found += 1
    return found, lookups


class NameTrie:
    """Mentionable name keys (tokens joined by ``NAME_SEP``), counted: added and discarded
    as concepts are indexed and forgotten."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self.lookups = 0  # edges looked up by the matches so far (the work tests bound)
        self._reset()
        self._add_many(keys)

    def _add_many(self, keys: Iterable[str]) -> None:
        """``add`` of each of ``keys``, in one compiled pass (a first use, a rebuild)."""
        held = [key for key in keys if mentionable(key)]
        if not held:
            return
        token_id = self._token_id
        ids: list[int] = []
        bounds = [0]
        for key in held:
            for token in key.split(NAME_SEP):
                found = token_id.get(token)
                if found is None:
                    found = token_id[token] = len(token_id)
                ids.append(found)
            bounds.append(len(ids))
        self._room(len(ids))
        last = np.empty(len(held), np.int32)
        nodes = _insert_many(
            self._edge_from,
            self._edge_token,
            self._edge_to,
            self._through,
            np.array(ids, np.int32),
            np.array(bounds, np.int64),
            len(self),
            last,
        )
        self._node_key.extend([None] * (nodes - len(self)))
        for key, node in zip(held, last.tolist(), strict=True):
            self._node_key[node] = key
        np.add.at(self._ends, last, 1)

    def _reset(self) -> None:
        self._token_id: dict[str, int] = {}
        self._node_key: list[str | None] = [None]  # node -> the key ending there (root: none)
        self._ends = np.zeros(1024, np.int32)  # node -> names (counted) ending there
        self._through = np.zeros(1024, np.int32)  # node -> names (counted) passing there
        self._edge_from = np.full(2048, -1, np.int32)
        self._edge_token = np.zeros(2048, np.int32)
        self._edge_to = np.zeros(2048, np.int32)
        self._dead = 0

    def __len__(self) -> int:
        """Nodes, the root's included."""
        return len(self._node_key)

    def _name_ids(self, key: str, intern: bool) -> np.ndarray | None:
        tokens = key.split(NAME_SEP)
        if intern:
            token_id = self._token_id
            for token in tokens:
                if token not in token_id:
                    token_id[token] = len(token_id)
        found = [self._token_id.get(token, NO_TOKEN) for token in tokens]
        return None if NO_TOKEN in found else np.array(found, np.int32)

    def add(self, key: str) -> None:
        if not mentionable(key):
            return
        ids = self._name_ids(key, True)
        assert ids is not None
        self._room(len(ids))
        node, nodes, revived = _insert(
            self._edge_from, self._edge_token, self._edge_to, self._through, ids, len(self)
        )
        self._dead -= revived
        self._node_key.extend([None] * (nodes - len(self)))
        self._node_key[node] = key
        self._ends[node] += 1

    def discard(self, key: str) -> None:
        """Forget one count of ``key``; a key not held is ignored."""
        ids = self._name_ids(key, False) if mentionable(key) else None
        if ids is None:
            return
        node = _find(self._edge_from, self._edge_token, self._edge_to, ids)
        if node < 0 or not self._ends[node]:
            return
        self._ends[node] -= 1
        if not self._ends[node]:
            self._node_key[node] = None
        self._dead += _lower(self._edge_from, self._edge_token, self._edge_to, self._through, ids)
        if self._dead > max(MIN_DEAD_REBUILD, len(self) - self._dead):
            self._rebuild()

    def _room(self, more: int) -> None:
        """Capacity for ``more`` nodes and edges (the table kept at most half full)."""
        need = len(self) + more
        if need > len(self._ends):
            size = max(need, 2 * len(self._ends))
            for name in ("_ends", "_through"):
                old = getattr(self, name)
                grown = np.zeros(size, np.int32)
                grown[: len(old)] = old
                setattr(self, name, grown)
        if 2 * need > len(self._edge_from):  # every node but the root ends one edge
            size = len(self._edge_from)
            while 2 * need > size:
                size *= 2
            new = np.full(size, -1, np.int32), np.zeros(size, np.int32), np.zeros(size, np.int32)
            _rehash(self._edge_from, self._edge_token, self._edge_to, *new)
            self._edge_from, self._edge_token, self._edge_to = new

    def _rebuild(self) -> None:
        """The trie of the names held now, without the dead nodes."""
        ends = self._ends
        held = [
            key
            for node, key in enumerate(self._node_key)
            if key is not None
            for _ in range(ends[node])
        ]
        self._reset()
        self._add_many(held)

    def ids(self, tokens: Sequence[str]) -> np.ndarray:
        """The token id of each of ``tokens``, ``NO_TOKEN`` for a token no name holds."""
        return np.fromiter(map(self._token_id.get, tokens, repeat(NO_TOKEN)), np.int32, len(tokens))

    def match_ids(self, ids: np.ndarray, bounds: np.ndarray) -> list[tuple[int, int, int, str]]:
        """Every (text, first token, end token, key) where a name occurs in the texts
        ``ids[bounds[k]:bounds[k + 1]]`` (``ids``' tokens), by text, first token, then end."""
        if len(self) == 1 or not len(ids):
            return []
        out = np.empty((max(16, len(ids) // 4), 4), np.int32)
        while True:
            found, lookups = match(
                ids, bounds, self._edge_from, self._edge_token, self._edge_to, self._ends, out
            )
            if found <= len(out):
                break
            out = np.empty((found, 4), np.int32)
        self.lookups += lookups
        keys = cast(list[str], self._node_key)  # a node a name ends at holds its key
        return [(k, i, j, keys[node]) for k, i, j, node in out[:found].tolist()]

    def matches(self, tokens: Sequence[str]) -> list[tuple[int, int, str]]:
        """Every (first token, end token, key) where a name's tokens occur in ``tokens``, by
        first token ascending, then end ascending."""
        bounds = np.array([0, len(tokens)], np.int64)
        return [(i, j, key) for _, i, j, key in self.match_ids(self.ids(tokens), bounds)]
