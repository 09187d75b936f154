"""Events in over HTTP: ``POST /v1/kbs/{kb}/events`` (SPEC section 2).

Checks, in order, each refusing the whole delivery with nothing stored:
KB name (422) -> the signature headers, before a body byte is read (401: missing, or a
timestamp outside the tolerance) -> body over the limit (413: Content-Length first, then while
streaming) -> room among the bodies in flight, taken as the bytes arrive (503) -> the body
complete within the server's body deadline (else the connection closes) -> UTF-8 (400) ->
the webhook signature with the KB's secrets (401) -> the content mode and its events
(``kbgraph.binding``: 415 / 400 / 422) -> the store: the same signed message (webhook-id
and body) already accepted for another KB, or re-sent with new events (401), a KB beyond
``max_kbs`` (403). A 200 is sent
only after the store's commit is durable (over JetStream: after a quorum of the stream's
replicas stored the delivery and this node's follower applied it, ``kbgraph.jetstream``);
then ``app.state.on_commit()`` wakes this process's projection follower when the delivery
applied at least one event.

The route reads from ``request.app.state``: ``store`` (Store), ``verifier`` (the default
SignatureVerifier) and ``kb_verifiers`` (per KB), ``inflight`` (InflightBytes), ``config``
(Config) and ``on_commit`` (zero-argument callable).
Metrics go to prometheus_client's default registry, which ``/metrics`` exposes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Final

import anyio.to_thread
import msgspec
from prometheus_client import Counter, Histogram
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from kbgraph.binding import decode_request
from kbgraph.events import DeliveryError, Event, SignatureVerifier
from kbgraph.jetstream import DeliveryTooLarge, LogUnavailable
from kbgraph.names import is_kb_name
from kbgraph.store import (
    DeliveryResult,
    KBLimitReached,
    ReplayRefused,
    Store,
    StoreBusy,
    StoreClosed,
    WebhookMessage,
)

DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
OFFLOAD_BYTES: Final = 1 << 20  # verify + decode bodies bigger than this off the event loop

log = logging.getLogger("kbgraph.ingest")

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
KB_NAME_PATTERN: Final = "[a-z0-9][a-z0-9_-]{0,63}"


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


class InflightBytes:
    """Delivery bodies being read or decoded in this process, bounded (event loop only).

    A delivery takes its bytes as they arrive (``Reservation``), not what it declares, so a
    client that declares a large body and trickles it holds only what it sent (and the server's
    body deadline, ``kbgraph.server``, ends it); one delivery alone is always let in.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reservation(self) -> Reservation:
        return Reservation(self)


class Reservation:
    """One delivery's share of ``InflightBytes``: ``take`` as bytes arrive, ``release`` once."""

    def __init__(self, pool: InflightBytes) -> None:
        self.pool = pool
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes; False when other deliveries hold the room."""
        pool = self.pool
        if pool.used > self.held and pool.used + size > pool.limit:
            return False
        pool.used += size
        self.held += size
        return True

    def release(self) -> None:
        self.pool.used -= self.held
        self.held = 0


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _result_encoder.encode({"error": message}), status, headers=headers, media_type=_JSON
    )


async def _read_body(request: Request, limit: int, room: Reservation | None) -> bytes:
    """The body, refusing it (``_TooLarge``) as soon as it passes ``limit`` bytes, or
    (``_Busy``) as soon as the deliveries in flight hold the room it needs."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _TooLarge
        except ValueError:
            pass  # the server rejects malformed framing; streaming below still bounds it
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        if room is not None and not room.take(len(chunk)):
            raise _Busy
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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
    return decode_request(body, headers), message


def verifier_for(state: object, kb: str) -> SignatureVerifier:
    """The KB's own secrets' verifier, else the default one (none configured: unsigned)."""
    own = getattr(state, "kb_verifiers", {}).get(kb)
    if own is not None:
        return own
    return getattr(state, "verifier", None) or SignatureVerifier([])


async def post_events(request: Request) -> Response:
    """Take one delivery: answer 200 with the DeliveryResult once it is durable."""
    started = time.perf_counter()
    response = await _handle(request)
    counter = _delivery_counter.get(response.status_code)
    if counter is None:
        counter = _delivery_counter[response.status_code] = DELIVERIES.labels(
            str(response.status_code)
        )
    counter.inc()
    ACK_SECONDS.observe(time.perf_counter() - started)
    return response


async def _handle(request: Request) -> Response:
    kb: str = request.path_params["kb"]
    if not is_kb_name(kb):
        return error_response(422, f'invalid kb name "{kb}": expected {KB_NAME_PATTERN}')
    state = request.app.state
    headers = request.headers
    verifier = verifier_for(state, kb)
    if verifier.enabled:
        problem = verifier.header_problem(headers, time.time())
        if problem is not None:
            return error_response(401, problem)
    config = getattr(state, "config", None)
    server = getattr(config, "server", None)
    limit: int = getattr(server, "max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    declared = headers.get("content-length", "")
    if declared.isdigit() and (len(declared) >= 19 or int(declared) > limit):
        return error_response(413, f"body over the limit of {limit} bytes")
    inflight: InflightBytes | None = getattr(state, "inflight", None)
    room = None if inflight is None else inflight.reservation()
    try:
        return await _take(request, state, kb, verifier, limit, room)
    finally:
        if room is not None:
            room.release()


async def _take(
    request: Request,
    state: object,
    kb: str,
    verifier: SignatureVerifier,
    limit: int,
    room: Reservation | None,
) -> Response:
    try:
        body = await _read_body(request, limit, room)
    except _TooLarge:
        return error_response(413, f"body over the limit of {limit} bytes")
    except _Busy:
        assert room is not None
        pool = room.pool
        return error_response(
            503,
            f"ingest busy: {pool.used} bytes of deliveries in flight (limit {pool.limit}),"
            " retry later",
            {"Retry-After": "1", "Connection": "close"},
        )
    except ClientDisconnect:
        return error_response(400, "client disconnected before the body was complete")
    headers = request.headers
    try:
        if len(body) > OFFLOAD_BYTES:
            events, message = await anyio.to_thread.run_sync(
                _verify_and_decode, verifier, body, headers
            )
        else:
            events, message = _verify_and_decode(verifier, body, headers)
    except DeliveryError as exc:
        return error_response(exc.status, exc.message)
    del body

    store: Store = state.store  # type: ignore[attr-defined]
    replicated = getattr(state, "log", None)  # [log] kind = "jetstream": the stream decides
    try:
        if replicated is not None and events:
            result: DeliveryResult = await replicated.append(kb, events, message)
        else:
            result = await store.append_async(kb, events, message=message)
    except ReplayRefused as exc:
        return error_response(401, str(exc))
    except KBLimitReached as exc:
        return error_response(403, str(exc))
    except DeliveryTooLarge as exc:
        return error_response(413, str(exc))
    except LogUnavailable as exc:  # the node's own state, no KB's data: said as it is
        log.warning("delivery to kb %s not stored: %s", kb, exc)
        return error_response(503, f"log unavailable, retry later: {exc}", {"Retry-After": "1"})
    except (StoreBusy, StoreClosed) as exc:
        log.warning("delivery to kb %s not stored: %s", kb, exc)
        return error_response(503, "store unavailable, retry later", {"Retry-After": "1"})
    except Exception:
        log.exception("delivery to kb %s failed", kb)
        return error_response(500, "internal error: delivery not stored")

    if result.applied:
        _event_counter["applied"].inc(result.applied)
        on_commit = getattr(state, "on_commit", None)
        if on_commit is not None:
            try:
                on_commit()
            except Exception:  # the delivery is durable: the follower catches up on its own
                log.exception("on_commit hook failed")
    if result.duplicates:
        _event_counter["duplicate"].inc(result.duplicates)
    if result.stale:
        _event_counter["stale"].inc(result.stale)
    if result.ignored:
        _event_counter["ignored"].inc(result.ignored)
    return Response(_result_encoder.encode(result), 200, media_type=_JSON)


routes: list[Route] = [Route("/v1/kbs/{kb}/events", post_events, methods=["POST"])]
