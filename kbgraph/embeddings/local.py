"""WordLlama's static embedding model, read from the files its wheel ships (no download).

The model is a token table (32,000 x 256, float16): a text's vector is the mean of its tokens'
rows, normalised. ``wordllama``'s own loader looks the tokenizer up under a folder name the
wheel does not use and then tries the network, so the two files are read here directly with
``tokenizers`` and ``safetensors`` (both ``wordllama`` dependencies). Pooling runs in numba over
the unpadded token ids, which is several times faster than the library's padded batches.
Deterministic: the same text gives the same bytes on every machine and node.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Final

import numba as nb
import numpy as np

MODEL: Final = "l2_supercat"
DIM: Final = 256
MAX_CHARS: Final = 4000  # a static model's mean barely moves after the first few hundred words


def _package_folder() -> Path:
    spec = importlib.util.find_spec("wordllama")
    if spec is None or spec.origin is None:
        raise RuntimeError('[embeddings] provider "local" needs the wordllama package')
    return Path(spec.origin).parent


@nb.njit(cache=True, nogil=True)
def _pool(table, ids, off):  # pragma: no cover - compiled
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

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), np.float32)
        encoded = self._tokenizer.encode_batch(
            [t[:MAX_CHARS] for t in texts], add_special_tokens=False
        )
        lengths = np.fromiter((len(e.ids) for e in encoded), np.int64, len(encoded))
        off = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        ids = np.fromiter((i for e in encoded for i in e.ids), np.int64, int(off[-1])).clip(
            0, len(self._table) - 1
        )
        return _pool(self._table, ids, off)
