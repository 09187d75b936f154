"""Following the stream: every message, in order, into this node's store.

The follower is a push consumer of its own (ephemeral, in memory, no acks, flow control, idle
heartbeats) started at the next sequence the store needs; a gap, a repeat or a silent
consumer (two heartbeats missed: its server died) drops it and starts a new one from the
store's recorded position, so no message is skipped or applied twice whatever the cluster
does. A stream that no longer holds the next message stops the follower there.

A message the store cannot apply (``MessageFailed``: I/O, a bug, an SQLite difference) is
retried after a pause, alone, and meanwhile the node says so on ``/readyz``, ``/metrics`` and
its log: the position, the KB, the error. If every node fails on it, the way forward is an
operator's decision recorded in the stream (``kbgraph cluster skip``): each new consumer
first reads the decisions ahead of its position, so every node skips exactly the message
the decision names, noting it in its store, and notes the decision when it reaches it. A
node that had applied a message the cluster then skipped stops following and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Callable
from typing import Any, Final

import msgspec
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api
from prometheus_client import Counter, Gauge, generate_latest

from kbgraph.events import ECHO_CHARS
from kbgraph.log import DeliverySkipped, LogUnavailable
from kbgraph.log.jetstream import wire
from kbgraph.store import DeliveryResult, Store, WebhookMessage
from kbgraph.store.group import LoggedVectors
from kbgraph.store.positions import DECIDED, MessageFailed  # DECIDED: a delivery's own refusal
from kbgraph.threads import LoopSettle

log = logging.getLogger("kbgraph.log.jetstream")

HEARTBEAT_SECONDS: Final = 1.0  # the consumer's idle heartbeat; two missed: start a new one
APPLY_BATCH: Final = 512  # messages handed to the store's writer at once (one group commit)

POSITION = Gauge("kbgraph_stream_position", "Last stream sequence this node applied.", ["stream"])
FAILING = Gauge(
    "kbgraph_stream_apply_failing",
    "1 while the message at this position fails to apply on this node (labels name it).",
    ["stream", "position", "kb", "error"],
)
FAILURES = Counter(
    "kbgraph_stream_apply_failures", "Failed attempts to apply a stream message.", ["stream"]
)
NOTED = Counter(
    "kbgraph_stream_messages_noted",
    "Stream messages that applied nothing, noted in the store, by kind.",
    ["stream", "kind"],
)
STREAM_METRICS: Final = (POSITION, FAILING, FAILURES, NOTED)


def count_notes(store: Store, stream: str) -> None:
    """Set ``NOTED`` from the notes ``store`` holds for ``stream``: the counts a restarted
    node shows are those of its store, as the notes are."""
    counts: dict[str, int] = {}
    for _, kind, _ in store.stream_notes(stream):
        counts[kind] = counts.get(kind, 0) + 1
    for kind, count in counts.items():
        with contextlib.suppress(KeyError):
            NOTED.remove(stream, kind)
        NOTED.labels(stream, kind).inc(count)


def forget_stream(stream: str) -> None:
    """Remove ``stream``'s series from ``STREAM_METRICS`` (its log closed: a process that
    follows it no more must not show it on ``/metrics``, nor a position it stopped at)."""
    for metric in STREAM_METRICS:
        for family in metric.collect():
            for sample in family.samples:  # labels in the metric's order: what remove takes
                if sample.labels.get("stream") == stream:
                    with contextlib.suppress(KeyError):  # a counter's _created: gone already
                        metric.remove(*sample.labels.values())


class _Collectors:
    def __init__(self, collectors: tuple[Any, ...]) -> None:
        self.collectors = collectors

    def collect(self) -> Any:
        for collector in self.collectors:
            yield from collector.collect()


def stream_metrics_text() -> str:
    """The ``kbgraph_stream_*`` metrics of this process in Prometheus's text format (an
    applier hands them to its node's workers, which serve them on ``/metrics``)."""
    return generate_latest(_Collectors(STREAM_METRICS)).decode()


class ApplyFailed(RuntimeError):
    """The store did not commit a message: retried after a pause, not ready meanwhile."""


class StreamBehind(RuntimeError):
    """The stream no longer holds the message this store needs next (cut or deleted)."""


class Diverged(RuntimeError):
    """This node applied a message that a decision in the stream skipped on every node."""


class _Restart(Exception):
    """The consumer must be replaced (a gap, or silence)."""


class Stuck(msgspec.Struct, frozen=True):
    """The message this node cannot apply, as ``/readyz`` and ``/metrics`` name it."""

    position: int
    kb: str
    error: str


class StreamConsumer:
    """The follow-and-apply half of ``JetStreamLog`` (its attributes are set there)."""

    stream: str
    store: Store
    applied: int
    failure: str | None
    stuck: Stuck | None
    signer: wire.Signer
    vector_max_chars: int  # [embeddings] max_chars: what a vectors row's hash is checked on
    on_applied: Callable[[], None]
    _nc: Any
    _js: Any
    _waiters: dict[str, tuple[str, asyncio.Future[DeliveryResult]]]  # Msg-Id -> (MAC, its)
    _skips: dict[int, tuple[int, str]]  # position -> (the decision's position, its reason)
    _refusals: dict[int, Exception]  # what the sender of a skipped delivery hears
    skipped_messages: set[WebhookMessage]  # the signed messages of skipped deliveries

    async def _follow(self) -> None:
        """One consumer from ``applied + 1`` until it must be replaced (``_Restart``)."""
        await self._read_decisions()
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

    async def _read_decisions(self) -> None:
        """The operators' decisions in the stream past this node's position (usually none: one
        request), so that a message a later decision skips is skipped before it is applied."""
        subject, after = wire.decision_subject(self.stream), self.applied + 1
        skips: dict[int, tuple[int, str]] = {}
        while True:
            try:
                raw = await self._js.get_msg(self.stream, after, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            seq, data = int(raw.seq), raw.data or b""
            if not self.signer.valid(subject, data, raw.headers or {}):
                after = seq + 1  # refused in order when reached, as every node refuses it
                continue
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                decision = wire.decode_decision(data)
                if self.applied < decision.position < seq:
                    skips.setdefault(decision.position, (seq, decision.reason))
            after = seq + 1
        self._skips = skips

    async def _check_stream_start(self) -> None:
        """Raise ``StreamBehind`` (and say so on ``/readyz``) when the stream no longer holds
        the next message this store needs: purged, or cut by limits set on it."""
        info = await self._js.stream_info(self.stream)
        first, last, need = int(info.state.first_seq), int(info.state.last_seq), self.applied + 1
        if first > need:
            self.failure = (
                f"stream {self.stream} starts at {first}, this node's store is at"
                f" {self.applied}: start it from a copy of another node's store (or restart it:"
                " at start, a node behind the stream restores the newest snapshot, if any)"
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
        """Apply the messages of ``batch`` in order; answer the consumer's control messages.

        The message that failed last is handed to the store alone, after those before it
        commit, so the failure stays its own and everything before it is applied."""
        messages: list[Msg] = []
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
            messages.append(msg)
            expected += 1
        alone = self.stuck.position if self.stuck is not None else None
        cut = next((i for i, m in enumerate(messages) if m.metadata.sequence.stream == alone), -1)
        parts = [messages[:cut], messages[cut : cut + 1], messages[cut + 1 :]] if cut >= 0 else []
        for part in parts or [messages]:
            if part:
                await self._apply_part(part)
        if restart is not None:
            raise _Restart(restart)

    async def _apply_part(self, messages: list[Msg]) -> None:
        loop = asyncio.get_running_loop()
        submitted: list[tuple[int, str | None, asyncio.Future[DeliveryResult]]] = []
        for msg in messages:
            seq = msg.metadata.sequence.stream
            future: asyncio.Future[DeliveryResult] = loop.create_future()
            try:
                await self._submit(msg, seq, LoopSettle(loop, future))
            except Diverged:  # the messages before it still commit: wait for them
                for *_, done in submitted:
                    with contextlib.suppress(Exception):
                        await done
                self.applied = await asyncio.to_thread(self.store.log_position, self.stream)
                raise
            submitted.append((seq, self._awaited(msg), future))
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
            refusal = self._refusals.pop(seq, None)
            waiter = self._waiter(msg_id)
            if waiter is not None and not waiter.done():
                outcome = refusal or future.exception()
                if outcome is not None:
                    waiter.set_exception(outcome)
                else:
                    waiter.set_result(future.result())
        POSITION.labels(self.stream).set(self.applied)
        if submitted:
            self.on_applied()
        if failed is not None:  # nothing of it committed: read on from the store's position
            self.applied = await asyncio.to_thread(self.store.log_position, self.stream)
            self._failed(failed)
            culprit = failed.seq if isinstance(failed, MessageFailed) else None
            for seq, msg_id, _ in submitted:  # its sender hears it now, not after a time-out
                waiter = self._waiter(msg_id) if seq == culprit else None
                if waiter is not None and not waiter.done():
                    waiter.set_exception(LogUnavailable(f"stored in the stream, {self.failure}"))
            raise ApplyFailed(f"applying stream {self.stream} after {self.applied}") from failed
        if self.stuck is not None and self.applied >= self.stuck.position:
            log.warning("stream %s: position %s applied now", self.stream, self.stuck.position)
            FAILING.clear()
            self.stuck = None
        self.failure = None

    def _awaited(self, msg: Msg) -> str | None:
        """The Msg-Id of ``msg`` if a delivery this node published awaits it: the id is its
        and so is the MAC (the message is that delivery). Another's message under the id, a
        forged or unsigned one, settles nothing."""
        headers = msg.headers or {}
        msg_id, mac = headers.get(wire.MSG_ID), headers.get(wire.MAC)
        awaited = self._waiters.get(msg_id) if isinstance(msg_id, str) else None
        if awaited is None or not isinstance(mac, str) or not hmac.compare_digest(mac, awaited[0]):
            return None
        return msg_id

    def _waiter(self, msg_id: str | None) -> asyncio.Future[DeliveryResult] | None:
        pending = self._waiters.pop(msg_id, None) if msg_id is not None else None
        return None if pending is None else pending[1]

    def _failed(self, exc: BaseException) -> None:
        """Say which message fails, once per message in the log, on every attempt in the
        metrics, and on ``/readyz`` until it applies or a decision skips it."""
        FAILURES.labels(self.stream).inc()
        if not isinstance(exc, MessageFailed):  # the group did not commit: not one message's
            self.failure = f"the store did not commit: {exc!r}"
            return
        stuck = Stuck(exc.seq, exc.kb, repr(exc.cause)[:300])
        self.failure = (
            f"position {stuck.position} (kb {stuck.kb}) fails to apply here: {stuck.error};"
            " retried. If every node says the same, the way forward is `kbgraph cluster skip"
            f" --config FILE --position {stuck.position} --reason TEXT`"
        )
        if stuck != self.stuck:
            self.stuck = stuck
            FAILING.clear()
            FAILING.labels(self.stream, str(stuck.position), stuck.kb, stuck.error).set(1)
            log.error("stream %s: %s", self.stream, self.failure)

    async def _submit(
        self,
        msg: Msg,
        seq: int,
        resolve: Callable[[DeliveryResult | None, BaseException | None], None],
    ) -> None:
        """Hand one message to the store: a delivery to apply, or a note of why it applies
        nothing (skipped by a decision, a decision, unreadable), the same on every node."""
        headers = msg.headers or {}
        position = (self.stream, seq)
        note: tuple[str, str] | None = None
        message = None
        if not self.signer.valid(msg.subject, msg.data or b"", headers):
            note = (
                "refused",
                f"no valid MAC ({wire.MAC}) on {msg.subject[:ECHO_CHARS]}: not applied",
            )
            log.warning("stream %s: position %s refused: %s", self.stream, seq, note[1])
        elif msg.subject == wire.decision_subject(self.stream):
            note = await self._decision_note(msg.data or b"", seq)
        elif msg.subject == wire.vectors_subject(self.stream):
            try:
                kb, model, rows = wire.decode_vectors(msg.data or b"")
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                note = ("unreadable", f"not vectors: {exc}"[:500])
            else:
                vectors = LoggedVectors(model, self.vector_max_chars, rows)
                self.store.submit_vectors_from_log(position, kb, vectors, self._counted(resolve))
                return
        else:
            try:
                kb, events, message, shipped = wire.unpack(msg.data or b"", headers)
            except Exception as exc:  # the same bytes fail alike on every node
                note = ("unreadable", f"not a delivery: {exc!r}"[:500])
            if seq in self._skips:
                decided_at, reason = self._skips[seq]
                note = ("skipped", f"by the decision at {decided_at}: {reason}")
            elif message is not None and message in self.skipped_messages:
                shown = message.id[:64]
                note = ("skipped", f"a re-send of a skipped delivery (webhook-id {shown!r})")
            elif note is None:
                at = msg.metadata.timestamp.timestamp()
                self.store.submit_from_log(kb, events, message, at, position, resolve, shipped)
                return
        NOTED.labels(self.stream, note[0]).inc()
        if note[0] == "skipped":
            log.warning("stream %s: position %s skipped %s", self.stream, seq, note[1])
            if message is not None:  # its re-sends are skipped too, on every node alike
                self.skipped_messages.add(message)
            self._refusals[seq] = DeliverySkipped(f"not applied: skipped {note[1]}")
        self.store.submit_note_from_log(position, *note, resolve, message)

    def _counted(
        self, resolve: Callable[[DeliveryResult | None, BaseException | None], None]
    ) -> Callable[[DeliveryResult | None, BaseException | None], None]:
        """``resolve``, counting the note of a vectors message once it is stored: the store
        takes the cluster embedder's rows for the texts at their position
        (``kbgraph.store.vectorrows.take``), where every process's filler finds them."""

        def counted(result: DeliveryResult | None, exc: BaseException | None) -> None:
            if exc is None:
                NOTED.labels(self.stream, "vectors").inc()
            resolve(result, exc)

        return counted

    async def _decision_note(self, payload: bytes, seq: int) -> tuple[str, str]:
        """Note a decision reached in order; a skip of a message this node applied means it
        now differs from the nodes that skipped it: stop following."""
        try:
            decision = wire.decode_decision(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return ("unreadable", f"not a decision: {exc}"[:500])
        if not 0 < decision.position < seq:
            return ("decision", f"void: skip {decision.position} from {seq}: {decision.reason}")
        skipped = decision.position in self._skips  # maybe not committed yet: in this batch
        if (
            not skipped
            and (await asyncio.to_thread(self.store.stream_note, self.stream, decision.position))
            is None
        ):
            self.failure = (
                f"this node applied position {decision.position}, which the decision at {seq}"
                f" skips on the nodes that could not apply it ({decision.reason}): it differs"
                " from them, so it stops; start it from a copy of another node's store"
            )
            raise Diverged(self.failure)
        return ("decision", f"skip {decision.position}: {decision.reason}")
