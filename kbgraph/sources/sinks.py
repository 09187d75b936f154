"""Where sync sends its deliveries: the local store, or a remote kbgraph by signed webhook.

The local sink calls ``Store.append``, the very path the webhook takes after decoding. The
webhook sink POSTs a CloudEvents batch to ``{url}/v1/kbs/{kb}/events`` signed per Standard
Webhooks; its ``webhook-id`` is derived from the body, so a retried delivery carries the same
id and the same event ids and is answered as duplicates, never applied twice. Connection
errors and 5xx answers are retried with exponential backoff; any other refusal stops the sync
with the server's message.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol

import httpx
import msgspec
from standardwebhooks.webhooks import Webhook

from kbgraph.events import ECHO_CHARS, Event
from kbgraph.store import DeliveryResult, KBLimitReached, MadeAhead, Store

SECRET_ENV: Final = "KBGRAPH_WEBHOOK_SECRET"


class SyncError(Exception):
    """A delivery that could not be made: the message says what and where."""


class Sink(Protocol):
    dest: str  # names the destination in the manifest

    def send(self, kb: str, events: list[Event]) -> DeliveryResult: ...

    def kb_seq(self, kb: str) -> int | None:
        """The KB's log position at the destination, None when it cannot be asked."""
        ...

    def close(self) -> None: ...


class LocalSink:
    """A store of this machine: ``kbgraph import --config`` hands it the store as the service
    opens it (``kbgraph.store.opening.open_store``: the same KB limit, names and key retention);
    a bare path opens one with the store's defaults (tests, the demo)."""

    def __init__(self, store: Store | str | Path) -> None:
        self.store = store if isinstance(store, Store) else Store(store)
        self.dest = f"store:{Path(self.store.path).resolve()}"

    def send(
        self, kb: str, events: list[Event], ahead: Sequence[MadeAhead | None] = ()
    ) -> DeliveryResult:
        """``ahead``: per event, its analysis made by the caller (``Store.append``)."""
        try:
            return self.store.append(kb, events, ahead=ahead)
        except KBLimitReached as exc:  # as the webhook answers it (403): nothing stored
            raise SyncError(f"{self.dest}: {exc}") from None

    def kb_seq(self, kb: str) -> int | None:
        return self.store.kb_seq(kb)

    def close(self) -> None:
        self.store.close()


class WebhookSink:
    def __init__(
        self,
        url: str,
        secret: str | None,
        *,
        attempts: int = 6,
        backoff: float = 0.5,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.dest = f"url:{self.url}"
        self._webhook = Webhook(secret) if secret else None
        self._attempts = attempts
        self._backoff = backoff
        self._client = httpx.Client(timeout=timeout, transport=transport)

    def send(self, kb: str, events: list[Event]) -> DeliveryResult:
        body = msgspec.json.encode(events)
        msg_id = "vault_" + hashlib.sha256(kb.encode() + b"\0" + body).hexdigest()[:32]
        url = f"{self.url}/v1/kbs/{kb}/events"
        problem = ""
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                response = self._client.post(url, content=body, headers=self._headers(msg_id, body))
            except httpx.HTTPError as exc:
                problem = f"cannot reach {url}: {exc or exc.__class__.__name__}"
                continue
            if response.status_code >= 500:
                problem = f"{url} answered {response.status_code}: {_error(response)}"
                continue
            if response.status_code != 200:
                raise SyncError(f"{url} refused the delivery ({response.status_code}): "
                                f"{_error(response)}")  # fmt: skip
            return msgspec.json.decode(response.content, type=DeliveryResult)
        raise SyncError(f"{problem} (gave up after {self._attempts} attempts)")

    def kb_seq(self, kb: str) -> int | None:
        return None  # reading it needs a bearer token; the sender has only the secret

    def _headers(self, msg_id: str, body: bytes) -> dict[str, str]:
        headers = {"content-type": "application/cloudevents-batch+json"}
        if self._webhook is not None:
            now = datetime.now(tz=UTC)
            headers["webhook-id"] = msg_id
            headers["webhook-timestamp"] = str(int(now.timestamp()))
            headers["webhook-signature"] = self._webhook.sign(msg_id, now, body.decode())
        return headers

    def close(self) -> None:
        self._client.close()


def _error(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"])
    except Exception:
        return response.text[:ECHO_CHARS] or response.reason_phrase
