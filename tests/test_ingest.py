"""POST /v1/kbs/{kb}/events: every answer of docs/events.md, and nothing stored on a refusal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.testclient import TestClient

from kbgraph.config import Config, parse_config
from kbgraph.http import ingest
from kbgraph.http.context import AppContext
from kbgraph.log.sqlite import StoreLog
from kbgraph.service import Service
from kbgraph.store import Store, StoreBusy
from tests import webhook_client as wc
from tests.support import SECRET

OLD_SECRET = "whsec_c2VjcmV0LXRoYXQtd2FzLXJvdGF0ZWQtb3V0"


class Harness:
    def __init__(self, client: TestClient, service: Service, commits: list[int]) -> None:
        self.client = client
        self.service = service
        self.commits = commits

    @property
    def store(self) -> Store:
        return self.service.store

    def post(self, kb: str, body: bytes, headers: dict[str, str]):
        return self.client.post(f"/v1/kbs/{kb}/events", content=body, headers=headers)

    def send(self, kb: str, events, secret: str | list[str] | None = SECRET):
        body, headers = wc.delivery(secret, events)
        return self.post(kb, body, headers)


def make_app(config: Config, service: Service, commits: list[int]) -> Starlette:
    """The ingest routes over the SQLite delivery log, as the real service builds them
    (``kbgraph.service``), with the projection's wake-up counted instead."""

    @asynccontextmanager
    async def lifespan(app: Starlette):
        service.store = store = Store(config.store.path)
        service.log = StoreLog(store, lambda: commits.append(1))
        try:
            yield
        finally:
            store.close()

    return Starlette(routes=ingest.routes(AppContext.build(config, service)), lifespan=lifespan)


def harness_for(tmp_path: Path, secrets: list[str], extra: str = "") -> Iterator[Harness]:
    listed = ", ".join(f'"{s}"' for s in secrets)
    config = parse_config(
        f'[store]\npath = "kb.db"\n[webhooks]\nsecrets = [{listed}]\n{extra}', base_dir=tmp_path
    )
    commits: list[int] = []
    service = Service(config)
    with TestClient(make_app(config, service, commits)) as client:
        yield Harness(client, service, commits)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    yield from harness_for(tmp_path, [SECRET], "[server]\nmax_body_bytes = 4096\n")


def assert_nothing_stored(h: Harness, kb: str = "kb") -> None:
    assert h.store.kb_seq(kb) == 0
    assert h.store.read_log(0) == []
    assert h.store.load().kbs == {}


def test_single_event_answer_is_exact_and_after_commit(h: Harness) -> None:
    response = h.send("kb", wc.upsert("a/b", 1, title="T", links=["c"]))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.content == (
        b'{"accepted":1,"applied":1,"duplicates":0,"stale":0,"ignored":0,"seq":1}'
    )
    assert h.commits == [1]
    # durable before the answer: a fresh connection to the file sees it
    with Store(h.store.path) as other:
        assert other.kb_seq("kb") == 1


def test_batch_and_counts(h: Harness) -> None:
    first = wc.upsert("x", 2)
    assert h.send("kb", [first, wc.upsert("y", 1)]).json()["seq"] == 2
    body = h.send(
        "kb",
        [
            first,  # duplicate
            wc.upsert("x", 1),  # stale
            wc.event("link.added", "nobody", 1, target="x"),  # ignored
            wc.event("link.added", "x", 3, target="y"),  # applied
        ],
    ).json()
    assert body == {
        "accepted": 4,
        "applied": 1,
        "duplicates": 1,
        "stale": 1,
        "ignored": 1,
        "seq": 3,
    }
    assert len(h.commits) == 2
    # a delivery that applies nothing does not wake the follower
    assert h.send("kb", [first]).json()["duplicates"] == 1
    assert len(h.commits) == 2


def test_plain_json_single_and_array(h: Harness) -> None:
    for payload in (wc.upsert("p"), [wc.upsert("q")]):
        body = wc.encode(payload)
        headers = wc.signed_headers(SECRET, body, "application/json; charset=utf-8")
        assert h.post("kb", body, headers).status_code == 200
    assert h.store.kb_seq("kb") == 2


def test_empty_batch_is_accepted_with_zeros(h: Harness) -> None:
    response = h.send("kb", [])
    assert response.status_code == 200
    assert response.json() == dict.fromkeys(
        ("accepted", "applied", "duplicates", "stale", "ignored", "seq"), 0
    )
    assert h.commits == []


def test_malformed_json_is_400(h: Harness) -> None:
    body = b'[{"specversion": "1.0",'
    response = h.post("kb", body, wc.signed_headers(SECRET, body, wc.BATCH))
    assert response.status_code == 400
    assert response.json()["error"].startswith("malformed JSON")
    assert_nothing_stored(h)


@pytest.mark.parametrize(
    "case", ["missing", "wrong-secret", "tampered", "old", "new", "garbage-signature"]
)
def test_bad_signatures_are_401(h: Harness, case: str) -> None:
    body = wc.encode([wc.upsert("x")])
    now = int(time.time())
    if case == "missing":
        headers = {"content-type": wc.BATCH}
    elif case == "wrong-secret":
        headers = wc.signed_headers(OLD_SECRET, body, wc.BATCH)
    elif case == "tampered":
        headers = wc.signed_headers(SECRET, body, wc.BATCH)
        body = body.replace(b'"x"', b'"y"')
    elif case == "old":
        headers = wc.signed_headers(SECRET, body, wc.BATCH, timestamp=now - 6 * 60)
    elif case == "new":
        headers = wc.signed_headers(SECRET, body, wc.BATCH, timestamp=now + 6 * 60)
    else:
        headers = wc.signed_headers(SECRET, body, wc.BATCH)
        headers["webhook-signature"] = "v1,%%%not-base64 v2,abc ,"
    response = h.post("kb", body, headers)
    assert response.status_code == 401
    expected = {
        "missing": "missing webhook header webhook-id, webhook-timestamp, webhook-signature",
        "old": "webhook-timestamp outside the 5-minute tolerance",
        "new": "webhook-timestamp outside the 5-minute tolerance",
    }.get(case, "invalid webhook signature")  # the headers alone are refused before the body
    assert response.json() == {"error": expected}
    assert_nothing_stored(h)


def test_timestamps_within_five_minutes_pass(h: Harness) -> None:
    body = wc.encode([wc.upsert("x")])
    headers = wc.signed_headers(SECRET, body, wc.BATCH, timestamp=int(time.time()) - 4 * 60)
    assert h.post("kb", body, headers).status_code == 200


def test_over_the_limit_is_413_by_content_length_and_while_streaming(h: Harness) -> None:
    big = [wc.upsert(f"x{i}", text="y" * 100) for i in range(60)]  # > 4096 bytes
    response = h.send("kb", big)
    assert response.status_code == 413
    assert response.json() == {"error": "body over the limit of 4096 bytes"}
    # no Content-Length: a chunked body is cut while streaming
    body, headers = wc.delivery(SECRET, big)

    def chunks():
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    response = h.client.post("/v1/kbs/kb/events", content=chunks(), headers=headers)
    assert response.status_code == 413
    # the signature headers come before the size: an unsigned upload is refused unread
    assert h.send("kb", big, secret=None).status_code == 401
    assert_nothing_stored(h)


def test_other_content_types_are_415(h: Harness) -> None:
    body = wc.encode(wc.upsert("x"))
    for content_type in ("text/plain", "application/xml", ""):
        response = h.post("kb", body, wc.signed_headers(SECRET, body, content_type))
        assert response.status_code == 415, content_type
        assert "unsupported content type" in response.json()["error"]
    assert_nothing_stored(h)


def test_invalid_event_is_422_naming_the_field_and_nothing_stored(h: Harness) -> None:
    events = [wc.upsert("good"), wc.upsert("also-good"), wc.upsert("x"), wc.upsert("y")]
    events[3]["data"]["version"] = "seven"
    response = h.send("kb", events)
    assert response.status_code == 422
    assert response.json() == {"error": "events[3].data.version: Expected int, got str"}
    events[3]["data"]["version"] = 1
    events[2]["subject"] = "a//b"
    response = h.send("kb", events)
    assert response.status_code == 422
    assert response.json() == {"error": "events[2].subject: invalid concept id: empty segment"}
    single = wc.upsert("x")
    del single["data"]["version"]
    response = h.send("kb", single)
    assert response.status_code == 422
    assert response.json()["error"] == "event.data: Object missing required field version"
    assert_nothing_stored(h)


def test_invalid_kb_name_is_422(h: Harness) -> None:
    response = h.send("Bad.Name", [wc.upsert("x")])
    assert response.status_code == 422
    assert response.json() == {
        "error": 'invalid kb name "Bad.Name": expected [a-z0-9][a-z0-9_-]{0,63}'
    }
    assert_nothing_stored(h, "Bad.Name")


def test_signature_is_checked_before_decoding(h: Harness) -> None:
    body = b"not json at all"
    assert h.post("kb", body, {"content-type": "text/plain"}).status_code == 401


def test_secret_rotation(tmp_path: Path) -> None:
    for harness in harness_for(tmp_path / "both", [SECRET, OLD_SECRET]):
        assert harness.send("kb", wc.upsert("a"), secret=SECRET).status_code == 200
        assert harness.send("kb", wc.upsert("b"), secret=OLD_SECRET).status_code == 200
        # a sender signing with both (mid-rotation) passes too
        assert harness.send("kb", wc.upsert("c"), secret=[OLD_SECRET, SECRET]).status_code == 200
    for harness in harness_for(tmp_path / "new-only", [SECRET]):
        assert harness.send("kb", wc.upsert("a"), secret=OLD_SECRET).status_code == 401
        assert harness.send("kb", wc.upsert("a"), secret=[OLD_SECRET, SECRET]).status_code == 200


def test_no_secrets_configured_accepts_unsigned(tmp_path: Path) -> None:
    for harness in harness_for(tmp_path, []):
        assert harness.send("kb", wc.upsert("a"), secret=None).status_code == 200


def test_metrics_count_deliveries_by_status(h: Harness) -> None:
    def count(status: str) -> float:
        value = REGISTRY.get_sample_value("kbgraph_ingest_deliveries_total", {"status": status})
        return value or 0.0

    before_200, before_401 = count("200"), count("401")
    h.send("kb", wc.upsert("a"))
    h.send("kb", wc.upsert("a"), secret=None)
    assert count("200") == before_200 + 1
    assert count("401") == before_401 + 1
    assert (REGISTRY.get_sample_value("kbgraph_ingest_ack_seconds_count") or 0) >= 2


class _FailingStore:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def append_async(self, kb, events, message=None):
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "status"), [(StoreBusy("locked"), 503), (RuntimeError("bug"), 500)]
)
def test_store_failures_are_not_acknowledged(tmp_path: Path, exc: Exception, status: int) -> None:
    commits: list[int] = []
    config = parse_config("", base_dir=tmp_path)
    service = Service(config)
    service.log = StoreLog(_FailingStore(exc), lambda: commits.append(1))  # type: ignore[arg-type]
    app = Starlette(routes=ingest.routes(AppContext.build(config, service)))
    with TestClient(app) as client:
        body, headers = wc.delivery(None, [wc.upsert("x")])
        response = client.post("/v1/kbs/kb/events", content=body, headers=headers)
    assert response.status_code == status
    assert "error" in response.json()
    assert commits == []
    if status == 503:
        assert response.headers["retry-after"] == "1"
