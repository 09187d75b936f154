"""One embedder for the cluster: the process holding a lease embeds, and publishes what it
computed on the stream for every node's store.

With a provider outside the process (``[embeddings] provider = "openai"``) every process of
every node would otherwise pay for the same text. Instead, each process that fills vectors
(a node's single worker, or each worker of ``serve --workers N``; never the applier) runs a
``ClusterEmbedder``: it tries to hold the key ``holder`` of the key-value bucket
``<stream>-embedder`` (entries expire after ``LEASE_SECONDS``), renewing it every
``RENEW_SECONDS`` with a compare-and-set on its revision. Only the holder calls the provider
(``may_embed``); it publishes the rows it computed (vectors, or refusals) as signed messages on
``<stream>._vectors`` (``publish``), which every node's follower writes into its store in stream
order (``kbgraph.log.jetstream.consumer``), where every process's filler finds them by text hash.
So each changed text is embedded once for the cluster and every node holds the same bytes,
even from a provider that is not deterministic.

A holder that dies, hangs or loses NATS stops renewing; its key expires and another process
takes the lease within ``LEASE_SECONDS`` plus a renewal (vectors wait meanwhile, served by
words; nothing else does). A holder believes itself the holder only until half the lease has
passed since its last renewal began, so two processes embed at once only if a renewal takes
longer than that; their rows are then the same texts' vectors, applied in stream order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import nats.js.errors

from kbgraph.log import LogUnavailable
from kbgraph.log.jetstream import wire
from kbgraph.store.vectorrows import VectorRow

log = logging.getLogger("kbgraph.log.jetstream")

LEASE_SECONDS: Final = 10.0  # the bucket's TTL: a holder not renewing loses the lease by then
RENEW_SECONDS: Final = 2.0  # the holder renews (and the others try to take it) this often
LEASE_KEY: Final = "holder"
HEADER_ROOM: Final = 4096  # bytes of max_payload left for a message's headers
CLOSE_SECONDS: Final = 2.0  # giving the lease back on close waits at most this long


def lease_bucket(stream: str) -> str:
    return f"{stream}-embedder"


def payloads(kb: str, model: str, rows: list[VectorRow], limit: int) -> list[bytes]:
    """``rows`` as vectors messages of at most ``limit`` bytes each, in order (halved until
    they fit; one row over the limit is a ``ValueError``)."""
    payload = wire.encode_vectors(kb, model, rows)
    if len(payload) <= limit:
        return [payload]
    if len(rows) == 1:
        raise ValueError(f"one vector of {len(payload)} bytes is over the stream's limit")
    half = len(rows) // 2
    return payloads(kb, model, rows[:half], limit) + payloads(kb, model, rows[half:], limit)


class ClusterEmbedder:
    """A filler's ``VectorShare`` over JetStream (see the module's text); made by the process's
    ``Publisher.vector_share``, started and closed with its log."""

    def __init__(
        self,
        stream: str,
        signer: wire.Signer,
        name: str,
        js: Callable[[], Any],
        publish: Callable[[str, bytes, dict[str, str]], Awaitable[int]],
        max_payload: Callable[[], int],
        publish_seconds: float,
    ) -> None:
        self.stream = stream
        self.name = name  # this process's, as the lease names its holder
        self._signer = signer
        self._js = js
        self._publish = publish
        self._max_payload = max_payload
        self._publish_seconds = publish_seconds
        self._revision: int | None = None  # the lease's revision while this process holds it
        self._held_until = 0.0  # time.monotonic() until which this process may embed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start taking and renewing the lease (in the process's event loop)."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._hold(), name="kbgraph-cluster-embedder")

    async def close(self) -> None:
        """Stop, giving the lease back at once if held (else it expires)."""
        self._held_until = 0.0
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        js, revision = self._js(), self._revision
        self._revision = None
        if js is not None and revision is not None:
            with contextlib.suppress(Exception):
                kv = await asyncio.wait_for(js.key_value(lease_bucket(self.stream)), CLOSE_SECONDS)
                await asyncio.wait_for(kv.delete(LEASE_KEY, last=revision), CLOSE_SECONDS)

    def may_embed(self) -> bool:
        """Whether this process holds the cluster's lease now (thread-safe)."""
        return time.monotonic() < self._held_until

    def publish(self, kb: str, model: str, rows: list[VectorRow]) -> None:
        """Publish ``rows`` for every node's store, from the filler's thread; returns once the
        stream acknowledged them, raises ``LogUnavailable`` otherwise."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise LogUnavailable("not following the stream")
        future = asyncio.run_coroutine_threadsafe(self._publish_rows(kb, model, rows), loop)
        try:
            future.result(self._publish_seconds + RENEW_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise LogUnavailable("the stream did not acknowledge the vectors in time") from None

    async def _publish_rows(self, kb: str, model: str, rows: list[VectorRow]) -> None:
        subject = wire.vectors_subject(self.stream)
        for payload in payloads(kb, model, rows, self._max_payload() - HEADER_ROOM):
            headers: dict[str, str] = {}
            self._signer.sign(subject, payload, headers)
            await self._publish(subject, payload, headers)

    async def _hold(self) -> None:
        while True:
            try:
                await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away, say: not the holder until it answers
                self._held_until = 0.0
                log.debug("stream %s: the embedder lease: %r", self.stream, exc)
            await asyncio.sleep(RENEW_SECONDS)

    async def _renew(self) -> None:
        """Take the lease if free, renew it if held (compare-and-set on its revision)."""
        js = self._js()
        if js is None:
            return
        began = time.monotonic()
        try:
            kv = await js.key_value(lease_bucket(self.stream))
        except nats.js.errors.NotFoundError:
            kv = await js.create_key_value(
                bucket=lease_bucket(self.stream), history=1, ttl=LEASE_SECONDS
            )
        try:
            if self._revision is None:
                self._revision = await kv.create(LEASE_KEY, self.name.encode())
                log.info("stream %s: this process (%s) embeds for the cluster", *self.where())
            else:
                self._revision = await kv.update(LEASE_KEY, self.name.encode(), last=self._revision)
        except nats.js.errors.KeyWrongLastSequenceError:  # another holds it (or took it)
            if self._revision is not None:
                log.warning("stream %s: %s lost the embedder lease", *self.where())
            self._revision = None
            self._held_until = 0.0
            return
        self._held_until = began + LEASE_SECONDS / 2

    def where(self) -> tuple[str, str]:
        return self.stream, self.name
