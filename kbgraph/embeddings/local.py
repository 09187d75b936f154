"""WordLlama's static embedding model, read from the files its wheel ships (no download).

The model is a token table (32,000 x 256, float16): a text's vector is the mean of its tokens'
rows, normalised. ``wordllama``'s own loader looks the tokenizer up under a folder name the
wheel does not use and then tries the network, so the two files are read here directly with
``tokenizers`` and ``safetensors`` (both ``wordllama`` dependencies). Pooling runs in numba over
the unpadded token ids, which is several times faster than the library's padded batches.

Tokens by word: the tokenizer has no pre-tokenizer (its normaliser turns each space into "▁"
and prepends one), so BPE runs over a whole text as one piece, uncached and slow (1,800 texts
of 800 characters a second here). No token of its vocabulary holds "▁" after its first
character, so no merge crosses from a word into the spaces after it: the tokens of a text are
those of its pieces (a word and the spaces before it), each tokenized alone; no token holds a
line break either, so pieces are cut there too (a concept's text joins its names and text with
line breaks, which would otherwise make a new piece of every title's last word). Pieces are
tokenized once and kept (``WORD_CACHE``), the new ones of an ``embed`` call in one batch;
the mean of the tokens' rows does not depend on their order. Tests check the equality with a
whole-text tokenization. Deterministic: the same text gives the same bytes everywhere.

The cache numbers its pieces and keeps their tokens in one array (``_Words``), so a call's
Python work is a split and one dict look-up a piece (``map``, in C); the kernel walks the
texts' pieces and each piece's tokens (``_pool_words``), adding the rows in the order the
texts' token lists would (the same bytes; a test holds them to an oracle), with the GIL
released. A new piece is tokenized by the tokenizer's normaliser and BPE model directly
(``_tokenize``), at under half the CPU of ``encode_batch``.
"""

from __future__ import annotations

import importlib.util
import itertools
import operator
import re
import threading
from pathlib import Path
from typing import Final

import numba as nb
import numpy as np

MODEL: Final = "l2_supercat"
DIM: Final = 256
MAX_CHARS: Final = 4000  # a static model's mean barely moves after the first few hundred words
_PIECE: Final = re.compile(r" *[^ ]+| +")
WORD_CACHE: Final = 500_000  # words whose tokens are kept (emptied when full)


def _pieces(text: str) -> list[str] | None:
    """The keys ``text`` is tokenized by: its words, each less the one space before it (the
    normaliser puts it back as its leading "▁"; runs of spaces have tokens of their own), cut
    again before each line break, since no token holds one (the normaliser's "▁" prepended
    to such a piece is dropped again). None: the text holds the space mark "▁" itself, so
    merges may cross pieces and it is tokenized whole."""
    if "▁" in text:
        return None
    if "  " in text or text.startswith(" "):
        keys = [m.group() if m.start() == 0 else m.group()[1:] for m in _PIECE.finditer(text)]
        if "\n" not in text:
            return keys
        out: list[str] = []
        for key in keys:
            first, *lines = key.split("\n")
            out.append(first)
            out.extend("\n" + line for line in lines)
        return out
    # single spaces only: the pieces are the words, each line's first one after its break (a
    # space put before each break cuts there too: one split in C, no loop over the lines)
    return text.replace("\n", " \n").split(" ") if text else []


def _package_folder() -> Path:
    spec = importlib.util.find_spec("wordllama")
    if spec is None or spec.origin is None:
        raise RuntimeError('[embeddings] provider "local" needs the wordllama package')
    return Path(spec.origin).parent


@nb.njit(cache=True, nogil=True, inline="always")
def _unit(row: np.ndarray) -> None:  # pragma: no cover - compiled
    """Scale ``row`` (float32) to unit length in place; a zero row stays zero."""
    norm = 0.0
    for j in range(len(row)):
        norm += row[j] * row[j]
    if norm > 0:
        inv = np.float32(1.0 / np.sqrt(norm))
        for j in range(len(row)):
            row[j] *= inv


@nb.njit(cache=True, nogil=True)
def _pool(  # pragma: no cover - compiled
    table: np.ndarray, ids: np.ndarray, off: np.ndarray
) -> np.ndarray:
    n = len(off) - 1
    dim = table.shape[1]
    out = np.zeros((n, dim), np.float32)
    for i in range(n):
        a, b = off[i], off[i + 1]
        for k in range(a, b):
            row = ids[k]
            for j in range(dim):
                out[i, j] += table[row, j]
        _unit(out[i])
    return out


@nb.njit(cache=True, nogil=True)
def _pool_words(  # pragma: no cover - compiled
    table: np.ndarray, ids: np.ndarray, word_off: np.ndarray, words: np.ndarray, off: np.ndarray
) -> np.ndarray:
    """``_pool`` over texts given as words: text i is ``words[off[i]:off[i + 1]]``, word w's
    tokens ``ids[word_off[w]:word_off[w + 1]]``; the same sums in the same order, so the
    same bytes as ``_pool`` over the texts' token lists."""
    n = len(off) - 1
    dim = table.shape[1]
    out = np.zeros((n, dim), np.float32)
    for i in range(n):
        for k in range(off[i], off[i + 1]):
            w = words[k]
            for t in range(word_off[w], word_off[w + 1]):
                row = ids[t]
                for j in range(dim):
                    out[i, j] += table[row, j]
        _unit(out[i])
    return out


class _Words:
    """The word cache: piece -> its number, and each number's token ids (one growing array,
    ``off[w]:off[w + 1]``). Only grows: a caller holding ``ids`` and ``off`` reads the words
    it found, whatever another thread adds meanwhile (the arrays are replaced, never changed
    below their length, when they grow)."""

    __slots__ = ("ids", "index", "off", "tokens")

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.ids = np.zeros(1 << 16, np.int64)
        self.off = np.zeros(1 << 12, np.int64)
        self.tokens = 0

    def add(self, words: dict[str, list[int]], rows: int) -> None:
        """Number the new words (their token ids clipped to the table's ``rows``)."""
        count, size = len(self.index), sum(map(len, words.values()))
        if self.tokens + size > len(self.ids):
            self.ids = _grown(self.ids, self.tokens + size)
        if count + len(words) + 1 > len(self.off):
            self.off = _grown(self.off, count + len(words) + 1)
        flat = np.fromiter(itertools.chain.from_iterable(words.values()), np.int64, size)
        self.ids[self.tokens : self.tokens + size] = flat.clip(0, rows - 1)
        lengths = np.fromiter(map(len, words.values()), np.int64, len(words))
        self.off[count + 1 : count + len(words) + 1] = self.tokens + np.cumsum(lengths)
        self.tokens += size
        for number, word in enumerate(words, count):
            self.index[word] = number  # published last: a reader finds only whole words


def _grown(array: np.ndarray, need: int) -> np.ndarray:
    bigger = np.zeros(max(need, 2 * len(array)), array.dtype)
    bigger[: len(array)] = array
    return bigger


class LocalEmbedder:
    name = f"local:wordllama-{MODEL}-{DIM}"
    remote = False  # in-process, about a millisecond a question: never cut short

    def __init__(self) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        folder = _package_folder()
        weights = load_file(str(folder / "weights" / f"{MODEL}_{DIM}.safetensors"))
        self._table = np.ascontiguousarray(weights["embedding.weight"], np.float32)
        self._tokenizer = Tokenizer.from_file(
            str(folder / "tokenizers" / f"{MODEL}_tokenizer_config.json")
        )
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._words = _Words()
        self._lock = threading.Lock()  # adding words (a lookup never waits on it)
        space = self._tokenizer.token_to_id("▁")
        if space is None:
            raise RuntimeError(f"the {MODEL} tokenizer in {folder} has no '▁' token")
        self._space = space
        normalizer = self._tokenizer.normalizer
        if normalizer is None or self._tokenizer.pre_tokenizer is not None:
            raise RuntimeError(f"the {MODEL} tokenizer in {folder} is not normaliser then BPE")
        self._normalizer, self._model = normalizer, self._tokenizer.model
        added = self._tokenizer.get_added_tokens_decoder().values()
        self._added_marks = {token.content[0] for token in added if token.content}

    def tokens(self, text: str) -> list[int]:
        """The token ids of ``text`` (cut to MAX_CHARS)."""
        return self._token_lists([text])[0]

    def whole_tokens(self, text: str) -> list[int]:
        """The token ids of all of ``text`` tokenized at once, without the word cache: the
        same tokens ``tokens`` gives word by word (what the tests hold it to)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _tokenize(self, pieces: list[str]) -> dict[str, list[int]]:
        """The token ids of pieces tokenized alone: the tokenizer's normaliser, then its BPE
        model, piece by piece (what ``encode`` does without its ``Encoding``'s offsets and
        masks, at under half its CPU, and without ``encode_batch``'s thread pool, whose
        threads cost more CPU than the work on two shared cores); a piece that could hold one
        of its added tokens (``<s>``, matched before the normaliser) goes through ``encode``."""
        if not pieces:
            return {}
        normalize, model = self._normalizer.normalize_str, self._model.tokenize
        marks = self._added_marks
        fresh = {
            k: (
                self._tokenizer.encode(k, add_special_tokens=False).ids
                if not marks.isdisjoint(k)  # one of the added tokens' first characters
                else [token.id for token in model(normalize(k))]
            )
            for k in pieces
        }
        for k in pieces:
            if k.startswith("\n"):  # no "▁" before a line's first word: drop the prepended one
                del fresh[k][0]
        if "" in fresh:  # a single trailing space: a lone "▁" (the normaliser skips "")
            fresh[""] = [self._space]
        return fresh

    def _numbered(self, keys: list[str]) -> tuple[list[int], _Words]:
        """Each piece's number in the word cache, the new ones tokenized (in one batch) and
        added; with the cache they are numbers of (started again when it is full)."""
        words = self._words
        found = list(map(words.index.get, keys))
        if None not in found:
            return found, words  # type: ignore[return-value]
        with self._lock:  # one thread adds at a time; lookups of known words never wait
            if words is not self._words:  # started over meanwhile
                words = self._words
                found = list(map(words.index.get, keys))
            missing = list(
                itertools.compress(
                    range(len(keys)), map(operator.is_, found, itertools.repeat(None))
                )
            )
            index = words.index  # another thread may have added some since the look-up
            fresh = self._tokenize(
                [k for k in dict.fromkeys(keys[i] for i in missing) if k not in index]
            )
            rows = len(self._table)
            if len(words.index) + len(fresh) > WORD_CACHE:  # start over with this call's words
                old, words = words, _Words()
                kept = {
                    k: old.ids[old.off[n] : old.off[n + 1]].tolist()
                    for k in dict.fromkeys(keys)
                    if (n := old.index.get(k)) is not None
                }
                words.add(kept | fresh, rows)
                self._words = words
                return list(map(words.index.__getitem__, keys)), words
            words.add(fresh, rows)
            # the numbers found stand (the cache only grows): only the missing are looked up
            # again, not every piece (each look-up in a cache of 10^5 words misses the CPU's
            # caches: two passes over a call's pieces were ~70 us a note of a vault's import)
            for i in missing:
                found[i] = index[keys[i]]
            return found, words  # type: ignore[return-value]

    def _token_lists(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids (the word cache's, as ``embed`` pools them)."""
        out: list[list[int]] = []
        for text in texts:
            keys = _pieces(text[:MAX_CHARS])
            if keys is None:
                out.append(self._tokenizer.encode(text[:MAX_CHARS], add_special_tokens=False).ids)
                continue
            numbers, words = self._numbered(keys)
            ids, off = words.ids, words.off
            out.append([int(t) for n in numbers for t in ids[off[n] : off[n + 1]]])
        return out

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), np.float32)
        pieces = [_pieces(text[:MAX_CHARS]) for text in texts]
        whole = [i for i, keys in enumerate(pieces) if keys is None]
        by_word = [keys or [] for keys in pieces]
        off = np.zeros(len(texts) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, by_word), np.int64, len(texts)), out=off[1:])
        numbers, words = self._numbered(list(itertools.chain.from_iterable(by_word)))
        table = self._table
        out = _pool_words(table, words.ids, words.off, np.array(numbers, np.int64), off)
        if whole:  # texts holding "▁" itself, tokenized whole: their own tokens
            lists = [
                self._tokenizer.encode(texts[i][:MAX_CHARS], add_special_tokens=False).ids
                for i in whole
            ]
            at = np.zeros(len(lists) + 1, np.int64)
            np.cumsum([len(t) for t in lists], out=at[1:])
            flat = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(at[-1]))
            out[whole] = _pool(table, flat.clip(0, len(table) - 1), at)
        return out
