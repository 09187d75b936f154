"""Publishing one delivery to the stream, as every process that takes deliveries does: the
node's single worker (``kbgraph.jetstream.node``) or each of its workers beside an applier
(``kbgraph.jetstream.worker``). One message per delivery, MAC-signed, with a
``Nats-Msg-Id`` unique to this process, published until acknowledged."""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import nats.errors
import nats.js.errors

from kbgraph.config import LogConfig
from kbgraph.events import Event
from kbgraph.jetstream import wire
from kbgraph.jetstream.connect import connect
from kbgraph.jetstream.errors import DeliverySkipped, DeliveryTooLarge, LogUnavailable
from kbgraph.store import WebhookMessage

log = logging.getLogger("kbgraph.jetstream")
IN_PROCESS: Final = 10158  # JetStream: a publish with this Msg-Id is being stored: ask again


class Publisher:
    """The publishing half of a process's end of the stream (attributes set by its owner)."""

    config: LogConfig
    stream: str
    signer: wire.Signer
    _nc: Any
    _js: Any
    connected: bool
    answered_at: float = 0.0  # when the stream's leader last answered (time.monotonic)

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

    def _msg_ids(self, node: str) -> None:
        """Message ids ``<node>-<process>-<n>``: unique per process (one node's workers, and a
        restarted worker, never reuse one within JetStream's duplicate window)."""
        self._id_prefix = f"{node}-{secrets.token_hex(3)}"
        self._ids = itertools.count(1)

    def _message(
        self,
        kb: str,
        events: list[Event],
        message: WebhookMessage | None,
        skipped: set[WebhookMessage],
    ) -> tuple[str, bytes, dict[str, str], str]:
        """(subject, payload, headers, message id) of one delivery, signed; refusals first:
        ``DeliverySkipped`` (a re-send of a delivery an operator skipped), ``DeliveryTooLarge``."""
        if message is not None and message in skipped:  # nothing published
            raise DeliverySkipped(
                f"webhook-id {message.id[:64]!r}: this delivery was skipped by an operator's"
                " decision on every node (kbgraph cluster skip); send it anew, changed"
            )
        payload, headers = wire.pack(kb, events, message)
        limit = self._nc.max_payload - 1024  # room for the headers
        if len(payload) > limit:
            raise DeliveryTooLarge(
                f"delivery of {len(payload)} bytes (compressed) is over the stream's"
                f" message limit of {limit} bytes (nats-server max_payload): send it in parts"
            )
        subject = f"{self.stream}.{kb}"
        self.signer.sign(subject, payload, headers)
        msg_id = f"{self._id_prefix}-{next(self._ids)}"
        headers[wire.MSG_ID] = msg_id
        return subject, payload, headers, msg_id

    async def _publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        """Publish until acknowledged (same ``Nats-Msg-Id``: JetStream keeps one copy) or the
        configured timeout passes; the stream sequence."""
        deadline = time.monotonic() + self.config.publish_timeout_seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LogUnavailable("the stream did not acknowledge the delivery in time")
            try:
                ack = await self._js.publish(
                    subject, payload, timeout=min(2.0, remaining), headers=headers
                )
                self.answered_at = time.monotonic()
                return int(ack.seq)
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
