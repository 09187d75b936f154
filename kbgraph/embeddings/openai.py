"""Any OpenAI-compatible ``POST {url}/embeddings`` (OpenAI, Ollama, vLLM, TEI), over httpx.

Texts go in batches of ``[embeddings] batch``; each request has ``timeout_seconds`` and is
tried ``1 + retries`` times with a doubling pause (0.25 s, 0.5 s, ...) on a transport error,
a timeout, 429 or a 5xx; then ``EmbeddingUnavailable`` (the caller serves without vectors and
tries again later). 400, 413 and 422 (a text the model cannot take) raise ``EmbeddingRefused``
at once (the filler splits the batch); any other answer (401, 404, a malformed body) raises
``EmbeddingUnavailable`` at once. The embedder's ``name`` (stored with each vector and in
checkpoints) holds the URL's scheme, host, port and path only; a URL with credentials in it is
refused when the config is loaded. The key is
read from the environment variable ``api_key_env`` names, at each request, never from the file.
Vectors are normalised to unit length (cosine is what search ranks by).
"""

from __future__ import annotations

import os
import time
from typing import Final

import httpx
import msgspec
import numpy as np

from kbgraph.config import EmbeddingsConfig
from kbgraph.embeddings import EmbeddingRefused, EmbeddingUnavailable

PAUSE: Final = 0.25
RETRY_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})
REFUSED_STATUS: Final = frozenset({400, 413, 422})


def public_url(url: str) -> str:
    """``url`` without credentials, query or fragment: what may be stored and shown."""
    parts = httpx.URL(url)
    return str(parts.copy_with(username=None, password=None, query=None, fragment=None))


class _Item(msgspec.Struct):
    index: int
    embedding: list[float]


class _Answer(msgspec.Struct):
    data: list[_Item]


class OpenAIEmbedder:
    remote = True

    def __init__(self, config: EmbeddingsConfig) -> None:
        self.name = f"openai:{public_url(config.url)}:{config.model}"
        self._url = config.url.rstrip("/") + "/embeddings"
        self._model = config.model
        self._key_env = config.api_key_env
        self._batch = config.batch
        self._retries = config.retries
        self._client = httpx.Client(timeout=config.timeout_seconds)
        self._decoder = msgspec.json.Decoder(_Answer)

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = [
            self._request(texts[i : i + self._batch]) for i in range(0, len(texts), self._batch)
        ]
        if not rows:
            return np.zeros((0, 0), np.float32)
        out = np.concatenate(rows).astype(np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        unit: np.ndarray = out / norms
        return unit

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self._key_env, "") if self._key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _request(self, texts: list[str]) -> np.ndarray:
        body = {"model": self._model, "input": texts}
        problem = ""
        for attempt in range(self._retries + 1):
            if attempt:
                time.sleep(PAUSE * 2 ** (attempt - 1))
            try:
                response = self._client.post(self._url, json=body, headers=self._headers())
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in RETRY_STATUS:
                problem = f"HTTP {response.status_code}"
                continue
            if response.status_code in REFUSED_STATUS:
                raise EmbeddingRefused(f"HTTP {response.status_code} from {self._url}")
            if response.status_code != 200:
                raise EmbeddingUnavailable(f"HTTP {response.status_code} from {self._url}")
            try:
                answer = self._decoder.decode(response.content)
            except msgspec.DecodeError as exc:
                raise EmbeddingUnavailable(f"malformed answer from {self._url}: {exc}") from None
            items = sorted(answer.data, key=lambda item: item.index)
            if [item.index for item in items] != list(range(len(texts))):
                raise EmbeddingUnavailable(f"{self._url} did not answer one vector per text")
            return np.array([item.embedding for item in items], np.float32)
        raise EmbeddingUnavailable(f"{self._url}: {problem}")
