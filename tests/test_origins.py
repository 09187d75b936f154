"""Issue 28, Medium 8: with authentication off (loopback only), a DNS-rebinding or
cross-site page can neither read nor write: only loopback ``Host`` names and this same origin
(or none) pass; the refusals are JSON and change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kbgraph.api import create_app
from kbgraph.config import load_config
from kbgraph.http.origins import is_loopback_host
from tests import webhook_client as wc

BASE = "http://127.0.0.1:8000"


@pytest.fixture
def open_service(tmp_path: Path) -> Iterator[TestClient]:
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n[server]\nallowed_origins = ["http://ok.test"]\n')
    with TestClient(create_app(load_config(config)), base_url=BASE) as client:
        yield client


def test_loopback_host_names() -> None:
    for host in ("localhost", "127.0.0.1", "[::1]", "LOCALHOST:80", "127.0.0.1:65535", "[::1]:8"):
        assert is_loopback_host(host), host
    for host in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example:80",
                 "127.0.0.2", "[::2]", "", "localhost:", "localhost:x", "0.0.0.0"):  # fmt: skip
        assert not is_loopback_host(host), host


def test_rebinding_host_is_refused_and_writes_nothing(open_service: TestClient) -> None:
    body = wc.encode([wc.upsert("a/b", title="B")])
    headers = {"content-type": "application/cloudevents-batch+json"}
    for host in ("evil.example", "evil.example:8000"):
        read = open_service.get("/v1/kbs", headers={"host": host})
        assert read.status_code == 421
        assert read.json() == {
            "error": f"Host {host!r}: authentication is off, so only loopback names"
        }
        write = open_service.post(
            "/v1/kbs/k/events", content=body, headers={**headers, "host": host}
        )
        assert write.status_code == 421
    assert open_service.get("/v1/kbs").json()["count"] == 0
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000"):
        assert open_service.get("/v1/kbs", headers={"host": host}).status_code == 200


def test_cross_origin_is_refused_same_origin_passes(open_service: TestClient) -> None:
    for origin in ("http://evil.example", "http://localhost:8000", "http://127.0.0.1:9", "null"):
        refused = open_service.get("/healthz", headers={"origin": origin})
        assert refused.status_code == 403, origin
        assert "is not this service's origin" in refused.json()["error"]
    for origin in (BASE, "http://ok.test"):
        assert open_service.get("/healthz", headers={"origin": origin}).status_code == 200
    assert open_service.get("/healthz").status_code == 200  # no Origin: not a cross-site page
