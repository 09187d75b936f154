"""One node's end of the stream: ``append`` publishes a delivery and awaits the result this
node's own follower computes for it (``kbgraph.log.jetstream.consumer``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from kbgraph.config import EmbeddingsConfig, JetStreamConfig
from kbgraph.events import Event
from kbgraph.log import LogUnavailable
from kbgraph.log.jetstream import snapshotfile, snapshots, wire
from kbgraph.log.jetstream.connect import (
    ConnectFailed,
    RulesDiffer,
    decision_rules,
    disconnect,
    ensure_stream,
    signer,
)
from kbgraph.log.jetstream.consumer import (
    ApplyFailed,
    Diverged,
    StreamConsumer,
    Stuck,
    count_notes,
    forget_stream,
)
from kbgraph.log.jetstream.publisher import Publisher, applied_outcome
from kbgraph.store import DeliveryResult, Store, WebhookMessage

log = logging.getLogger("kbgraph.log.jetstream")

NODE_ENV: Final = "KBGRAPH_NODE_ID"  # set by kbgraph serve: its start-up report's key
REPORT_SECONDS: Final = 5.0  # this node's position to "<stream>-nodes" this often (it is live)
WATCH_SECONDS: Final = 1.0  # the stream's leader asked this often whether it answers
CLOSE_SECONDS: Final = 5.0  # a NATS connection not closed by then is left behind
SILENT_SECONDS: Final = 4.0  # no answer from it for this long: /readyz says not ready


class JetStreamLog(StreamConsumer, Publisher):
    """One node's end of the stream, a ``kbgraph.log.DeliveryLog``: ``append``
    publishes, the follower applies."""

    def __init__(
        self,
        config: JetStreamConfig,
        store: Store,
        on_applied: Callable[[], None] = lambda: None,
        checkpoints: Path | None = None,
        vector_max_chars: int = EmbeddingsConfig().max_chars,
    ) -> None:
        self.config = config
        self.vector_max_chars = vector_max_chars
        self.checkpoints = checkpoints  # the projection's, published with snapshots
        self.signer = signer(config)  # raises SecretMissing, naming the key: no start-up
        self.store = store
        self.on_applied = on_applied
        self.stream = config.stream
        self.applied = store.log_position(config.stream)  # last sequence applied here
        self.target: int | None = None  # the stream's last sequence when this node started
        self.connected = False
        self.error: str | None = "connecting to JetStream"
        self.nats_error = ""  # the last error nats-py reported (named while reconnecting)
        self.failure: str | None = None  # why following fails, until a message applies
        self.stuck: Stuck | None = None  # the message that fails to apply here, if one does
        self._skips: dict[int, tuple[int, str]] = {}
        self._refusals: dict[int, Exception] = {}
        self.skipped_messages = store.skipped_messages(config.stream)
        count_notes(store, config.stream)
        self._node = os.environ.get(NODE_ENV) or secrets.token_hex(6)
        self._msg_ids(self._node)
        self._waiters: dict[str, tuple[str, asyncio.Future[DeliveryResult]]] = {}
        self._nc: Any = None
        self._js: Any = None
        self._task: asyncio.Task[None] | None = None
        self._upkeep_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.answered_at = 0.0  # when the stream's leader last answered (time.monotonic)
        self.snapshot_at = 0  # the position of the last snapshot this node published

    # --- lifecycle ----------------------------------------------------------------------

    async def follow(self) -> None:
        """Connect and follow in the background (``problem()`` says when it has caught up)."""
        self._task = asyncio.create_task(self._run(), name="kbgraph-jetstream-follower")
        self._upkeep_task = asyncio.create_task(self._upkeep(), name="kbgraph-jetstream-upkeep")
        self._watch_task = asyncio.create_task(self._watch(), name="kbgraph-jetstream-watch")
        if self.share is not None:
            self.share.start()

    async def close(self) -> None:
        if self.share is not None:
            await self.share.close()
        await disconnect(self._nc, (self._watch_task, self._upkeep_task, self._task))
        forget_stream(self.stream)

    def problem(self) -> str | None:
        """Why this node is not ready: not connected (yet), failing to follow (a message its
        store cannot apply, or the stream no longer holds what it needs), or behind the
        stream's last sequence as of its start (a fresh node catches up first), or the
        stream's leader has not answered for ``SILENT_SECONDS`` (``_watch``): paused, cut
        off, being elected, or the NATS server this node is connected to hangs; writes are
        refused (503) meanwhile, so the node says so rather than look ready."""
        if self.target is None:
            return self.error or "connecting to JetStream"
        if not self.connected:
            last = f" (last error: {self.nats_error})" if self.nats_error else ""
            return f"disconnected from JetStream: reconnecting{last}"
        if self.failure is not None:
            return f"following stream {self.stream} fails: {self.failure}"
        if self.applied < self.target:
            return f"catching up with stream {self.stream}: at {self.applied} of {self.target}"
        silent = time.monotonic() - self.answered_at
        if silent > SILENT_SECONDS:
            return (
                f"stream {self.stream} has not answered for {silent:.0f} s (its leader paused,"
                " cut off or being elected, or this node's NATS server hangs): deliveries are"
                " refused until it does"
            )
        return None

    def refusal(self) -> str | None:
        """Why a delivery must be refused before anything is published (503), or None: not
        connected, its rules differ, a message fails to apply here, or following stopped."""
        if self._js is None:
            return "not connected to JetStream yet"
        if self.target is None and self.error is not None:  # e.g. its rules differ
            return self.error
        if self.stuck is not None or (self._task is not None and self._task.done()):
            return f"following stream {self.stream} fails: {self.failure}"
        return None

    async def _connect(self) -> None:
        async def error(exc: Exception) -> None:  # nats-py retries; /readyz says why
            log.debug("nats: %r", exc)
            self.nats_error = repr(exc)
            if "authorization" in str(exc).lower():  # kept: it says the most
                self.error = f"JetStream refused this node's credentials: {exc}"
            elif self.target is None and "credentials" not in (self.error or ""):
                self.error = f"JetStream not reachable: {exc!r}"

        await self._open_nats(f"kbgraph-{self._node}", error)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self._nc is None or self._nc.is_closed:
                    await self._connect()
                if self.target is None:
                    self.target = await ensure_stream(
                        self._js, self.config, decision_rules(self.store, self.signer)
                    )
                    self.error = None
                    self.answered_at = time.monotonic()
                    log.info(
                        "following stream %s from %s (last %s)",
                        self.stream,
                        self.applied,
                        self.target,
                    )
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Diverged as exc:
                log.error("stream %s: %s", self.stream, exc)
                return  # nothing this node applies from here on would be alike
            except Exception as exc:
                if isinstance(exc, RulesDiffer):
                    self.error = str(exc)
                elif self.target is None:
                    if "credentials" not in (self.error or ""):  # kept: it says the most
                        cause = str(exc) if isinstance(exc, ConnectFailed) else repr(exc)
                        self.error = f"JetStream not reachable: {cause}"
                    if self._nc is not None and not self._nc.is_connected:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(self._nc.close(), CLOSE_SECONDS)
                        self._nc = None
                if not isinstance(exc, ApplyFailed):  # ApplyFailed was said once already
                    log.warning(
                        "following stream %s: %r (again in %.1f s)", self.stream, exc, backoff
                    )
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
            else:
                backoff = 0.1

    async def _watch(self) -> None:
        """Ask the stream's leader whether it answers, every ``WATCH_SECONDS`` (``problem``
        reads when it last did). A paused or cut-off leader, or a hung server this node's
        connection stays on, closes no connection: only a request that goes unanswered
        shows it."""
        while True:
            if self._js is not None and self.target is not None:
                try:
                    await asyncio.wait_for(self._js.stream_info(self.stream), SILENT_SECONDS)
                    self.answered_at = time.monotonic()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.debug("stream %s does not answer: %r", self.stream, exc)
            await asyncio.sleep(WATCH_SECONDS)

    # --- snapshots and trimming (kbgraph.log.jetstream.snapshots) ------------------------------

    async def _upkeep(self) -> None:
        """Report this node's position (it is live: the stream is not trimmed past it), and
        once per ``snapshot_every_seconds`` while it is ready and has applied something new:
        publish a snapshot, keep the newest ``snapshots_keep``, trim the stream below what
        they and every live node covered."""
        every = self.config.snapshot_every_seconds
        due = time.monotonic() + every
        pause = min(REPORT_SECONDS, every) if every else REPORT_SECONDS
        while True:
            if self._js is None or self.target is None or not self.connected:
                await asyncio.sleep(0.2)  # reported as soon as it can be
                continue
            try:
                await snapshots.report(self._js, self.stream, self._node, self.applied)
                if every and time.monotonic() >= due and self.problem() is None:
                    due = time.monotonic() + every
                    if self.applied > self.snapshot_at:
                        await self._snapshot()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("stream %s: snapshot or trim failed: %r", self.stream, exc)
            await asyncio.sleep(pause)

    async def _snapshot(self) -> None:
        path = Path(self.store.path)
        packed = await asyncio.to_thread(snapshotfile.take, path, self.checkpoints, self.stream)
        rules = decision_rules(self.store, self.signer)
        name = await snapshots.publish(
            self._js, self.stream, self.signer, rules, packed, self.config.snapshots_keep
        )
        self.snapshot_at = packed.position
        kept = await snapshots.trim(self._js, self.stream)
        log.info(
            "stream %s: snapshot %s (%s bytes) published; the stream kept from %s",
            self.stream,
            name,
            len(packed.data),
            kept,
        )

    # --- publishing ---------------------------------------------------------------------

    async def append(
        self, kb: str, events: list[Event], message: WebhookMessage | None
    ) -> DeliveryResult:
        """Publish one delivery; once a quorum stored it and this node applied it, its result.

        Raises the store's refusals (``ReplayRefused``, ``KBLimitReached``) as the follower
        decided them, and ``LogUnavailable`` when the stream did not acknowledge in time, this
        node has not applied the message in time (``applied_outcome``), or this node cannot
        follow the stream now (nothing is published then).
        """
        if not events:  # nothing to publish: the KB's position as this node holds it
            return await self.store.append_async(kb, events, message=message)
        refusal = self.refusal()
        if refusal is not None:
            raise LogUnavailable(refusal)
        subject, payload, headers = await self._message(kb, events, message, self.skipped_messages)
        waiter: asyncio.Future[DeliveryResult] = asyncio.get_running_loop().create_future()
        claimed: list[str] = []

        def claim(msg_id: str) -> None:  # only a message with this id and this MAC settles it
            claimed.append(msg_id)
            self._waiters[msg_id] = (headers[wire.MAC], waiter)

        try:
            await self._publish(subject, payload, headers, claim)
            return await applied_outcome(waiter)
        finally:
            for msg_id in claimed:
                self._waiters.pop(msg_id, None)
            if not waiter.done():
                waiter.cancel()
            elif not waiter.cancelled():
                waiter.exception()
