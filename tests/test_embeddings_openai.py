"""The openai provider against a real HTTP server speaking the OpenAI embeddings shape (the
tests' own, on 127.0.0.1, answering with the local model's vectors): batches, the key from the
environment, retries, a slow server and a stopped one; and a service whose provider is down at
import fills its vectors in once the provider answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from kbgraph.api import create_app
from kbgraph.config import load_config
from kbgraph.embeddings import EmbeddingUnavailable
from kbgraph.embeddings.openai import OpenAIEmbedder
from tests.embedders import LOCAL, FakeServer, config
from tests.kb_events import upsert
from tests.support import ADMIN, Service, write_config


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    s.start()
    yield s
    if s.thread.is_alive():
        s.stop()


def test_batches_key_and_vectors(server: FakeServer, monkeypatch) -> None:
    monkeypatch.setenv("KBG_TEST_KEY", "sk-test")
    texts = [f"note {i} about disks" for i in range(7)]
    got = OpenAIEmbedder(config(server.url, batch=3)).embed(texts)
    assert [len(r["input"]) for r in server.requests] == [3, 3, 1]
    assert set(server.keys) == {"Bearer sk-test"} and {r["model"] for r in server.requests} == {"m"}
    assert np.allclose(got, LOCAL.embed(texts), atol=1e-6)


def test_retries_a_busy_server_then_answers(server: FakeServer) -> None:
    server.fail = 2
    got = OpenAIEmbedder(config(server.url, retries=3)).embed(["dns"])
    assert len(server.requests) == 3 and np.allclose(got, LOCAL.embed(["dns"]), atol=1e-6)


def test_slow_and_stopped_servers_are_unavailable(server: FakeServer) -> None:
    server.delay = 1.0
    slow = OpenAIEmbedder(config(server.url, timeout_seconds=0.2, retries=1))
    with pytest.raises(EmbeddingUnavailable, match="Timeout"):
        slow.embed(["dns"])
    server.delay = 0.0
    server.stop()
    stopped = OpenAIEmbedder(config(server.url, retries=1))
    with pytest.raises(EmbeddingUnavailable, match="Connect"):
        stopped.embed(["dns"])


def test_a_service_fills_in_once_the_provider_is_back(tmp_path: Path) -> None:
    """The provider is down while a delivery is applied: the delivery is applied and searchable
    by words at once, /status says filling; once the server answers, the vectors fill in."""
    s = FakeServer()  # bound, not started: connections are refused
    extra = f'[embeddings]\nprovider = "openai"\nurl = "{s.url}"\nretries = 0\n'
    app = create_app(load_config(write_config(tmp_path, extra)))
    try:
        with TestClient(app) as client:
            service = Service(client)
            seq = service.write("homelab", [upsert("a/dns", title="DNS resolver")], vectors=False)
            status = service.call(ADMIN, "GET", "/v1/kbs/homelab/status", seq).json()
            assert status["vectors"] == "filling" and status["vectors_missing"] == 1
            words = service.call(ADMIN, "GET", "/v1/kbs/homelab/search?q=dns", seq).json()
            assert [h["id"] for h in words["hits"]] == ["a/dns"]
            s.start()
            deadline = time.monotonic() + 60
            while status["vectors"] != "complete":
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
                status = service.call(ADMIN, "GET", "/v1/kbs/homelab/status", seq).json()
            url = "/v1/kbs/homelab/search?q=name%20lookup&mode=vector"
            hits = service.call(ADMIN, "GET", url, seq).json()["hits"]
            assert [h["id"] for h in hits] == ["a/dns"]
    finally:
        if s.thread.is_alive():
            s.stop()
        else:
            s.sock.close()
