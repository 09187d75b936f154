"""One embedder for the cluster: the process holding the lease embeds, and publishes what it
computed on the stream for every node's store.

With a provider outside the process (``[embeddings] provider = "openai"``) every process of
every node would otherwise pay for the same text. Instead, each process that fills vectors
(a node's single worker, or each worker of ``serve --workers N``; never the applier) runs a
``ClusterEmbedder``: every ``RENEW_SECONDS`` it writes its signed claim in the key-value
bucket ``<stream>-embedder``, reads the others' and applies the rule of
``kbgraph.log.jetstream.lease``, which names one holder for every process alike. Only the holder
calls the provider (``may_embed``); it publishes the rows it computed (vectors, or refusals)
as signed messages on ``<stream>._vectors`` (``publish``), which every node's follower hands
to its store in stream order (``kbgraph.log.jetstream.consumer``): the store takes a row only for
the concept's text at that position, where no row for that text is held yet
(``kbgraph.store.vectorrows.take``), and every process's filler settles from there. So each
changed text is embedded once for the cluster and every node holds the same bytes, even from
a provider that is not deterministic, whatever is published again.

A holder that dies, hangs or loses NATS stops renewing; its claim stops counting after
``LEASE_SECONDS`` and the next process by the rule takes over at its next renewal (vectors
wait meanwhile, served by words; nothing else does). A holder that renews but produces no
vectors (its provider fails for it alone, say) is named stalled by the processes whose rows
wait (``progress``) and passed over. A holder believes itself the holder only until half the
lease has passed since its last renewal began, so two processes embed at once only briefly
(a change of holder, a renewal slower than that, or claims hidden from each other); their
rows are then the same texts', and each store keeps the first.
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
from kbgraph.log.jetstream import lease, wire
from kbgraph.log.jetstream.lease import LEASE_SECONDS, RENEW_SECONDS, STALL_SECONDS, VOTE_SECONDS
from kbgraph.store.vectorrows import VectorRow

log = logging.getLogger("kbgraph.log.jetstream")

HEADER_ROOM: Final = 4096  # bytes of max_payload left for a message's headers
CLOSE_SECONDS: Final = 2.0  # giving the lease back on close waits at most this long


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
        self._since = 0.0  # when this process began claiming (wall clock, signed)
        self._holder: str | None = None  # the holder by the rule at the last renewal
        self._held_until = 0.0  # time.monotonic() until which this process may embed
        self._stuck_since: float | None = None  # rows have waited since, none settling
        self._votes: dict[str, float] = {}  # holders named stalled -> when (time.monotonic)
        self._claimed_at: float | None = None  # time.monotonic() its claim was last written
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start taking and renewing the lease (in the process's event loop)."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._hold(), name="kbgraph-cluster-embedder")

    async def close(self) -> None:
        """Stop, taking this process's claim back at once (else it expires)."""
        self._held_until = 0.0
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        js = self._js()
        if js is not None and self._claimed_at is not None:
            with contextlib.suppress(Exception):
                kv = await asyncio.wait_for(js.key_value(lease.bucket(self.stream)), CLOSE_SECONDS)
                await asyncio.wait_for(kv.delete(lease.key(self.name)), CLOSE_SECONDS)

    def may_embed(self) -> bool:
        """Whether this process holds the cluster's lease now (thread-safe)."""
        return time.monotonic() < self._held_until

    def progress(self, waiting: int, settled: int) -> None:
        """The filler's round (its thread): rows still waiting in this process, and rows
        settled in the round; waiting with none settled is the start of a stall."""
        if settled or not waiting:
            self._stuck_since = None
        elif self._stuck_since is None:
            self._stuck_since = time.monotonic()

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
        said = ""
        while True:
            try:
                await self._renew()
                said = ""
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away, say: not the holder until it answers
                self._held_until = 0.0
                if repr(exc) != said:  # once per cause, not every renewal
                    said = repr(exc)
                    log.warning("stream %s: the embedder's claim failed: %s", self.stream, said)
            await asyncio.sleep(RENEW_SECONDS)

    async def _renew(self) -> None:
        """Write this process's claim, read the others' and apply the rule."""
        js = self._js()
        if js is None:
            return
        began = time.monotonic()
        try:
            kv = await js.key_value(lease.bucket(self.stream))
        except nats.js.errors.NotFoundError:
            kv = await js.create_key_value(
                bucket=lease.bucket(self.stream), history=1, ttl=LEASE_SECONDS
            )
        stuck = self._stuck_since
        if stuck is not None and began - stuck >= STALL_SECONDS and self._holder is not None:
            if self._holder not in self._votes:
                log.warning(
                    "stream %s: vectors wait here for %.0f s while the embedder %s produces"
                    " none: passed over",
                    self.stream,
                    began - stuck,
                    self._holder,
                )
            self._votes[self._holder] = began
        self._votes = {n: t for n, t in self._votes.items() if began - t < VOTE_SECONDS}
        new = self._claimed_at is None or began - self._claimed_at > LEASE_SECONDS
        if new:  # first, or after its claim lapsed: it counts as the newest
            self._since = time.time()
        mine = lease.Claim(self.name, self._since, time.time(), tuple(sorted(self._votes)))
        await kv.put(lease.key(self.name), lease.seal(self._signer, self.stream, mine))
        self._claimed_at = began
        if new:  # claims written meanwhile may not show yet: decide from the next renewal on,
            self._held_until = 0.0  # when every process claiming by now shows
            return
        others = [c for c in await lease.read(js, self._signer, self.stream) if c.name != self.name]
        holder = lease.holder([mine, *others], time.time())
        if holder != self._holder:
            if holder == self.name:
                log.info("stream %s: this process (%s) embeds for the cluster", *self.where())
            elif self._holder == self.name:
                log.warning("stream %s: %s no longer embeds (now %s)", *self.where(), holder)
            self._holder = holder
        self._held_until = began + LEASE_SECONDS / 2 if holder == self.name else 0.0

    def where(self) -> tuple[str, str]:
        return self.stream, self.name
