"""The configured embedding provider (``[embeddings] provider``), its module imported only
when chosen (``local`` needs wordllama, ``openai`` httpx)."""

from __future__ import annotations

from kbgraph.config import EmbeddingsConfig
from kbgraph.embeddings import Embedder
from kbgraph.extras import missing


def local_available() -> bool:
    return not missing("local")


def local_model(config: EmbeddingsConfig) -> bool:
    """Whether the configured provider is the model that runs in the process."""
    return config.provider == "local" or (config.provider == "default" and local_available())


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
