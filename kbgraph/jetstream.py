"""The log on NATS JetStream: every node a full replica (``[log] kind = "jetstream"``).

The stream is the one total order of deliveries. A node that takes a delivery does not decide
it: it publishes the delivery as ONE message (the KB, the events as the log encodes them, the
signed webhook message) and awaits JetStream's acknowledgement, which a stream of R replicas
gives once a quorum stored it. Every node runs ``JetStreamLog``'s follower, which reads the
stream in order from the position its own SQLite store recorded and applies each message with
the single store's decision code (``Store.submit_from_log``: ``decide`` and the webhook-id
binding, timed by the message's stream timestamp, never the node's clock), recording the
stream sequence in the same transaction as the state it produced. Same messages, same order,
same code: every node reaches the same state and the same per-KB ``seq``, so two nodes taking
deliveries for one KB at the same moment cannot both append on one position, and the node that
took a delivery answers with the result its own follower computed for that message.

The follower is a push consumer of this module's own (ephemeral, in memory, no acks, flow
control, idle heartbeats) started at the next sequence the store needs; a gap, a repeat or a
silent consumer (two heartbeats missed: its server died) drops it and starts a new one from
the store's recorded position, so no message is skipped or applied twice whatever the cluster
does. A commit that fails is retried after a pause; a stream that no longer holds the next
message stops the follower there. Either way ``/readyz`` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
import zlib
from collections.abc import Callable
from typing import Any, Final

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from kbgraph.config import LogConfig
from kbgraph.events import Event, decode_from_log, encode_for_log
from kbgraph.store import DeliveryResult, Store, WebhookMessage
from kbgraph.store.positions import DECIDED  # a delivery's own refusal, on every node
from kbgraph.threads import settle

log = logging.getLogger("kbgraph.jetstream")

HEARTBEAT_SECONDS: Final = 1.0  # the consumer's idle heartbeat; two missed: start a new one
APPLY_BATCH: Final = 512  # messages handed to the store's writer at once (one group commit)
APPLY_WAIT_SECONDS: Final = 30.0  # a published delivery not applied here by then: 503
DUPLICATE_WINDOW_SECONDS: Final = 120.0  # JetStream drops a re-publish with the same Msg-Id
MSG_ID: Final = "Nats-Msg-Id"
ENCODING: Final = "Kbgraph-Encoding"  # "deflate": the payload is zlib-compressed
COMPRESS_ABOVE: Final = 32 << 10  # bytes; batched deliveries of text shrink 3-5x
RULES_KEY: Final = "kbgraph_decision_rules"  # stream metadata: what every node decides with


def decision_rules(store: Store) -> str:
    """The settings a delivery's decision depends on besides the stream: every node must have
    the same, or nodes would disagree on the same message (a KB created or refused, a key
    remembered or forgotten)."""
    names = ",".join(sorted(store.named_kbs))
    return f"max_kbs={store.max_kbs}; dedupe_keys={store.dedupe_keys}; webhooks.kbs=[{names}]"


class LogUnavailable(RuntimeError):
    """The stream did not take the delivery, or it is not applied here yet (503)."""


class DeliveryTooLarge(ValueError):
    """The delivery, compressed, is over the NATS servers' ``max_payload`` (413)."""


class StreamDelivery(msgspec.Struct, array_like=True, frozen=True):
    """One delivery as the stream carries it (MessagePack)."""

    kb: str
    events: list[bytes]  # each ``encode_for_log(event)``
    message_id: str | None = None  # the signed webhook message, if any
    message_digest: bytes | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StreamDelivery)


def encode_delivery(kb: str, events: list[Event], message: WebhookMessage | None) -> bytes:
    return _encoder.encode(
        StreamDelivery(
            kb,
            [encode_for_log(event) for event in events],
            message.id if message else None,
            message.digest if message else None,
        )
    )


def decode_delivery(payload: bytes) -> tuple[str, list[Event], WebhookMessage | None]:
    delivery = _decoder.decode(payload)
    message = None
    if delivery.message_id is not None and delivery.message_digest is not None:
        message = WebhookMessage(delivery.message_id, delivery.message_digest)
    return delivery.kb, [decode_from_log(raw) for raw in delivery.events], message


class ApplyFailed(RuntimeError):
    """The store did not commit a message (I/O, a bug): retried after a pause, and the node
    says not ready meanwhile."""


class RulesDiffer(RuntimeError):
    """This node's decision settings differ from those the stream's nodes decide with."""


class StreamBehind(RuntimeError):
    """The stream no longer holds the message this store needs next (cut or deleted)."""


class _Restart(Exception):
    """The consumer must be replaced (a gap, or silence)."""


class JetStreamLog:
    """One node's end of the stream: ``append`` publishes, the follower applies."""

    def __init__(
        self, config: LogConfig, store: Store, on_applied: Callable[[], None] = lambda: None
    ) -> None:
        self.config = config
        self.store = store
        self.on_applied = on_applied
        self.stream = config.stream
        self.applied = store.log_position(config.stream)  # last sequence applied here
        self.target: int | None = None  # the stream's last sequence when this node started
        self.connected = False
        self.error: str | None = "connecting to JetStream"
        self.failure: str | None = None  # the store's last failure to apply, until one applies
        self._node = secrets.token_hex(6)
        self._ids = itertools.count(1)
        self._waiters: dict[str, asyncio.Future[DeliveryResult]] = {}
        self._nc: Any = None
        self._js: Any = None
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and follow in the background (``problem()`` says when it has caught up)."""
        self._task = asyncio.create_task(self._run(), name="kbgraph-jetstream-follower")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    def problem(self) -> str | None:
        """Why this node is not ready: not connected (yet), failing to follow (its store
        cannot apply, or the stream no longer holds what it needs), or behind the stream's
        last sequence as of its start (a fresh node catches up first)."""
        if self.target is None:
            return self.error or "connecting to JetStream"
        if not self.connected:
            return "disconnected from JetStream: reconnecting"
        if self.failure is not None:
            return f"following stream {self.stream} fails: {self.failure}"
        if self.applied < self.target:
            return f"catching up with stream {self.stream}: at {self.applied} of {self.target}"
        return None

    async def _connect(self) -> None:
        async def disconnected() -> None:
            self.connected = False

        async def reconnected() -> None:
            self.connected = True

        async def error(exc: Exception) -> None:
            log.debug("nats: %r", exc)

        self._nc = await nats.connect(
            servers=list(self.config.servers),
            name=f"kbgraph-{self._node}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            connect_timeout=2,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            error_cb=error,
        )
        self.connected = True
        self._js = self._nc.jetstream(timeout=5)

    async def _ensure_stream(self) -> int:
        """Create the stream if missing (every node may try: it is idempotent); its last seq.

        The stream's metadata holds the decision rules (``decision_rules``) of the first node
        that found none there; a node whose own differ raises ``RulesDiffer`` and follows
        nothing (``/readyz`` names both), rather than decide some message otherwise."""
        rules = decision_rules(self.store)
        config = api.StreamConfig(
            name=self.stream,
            subjects=[f"{self.stream}.*"],
            num_replicas=self.config.replicas,
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            duplicate_window=DUPLICATE_WINDOW_SECONDS,
            metadata={RULES_KEY: rules},
        )
        try:
            info = await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            info = await self._js.add_stream(config)
        stated = (info.config.metadata or {}).get(RULES_KEY)
        if stated is None:  # a stream made by other means, or before the rules were stated
            info.config.metadata = {**(info.config.metadata or {}), RULES_KEY: rules}
            info = await self._js.update_stream(info.config)
            stated = (info.config.metadata or {}).get(RULES_KEY)
        if stated != rules:
            raise RulesDiffer(
                f"this node decides with {rules}, the nodes of stream {self.stream} with"
                f" {stated}: every node must decide alike ([limits] max_kbs, [store]"
                " dedupe_keys, the [webhooks.kbs] names), so this one follows nothing"
            )
        if info.config.num_replicas != self.config.replicas:
            log.warning(
                "stream %s has %s replicas, the config says %s: kept as it is",
                self.stream,
                info.config.num_replicas,
                self.config.replicas,
            )
        return int(info.state.last_seq)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self._nc is None or self._nc.is_closed:
                    await self._connect()
                if self.target is None:
                    self.target = await self._ensure_stream()
                    self.error = None
                    log.info(
                        "following stream %s from %s (last %s)",
                        self.stream,
                        self.applied,
                        self.target,
                    )
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, ApplyFailed):  # cleared once a batch applies
                    self.failure = f"{exc}: {exc.__cause__!r}"
                if isinstance(exc, RulesDiffer):
                    self.error = str(exc)
                elif self.target is None:
                    self.error = f"JetStream not reachable: {exc!r}"
                    if self._nc is not None and not self._nc.is_connected:
                        with contextlib.suppress(Exception):
                            await self._nc.close()
                        self._nc = None
                log.warning("following stream %s: %r (again in %.1f s)", self.stream, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
            else:
                backoff = 0.1

    # --- following ----------------------------------------------------------------------

    async def _follow(self) -> None:
        """One consumer from ``applied + 1`` until it must be replaced (``_Restart``)."""
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def deliver(msg: Msg) -> None:
            queue.put_nowait(msg)

        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox, cb=deliver)
        consumer = None
        try:
            info = await self._js.add_consumer(
                self.stream,
                api.ConsumerConfig(
                    deliver_subject=inbox,
                    deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=self.applied + 1,
                    ack_policy=api.AckPolicy.NONE,
                    max_deliver=1,
                    flow_control=True,
                    idle_heartbeat=HEARTBEAT_SECONDS,
                    mem_storage=True,
                    num_replicas=1,
                    inactive_threshold=30.0,
                ),
            )
            consumer = info.name
            while True:
                try:
                    first = await asyncio.wait_for(queue.get(), 2.5 * HEARTBEAT_SECONDS)
                except TimeoutError:
                    raise _Restart("consumer silent: no message or heartbeat") from None
                batch = [first]
                while len(batch) < APPLY_BATCH and not queue.empty():
                    batch.append(queue.get_nowait())
                await self._apply(batch)
        except _Restart as why:
            log.info("stream %s: new consumer from %s (%s)", self.stream, self.applied + 1, why)
            await self._check_stream_start()
            await asyncio.sleep(0.05)  # a consumer that keeps failing must not spin
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if consumer is not None and self._nc.is_connected:
                with contextlib.suppress(Exception):
                    await self._js.delete_consumer(self.stream, consumer)

    async def _check_stream_start(self) -> None:
        """Raise ``StreamBehind`` (and say so on ``/readyz``) when the stream no longer holds
        the next message this store needs: purged, or cut by limits set on it."""
        info = await self._js.stream_info(self.stream)
        first, last, need = int(info.state.first_seq), int(info.state.last_seq), self.applied + 1
        if first > need:
            self.failure = (
                f"stream {self.stream} starts at {first}, this node's store is at"
                f" {self.applied}: start it from a copy of another node's store"
            )
            raise StreamBehind(self.failure)
        if need <= last:  # the message exists unless someone deleted it from the stream
            try:
                await self._js.get_msg(self.stream, need)
            except nats.js.errors.NotFoundError:
                self.failure = (
                    f"stream {self.stream} lacks message {need} (deleted): the nodes that"
                    " applied it and those that did not would differ, so this one stops"
                )
                raise StreamBehind(self.failure) from None

    async def _apply(self, batch: list[Msg]) -> None:
        """Apply the data messages of ``batch`` in order; answer control messages."""
        loop = asyncio.get_running_loop()
        submitted: list[tuple[int, str | None, asyncio.Future[DeliveryResult]]] = []
        expected = self.applied + 1
        restart: str | None = None
        for msg in batch:
            headers = msg.headers or {}
            if headers.get("Status"):  # heartbeat or flow control
                if msg.reply:
                    await self._nc.publish(msg.reply, b"")
                last = int(headers.get("Nats-Last-Stream", "0") or 0)
                if last >= expected:  # the consumer delivered more than we saw
                    restart = f"heartbeat says {last}, next expected {expected}"
                    break
                continue
            seq = msg.metadata.sequence.stream
            if seq < expected:
                continue  # a repeat: applied already
            if seq > expected:
                restart = f"gap: {seq} after {expected - 1}"
                break
            payload = msg.data
            if headers.get(ENCODING) == "deflate":
                payload = zlib.decompress(payload)
            kb, events, message = decode_delivery(payload)
            future: asyncio.Future[DeliveryResult] = loop.create_future()

            def resolve(
                result: DeliveryResult | None,
                exc: BaseException | None,
                future: asyncio.Future[DeliveryResult] = future,
            ) -> None:
                loop.call_soon_threadsafe(settle, future, result, exc)

            self.store.submit_from_log(
                kb,
                events,
                message,
                msg.metadata.timestamp.timestamp(),
                (self.stream, seq),
                resolve,
            )
            submitted.append((seq, headers.get(MSG_ID), future))
            expected += 1
        failed: BaseException | None = None
        for seq, msg_id, future in submitted:
            if failed is not None:  # after a failure: only consume the rest's outcomes
                with contextlib.suppress(Exception):
                    await future
                continue
            try:
                await future
            except Exception as exc:
                if not isinstance(exc, DECIDED):
                    failed = exc
                    continue
            self.applied = seq
            waiter = self._waiters.pop(msg_id, None) if msg_id else None
            if waiter is not None and not waiter.done():
                exc = future.exception()
                if exc is not None:
                    waiter.set_exception(exc)
                else:
                    waiter.set_result(future.result())
        if submitted:
            self.on_applied()
        if failed is not None:  # nothing of it committed: read on from the store's position
            self.applied = await asyncio.to_thread(self.store.log_position, self.stream)
            raise ApplyFailed(f"applying stream {self.stream} after {self.applied}") from failed
        self.failure = None
        if restart is not None:
            raise _Restart(restart)

    # --- publishing ---------------------------------------------------------------------

    async def append(
        self, kb: str, events: list[Event], message: WebhookMessage | None
    ) -> DeliveryResult:
        """Publish one delivery; once a quorum stored it and this node applied it, its result.

        Raises the store's refusals (``ReplayRefused``, ``KBLimitReached``) as the follower
        decided them, and ``LogUnavailable`` when the stream did not acknowledge in time or
        this node has not applied the message within ``APPLY_WAIT_SECONDS`` (a retry of the
        delivery is then answered as duplicates, or applied if it never got in).
        """
        if self._js is None:
            raise LogUnavailable("not connected to JetStream yet")
        if self.target is None and self.error is not None:  # e.g. its rules differ
            raise LogUnavailable(self.error)
        msg_id = f"{self._node}-{next(self._ids)}"
        waiter: asyncio.Future[DeliveryResult] = asyncio.get_running_loop().create_future()
        self._waiters[msg_id] = waiter
        try:
            payload = encode_delivery(kb, events, message)
            headers = {MSG_ID: msg_id}
            if len(payload) > COMPRESS_ABOVE:
                payload = zlib.compress(payload, 1)
                headers[ENCODING] = "deflate"
            limit = self._nc.max_payload - 1024  # room for the headers
            if len(payload) > limit:
                raise DeliveryTooLarge(
                    f"delivery of {len(payload)} bytes (compressed) is over the stream's"
                    f" message limit of {limit} bytes (nats-server max_payload): send it in parts"
                )
            await self._publish(f"{self.stream}.{kb}", payload, headers)
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), APPLY_WAIT_SECONDS)
            except TimeoutError:
                raise LogUnavailable(
                    "stored in the stream, not yet applied on this node: retry"
                ) from None
        finally:
            self._waiters.pop(msg_id, None)
            if not waiter.done():
                waiter.cancel()
            elif not waiter.cancelled():
                waiter.exception()

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
                if exc.code is not None and exc.code >= 500:
                    await asyncio.sleep(0.1)
                    continue
                raise LogUnavailable(f"the stream refused the delivery: {exc}") from exc
