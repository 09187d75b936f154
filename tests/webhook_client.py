"""Build signed webhook deliveries the way a KB would send them (tests and the load test).

Signing follows Standard Webhooks: ``v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>``
with the key the base64 after ``whsec_``. Written out here (not via the ``standardwebhooks``
package) so that the tests check the server against an independent implementation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import secrets
import time
from collections.abc import Iterable
from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()
_counter = itertools.count()

SINGLE = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signed_headers(
    secret: str | Iterable[str] | None,
    body: bytes,
    content_type: str = "application/json",
    *,
    timestamp: int | None = None,
    msg_id: str | None = None,
) -> dict[str, str]:
    """Headers for ``body``; several secrets give several signatures (as senders rotate)."""
    headers = {"content-type": content_type}
    if secret is None:
        return headers
    keys = [secret] if isinstance(secret, str) else list(secret)
    msg_id = msg_id or f"msg_{next(_counter)}_{secrets.token_hex(4)}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    headers["webhook-id"] = msg_id
    headers["webhook-timestamp"] = str(timestamp)
    headers["webhook-signature"] = " ".join(sign(k, msg_id, timestamp, body) for k in keys)
    return headers


def event(
    kind: str,
    subject: str,
    version: int,
    *,
    source: str = "test://kb",
    event_id: str | None = None,
    **data: Any,
) -> dict[str, Any]:
    """One CloudEvents JSON object (``kind``: upserted, deleted, link.added, link.removed)."""
    types = {
        "upserted": "concept.upserted",
        "deleted": "concept.deleted",
        "link.added": "link.added",
        "link.removed": "link.removed",
    }
    return {
        "specversion": "1.0",
        "id": event_id or f"ev-{next(_counter)}",
        "source": source,
        "type": types.get(kind, kind),
        "subject": subject,
        "data": {"version": version, **data},
    }


def upsert(subject: str, version: int = 1, **data: Any) -> dict[str, Any]:
    return event("upserted", subject, version, **data)


def encode(payload: Any) -> bytes:
    return _encoder.encode(payload)


def delivery(
    secret: str | Iterable[str] | None, events: list[dict[str, Any]] | dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for a batch (a list) or a single event (a dict), signed."""
    body = encode(events)
    content_type = BATCH if isinstance(events, list) else SINGLE
    return body, signed_headers(secret, body, content_type)


def raw_request(path: str, host: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The HTTP/1.1 request bytes (keep-alive), for load generators on raw sockets."""
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
