"""Ranking hits and cutting snippets: what a result shows of a concept's text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from kbgraph.search.analysis import ASCII_ALNUM, ASCII_TOKEN, TOKEN, fold, stem, tokenize

SNIPPET_WIDTH: Final = 160


def top(
    nodes: np.ndarray, scores: np.ndarray, ids: Sequence[str], limit: int
) -> list[tuple[int, float]]:
    """The ``limit`` best (node, score) pairs: score descending, then id ascending."""
    if len(nodes) == 0 or limit <= 0:
        return []
    if len(nodes) > limit:
        # Everything scoring at least the limit-th best score, ties included, then exact order.
        cut = np.partition(scores, len(scores) - limit)[len(scores) - limit]
        keep = scores >= cut
        nodes, scores = nodes[keep], scores[keep]
    ranked = sorted(
        zip(nodes.tolist(), scores.tolist(), strict=True), key=lambda h: (-h[1], ids[h[0]])
    )
    return ranked[:limit]


def _first_ascii_hit(lowered: str, forms: Sequence[str]) -> int:
    """``first_hit`` on lower-cased ASCII text, in time linear in the text.

    ``str.find`` gives each form's first raw occurrence (a C scan per form); tokens are then
    matched one by one from the start of the token holding the earliest occurrence.
    """
    first = min((at for form in forms if (at := lowered.find(form)) >= 0), default=-1)
    if first < 0:
        return 0
    start = len(lowered[:first].rstrip(ASCII_ALNUM))  # the start of the token holding it
    wanted = set(forms)
    for match in ASCII_TOKEN.finditer(lowered, start):
        if match.group() in wanted:
            return match.start()
    return 0


def first_hit(text: str, terms: Sequence[str]) -> int:
    """Where the first token of ``text`` whose term is one of ``terms`` starts (0: none is).

    A function of ``text`` and ``terms`` alone (no state another request or concept leaves):
    each distinct token of the text is stemmed once, then ASCII text is searched for the
    tokens that give those terms, in linear time; other text folds each distinct token once
    (in one batch), then walks the tokens only when one matches.
    """
    if not terms:
        return 0
    wanted = set(terms)
    if text.isascii():  # lower-casing keeps every offset
        forms = [token for token in set(tokenize(text)) if stem(token) in wanted]
        return _first_ascii_hit(text.lower(), forms) if forms else 0
    distinct = list(set(TOKEN.findall(text)))
    folded = fold("\n".join(distinct)).split("\n")  # a token never holds a newline
    hits = {
        token
        for token, f in zip(distinct, folded, strict=True)
        if any(stem(t) in wanted for t in TOKEN.findall(f))
    }
    if hits:
        for match in TOKEN.finditer(text):
            if match.group() in hits:
                return match.start()
    return 0


def snippet_at(text: str, hit: int, width: int = SNIPPET_WIDTH) -> str:
    """At most ``width`` characters of ``text`` around offset ``hit``.

    The window opens a quarter width before the hit; whitespace runs collapse to one space and
    an ellipsis (counted in the width) marks each cut.
    """
    start = max(0, hit - width // 4)
    end = start + 2 * width  # enough raw text to fill the width after collapsing whitespace
    prefix = "…" if start > 0 else ""
    body = " ".join(text[start:end].split())
    room = width - len(prefix)
    if len(body) > room or end < len(text):
        body = body[: room - 1].rstrip() + "…"
    return prefix + body


def snippet(text: str, terms: Sequence[str], width: int = SNIPPET_WIDTH) -> str:
    """At most ``width`` characters around the first occurrence of a query term, else from
    the text's start."""
    return snippet_at(text, first_hit(text, terms), width)
