"""Publishing one delivery to the stream, as every process that takes deliveries does: the
node's single worker (``kbgraph.log.jetstream.node``) or each of its workers beside an applier
(``kbgraph.log.jetstream.worker``). One message per delivery, MAC-signed, with a random
``Nats-Msg-Id`` (128 bits: nobody can publish under it first), published until acknowledged.

JetStream drops a message whose Msg-Id it stored within its duplicate window and acknowledges
it with the first one's sequence. Such an acknowledgement is believed only when the message
stored there is this delivery, byte for byte (its MAC and payload): else someone who may
write the stream claimed the id first, and the delivery is published again under a new one
(``PUBLISH_ATTEMPTS`` in all), never answered by another's message."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import nats.errors
import nats.js.errors

from kbgraph.config import JetStreamConfig
from kbgraph.embeddings import shipped
from kbgraph.events import Event
from kbgraph.log import DeliverySkipped, DeliveryTooLarge, LogUnavailable
from kbgraph.log.jetstream import wire
from kbgraph.log.jetstream.connect import connect
from kbgraph.log.jetstream.embedder import ClusterEmbedder
from kbgraph.store import DeliveryResult, Store, WebhookMessage

log = logging.getLogger("kbgraph.log.jetstream")
IN_PROCESS: Final = 10158  # JetStream: a publish with this Msg-Id is being stored: ask again
PUBLISH_ATTEMPTS: Final = 3  # Msg-Ids found taken by another's message: then 503
APPLY_WAIT_SECONDS: Final = 30.0  # a published delivery not applied here by then: 503


async def applied_outcome(outcome: asyncio.Future[DeliveryResult]) -> DeliveryResult:
    """The result of a published delivery once this node has applied it, as ``outcome`` (set
    by whoever applies: the node's follower, or a worker's poll of the applier's store) gets
    it; ``LogUnavailable`` after ``APPLY_WAIT_SECONDS`` (a retry of the delivery is then
    answered as duplicates, or applied if it never got in). ``outcome`` is left to its owner:
    shielded here, neither cancelled nor forgotten."""
    try:
        return await asyncio.wait_for(asyncio.shield(outcome), APPLY_WAIT_SECONDS)
    except TimeoutError:
        raise LogUnavailable("stored in the stream, not yet applied on this node: retry") from None


class Publisher:
    """The publishing half of a process's end of the stream (attributes set by its owner)."""

    config: JetStreamConfig
    stream: str
    signer: wire.Signer
    store: Store  # its carrier (the local model) embeds what the delivery ships
    _nc: Any
    _js: Any
    connected: bool
    answered_at: float = 0.0  # when the stream's leader last answered (time.monotonic)
    share: ClusterEmbedder | None = None  # set by vector_share: the owner starts and closes it

    async def _open_nats(self, name: str, on_error: Callable[[Exception], Awaitable[None]]) -> None:
        """Connect as ``name``; ``connected`` follows nats-py's disconnects and reconnects, and
        ``on_error`` hears the errors nats-py retries after (each owner keeps its own reasons
        for ``/readyz``). Raises when no server is reachable at all."""

        async def disconnected() -> None:
            self.connected = False

        async def reconnected() -> None:
            self.connected = True

        self._nc = await connect(
            self.config, name, disconnected=disconnected, reconnected=reconnected, error=on_error
        )
        self._js = self._nc.jetstream(timeout=5)
        self.connected = True

    def vector_share(self) -> ClusterEmbedder:
        """This process's part in the cluster's one embedder (``kbgraph.log.jetstream.embedder``),
        over its connection: made once, started by the owner's ``follow``."""
        if self.share is None:
            self.share = ClusterEmbedder(
                self.stream,
                self.signer,
                self._id_prefix,
                lambda: self._js,
                self._publish,
                lambda: int(self._nc.max_payload),
                self.config.publish_timeout_seconds,
            )
        return self.share

    def _msg_ids(self, node: str) -> None:
        """This process's name ``<node>-<process>`` (its NATS connection's, its ids' prefix)."""
        self._id_prefix = f"{node}-{secrets.token_hex(3)}"

    def _new_msg_id(self) -> str:
        """``<node>-<process>-<128 random bits>``: unique, and unknown to anyone until it is
        published, so nobody can store a message under it first."""
        return f"{self._id_prefix}-{secrets.token_hex(16)}"

    async def _message(
        self,
        kb: str,
        events: list[Event],
        message: WebhookMessage | None,
        skipped: set[WebhookMessage],
    ) -> tuple[str, bytes, dict[str, str]]:
        """(subject, payload, headers) of one delivery, signed, with the local model's vectors
        of its upserts (``kbgraph.embeddings.shipped``: every node takes them in place of
        running the model) unless they would make it too big; refusals first:
        ``DeliverySkipped`` (a re-send of a delivery an operator skipped), ``DeliveryTooLarge``."""
        if message is not None and message in skipped:  # nothing published
            raise DeliverySkipped(
                f"webhook-id {message.id[:64]!r}: this delivery was skipped by an operator's"
                " decision on every node (kbgraph cluster skip); send it anew, changed"
            )
        limit = self._nc.max_payload - 1024  # room for the headers
        carrier = self.store.carrier
        vectors = None
        if carrier is not None:
            with contextlib.suppress(Exception):  # e.g. a text its tokenizer refuses
                vectors = await asyncio.to_thread(shipped.ship, carrier, events)
        payload, headers = wire.pack_within(kb, events, message, vectors, limit)
        if len(payload) > limit:
            raise DeliveryTooLarge(
                f"delivery of {len(payload)} bytes (compressed) is over the stream's"
                f" message limit of {limit} bytes (nats-server max_payload): send it in parts"
            )
        subject = f"{self.stream}.{kb}"
        self.signer.sign(subject, payload, headers)
        return subject, payload, headers

    async def _publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        claim: Callable[[str], None] = lambda msg_id: None,
    ) -> int:
        """Publish under a new Msg-Id (``claim`` hears it first: the node awaits its message
        by it) until acknowledged, and the acknowledgement is for this delivery; the stream
        sequence. ``LogUnavailable`` when the configured timeout passes, or when
        ``PUBLISH_ATTEMPTS`` ids in a row were found taken by another's message."""
        deadline = time.monotonic() + self.config.publish_timeout_seconds
        for _ in range(PUBLISH_ATTEMPTS):
            msg_id = headers[wire.MSG_ID] = self._new_msg_id()
            claim(msg_id)
            seq, duplicate = await self._publish_once(subject, payload, headers, deadline)
            if not duplicate or await self._stored_is(seq, subject, payload, headers):
                return seq
            log.warning(
                "stream %s: Msg-Id %s was taken by the message at %s, not this delivery's:"
                " published again under a new one",
                self.stream,
                msg_id,
                seq,
            )
        raise LogUnavailable(
            f"the stream acknowledged {PUBLISH_ATTEMPTS} other messages in place of this"
            " delivery (their Msg-Ids were taken first): not stored, retry"
        )

    async def _stored_is(
        self, seq: int, subject: str, payload: bytes, headers: dict[str, str]
    ) -> bool:
        """Whether the message at ``seq`` is this delivery: same subject, payload and MAC."""
        try:
            stored = await self._js.get_msg(self.stream, seq)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            raise LogUnavailable(
                f"the stream acknowledged this delivery as a duplicate of {seq}, which could"
                f" not be read ({exc!r}): not known to be stored, retry"
            ) from None
        mac = (stored.headers or {}).get(wire.MAC)
        return (
            stored.subject == subject
            and (stored.data or b"") == payload
            and isinstance(mac, str)
            and hmac.compare_digest(mac, headers[wire.MAC])
        )

    async def _publish_once(
        self, subject: str, payload: bytes, headers: dict[str, str], deadline: float
    ) -> tuple[int, bool]:
        """Publish until acknowledged (same ``Nats-Msg-Id``: JetStream keeps one copy) or
        ``deadline`` passes: (the stream sequence, whether JetStream called it a duplicate)."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LogUnavailable("the stream did not acknowledge the delivery in time")
            try:
                ack = await self._js.publish(
                    subject, payload, timeout=min(2.0, remaining), headers=headers
                )
                self.answered_at = time.monotonic()
                return int(ack.seq), bool(ack.duplicate)
            except (
                nats.errors.TimeoutError,
                nats.errors.NoRespondersError,
                nats.errors.ConnectionClosedError,
                nats.errors.ConnectionReconnectingError,
                nats.js.errors.NoStreamResponseError,
                nats.js.errors.ServiceUnavailableError,
                TimeoutError,
            ) as exc:
                log.debug("publish to %s: %r, retrying", subject, exc)
                await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            except nats.js.errors.APIError as exc:
                # 10158: an earlier attempt with this Msg-Id is being stored (the leader
                # changed meanwhile): its outcome is this delivery's, so ask until it is known
                if (exc.code is not None and exc.code >= 500) or exc.err_code == IN_PROCESS:
                    await asyncio.sleep(0.1)
                    continue
                raise LogUnavailable(f"the stream refused the delivery: {exc}") from exc
