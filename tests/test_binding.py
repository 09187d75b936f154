"""CloudEvents binary content mode (issue 18): the same event in binary and structured mode
is the same delivery; a request in neither mode is told which mode it was taken for."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from kbgraph.api import context_of, create_app
from kbgraph.config import load_config
from kbgraph.http.binding import decode_events
from tests import webhook_client as wc
from tests.support import SECRET, Service, binary, write_config

KB = "homelab"


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with TestClient(create_app(load_config(write_config(tmp_path)))) as client:
        yield Service(client)


def post(svc: Service, body: bytes, headers: dict[str, str], kb: str = KB):
    return svc.client.post(f"/v1/kbs/{kb}/events", content=body, headers=headers)


def state(svc: Service, kb: str = KB) -> tuple:
    snapshot = context_of(svc.app).service.store.load()
    log = [(r.seq, r.event) for r in context_of(svc.app).service.store.read_log(0) if r.kb == kb]
    return snapshot.kbs.get(kb), log


def test_binary_mode_applies_as_structured_does(tmp_path: Path) -> None:
    events = [
        wc.upsert("notes/café et thé", title="Café", links=["notes/b"], tags=["x"]),
        wc.event("link.added", "notes/café et thé", 2, target="notes/c"),
        wc.upsert("notes/b", 1, text="b"),
        wc.event("deleted", "notes/b", 2),
    ]
    answers, states = [], []
    for mode in ("structured", "binary"):
        (tmp_path / mode).mkdir()
        with TestClient(create_app(load_config(write_config(tmp_path / mode)))) as client:
            svc = Service(client)
            for event in events + events[:1]:  # the re-sent first event: a duplicate
                if mode == "binary":
                    body, headers = binary(event)
                else:  # binary mode's Content-Type is the event's datacontenttype
                    event = {**event, "datacontenttype": "application/json"}
                    body, headers = wc.delivery(SECRET, event)
                answers.append((mode, post(svc, body, headers).json()))
            states.append(state(svc))
    structured = [a for m, a in answers if m == "structured"]
    assert structured == [a for m, a in answers if m == "binary"]
    assert structured[-1]["duplicates"] == 1 and structured[0]["applied"] == 1
    assert states[0] == states[1]
    assert states[0][0].concepts[0].id == "notes/café et thé"  # percent-decoded


@pytest.mark.parametrize(
    ("drop", "missing"), [("ce-id", "ce-id"), ("ce-type", "ce-type"), ("ce-subject", "ce-subject")]
)
def test_binary_mode_names_a_missing_header(svc: Service, drop: str, missing: str) -> None:
    body, headers = binary(wc.upsert("a/x"))
    del headers[drop]
    response = post(svc, body, headers)
    assert response.status_code == 422
    assert response.json() == {
        "error": "binary mode (a ce-specversion header, Content-Type application/json): "
        f"missing header {missing}"
    }
    assert state(svc) == (None, [])


def test_binary_mode_errors_name_the_header_or_the_data(svc: Service) -> None:
    body, headers = binary(wc.upsert("a/x"))
    headers["ce-type"] = "concept.renamed"
    wrong_type = post(svc, body, headers)
    assert wrong_type.status_code == 422
    assert wrong_type.json()["error"].startswith("ce-type header: Invalid value 'concept.renamed'")
    body, headers = binary(wc.upsert("a/x"))
    headers["ce-specversion"] = "0.3"
    assert post(svc, body, headers).json()["error"].startswith("ce-specversion header:")
    body, headers = binary({**wc.upsert("a/x"), "data": {"version": "one"}})
    bad_data = post(svc, body, headers)
    assert (bad_data.status_code, bad_data.json()) == (
        422, {"error": "event.data.version: Expected int, got str"}
    )  # fmt: skip
    body, headers = binary(wc.upsert("a/x"), "text/plain")
    as_text = post(svc, body, headers)
    assert as_text.status_code == 415
    assert "binary mode" in as_text.json()["error"] and "JSON" in as_text.json()["error"]
    body, headers = binary(wc.upsert("a/x"))
    headers["ce-subject"] = "a/%FF"
    assert post(svc, body, headers).json() == {
        "error": "ce-subject header: its percent-encoding is not UTF-8"
    }
    assert state(svc) == (None, [])


def test_data_without_attributes_is_told_about_binary_mode(svc: Service) -> None:
    body = json.dumps({"version": 1, "title": "x"}).encode()
    response = post(svc, body, wc.signed_headers(SECRET, body, "application/json"))
    assert response.status_code == 422
    message = response.json()["error"]
    assert message.startswith("event: Object missing required field type (structured mode")
    assert "binary mode: the attributes as ce-* headers" in message


def test_ce_headers_without_ce_specversion_are_told_what_binary_mode_needs(
    svc: Service,
) -> None:
    body, headers = binary(wc.upsert("a/x"))
    del headers["ce-specversion"]
    response = post(svc, body, headers)
    assert response.status_code == 422
    message = response.json()["error"]
    assert message.startswith("event: Object missing required field type (structured mode")
    assert message.endswith(
        "; the request has ce-id, ce-source, ce-subject, ce-type but no ce-specversion header,"
        " which binary mode needs"
    )
    assert state(svc) == (None, [])


def test_binary_mode_content_type_is_the_datacontenttype() -> None:
    """HTTP binding 3.1.1: in binary mode the Content-Type is the datacontenttype attribute,
    so the event is the one a structured request with that attribute carries."""
    event = {**wc.upsert("a/x"), "datacontenttype": "application/json; charset=utf-8",
             "dataschema": "https://wiki.example/schema"}  # fmt: skip
    body, headers = binary(event, "application/json; charset=utf-8")
    headers["ce-dataschema"] = quote(event["dataschema"], safe="/:")
    (from_binary,) = decode_events(body, headers)
    (structured,) = decode_events(json.dumps(event).encode(), {"content-type": wc.SINGLE})
    assert from_binary == structured


@settings(max_examples=30, deadline=None)
@given(subject=st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc", "Cf"]),
                       min_size=1, max_size=12).filter(lambda s: "/" not in s))  # fmt: skip
def test_any_percent_encoded_subject_round_trips(subject: str) -> None:
    """Decoded as sent, then in NFC as structured mode stores it (here sent in NFD, so that
    every decomposable character checks the normalisation)."""
    sent = unicodedata.normalize("NFD", f"notes/{subject}")
    event = wc.upsert(sent)
    body = json.dumps(event["data"]).encode()
    headers = {"content-type": "application/json", "ce-specversion": "1.0", "ce-id": "1",
               "ce-source": "s", "ce-type": "concept.upserted",
               "ce-subject": quote(sent, safe="")}  # fmt: skip
    (decoded,) = decode_events(body, headers)
    (structured,) = decode_events(json.dumps(event).encode(), {"content-type": wc.SINGLE})
    assert decoded.subject == structured.subject == unicodedata.normalize("NFC", sent)


def test_binary_mode_stores_ids_in_nfc(svc: Service) -> None:
    nfd = unicodedata.normalize("NFD", "notes/café")
    body, headers = binary(wc.upsert(nfd, links=[nfd + "/x"]))
    assert post(svc, body, headers).json()["applied"] == 1
    (stored,) = state(svc)[0].concepts
    nfc = unicodedata.normalize("NFC", nfd)
    assert (stored.id, stored.links) == (nfc, [nfc + "/x"])
    again = post(svc, *wc.delivery(SECRET, wc.upsert(nfc)))  # one concept: version 1 is stale
    assert again.json()["stale"] == 1


def test_a_repeated_ce_header_is_refused_naming_it(svc: Service) -> None:
    body, headers = binary(wc.upsert("notes/a", title="A"))
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    for name in ("ce-subject", "ce-id"):
        twice = [*raw, (name.encode(), b"notes/other")]
        response = svc.client.post(f"/v1/kbs/{KB}/events", content=body, headers=twice)
        assert response.status_code == 422
        assert response.json()["error"].endswith(
            f"header {name} sent more than once: an attribute has one value"
        )
    assert state(svc) == (None, [])  # nothing stored
    assert post(svc, body, headers).status_code == 200
