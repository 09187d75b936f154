"""The local model's vector of an upsert, computed once per store and carried in its log row.

A model that runs in the process (``Embedder.remote`` false: the local one) is a pure,
deterministic function of the text, and cheap. So the store's analyser thread embeds each
delivery's upserts in one call (``Carrier.vectors``, from ``kbgraph.store.group.Pending``),
and the event's log row carries the vector quantised as the projection keeps it (``pack``:
int8 row, float32 scale, 128-bit code) beside its text analysis
(``kbgraph.search.document.Analysed``), under the key of the model and of the cut that made it
(``key``). The writer stores the float vector in the ``vector`` table in the same transaction
(``kbgraph.store.vectorrows``), so a build without a checkpoint finds it too. Every follower of
the store (each worker of ``serve --workers N``) installs the carried bytes
(``Vectors.changed``) instead of running the model; a row of another key (another model,
version or ``max_chars``), or without one, leaves the vector waiting as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np

from kbgraph.embeddings import Embedder, concept_text, text_hash
from kbgraph.events import UpsertData
from kbgraph.graphalgo.nearest import CODE_BITS, quantize

EXTRA: Final = 4 + CODE_BITS // 8  # bytes of a packed row beyond its int8 values


def key(model: str, max_chars: int) -> str:
    """What a carried vector was made by: the model's name and the cut of its text."""
    return f"{model}|{max_chars}"


def pack(vectors: np.ndarray) -> list[bytes]:
    """Each float row as the log carries it: its int8 values, its scale (float32), its code
    (two uint64), little-endian; exactly what ``Vectors.install`` would keep of it."""
    q8, scale, codes = quantize(vectors)
    n = len(q8)
    rows = np.concatenate(
        (
            q8.view(np.uint8),
            scale.astype("<f4").view(np.uint8).reshape(n, 4),
            codes.astype("<u8").view(np.uint8).reshape(n, CODE_BITS // 8),
        ),
        axis=1,
    )
    return [row.tobytes() for row in rows]


def unpack(blobs: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(q8, scale, codes) of packed rows of one length, in one step; None when they are not
    rows of one shape (a row of another layout is never installed)."""
    width = len(blobs[0]) if blobs else 0
    dim = width - EXTRA
    if dim <= 0 or any(len(b) != width for b in blobs):
        return None
    rows = np.frombuffer(b"".join(blobs), np.uint8).reshape(len(blobs), width)
    q8 = rows[:, :dim].view(np.int8)
    scale = rows[:, dim : dim + 4].copy().view("<f4").reshape(-1).astype(np.float32)
    codes = rows[:, dim + 4 :].copy().view("<u8").astype(np.uint64)
    return q8, scale, codes


class Carried(NamedTuple):
    """One upsert's vector as the store writes it: the log's bytes and the ``vector`` row's."""

    text_hash: bytes
    vector: np.ndarray  # float32, for the store's ``vector`` row
    packed: bytes  # for the log row


class Carrier:
    """The store's side: the vectors of a delivery's upserts, made once (analyser thread)."""

    def __init__(self, embedder: Embedder, max_chars: int) -> None:
        if embedder.remote:
            raise ValueError(f"{embedder.name} leaves the process: its vectors are not carried")
        self.embedder = embedder
        self.model = embedder.name
        self.max_chars = max_chars
        self.key = key(embedder.name, max_chars)

    def vectors(self, upserts: Sequence[UpsertData]) -> list[Carried]:
        """Each upsert's vector, each distinct text embedded once, in one call."""
        if not upserts:
            return []
        cut = self.max_chars
        texts = [concept_text(d.title, d.aliases, d.tags, d.text)[:cut] for d in upserts]
        distinct = list(dict.fromkeys(texts))
        embedded = np.asarray(self.embedder.embed(distinct), np.float32)
        packed = pack(embedded)
        at = {text: i for i, text in enumerate(distinct)}
        hashes = {text: text_hash(text) for text in distinct}
        return [Carried(hashes[t], embedded[at[t]], packed[at[t]]) for t in texts]
