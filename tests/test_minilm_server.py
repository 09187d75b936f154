"""loadtest.minilm_server's HTTP shape and vector cache, with a stand-in model (the real
weights ship in a package the evaluation installs; ``--check`` checks them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from starlette.testclient import TestClient

from loadtest.minilm_server import Cache, create_app


class Counting:
    """A stand-in model: a deterministic unit vector per text, counting what it embeds."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.seen += texts
        out = np.array([[len(t), t.count("a") + 1.0, 1.0] for t in texts], np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_answers_as_openai_embeddings_and_embeds_each_text_once(tmp_path: Path) -> None:
    model = Counting()
    client = TestClient(create_app(model, Cache(tmp_path / "cache.sqlite")))
    body = {"model": "all-MiniLM-L6-v2", "input": ["alpha", "beta", "alpha"]}
    first = client.post("/v1/embeddings", json=body).json()
    assert [row["index"] for row in first["data"]] == [0, 1, 2]
    assert first["data"][0]["embedding"] == first["data"][2]["embedding"]
    assert model.seen == ["alpha", "beta"]  # a repeated text is embedded once
    again = TestClient(create_app(model, Cache(tmp_path / "cache.sqlite")))  # a new process
    second = again.post("/v1/embeddings", json={"input": "beta"}).json()
    assert second["data"][0]["embedding"] == first["data"][1]["embedding"]
    assert model.seen == ["alpha", "beta"]  # from the cache file
    bad = client.post("/v1/embeddings", json={"input": [1, 2]})
    assert bad.status_code == 400 and "'input'" in bad.json()["error"]["message"]
