"""Issue 10, in process: agent bodies bounded, X-Min-Seq strict, no slash redirect, a readyz
that sees an unwritable store. (The socket-level limits are in tests/test_server_limits.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kbgraph.api import create_app
from kbgraph.config import load_config
from kbgraph.http.health import write_problem
from tests.kb_events import upsert
from tests.support import ADMIN, Service, bearer, write_config

KB = "homelab"
LIMIT = 2000


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Service]:
    config = load_config(write_config(tmp_path, f"[limits]\nmax_request_bytes = {LIMIT}\n"))
    with TestClient(create_app(config)) as client:
        service = Service(client)
        service.write(KB, [upsert("infra/dns", title="DNS", text="The resolver.")])
        yield service


def post(service: Service, body: bytes, **headers: str):
    headers = {**bearer(ADMIN), "X-Min-Seq": "1", **headers}
    return service.client.post(f"/v1/kbs/{KB}/tools/graph_context", content=body, headers=headers)


def test_a_body_past_the_limit_is_413_and_closes(small: Service) -> None:
    query = b'{"query": "dns", "limit": 5}'
    padded = query[:-1] + b" " * (LIMIT - len(query)) + b"}"
    assert len(padded) == LIMIT and post(small, padded).status_code == 200
    for body in (padded + b" ", b'{"ids": ["' + b"x" * 10**6 + b'"]}'):
        response = post(small, body)
        assert response.status_code == 413
        assert response.json() == {"error": f"request body over the limit of {LIMIT} bytes"}
        assert response.headers["connection"] == "close"


@pytest.mark.parametrize("value", ["1_0", "+3", " 3", "3 ", "-1", "0x10", "²", "1" * 20, ""])
def test_x_min_seq_takes_plain_digits_only(service: Service, value: str) -> None:
    raw = value.encode("latin-1")  # "²" is a digit to str.isdigit, and latin-1 on the wire
    response = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", headers={"X-Min-Seq": raw})
    assert response.status_code == 422
    assert response.json()["error"].startswith("X-Min-Seq: expected up to 19 digits 0-9, got")


def test_x_min_seq_error_never_echoes_a_long_header(service: Service) -> None:
    service.write(KB, [upsert("infra/dns")])
    huge = "7" * 5000
    response = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", headers={"X-Min-Seq": huge})
    assert response.status_code == 422
    assert len(response.content) < 200 and huge not in response.text
    ok = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", headers={"X-Min-Seq": "0000001"})
    assert ok.status_code == 200


def test_a_trailing_slash_is_a_404_that_does_not_echo_the_host(service: Service) -> None:
    response = service.client.get(
        "/healthz/", headers={"Host": "evil.example"}, follow_redirects=False
    )
    assert response.status_code == 404
    assert response.json() == {"error": "not found: /healthz/"}
    assert "evil" not in response.text and "location" not in response.headers


def test_write_problem_names_a_missing_store_and_an_unusable_folder(tmp_path: Path) -> None:
    assert "cannot write" in str(write_problem(str(tmp_path / "missing.db")))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert "cannot write" in str(write_problem(str(not_a_folder / "kb.db")))


def test_an_mcp_body_past_the_limit_is_413_before_the_sdk_reads_it(small: Service) -> None:
    headers = {
        **bearer(ADMIN),
        "X-Min-Seq": "1",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "' + b"x" * LIMIT + b'"}'
    response = small.client.post(f"/v1/kbs/{KB}/mcp", content=big, headers=headers)
    assert response.status_code == 413
    assert response.json() == {"error": f"request body over the limit of {LIMIT} bytes"}
