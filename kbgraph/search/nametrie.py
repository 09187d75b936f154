"""The concepts' names (titles, aliases) as a trie of folded tokens, for mention matching.

``link_suggest`` looks for every name in a text. Trying each distinct name length at each
token costs the text's length times the number of lengths (names of 1 to 200 words made one
call take seconds); walking this trie from each token stops at the first token no name
continues with, so a text that repeats no name costs about its length.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final

NAME_SEP: Final = "\x1f"  # joins a name's tokens into one key (tokens are letters and digits)


class NameTrie:
    """Name keys (tokens joined by ``NAME_SEP``), counted: added and discarded as concepts
    are indexed and forgotten. Nodes are ints, the root 0; edges ``(node, token) -> child``."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._edges: dict[tuple[int, str], int] = {}
        self._through: dict[int, int] = {}  # node -> names (counted) whose path passes it
        self._ends: dict[int, str] = {}  # node -> the key of the names ending there
        self._ending: dict[int, int] = {}  # node -> names (counted) ending there
        self._next = 1
        for key in keys:
            self.add(key)

    def add(self, key: str) -> None:
        node = 0
        for token in key.split(NAME_SEP):
            child = self._edges.get((node, token))
            if child is None:
                child = self._edges[(node, token)] = self._next
                self._next += 1
            self._through[child] = self._through.get(child, 0) + 1
            node = child
        self._ends[node] = key
        self._ending[node] = self._ending.get(node, 0) + 1

    def discard(self, key: str) -> None:
        """Forget one count of ``key``; a key not held is ignored."""
        path: list[tuple[int, str, int]] = []
        node = 0
        for token in key.split(NAME_SEP):
            child = self._edges.get((node, token))
            if child is None:
                return
            path.append((node, token, child))
            node = child
        if node not in self._ending:
            return
        self._ending[node] -= 1
        if not self._ending[node]:
            del self._ending[node], self._ends[node]
        for parent, token, child in path:
            self._through[child] -= 1
            if not self._through[child]:
                del self._through[child], self._edges[(parent, token)]

    def matches(self, tokens: Sequence[str]) -> Iterator[tuple[int, int, str]]:
        """Every (first token, end token, key) where a name's tokens occur in ``tokens``, by
        first token ascending."""
        edges, ends = self._edges, self._ends
        size = len(tokens)
        for i in range(size):
            node = 0
            j = i
            while j < size:
                child = edges.get((node, tokens[j]))
                if child is None:
                    break
                node = child
                j += 1
                key = ends.get(node)
                if key is not None:
                    yield i, j, key
