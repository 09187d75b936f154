"""Many documents analysed at once, for a first build: the postings rows ``SearchIndex.put``
would give one document at a time (``kbgraph.search.document.parts``), made a chunk of
documents at a time with a few calls per chunk instead of a dozen per document.

Per chunk: every title, alias and text tokenised by one ``translate`` of the chunk joined
(ASCII chunks; any other is tokenised text by text, as ``tokenize`` does), each distinct
token's term found once per build (a token that is its own term found among the terms'
keys, any other in a dict of this build only: the stem cache that serves ``put`` is left as
it is), and each document's term counts and their order (its text's terms
in the order they first appear, then its title's and aliases') made by sorting rows in numpy.
``tests/test_bulk_build.py`` holds it equal to ``put`` one by one.
"""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from typing import Final

import numpy as np

from kbgraph.search.analysis import compounds, fold, terms_of, tokenize
from kbgraph.search.nametrie import NAME_SEP
from kbgraph.search.postings import PostingsBuilder

FIELD: Final = 1 << 32  # a posting's hits packed as title_hits * FIELD + text_hits
_COMPOUND_POS: Final = 1 << 31  # a joined hyphenated word comes after every token
_TITLE_FIELD: Final = 1 << 62  # order: a document's text terms first, then its names'
_separators = operator.methodcaller("count", NAME_SEP)
_ASCII_FOLD_KEEP_NUL = (
    bytes(ord(chr(c).lower()) if chr(c).isalnum() else (0 if c == 0 else 32) for c in range(128))
    * 2
)


def tokenize_many(strings: Sequence[str]) -> list[list[str]]:
    """``[tokenize(s) for s in strings]``: an ASCII chunk in one ``translate`` (NULs, which
    no string of it holds, keep the strings apart), any other string by string."""
    joined = "\0".join(strings)
    if joined.isascii() and joined.count("\0") == len(strings) - 1:
        folded = joined.encode("ascii").translate(_ASCII_FOLD_KEEP_NUL).decode("ascii")
        return list(map(str.split, folded.split("\0")))
    return list(map(tokenize, strings))


class BulkAnalyzer:
    """Feeds the three ``PostingsBuilder`` of a ``SearchIndex`` chunk by chunk."""

    def __init__(
        self, terms: PostingsBuilder, names: PostingsBuilder, tags: PostingsBuilder
    ) -> None:
        self.terms, self.names, self.tags = terms, names, tags
        self.name_lengths: Counter[int] = Counter()
        self._stemmed: dict[str, int] = {}  # token -> its term's key (-1: a stop word), of
        # the tokens whose term is another string; this build's
        self._own = np.zeros(1024, bool)  # term key k: keys[k] is a token, its own term

    def add(
        self,
        nodes: np.ndarray,
        titles: Sequence[str],
        texts: Sequence[str],
        aliases: Sequence[Sequence[str]],
        tags: Sequence[Sequence[str]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Index these documents (``nodes`` ascending, after every node added before);
        returns their (title lengths, text lengths) in terms."""
        n = len(nodes)
        text_doc, text_key, text_pos, _ = self._term_rows(texts)
        # names: each document's title, then its aliases
        alias_counts = np.fromiter(map(len, aliases), np.int64, n)
        if alias_counts.any():
            names = [name for title, more in zip(titles, aliases, strict=True)
                     for name in (title, *more)]  # fmt: skip
        else:
            names = list(titles)
        per_doc = alias_counts + 1
        name_doc = np.repeat(np.arange(n, dtype=np.int64), per_doc)
        name_ord = np.arange(len(names), dtype=np.int64) - np.repeat(
            np.cumsum(per_doc) - per_doc, per_doc
        )
        owner, title_key, title_pos, name_tokens = self._term_rows(names)
        title_doc = name_doc[owner]
        title_pos = _TITLE_FIELD + (name_ord[owner] << 32) + title_pos
        text_len = np.bincount(text_doc, minlength=n)
        title_len = np.bincount(title_doc, minlength=n)
        # each (document, term) once: its hits summed, placed where it first appears
        doc = np.concatenate((text_doc, title_doc))
        key = np.concatenate((text_key, title_key))
        pos = np.concatenate((text_pos, title_pos))
        weight = np.concatenate(
            (np.ones(len(text_doc), np.int64), np.full(len(title_doc), FIELD, np.int64))
        )
        order = np.lexsort((pos, key, doc))
        doc, key, pos, weight = doc[order], key[order], pos[order], weight[order]
        first = np.ones(len(doc), bool)
        if len(doc) > 1:
            first[1:] = (doc[1:] != doc[:-1]) | (key[1:] != key[:-1])
        starts = np.flatnonzero(first)
        hits = np.add.reduceat(weight, starts) if len(starts) else weight[:0]
        doc, key, pos = doc[starts], key[starts], pos[starts]
        order = np.lexsort((pos, doc))
        self.terms.add_rows(nodes, nodes[doc[order]], key[order], hits[order])
        self._add_names(nodes, name_doc, name_tokens, alias_counts)
        self._add_tags(nodes, tags)
        return title_len, text_len

    def _term_rows(
        self, strings: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[str]]]:
        """(string, term key, position) of every term ``analyze`` gives each string, in
        order, and each string's tokens."""
        lists = tokenize_many(strings)
        counts = np.fromiter(map(len, lists), np.int64, len(lists))
        flat = list(itertools.chain.from_iterable(lists))
        owner = np.repeat(np.arange(len(lists), dtype=np.int64), counts)
        pos = np.arange(len(flat), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        hyphenated = list(
            itertools.compress(
                range(len(strings)), map(operator.contains, strings, itertools.repeat("-"))
            )
        )
        if hyphenated:  # the joined form of each hyphenated word, after the string's tokens
            extra_owner: list[int] = []
            extra_pos: list[int] = []
            for i in hyphenated:
                joined = compounds(strings[i])
                flat.extend(joined)
                extra_owner.extend([i] * len(joined))
                extra_pos.extend(range(_COMPOUND_POS, _COMPOUND_POS + len(joined)))
            owner = np.concatenate((owner, np.array(extra_owner, np.int64)))
            pos = np.concatenate((pos, np.array(extra_pos, np.int64)))
        keys = self._term_keys(flat)
        keep = keys >= 0
        return owner[keep], keys[keep], pos[keep], lists

    def _term_keys(self, tokens: list[str]) -> np.ndarray:
        """Each token's term key (-1: a stop word), each new token stemmed once. A token
        that is its own term (most are: a million number tokens) is found among the terms'
        keys, flagged ``_own``; only the others are kept in ``_stemmed``."""
        key_id = self.terms.postings.key_id
        keys = np.fromiter(map(key_id.get, tokens, itertools.repeat(-1)), np.int64, len(tokens))
        found = keys >= 0
        found[found] = self._own[keys[found]]
        rest = np.flatnonzero(~found).tolist()
        if not rest:
            return keys
        stemmed = self._stemmed
        rest_tokens = [tokens[i] for i in rest]
        got = np.fromiter(map(stemmed.get, rest_tokens, itertools.repeat(-2)), np.int64,
                          len(rest))  # fmt: skip
        unknown = np.flatnonzero(got == -2).tolist()
        if unknown:
            new = list(dict.fromkeys([rest_tokens[i] for i in unknown]))
            # a term equal to its token is the token's own string (a million number tokens)
            terms = [
                token if t == token else t for token, t in zip(new, terms_of(new), strict=True)
            ]
            ids = np.full(len(new), -1, np.int64)
            ids[[i for i, t in enumerate(terms) if t]] = self.terms.intern_all(
                list(filter(None, terms))
            )
            if len(self._own) < len(self.terms.postings.keys):
                self._own = np.concatenate((self._own, np.zeros(len(self._own) + len(new), bool)))
            own = np.fromiter(map(operator.is_, new, terms), bool, len(new))
            self._own[ids[own]] = True
            stemmed.update(itertools.compress(zip(new, ids.tolist(), strict=True), ~own))
            if len(new) == len(unknown):  # each once: in their order (most chunks)
                got[unknown] = ids
            else:
                now = dict(zip(new, ids.tolist(), strict=True))
                got[unknown] = np.fromiter(
                    map(now.__getitem__, [rest_tokens[i] for i in unknown]), np.int64, len(unknown)
                )
        keys[rest] = got
        return keys

    def _add_names(
        self,
        nodes: np.ndarray,
        name_doc: np.ndarray,
        name_tokens: list[list[str]],
        alias_counts: np.ndarray,
    ) -> None:
        """Each document's distinct non-empty names, tokens joined by ``NAME_SEP``."""
        keys = list(map(NAME_SEP.join, name_tokens))
        if alias_counts.any():  # a name repeated in one document counts once
            seen: set[tuple[int, str]] = set()
            keep = []
            for d, k in zip(name_doc.tolist(), keys, strict=True):
                keep.append(bool(k) and (d, k) not in seen)
                seen.add((d, k))
        else:
            keep = list(map(bool, keys))
        held = np.array(keep, bool)
        kept = list(itertools.compress(keys, keep))
        for separators, count in Counter(map(_separators, kept)).items():
            self.name_lengths[separators + 1] += count
        key_ids = self.names.intern_all(kept)
        doc = name_doc[held]
        self.names.add_rows(nodes, nodes[doc], key_ids, np.ones(len(doc), np.int64))

    def _add_tags(self, nodes: np.ndarray, tags: Sequence[Sequence[str]]) -> None:
        """Each document's distinct folded non-empty tags, in order."""
        docs: list[int] = []
        keys: list[str] = []
        for d in itertools.compress(range(len(tags)), tags):
            folded = list(dict.fromkeys(fold(tag) for tag in tags[d] if tag))
            docs.extend([d] * len(folded))
            keys.extend(folded)
        doc = np.array(docs, np.int64)
        self.tags.add_rows(
            nodes, nodes[doc], self.tags.intern_all(keys), np.ones(len(doc), np.int64)
        )
