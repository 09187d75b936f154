"""Embedding providers (``[embeddings]``, docs/configuration.md): text in, unit float32 vectors out.

- ``local`` (``kbgraph.embeddings.local``): WordLlama's static 256-dimension model, whose weights
  ship inside the ``wordllama`` wheel; nothing is fetched at run time. The default when the
  package is installed.
- ``openai`` (``kbgraph.embeddings.openai``): any OpenAI-compatible ``/v1/embeddings``.
- ``none``: no vectors; search is lexical only.

The configured provider is made by ``kbgraph.embeddings.providers.make_embedder``. A provider
raises ``EmbeddingUnavailable`` when it cannot answer now; vectors are derived data,
so the caller serves without them and tries again later (``kbgraph.projection.filler``). It
raises ``EmbeddingRefused`` when it answered that a text of the batch cannot be embedded (too
long for its context): ``embed_each`` then splits the batch until the refusal belongs to one
text, which is recorded as failed while the others get their vectors.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import numpy as np


class EmbeddingUnavailable(Exception):
    """The provider cannot embed now (down, slow, refusing): try again later."""


class EmbeddingRefused(EmbeddingUnavailable):
    """The provider refused the batch for what it holds (400/413/422: a text too long, say)."""


class Embedder(Protocol):
    """``name`` identifies the model (stored vectors of another name are recomputed);
    ``remote``: calls leave the process (a question then waits for its vector only so long)."""

    name: str
    remote: bool

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit float32 rows, one per text, in order; raises EmbeddingUnavailable."""
        ...


def concept_text(title: str, aliases: list[str], tags: list[str], text: str) -> str:
    """What is embedded for a concept: its names first, then its text."""
    return "\n".join((title, " ".join(aliases), " ".join(tags), text))


def text_hash(text: str) -> bytes:
    """What a stored vector was computed from (with the model's name): 16 bytes of BLAKE2b."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def embed_each(embedder: Embedder, texts: list[str]) -> list[np.ndarray | str]:
    """Each text's unit vector, or the provider's refusal of that text alone: a refused batch
    is split in halves until the refusal belongs to one text. ``EmbeddingUnavailable`` (the
    provider down or slow) is raised as it is: no text is at fault."""
    if not texts:
        return []
    try:
        return list(embedder.embed(texts))
    except EmbeddingRefused as exc:
        if len(texts) == 1:
            return [str(exc) or "refused"]
    half = len(texts) // 2
    return embed_each(embedder, texts[:half]) + embed_each(embedder, texts[half:])
