"""The concepts' names (titles, aliases) as a trie of folded tokens, for mention matching.

Mentions (``kbgraph.projection.mentions``) look for every name in a text. Trying each
distinct name length at each token costs the text's length times the number of lengths
(names of 1 to 200 words made one call take seconds); walking this trie from each token
stops at the first token no name continues with, so a text that repeats no name costs about
its length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

NAME_SEP: Final = "\x1f"  # joins a name's tokens into one key (tokens are letters and digits)


class _Node:
    __slots__ = ("children", "ending", "key", "through")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.key: str | None = None  # the key of the names ending here
        self.ending = 0  # names (counted) ending here
        self.through = 0  # names (counted) whose path passes here


class NameTrie:
    """Name keys (tokens joined by ``NAME_SEP``), counted: added and discarded as concepts
    are indexed and forgotten. Each node holds its children by token (a dict lookup per token
    walked, no key built)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._root = _Node()
        for key in keys:
            self.add(key)

    def add(self, key: str) -> None:
        node = self._root
        for token in key.split(NAME_SEP):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.through += 1
            node = child
        node.key = key
        node.ending += 1

    def discard(self, key: str) -> None:
        """Forget one count of ``key``; a key not held is ignored."""
        path: list[tuple[_Node, str, _Node]] = []
        node = self._root
        for token in key.split(NAME_SEP):
            child = node.children.get(token)
            if child is None:
                return
            path.append((node, token, child))
            node = child
        if not node.ending:
            return
        node.ending -= 1
        if not node.ending:
            node.key = None
        for parent, token, child in path:
            child.through -= 1
            if not child.through:
                del parent.children[token]
                return  # its subtree held this key alone

    def matches(self, tokens: Sequence[str]) -> list[tuple[int, int, str]]:
        """Every (first token, end token, key) where a name's tokens occur in ``tokens``, by
        first token ascending, then end ascending."""
        root = self._root.children
        firsts = root.keys() & set(tokens)  # in C: most tokens of a text start no name
        size = len(tokens)
        out: list[tuple[int, int, str]] = []
        if not firsts:
            return out
        for i, token in enumerate(tokens):
            if token not in firsts:
                continue
            node: _Node | None = root[token]
            j = i + 1
            while node is not None:
                if node.key is not None:
                    out.append((i, j, node.key))
                if j == size:
                    break
                node = node.children.get(tokens[j])
                j += 1
        return out
