"""Ingest hardening (issue 10): webhooks bound to their KB, a cap on KBs, bounded fields, NFC
ids, nested and non-UTF-8 bodies, headers before the body; each refusal stores nothing."""

from __future__ import annotations

import contextlib
import select
import socket
import sqlite3
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from starlette.testclient import TestClient

from kbgraph.api import context_of, create_app
from kbgraph.config import load_config
from kbgraph.events import MAX_JSON_DEPTH, TOO_DEEP, ConceptUpserted, UpsertData
from kbgraph.store import ReplayRefused, Store, WebhookMessage
from kbgraph.store.schema import SCHEMA_VERSION
from tests import webhook_client as wc
from tests.support import (
    ADMIN,
    PRIVATE_SECRET,
    SECRET,
    Service,
    binary,
    start_server,
    stop,
    write_config,
)

EXTRA = f"""
[limits]
max_kbs = 3

[webhooks.kbs.private]
secrets = ["{PRIVATE_SECRET}"]
"""


def upsert(concept_id: str) -> ConceptUpserted:
    return ConceptUpserted(specversion="1.0", id=f"e-{concept_id}", source="test://kb",
                           subject=concept_id, data=UpsertData(version=1))  # fmt: skip


def app_for(folder: Path) -> TestClient:
    return TestClient(create_app(load_config(write_config(folder, EXTRA))))


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with app_for(tmp_path) as client:
        yield Service(client)


def post(svc: Service, kb: str, body: bytes, headers: dict[str, str]):
    return svc.client.post(f"/v1/kbs/{kb}/events", content=body, headers=headers)


def send(svc: Service, kb: str, events, secret: str = SECRET):
    body, headers = wc.delivery(secret, events)
    return post(svc, kb, body, headers)


def kb_seq(svc: Service, kb: str) -> int:
    return context_of(svc.app).service.store.kb_seq(kb)


def test_a_kb_with_its_own_secrets_takes_only_those(svc: Service) -> None:
    refused = send(svc, "private", [wc.upsert("a/x")])
    assert (refused.status_code, refused.json()) == (401, {"error": "invalid webhook signature"})
    assert kb_seq(svc, "private") == 0
    assert send(svc, "private", [wc.upsert("a/x")], PRIVATE_SECRET).json()["applied"] == 1
    # and its secret signs nothing for the other KBs
    assert send(svc, "homelab", [wc.upsert("a/x")], PRIVATE_SECRET).status_code == 401
    assert kb_seq(svc, "homelab") == 0


def test_a_webhook_id_is_bound_to_its_kb_across_restarts(tmp_path: Path) -> None:
    body, headers = wc.delivery(SECRET, [wc.upsert("infra/dns")])
    with app_for(tmp_path) as client:
        svc = Service(client)
        assert post(svc, "one", body, headers).json()["applied"] == 1
        replay = post(svc, "two", body, headers)
        assert replay.status_code == 401
        assert "accepted for another KB: refused as a replay" in replay.json()["error"]
        assert kb_seq(svc, "two") == 0
        retry = post(svc, "one", body, headers)  # a sender's retry stays a duplicate
        assert (retry.status_code, retry.json()["duplicates"]) == (200, 1)
    with app_for(tmp_path) as client:  # durable: the binding holds after a restart
        svc = Service(client)
        assert post(svc, "two", body, headers).status_code == 401
        assert kb_seq(svc, "two") == 0
        fresh_body, fresh_headers = wc.delivery(SECRET, [wc.upsert("infra/dns")])
        assert post(svc, "two", fresh_body, fresh_headers).json()["applied"] == 1


def test_a_webhook_id_stays_bound_while_its_timestamp_verifies(svc: Service) -> None:
    """A sender's clock 290 s ahead: its delivery verifies for 590 s after it was accepted, so
    its binding to the KB must hold that long (it held 300 s: a replay 400 s later went in)."""
    now = int(time.time())
    body = wc.encode([wc.upsert("infra/dns")])
    headers = wc.signed_headers(SECRET, body, wc.BATCH, timestamp=now - 110)
    store = context_of(svc.app).service.store
    store.clock = lambda: time.time() - 400  # accepted 400 s ago, stamped 290 s ahead of it
    assert post(svc, "one", body, headers).json()["applied"] == 1
    store.clock = time.time
    replay = post(svc, "two", body, headers)
    assert replay.status_code == 401
    assert "accepted for another KB: refused as a replay" in replay.json()["error"]
    assert kb_seq(svc, "two") == 0


def test_a_binary_resend_with_other_attributes_is_refused(svc: Service) -> None:
    """Binary mode's attributes are headers, outside the signature: a captured delivery with a
    new ce-id and ce-subject is not a retry, though its webhook-id is the KB's own."""
    body, headers = binary(wc.event("deleted", "notes/a", 5))
    assert post(svc, "homelab", *binary(wc.upsert("notes/b", version=1))).status_code == 200
    assert post(svc, "homelab", body, headers).json()["stale"] == 0
    seq = kb_seq(svc, "homelab")
    tampered = {**headers, "ce-id": "forged-1", "ce-subject": "notes/b"}
    refused = post(svc, "homelab", body, tampered)
    assert refused.status_code == 401
    assert "was accepted before for other events: refused as a replay" in refused.json()["error"]
    assert kb_seq(svc, "homelab") == seq
    assert "notes/b" in {
        c.id for c in context_of(svc.app).service.store.load().kbs["homelab"].concepts
    }
    retry = post(svc, "homelab", body, headers)  # the sender's own retry: a duplicate
    assert (retry.status_code, retry.json()["duplicates"]) == (200, 1)


def test_senders_with_their_own_secrets_may_pick_the_same_webhook_id(svc: Service) -> None:
    """Standard Webhooks ids are unique per sender, not across senders: another sender's
    delivery that happens to carry the same webhook-id is no replay (its body differs)."""
    for kb, secret in (("homelab", SECRET), ("private", PRIVATE_SECRET)):
        body = wc.encode([wc.upsert("a/x", title=kb)])
        headers = wc.signed_headers(secret, body, wc.BATCH, msg_id="evt-1")
        response = post(svc, kb, body, headers)
        assert (response.status_code, response.json()["applied"]) == (200, 1), response.json()


def test_a_message_is_its_webhook_id_and_body_bound_for_ten_minutes(tmp_path: Path) -> None:
    now = [1_000_000.0]
    message = WebhookMessage("msg-1", bytes(32))
    with Store(tmp_path / "s.db") as store:
        store.clock = lambda: now[0]
        assert store.append("one", [upsert("a")], message=message).applied == 1
        now[0] += 9 * 60
        with pytest.raises(ReplayRefused):
            store.append("two", [upsert("a")], message=message)
        assert store.append("one", [upsert("a")], message=message).duplicates == 1
        other = WebhookMessage("msg-1", b"\1" * 32)  # same id, another body: another message
        assert store.append("two", [upsert("b")], message=other).applied == 1
        now[0] += 2 * 60  # past 10 minutes no signature of it verifies any more
        assert store.append("three", [upsert("a")], message=message).applied == 1


def test_a_schema_4_store_forgets_its_webhook_ids(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store(path) as store:
        store.append("one", [upsert("a")])
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TABLE webhook_message; CREATE TABLE webhook_id (id TEXT PRIMARY KEY, kb TEXT,"
        " received_at REAL); INSERT INTO webhook_id VALUES ('m', 'one', 0); PRAGMA user_version = 4"
    )
    conn.close()
    with Store(path) as store:
        assert store.kb_seq("one") == 1
    conn = sqlite3.connect(path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    assert "webhook_message" in tables and "webhook_id" not in tables
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_kbs_the_config_names_are_created_past_the_cap(svc: Service) -> None:
    """max_kbs bounds KBs made by deliveries; one named in [webhooks.kbs] is always made, so
    a flood of new KBs cannot lock it out."""
    for kb in ("k1", "k2", "k3"):
        assert send(svc, kb, [wc.upsert("a/x")]).status_code == 200
    assert send(svc, "k4", [wc.upsert("a/x")]).status_code == 403
    assert send(svc, "private", [wc.upsert("a/x")], PRIVATE_SECRET).json()["applied"] == 1


def test_kb_creation_is_capped(svc: Service) -> None:
    for kb in ("k1", "k2", "k3"):
        assert send(svc, kb, [wc.upsert("a/x")]).status_code == 200
    refused = send(svc, "k4", [wc.upsert("a/x")])
    assert refused.status_code == 403
    assert refused.json() == {
        "error": "kb k4 not created: 3 KBs exist, the limit ([limits] max_kbs)"
    }
    assert kb_seq(svc, "k4") == 0 and "k4" not in context_of(svc.app).service.store.load().kbs
    assert send(svc, "k1", [wc.upsert("a/y")]).json()["applied"] == 1  # existing KBs go on


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_deeply_nested_json_is_400(svc: Service, depth: int) -> None:
    """The same answer on every Python: the bound is kbgraph's, not the interpreter's
    recursion limit (3.11 stopped near 1,000 levels, 3.12+ decoded on and answered 422)."""
    body = b"[" * depth + b"]" * depth
    response = post(svc, "homelab", body, wc.signed_headers(SECRET, body, wc.BATCH))
    assert response.status_code == 400
    assert response.json()["error"] == TOO_DEEP
    assert kb_seq(svc, "homelab") == 0


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000])
def test_deeply_nested_binary_data_is_400(svc: Service, depth: int) -> None:
    event = wc.encode(wc.upsert("a/x"))
    _, headers = binary(msgspec.json.decode(event))
    body = b'{"x": ' + b"[" * depth + b"]" * depth + b"}"
    headers |= wc.signed_headers(SECRET, body, "application/json")
    response = post(svc, "homelab", body, headers)
    assert response.status_code == 400
    assert response.json()["error"] == TOO_DEEP
    assert kb_seq(svc, "homelab") == 0


def test_nesting_at_the_bound_is_judged_on_its_content(svc: Service) -> None:
    body = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    response = post(svc, "homelab", body, wc.signed_headers(SECRET, body, wc.BATCH))
    assert response.status_code == 422  # well-formed, within the bound: not an event
    assert kb_seq(svc, "homelab") == 0


def test_a_signed_non_utf8_body_is_400_naming_the_encoding(svc: Service) -> None:
    body = wc.encode([wc.upsert("a/x", title="caf")])[:-3] + b'\xe9"}}]'
    response = post(svc, "homelab", body, wc.signed_headers(SECRET, body, wc.BATCH))
    assert response.status_code == 400
    assert response.json()["error"].startswith("body is not UTF-8 (byte ")
    assert kb_seq(svc, "homelab") == 0


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"title": "t" * 1025}, "events[0].data.title: Expected str of length <= 1024"),
        ({"type": "T" * 257}, "events[0].data.type: Expected str of length <= 256"),
        ({"tags": ["t"] * 257}, "events[0].data.tags: Expected array of length <= 256"),
        ({"tags": ["t" * 257]}, "events[0].data.tags[0]: Expected str of length <= 256"),
        ({"links": [f"a/{i}" for i in range(10_001)]},
         "events[0].data.links: Expected array of length <= 10000"),
    ],
)  # fmt: skip
def test_fields_are_bounded(svc: Service, data: dict, where: str) -> None:
    response = send(svc, "homelab", [wc.upsert("a/x", **data)])
    assert (response.status_code, response.json()) == (422, {"error": where})
    assert kb_seq(svc, "homelab") == 0


def test_ids_are_nfc_and_format_characters_refused(svc: Service) -> None:
    nfd = unicodedata.normalize("NFD", "notes/café")
    nfc = unicodedata.normalize("NFC", "notes/café")
    assert nfd != nfc
    assert send(svc, "homelab", [wc.upsert(nfd, links=[unicodedata.normalize("NFD", "x/é")])]
                ).json()["applied"] == 1  # fmt: skip
    # the NFC spelling is the same concept: version 1 again is stale
    assert send(svc, "homelab", [wc.upsert(nfc)]).json()["stale"] == 1
    (stored,) = context_of(svc.app).service.store.load().kbs["homelab"].concepts
    assert (stored.id, stored.links) == (nfc, [unicodedata.normalize("NFC", "x/é")])
    seq = kb_seq(svc, "homelab")
    for spelling in (nfc, nfd):  # reads find it by either spelling
        read = svc.call(ADMIN, "GET", f"/v1/kbs/homelab/concepts/{spelling}", seq)
        assert read.status_code == 200 and read.json()["id"] == nfc
        path = svc.tool(ADMIN, "homelab", "graph_path", {"source": spelling, "target": spelling})
        assert path.json()["path"] == [{"id": nfc, "title": ""}]
    for bad in ("a/x\u200by", "a/\u202eevil"):
        refused = send(svc, "homelab", [wc.upsert(bad)])
        assert refused.status_code == 422
        assert refused.json() == {
            "error": "events[0].subject: invalid concept id: format character (Unicode Cf)"
        }
    assert kb_seq(svc, "homelab") == seq


# --- over real sockets ------------------------------------------------------------------------


def request_head(port: int, kb: str, length: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST /v1/kbs/{kb}/events HTTP/1.1", f"host: 127.0.0.1:{port}",
             f"content-length: {length}", "content-type: application/json"]  # fmt: skip
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(sock: socket.socket) -> bytes:
    """The response (head and body) the server sends while the client still owes its body."""
    sock.settimeout(20)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_headers_are_checked_before_the_body_and_bodies_in_flight_are_bounded(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, "[limits]\nmax_inflight_ingest_bytes = 33554432\n")
    proc = start_server(config)
    port = proc.port
    sockets: list[socket.socket] = []
    try:
        # unsigned, and a stale timestamp: answered at once, not a body byte sent
        for headers, error in (
            ({}, b"missing webhook header webhook-id, webhook-timestamp, webhook-signature"),
            ({"webhook-id": "m1", "webhook-timestamp": str(int(time.time()) - 3600),
              "webhook-signature": "v1,AAAA"}, b"webhook-timestamp outside the 5-minute"),
        ):  # fmt: skip
            sock = socket.create_connection(("127.0.0.1", port))
            sockets.append(sock)
            sock.sendall(request_head(port, "homelab", 15 << 20, headers))
            response = answer(sock)
            assert response.startswith(b"HTTP/1.1 401") and error in response, response
        # plausible headers (a fresh timestamp, a signature that will not verify): the body is
        # awaited, and at most 32 MiB of the bytes sent are held at once; of three 15 MB
        # uploads sent but for their last byte, one is turned away as its bytes pass the room
        uploads = []
        for index in range(3):
            sock = socket.create_connection(("127.0.0.1", port))
            sockets.append(sock)
            uploads.append(sock)
            fake = {"webhook-id": f"m{index}", "webhook-timestamp": str(int(time.time())),
                    "webhook-signature": "v1,AAAA"}  # fmt: skip
            sock.sendall(request_head(port, "homelab", 15 << 20, fake))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b" " * ((15 << 20) - 1))
        ready, _, _ = select.select(uploads, [], [], 20)
        assert ready, "no upload was turned away"
        response = answer(ready[0])
        assert response.startswith(b"HTTP/1.1 503"), response
        assert b"ingest busy" in response and b"retry-after: 1" in response.lower()
    finally:
        for sock in sockets:
            sock.close()
        stop(proc)
