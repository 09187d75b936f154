"""Text evidence for ``link_suggest`` ``hybrid`` (SPEC section 3): mentions, rare terms, tags.

For a concept x and each visible candidate v (not x, not linked to x either way):

- **mention**: x's text names v (v's title or an alias, as whole folded tokens) somewhere
  outside the names of the concepts x already links to (so "restic" inside "Backup with
  restic", which x links to, is not a mention of ``restic``). 1 when there is one.
- **terms**: the share of x's rare-term weight that v holds too. A term of x is rare when at
  most ``RARE_SHARE`` of the visible concepts (and at least 2, x included) hold it; its weight
  is ``ln(N / df)``. In [0, 1].
- **tags**: the same share over x's tags, each weighted ``ln(N / df)`` (a tag on every
  concept weighs 0). In [0, 1].

Everything is counted among the visible concepts (N, df, names, links), and every sum runs in
x's own term or tag order, so the floats do not depend on hidden concepts or interning order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from kbgraph.search import SearchIndex, tokenize

RARE_SHARE: Final = 0.1
_ASCII_TOKEN = re.compile(r"[a-z0-9]+")
_TOKEN = re.compile(r"[^\W_]+")


@dataclass(slots=True)
class Evidence:
    """Per candidate node: offset of its first unlinked mention in x's text, terms, tags."""

    mention: dict[int, int] = field(default_factory=dict)
    terms: dict[int, float] = field(default_factory=dict)
    tags: dict[int, float] = field(default_factory=dict)


def _tokens_with_offsets(text: str) -> tuple[list[str], list[int]]:
    """The folded tokens of ``text`` (as ``search.tokenize`` makes them) and where each starts."""
    tokens: list[str] = []
    starts: list[int] = []
    if text.isascii():
        for match in _ASCII_TOKEN.finditer(text.lower()):
            tokens.append(match.group())
            starts.append(match.start())
        return tokens, starts
    for match in _TOKEN.finditer(text):
        for token in tokenize(match.group()):
            tokens.append(token)
            starts.append(match.start())
    return tokens, starts


def mentions(
    index: SearchIndex, text: str, mask: np.ndarray, node: int, linked: set[int]
) -> dict[int, int]:
    """Visible concept -> offset of its first mention in ``text`` outside the names of
    ``linked`` (visible concepts ``node`` links to); ``node`` itself never counts."""
    tokens, starts = _tokens_with_offsets(text)
    found: list[tuple[int, int, int]] = []  # (first token, end token, node)
    for i, token in enumerate(tokens):
        for v, names in index.names_from(token).items():
            if v == node or not mask[v]:
                continue
            for name in names:
                end = i + len(name)
                if name[0] == token and tuple(tokens[i:end]) == name:
                    found.append((i, end, v))
    covered = [(i, end) for i, end, v in found if v in linked]
    out: dict[int, int] = {}
    for i, end, v in sorted(found):
        if v in linked or v in out:
            continue
        if any(a < end and i < b for a, b in covered):
            continue
        out[v] = starts[i]
    return out


def _shares(
    keys: Sequence[str],
    nodes_of,
    mask: np.ndarray,
    node: int,
    n_visible: int,
    max_df: float,
) -> dict[int, float]:
    """For each visible v != node: the share of ``node``'s key weight (ln(N/df) per key with
    2 <= df <= max_df) that v holds too."""
    acc: dict[int, float] = {}
    total = 0.0
    for key in keys:
        holders = nodes_of(key)
        holders = holders[mask[holders] != 0]
        df = len(holders)
        if df < 2 or df > max_df:
            continue
        weight = math.log(n_visible / df)
        total += weight
        for v in holders.tolist():
            if v != node:
                acc[v] = acc.get(v, 0.0) + weight
    if total <= 0.0:
        return {}
    return {v: w / total for v, w in acc.items() if w > 0.0}


def gather(
    index: SearchIndex, text: str, mask: np.ndarray, node: int, linked: set[int], n_visible: int
) -> Evidence:
    """Every piece of text evidence for links from ``node``."""
    rare = max(2.0, RARE_SHARE * n_visible)
    return Evidence(
        mention=mentions(index, text, mask, node, linked),
        terms=_shares(index.doc_terms.get(node, ()), index.term_nodes, mask, node, n_visible, rare),
        tags=_shares(
            index.doc_tags.get(node, ()), index.tag_nodes, mask, node, n_visible, n_visible
        ),
    )
