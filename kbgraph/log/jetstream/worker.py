"""One worker of a node of several (``kbgraph.log.jetstream.applier``): it publishes the deliveries
it takes to the stream over its own NATS connection, and answers each once the node's applier
has applied it to the store (durable) and this worker's projection has followed it.

The answer is the one the applier's store decided: it keeps each recent delivery's result
(or its own refusal) with its stream position (``Store.stream_outcomes``), so every worker
answers as the single worker of a node does, byte for byte. Waiting is one poll of the store
per ``POLL_SECONDS`` while deliveries wait, shared by all of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from typing import Any, Final

import msgspec

from kbgraph.config import JetStreamConfig
from kbgraph.events import Event
from kbgraph.log import DeliverySkipped, LogUnavailable
from kbgraph.log.jetstream.applier import ApplierProbe, serve_applier_metrics
from kbgraph.log.jetstream.connect import disconnect, signer
from kbgraph.log.jetstream.node import NODE_ENV
from kbgraph.log.jetstream.publisher import APPLY_WAIT_SECONDS, Publisher, applied_outcome
from kbgraph.projection.follower import Projections
from kbgraph.store import DeliveryResult, KBLimitReached, ReplayRefused, Store, WebhookMessage

log = logging.getLogger("kbgraph.log.jetstream")

POLL_SECONDS: Final = 0.005  # the store read this often while deliveries wait for the applier
_decode = msgspec.json.Decoder(DeliveryResult).decode


class WorkerLog(Publisher):
    """A worker's end of the stream, a ``kbgraph.log.DeliveryLog``: publish here,
    the node's applier applies."""

    def __init__(self, config: JetStreamConfig, store: Store, projections: Projections) -> None:
        self.config = config
        self.stream = config.stream
        self.signer = signer(config)  # raises SecretMissing, naming the key
        self.store = store
        self.projections = projections
        self.applier = ApplierProbe(store.path)
        serve_applier_metrics(self.applier)
        self.connected = False
        self._nc: Any = None
        self._js: Any = None
        self._msg_ids(os.environ.get(NODE_ENV) or secrets.token_hex(6))
        self._waiting: dict[int, asyncio.Future[DeliveryResult]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        """Connect in the background (the node's applier follows the stream)."""
        self._task = asyncio.create_task(self._connect(), name="kbgraph-worker-nats")
        if self.share is not None:
            self.share.start()

    async def _connect(self) -> None:
        async def error(exc: Exception) -> None:  # nats-py retries; /readyz says why
            log.debug("nats: %r", exc)

        backoff = 0.1
        while self._nc is None:
            try:
                await self._open_nats(f"kbgraph-{self._id_prefix}", error)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker: JetStream not reachable: %r (again in %.1f s)", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)

    async def close(self) -> None:
        if self.share is not None:
            await self.share.close()
        await disconnect(self._nc, (self._poller, self._task))
        self.applier.close()

    def problem(self) -> str | None:
        """Why this worker is not ready: its own connection, or the node's applier."""
        if self._js is None:
            return "connecting to JetStream"
        if not self.connected:
            return "disconnected from JetStream: reconnecting"
        return self.applier.problem()

    async def append(
        self, kb: str, events: list[Event], message: WebhookMessage | None
    ) -> DeliveryResult:
        """Publish one delivery; once the node's store holds it and this worker's projection
        has followed it, its result (the refusals of ``JetStreamLog.append``, alike)."""
        if not events:  # nothing to publish: the KB's position as the node's store holds it
            return await self.store.append_async(kb, events, message=message)
        if self._js is None:
            raise LogUnavailable("not connected to JetStream yet")
        refusal = self.applier.refusal()
        if refusal is not None:
            raise LogUnavailable(refusal)
        skipped = await asyncio.to_thread(self.store.skipped_messages, self.stream)
        subject, payload, headers = await self._message(kb, events, message, skipped)
        seq = await self._publish(subject, payload, headers)
        deadline = time.monotonic() + APPLY_WAIT_SECONDS
        result = await self._outcome(seq)
        if result.applied:  # read-your-writes on this worker, as on one machine
            await self.projections.wait_for(kb, result.seq, max(0.0, deadline - time.monotonic()))
        return result

    async def _outcome(self, seq: int) -> DeliveryResult:
        future = self._waiting.get(seq)
        if future is None:  # a second delivery answered at one position: a JetStream duplicate
            future = self._waiting[seq] = asyncio.get_running_loop().create_future()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="kbgraph-worker-outcomes")
        try:
            return await applied_outcome(future)
        finally:
            if self._waiting.get(seq) is future and not future.done():
                del self._waiting[seq]

    async def _poll(self) -> None:
        """Resolve the waiting deliveries from the store, while any wait."""
        while self._waiting:
            seqs = sorted(self._waiting)
            try:
                position, results, notes = await asyncio.to_thread(
                    self.store.stream_outcomes, self.stream, seqs
                )
            except Exception as exc:  # the store busy, say: the next round tries again
                log.warning("worker: reading the applied positions failed: %r", exc)
                position, results, notes = 0, [], []
            outcomes: dict[int, DeliveryResult | BaseException] = {}
            for seq, kind, detail in notes:  # a delivery noted, not applied, is never a 200
                outcomes[seq] = (
                    DeliverySkipped(f"not applied: skipped {detail}")
                    if kind == "skipped"
                    else LogUnavailable(f"the stream's message at {seq} was {kind} here: retry")
                )
            for seq, result, refusal, why in results:
                if result is not None:
                    outcomes[seq] = _decode(result)
                else:
                    outcomes[seq] = (ReplayRefused if refusal == "replay" else KBLimitReached)(why)
            dead, status = self.applier.read()
            for seq in seqs:
                outcome: DeliveryResult | BaseException | None = outcomes.get(seq)
                if outcome is None and seq <= position:
                    outcome = LogUnavailable(
                        "applied on this node, its answer no longer kept: retry (a retry is"
                        " answered as duplicates)"
                    )
                elif outcome is None and dead is not None:
                    outcome = LogUnavailable(f"stored in the stream, {dead}: retry")
                elif outcome is None and status is not None and status.stuck == seq:
                    outcome = LogUnavailable(f"stored in the stream, {status.problem}")
                if outcome is None:
                    continue
                future = self._waiting.pop(seq, None)
                if future is None or future.done():  # gone meanwhile: its sender timed out
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                    future.exception()  # retrieved here: its waiter may have gone
                else:
                    future.set_result(outcome)
            await asyncio.sleep(POLL_SECONDS)
