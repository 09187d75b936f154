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
"""

from __future__ import annotations

import importlib.util
import re
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
    # single spaces only: the pieces are the words, each line's first one after its break
    if not text:
        return []
    first, *lines = text.split("\n")
    out = first.split(" ")
    for line in lines:
        words = line.split(" ")
        words[0] = "\n" + words[0]
        out.extend(words)
    return out


def _package_folder() -> Path:
    spec = importlib.util.find_spec("wordllama")
    if spec is None or spec.origin is None:
        raise RuntimeError('[embeddings] provider "local" needs the wordllama package')
    return Path(spec.origin).parent


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
        norm = 0.0
        for j in range(dim):
            norm += out[i, j] * out[i, j]
        if norm > 0:
            inv = np.float32(1.0 / np.sqrt(norm))
            for j in range(dim):
                out[i, j] *= inv
    return out


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
        self._words: dict[str, list[int]] = {}
        space = self._tokenizer.token_to_id("▁")
        if space is None:
            raise RuntimeError(f"the {MODEL} tokenizer in {folder} has no '▁' token")
        self._space = space

    def tokens(self, text: str) -> list[int]:
        """The token ids of ``text`` (cut to MAX_CHARS)."""
        return self._token_lists([text])[0]

    def whole_tokens(self, text: str) -> list[int]:
        """The token ids of all of ``text`` tokenized at once, without the word cache: the
        same tokens ``tokens`` gives word by word (what the tests hold it to)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _token_lists(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, the words new to the cache tokenized in one batch."""
        pieces = [_pieces(text[:MAX_CHARS]) for text in texts]
        known = self._words
        missing = list({k for keys in pieces if keys is not None for k in keys if k not in known})
        fresh: dict[str, list[int]] = {}
        if missing:
            encoded = self._tokenizer.encode_batch(missing, add_special_tokens=False)
            fresh = dict(zip(missing, (e.ids for e in encoded), strict=True))
            for k in missing:
                if k.startswith("\n"):  # no "▁" before a line's first word: drop the prepended one
                    del fresh[k][0]
            if "" in fresh:  # a single trailing space: a lone "▁" (the normaliser skips "")
                fresh[""] = [self._space]
            if len(known) + len(fresh) > WORD_CACHE:
                # start a new cache: ``known`` is never emptied, so this call (and one in
                # another thread) still finds the words it saw there
                self._words = fresh
            else:
                known.update(fresh)
        out: list[list[int]] = []
        for text, keys in zip(texts, pieces, strict=True):
            if keys is None:
                out.append(self._tokenizer.encode(text[:MAX_CHARS], add_special_tokens=False).ids)
                continue
            ids: list[int] = []
            for k in keys:
                ids.extend(fresh[k] if k in fresh else known[k])
            out.append(ids)
        return out

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), np.float32)
        per_text = self._token_lists(texts)
        off = np.zeros(len(per_text) + 1, np.int64)
        np.cumsum([len(t) for t in per_text], out=off[1:])
        flat = np.fromiter((i for t in per_text for i in t), np.int64, int(off[-1]))
        return _pool(self._table, flat.clip(0, len(self._table) - 1), off)
