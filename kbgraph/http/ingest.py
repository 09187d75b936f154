"""Events in over HTTP: ``POST /v1/kbs/{kb}/events`` (docs/events.md).

Checks, in order, each refusing the whole delivery with nothing stored:
KB name (422) -> the signature headers, before a body byte is read (401: missing, or a
timestamp outside the tolerance) -> body over the limit (413: Content-Length first, then while
streaming) -> room among the bodies in flight, taken as the bytes arrive (503) -> the body
complete within the server's body deadline (else the connection closes) -> UTF-8 (400) ->
the webhook signature with the KB's secrets (401) -> the content mode and its events
(``kbgraph.http.binding``: 415 / 400 / 422) -> the store: the same signed message (webhook-id
and body) already accepted for another KB, or re-sent with new events (401), a KB beyond
``max_kbs`` (403). A 200 is sent
only after the store's commit is durable (over JetStream: after a quorum of the stream's
replicas stored the delivery and this node's follower applied it, ``kbgraph.log.jetstream``);
the log wakes this process's projection follower when the delivery applied at least one event.

Where the delivery goes is the process's one ``kbgraph.log.DeliveryLog`` (the service's
``log``), whatever ``[log] kind`` says. The route is handed the app's ``AppContext``
(``routes(context)``): the service, the KB's verifier, the bytes in flight and the limits.

The endpoint is a plain ASGI app (``PostEvents``), not a Starlette request function: it reads
the scope, the body messages and answers with two ``send`` calls, without a ``Request``, a
``Response`` object or the per-request exception wrapper (a quarter of the event loop's time
per single-event delivery went to them; the middlewares around the router still run).
Metrics go to prometheus_client's default registry, which ``/metrics`` exposes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Final

import anyio.to_thread
import msgspec
from prometheus_client import Counter, Histogram
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kbgraph.events import DeliveryError, Event, SignatureVerifier
from kbgraph.http.binding import decode_events
from kbgraph.http.context import AppContext
from kbgraph.http.inflight import Reservation
from kbgraph.log import DeliveryLog, DeliverySkipped, DeliveryTooLarge, LogUnavailable
from kbgraph.names import KB_NAME_PATTERN, is_kb_name
from kbgraph.store import (
    DeliveryResult,
    KBLimitReached,
    ReplayRefused,
    StoreBusy,
    StoreClosed,
    WebhookMessage,
)

OFFLOAD_BYTES: Final = 1 << 20  # verify + decode bodies bigger than this off the event loop

log = logging.getLogger("kbgraph.http.ingest")

DELIVERIES: Final = Counter(
    "kbgraph_ingest_deliveries",
    "Webhook deliveries answered, by HTTP status",
    ["status"],
)
EVENTS: Final = Counter(
    "kbgraph_ingest_events",
    "Events in acknowledged deliveries, by outcome",
    ["outcome"],
)
ACK_SECONDS: Final = Histogram(
    "kbgraph_ingest_ack_seconds",
    "Time from request start to the answer of a delivery (200: after the durable commit)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
_STATUSES: Final = (200, 400, 401, 403, 413, 415, 422, 500, 503)
_delivery_counter = {status: DELIVERIES.labels(str(status)) for status in _STATUSES}
_event_counter = {
    outcome: EVENTS.labels(outcome) for outcome in ("applied", "duplicate", "stale", "ignored")
}

_result_encoder = msgspec.json.Encoder()
_JSON: Final = "application/json"


class Headers(dict[str, str]):
    """A request's headers, read once from the ASGI scope: ``headers[name]`` and ``get`` give
    the first value of a name (lower case), as Starlette's ``Headers`` do, in one dict lookup
    instead of a scan decoding every header; iteration, ``keys`` and ``items`` list every
    header as sent, repeats included (binary mode refuses a repeated ``ce-*`` attribute)."""

    __slots__ = ("raw",)

    def __init__(self, scope: Scope) -> None:
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        super().__init__(reversed(raw))  # the first of a repeated header wins
        self.raw = raw

    def keys(self) -> list[str]:  # type: ignore[override]
        return [name for name, _ in self.raw]

    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]
        return self.raw

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        _result_encoder.encode({"error": message}), status, headers=headers, media_type=_JSON
    )


async def _read_body(receive: Receive, headers: Headers, limit: int, room: Reservation) -> bytes:
    """The body, refusing it (``_TooLarge``) as soon as it passes ``limit`` bytes, or
    (``_Busy``) as soon as the deliveries in flight hold the room it needs."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _TooLarge
        except ValueError:
            pass  # the server rejects malformed framing; streaming below still bounds it
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":
            raise ClientDisconnect
        if kind != "http.request":
            continue
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            if not room.take(len(chunk)):
                raise _Busy
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def _verify_and_decode(
    verifier: SignatureVerifier, body: bytes, headers: dict[str, str]
) -> tuple[list[Event], WebhookMessage | None]:
    """The delivery's events and, when it is signed, the message that binds it to its KB."""
    try:
        body.decode()
    except UnicodeDecodeError as exc:
        raise DeliveryError(
            400, f"body is not UTF-8 (byte {exc.start}): CloudEvents JSON is UTF-8"
        ) from None
    message = None
    if verifier.enabled:
        if not verifier.verify(body, headers):
            raise DeliveryError(401, "invalid webhook signature")
        message = WebhookMessage(headers["webhook-id"], hashlib.sha256(body).digest())
    return decode_events(body, headers), message


class _Answer:
    """What a delivery is answered: status, JSON body and extra headers."""

    __slots__ = ("body", "headers", "status_code")

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        self.body = body
        self.headers = headers

    async def send_to(self, send: Send) -> None:
        """Starlette's ``Response`` bytes: the extra headers, then length and type."""
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in
               (self.headers or {}).items()]  # fmt: skip
        raw.append((b"content-length", str(len(self.body)).encode("latin-1")))
        raw.append((b"content-type", b"application/json"))
        await send({"type": "http.response.start", "status": self.status_code, "headers": raw})
        await send({"type": "http.response.body", "body": self.body})


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> _Answer:
    return _Answer(status, _result_encoder.encode({"error": message}), headers)


class PostEvents:
    """``POST /v1/kbs/{kb}/events`` as a plain ASGI app (see the module's docstring)."""

    def __init__(self, context: AppContext) -> None:
        self.context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Take one delivery: answer 200 with the DeliveryResult once it is durable."""
        started = time.perf_counter()
        answer = await _handle(scope, receive, self.context)
        await answer.send_to(send)
        counter = _delivery_counter.get(answer.status_code)
        if counter is None:
            counter = _delivery_counter[answer.status_code] = DELIVERIES.labels(
                str(answer.status_code)
            )
        counter.inc()
        ACK_SECONDS.observe(time.perf_counter() - started)


async def _handle(scope: Scope, receive: Receive, context: AppContext) -> _Answer:
    kb: str = scope["path_params"]["kb"]
    if not is_kb_name(kb):
        return _error(422, f'invalid kb name "{kb}": expected {KB_NAME_PATTERN}')
    headers = Headers(scope)
    verifier = context.verifier_for(kb)
    if verifier.enabled:
        problem = verifier.header_problem(headers, time.time())
        if problem is not None:
            return _error(401, problem)
    limit = context.config.server.max_body_bytes
    declared = headers.get("content-length", "")
    if declared.isdigit() and (len(declared) >= 19 or int(declared) > limit):
        return _error(413, f"body over the limit of {limit} bytes")
    room = context.inflight.reservation()
    try:
        return await _take(receive, headers, context.service.log, kb, verifier, limit, room)
    finally:
        room.release()


async def _take(
    receive: Receive,
    headers: Headers,
    delivery_log: DeliveryLog,
    kb: str,
    verifier: SignatureVerifier,
    limit: int,
    room: Reservation,
) -> _Answer:
    try:
        body = await _read_body(receive, headers, limit, room)
    except _TooLarge:
        return _error(413, f"body over the limit of {limit} bytes")
    except _Busy:
        pool = room.pool
        return _error(
            503,
            f"ingest busy: {pool.used} bytes of deliveries in flight (limit {pool.limit}),"
            " retry later",
            {"Retry-After": "1", "Connection": "close"},
        )
    except ClientDisconnect:
        return _error(400, "client disconnected before the body was complete")
    try:
        if len(body) > OFFLOAD_BYTES:
            events, message = await anyio.to_thread.run_sync(
                _verify_and_decode, verifier, body, headers
            )
        else:
            events, message = _verify_and_decode(verifier, body, headers)
    except DeliveryError as exc:
        return _error(exc.status, exc.message)
    del body

    try:
        result: DeliveryResult = await delivery_log.append(kb, events, message)
    except ReplayRefused as exc:
        return _error(401, str(exc))
    except KBLimitReached as exc:
        return _error(403, str(exc))
    except DeliveryTooLarge as exc:
        return _error(413, str(exc))
    except DeliverySkipped as exc:  # an operator's decision, the same on every node
        return _error(409, str(exc))
    except LogUnavailable as exc:  # the node's own state, no KB's data: said as it is
        log.warning("delivery to kb %s not stored: %s", kb, exc)
        return _error(503, f"log unavailable, retry later: {exc}", {"Retry-After": "1"})
    except (StoreBusy, StoreClosed) as exc:
        log.warning("delivery to kb %s not stored: %s", kb, exc)
        return _error(503, "store unavailable, retry later", {"Retry-After": "1"})
    except Exception:
        log.exception("delivery to kb %s failed", kb)
        return _error(500, "internal error: delivery not stored")

    if result.applied:
        _event_counter["applied"].inc(result.applied)
    if result.duplicates:
        _event_counter["duplicate"].inc(result.duplicates)
    if result.stale:
        _event_counter["stale"].inc(result.stale)
    if result.ignored:
        _event_counter["ignored"].inc(result.ignored)
    return _Answer(200, _result_encoder.encode(result))


def routes(context: AppContext) -> list[Route]:
    """The webhook route, appending to the context's service's log."""
    return [Route("/v1/kbs/{kb}/events", PostEvents(context), methods=["POST"])]
