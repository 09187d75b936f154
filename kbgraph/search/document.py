"""One document analysed for the search index, computed once per applied event and carried
in the log beside it.

The analysis (terms with their packed field hits, name keys, tag keys, the two lengths) is a
pure function of the concept's title, text, aliases and tags, and it was most of what every
process's projection follower spent per upsert. The store computes it once per delivery
(``kbgraph.store.group.analyse``, in its analyser thread), its writer stores it in the
event's log row (``kbgraph.store.eventlog.SqliteLog.append``: once per store, however many workers
follow it) and the followers decode it (``SearchIndex.put(..., analysed=...)``); a
log row without it (written before, or by older code) or of another ``ANALYSIS_VERSION`` is
analysed by the follower as before.

With the local model, the row also carries the concept's vector, made in the same thread
(``kbgraph.embeddings.carried``): ``vector_model`` and ``vector``, trailing fields that a row
without them decodes to empty (and that code before them skips).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Final

import msgspec

from kbgraph.search.analysis import analyze, analyze_tokens, fold, tokenize
from kbgraph.search.bulk import FIELD
from kbgraph.search.nametrie import NAME_SEP

# Bump whenever what ``parts`` returns for some input changes (stop words, stemming, folding,
# tokenising, the packing): rows carrying another version are analysed again by the follower.
ANALYSIS_VERSION: Final = 1


def parts(
    title: str, text: str, aliases: Sequence[str], tags: Sequence[str]
) -> tuple[Counter[str], list[str], tuple[str, ...], int, int]:
    """(term -> packed hits in text order first, name keys, tag keys, title and text
    lengths) of one document."""
    # Each name tokenised once: its tokens give both its terms and its name key.
    text_terms = analyze(text) if text else []
    freq = Counter(text_terms)
    title_len = 0
    name_keys: dict[str, None] = {}
    for name in (title, *aliases) if aliases else (title,):
        tokens = tokenize(name)
        if not tokens:  # nothing to match: no terms, no name key
            continue
        name_keys[NAME_SEP.join(tokens)] = None
        terms = analyze_tokens(name, tokens)
        title_len += len(terms)
        for t in terms:
            freq[t] += FIELD
    tag_keys = tuple(dict.fromkeys([fold(tag) for tag in tags if tag])) if tags else ()
    return freq, list(name_keys), tag_keys, title_len, len(text_terms)


class Analysed(msgspec.Struct, array_like=True, frozen=True, omit_defaults=True):
    """``parts`` as carried: ``terms[i]`` with ``hits[i]`` (packed), in ``parts``'s order."""

    version: int
    terms: list[str]
    hits: list[int]
    names: list[str]
    tags: list[str]
    title_len: int
    text_len: int
    vector_model: str = ""  # kbgraph.embeddings.carried.key of the model that made ``vector``
    vector: bytes = b""  # the concept's vector, packed (kbgraph.embeddings.carried.pack)


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Analysed).decode


def encode(
    title: str,
    text: str,
    aliases: Sequence[str],
    tags: Sequence[str],
    vector: tuple[str, bytes] | None = None,
) -> bytes:
    """The document's analysis as the log carries it, with ``vector`` (its model's key, the
    packed row) when one was made."""
    model, packed = vector if vector is not None else ("", b"")
    freq, names, tag_keys, title_len, text_len = parts(title, text, aliases, tags)
    return _encode(
        Analysed(
            ANALYSIS_VERSION,
            list(freq),
            list(freq.values()),
            names,
            list(tag_keys),
            title_len,
            text_len,
            model,
            packed,
        )
    )


def decode(blob: bytes | None) -> Analysed | None:
    """The carried analysis, or None when there is none of this ``ANALYSIS_VERSION``."""
    if not blob:
        return None
    try:
        found = _decode(blob)
    except msgspec.DecodeError:  # another version's layout
        return None
    return found if found.version == ANALYSIS_VERSION else None
