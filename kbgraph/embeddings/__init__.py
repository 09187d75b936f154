"""Embedding providers (SPEC 5 ``[embeddings]``): text in, unit float32 vectors out.

- ``local`` (``kbgraph.embeddings.local``): WordLlama's static 256-dimension model, whose weights
  ship inside the ``wordllama`` wheel; nothing is fetched at run time. The default when the
  package is installed.
- ``openai`` (``kbgraph.embeddings.openai``): any OpenAI-compatible ``/v1/embeddings``.
- ``none``: no vectors; search is lexical only.

A provider raises ``EmbeddingUnavailable`` when it cannot answer now; vectors are derived data,
so the caller serves without them and tries again later (``kbgraph.projection.vectors``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kbgraph.config import EmbeddingsConfig
from kbgraph.extras import missing


class EmbeddingUnavailable(Exception):
    """The provider cannot embed now (down, slow, refusing): try again later."""


class Embedder(Protocol):
    """``name`` identifies the model (stored vectors of another name are recomputed)."""

    name: str

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit float32 rows, one per text, in order; raises EmbeddingUnavailable."""
        ...


def local_available() -> bool:
    return not missing("local")


def make_embedder(config: EmbeddingsConfig) -> Embedder | None:
    """The configured provider, or None for ``none`` (and ``local`` without its package)."""
    provider = config.provider
    if provider == "default":
        provider = "local" if local_available() else "none"
    if provider == "local":
        from kbgraph.embeddings.local import LocalEmbedder

        return LocalEmbedder()
    if provider == "openai":
        from kbgraph.embeddings.openai import OpenAIEmbedder

        return OpenAIEmbedder(config)
    return None


def concept_text(title: str, aliases: list[str], tags: list[str], text: str) -> str:
    """What is embedded for a concept: its names first, then its text."""
    return "\n".join((title, " ".join(aliases), " ".join(tags), text))
