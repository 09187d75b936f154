"""Arbitrary input never gets a 5xx, always gets a JSON error, and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from kbgraph.api import context_of, create_app
from kbgraph.config import load_config
from tests import webhook_client as wc
from tests.kb_events import upsert
from tests.support import ADMIN, INFRA, SECRET, Service, write_config

KB = "homelab"
TOOLS = ["graph_context", "link_suggest", "graph_path"]
FIELDS = ["query", "ids", "limit", "id", "source", "target", "direction", "max_hops", "x"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5).map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=40),
).map(str.encode)


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # A short X-Min-Seq wait: an unreachable seq drawn by the fuzz costs 50 ms, not a second.
    folder = tmp_path_factory.mktemp("fuzz")
    app = create_app(load_config(write_config(folder, min_seq_wait=0.05)))
    with TestClient(app) as client:
        service = Service(client)
        service.write(KB, [upsert("infra/a", links=["infra/b"]), upsert("infra/b", text="dns")])
        yield service


def state(service: Service) -> bytes:
    return (
        service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status").content
        + service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/infra/a").content
    )


def assert_clean_answer(response) -> None:
    assert response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/json")
    if response.status_code != 200:
        assert set(response.json()) == {"error"} and response.json()["error"]


settings_ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@settings_
@given(tool=st.sampled_from(TOOLS), body=bodies, token=st.sampled_from([ADMIN, INFRA]))
def test_tool_bodies(fuzz_service: Service, tool: str, body: bytes, token: str) -> None:
    before = state(fuzz_service)
    response = fuzz_service.call(token, "POST", f"/v1/kbs/{KB}/tools/{tool}", content=body)
    assert_clean_answer(response)
    assert state(fuzz_service) == before


@settings_
@given(
    query=st.text(max_size=30),
    limit=st.text(max_size=6),
    concept=st.text(min_size=1, max_size=20),
    min_seq=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=6),
)
def test_reads_with_arbitrary_strings(
    fuzz_service: Service, query: str, limit: str, concept: str, min_seq: str
) -> None:
    search = fuzz_service.call(
        INFRA, "GET", f"/v1/kbs/{KB}/search", params={"q": query, "limit": limit}
    )
    assert_clean_answer(search)
    read = fuzz_service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/{quote(concept, safe='/')}")
    assert_clean_answer(read)
    status = fuzz_service.call(
        ADMIN, "GET", f"/v1/kbs/{KB}/status", headers={"X-Min-Seq": min_seq[:3]}
    )
    sent = min_seq[:3].strip(" \t")  # HTTP drops the optional whitespace around a value
    if not (sent.isascii() and sent.isdigit()):
        assert status.status_code == 422, status.text
        assert status.json()["error"].startswith("X-Min-Seq: expected up to 19 digits 0-9")
    elif int(sent) > context_of(fuzz_service.app).service.store.kb_seq(KB):
        # A seq the KB has not reached: the contract's 503 after the bounded wait.
        assert status.status_code == 503 and status.headers["Retry-After"] == "1"
        assert status.json() == {"error": f"not yet at seq {int(sent)}: try again"}
    else:
        assert status.status_code == 200, status.text


@settings_
@given(
    body=bodies,
    content_type=st.sampled_from(
        ["application/json", "application/cloudevents+json",
         "application/cloudevents-batch+json", "text/plain"]
    ),
)  # fmt: skip
def test_signed_garbage_deliveries_store_nothing(
    fuzz_service: Service, body: bytes, content_type: str
) -> None:
    before = state(fuzz_service)
    seq = context_of(fuzz_service.app).service.store.kb_seq(KB)
    headers = wc.signed_headers(SECRET, body, content_type)
    response = fuzz_service.client.post(f"/v1/kbs/{KB}/events", content=body, headers=headers)
    assert_clean_answer(response)
    if response.status_code != 200 or response.json()["applied"] == 0:
        assert context_of(fuzz_service.app).service.store.kb_seq(KB) == seq
        assert state(fuzz_service) == before


def test_fixture_state_is_real(fuzz_service: Service) -> None:
    """The fuzzed KB is not empty, so 'state unchanged' compares something."""
    status = fuzz_service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status").json()
    assert status == {
        "kb": KB,
        "concepts": 2,
        "links": 1,
        "vectors": "complete",
        "vectors_missing": 0,
    }
