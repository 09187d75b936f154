"""Interop with the official CloudEvents Python SDK (issue 18): events it produces in
structured and binary mode, signed with ``standardwebhooks``, sent to a real ``kbgraph serve``,
are applied, deduplicated and refused exactly as the same events in the project's own form."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.v1.event import CloudEvent
from standardwebhooks.webhooks import Webhook

from kbgraph.http.binding import decode_events
from tests import webhook_client as wc
from tests.support import ADMIN, SECRET, bearer, running, served_config

SOURCE = "https://wiki.example/sdk"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(served_config(tmp_path_factory.mktemp("interop"))) as url:
        yield url


def sdk_event(event_id: str, kind: str, subject: str, data: dict) -> CloudEvent:
    attributes = {"id": event_id, "source": SOURCE, "type": kind, "subject": subject,
                  "specversion": "1.0", "datacontenttype": "application/json"}  # fmt: skip
    return CloudEvent(attributes, data)


def signed(body: bytes, headers: dict[str, str], msg_id: str) -> dict[str, str]:
    """The SDK's headers plus a Standard Webhooks signature made by the official package."""
    now = datetime.now(UTC)
    signature = Webhook(SECRET).sign(msg_id, now, body.decode())
    return {**headers, "webhook-id": msg_id, "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature}  # fmt: skip


def send(base: str, kb: str, event: CloudEvent, mode: str, msg_id: str) -> httpx.Response:
    message = to_binary_event(event) if mode == "binary" else to_structured_event(event)
    headers = signed(message.body, dict(message.headers), msg_id)
    return httpx.post(f"{base}/v1/kbs/{kb}/events", content=message.body, headers=headers)


def send_own(base: str, kb: str, event: dict) -> httpx.Response:
    body, headers = wc.delivery(SECRET, event)
    return httpx.post(f"{base}/v1/kbs/{kb}/events", content=body, headers=headers)


def concept(base: str, kb: str, concept_id: str, seq: int) -> dict:
    headers = {**bearer(ADMIN), "x-min-seq": str(seq)}
    return httpx.get(f"{base}/v1/kbs/{kb}/concepts/{concept_id}", headers=headers).json()


def test_sdk_binary_and_structured_messages_are_one_event() -> None:
    """What the SDK makes of one event in either mode decodes to the same event, every
    attribute included (binary mode's Content-Type is its datacontenttype)."""
    event = sdk_event("e1", "concept.upserted", "notes/Café", {"version": 1, "title": "Café"})
    decoded = []
    for message in (to_binary_event(event), to_structured_event(event)):
        headers = {name.lower(): value for name, value in message.headers.items()}
        decoded.append(decode_events(message.body, headers))
    assert decoded[0] == decoded[1]
    assert decoded[0][0].datacontenttype == "application/json"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_sdk_events_answer_as_our_own(server: str, mode: str) -> None:
    sdk_kb, own_kb = f"sdk-{mode}", f"own-{mode}"
    story = [  # (id, type, subject, data)
        ("e1", "concept.upserted", "notes/Café",
         {"version": 1, "title": "Café", "text": "Beans.", "links": ["notes/Tea"]}),
        ("e2", "concept.upserted", "notes/Tea", {"version": 1, "title": "Tea"}),
        ("e3", "link.added", "notes/Tea", {"version": 2, "target": "notes/Café"}),
        ("e1", "concept.upserted", "notes/Café", {"version": 1, "title": "Café"}),  # duplicate
        ("e4", "concept.upserted", "notes/Café", {"version": 1, "title": "old"}),  # stale
        ("e5", "link.added", "notes/Nobody", {"version": 1, "target": "notes/Tea"}),  # ignored
        ("e6", "concept.deleted", "notes/Tea", {"version": 3}),
    ]  # fmt: skip
    answers = {"sdk": [], "own": []}
    for index, (event_id, kind, subject, data) in enumerate(story):
        event = sdk_event(event_id, kind, subject, data)
        answers["sdk"].append(send(server, sdk_kb, event, mode, f"msg_{mode}_{index}").json())
        own = {"specversion": "1.0", "id": event_id, "source": SOURCE, "type": kind,
               "subject": subject, "data": data}  # fmt: skip
        answers["own"].append(send_own(server, own_kb, own).json())
    assert answers["sdk"] == answers["own"]
    outcomes = [(a["applied"], a["duplicates"], a["stale"], a["ignored"]) for a in answers["sdk"]]
    assert outcomes == [(1, 0, 0, 0), (1, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0),
                        (0, 0, 0, 1), (1, 0, 0, 0)]  # fmt: skip
    seq = answers["sdk"][-1]["seq"]
    assert concept(server, sdk_kb, "notes/Café", seq) == concept(server, own_kb, "notes/Café", seq)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_sdk_events_are_refused_as_our_own(server: str, mode: str) -> None:
    bad = sdk_event("x1", "concept.upserted", "notes/x", {"version": -1})
    refused = send(server, "refusals", bad, mode, f"msg_bad_{mode}")
    where = "event.data.version: Expected int >= 0"
    assert refused.status_code == 422 and refused.json()["error"] == where
    own = send_own(
        server,
        "refusals",
        {
            "specversion": "1.0",
            "id": "x1",
            "source": SOURCE,
            "type": "concept.upserted",
            "subject": "notes/x",
            "data": {"version": -1},
        },
    )
    assert (own.status_code, own.json()) == (422, {"error": where})
    unsigned = to_binary_event(sdk_event("x2", "concept.upserted", "notes/x", {"version": 1}))
    response = httpx.post(f"{server}/v1/kbs/refusals/events", content=unsigned.body,
                          headers=dict(unsigned.headers))  # fmt: skip
    assert response.status_code == 401
    status = httpx.get(f"{server}/v1/kbs", headers=bearer(ADMIN)).json()
    assert "refusals" not in json.dumps(status)  # nothing was stored, no KB was made
