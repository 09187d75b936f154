"""The publisher believes a duplicate acknowledgement only for its own message, the follower
settles a waiting delivery only with its own message, and a delivery waits for its outcome a
bounded time.

JetStream answers a message whose ``Nats-Msg-Id`` it already holds with the first one's
sequence and ``duplicate``. A stand-in for nats-py's JetStream context plays a stream where
someone else published under the id first (an attacker with a node's NATS credentials) and
one where the publisher's own earlier attempt got in (its acknowledgement lost)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace
from typing import Any

import nats.js.errors
import pytest

from kbgraph.config import JetStreamConfig
from kbgraph.log.jetstream import publisher, wire
from kbgraph.log.jetstream.consumer import LogUnavailable, StreamConsumer
from kbgraph.log.jetstream.publisher import PUBLISH_ATTEMPTS, Publisher, applied_outcome
from kbgraph.store import DeliveryResult
from tests.kb_events import upsert

STREAM = "unit-pub"


class Stream:
    """Just what ``Publisher`` asks of nats-py's JetStream context, with the duplicate rule."""

    def __init__(self, taken: dict[str, tuple[str, bytes, dict[str, str]]]) -> None:
        self.messages: list[tuple[str, bytes, dict[str, str]]] = []
        self.by_id: dict[str, int] = {}
        for msg_id, message in taken.items():  # stored first, by someone else
            self.store(msg_id, message)

    def store(self, msg_id: str, message: tuple[str, bytes, dict[str, str]]) -> int:
        self.messages.append(message)
        self.by_id[msg_id] = len(self.messages)
        return len(self.messages)

    async def publish(self, subject: str, payload: bytes, timeout: float, headers: dict) -> Any:
        msg_id = headers[wire.MSG_ID]
        if msg_id in self.by_id:
            return SimpleNamespace(seq=self.by_id[msg_id], duplicate=True)
        seq = self.store(msg_id, (subject, payload, dict(headers)))
        return SimpleNamespace(seq=seq, duplicate=None)  # nats-py: None when not one

    async def get_msg(self, stream: str, seq: int) -> Any:
        subject, data, headers = self.messages[seq - 1]
        return SimpleNamespace(subject=subject, data=data, headers=headers)


class Squatter:
    """Every id the publisher draws is one an attacker stored junk under first."""

    def __init__(self, stream: Stream, squat: int) -> None:
        self.stream, self.left = stream, squat

    def __call__(self, msg_id: str) -> None:
        if self.left:
            self.left -= 1
            self.stream.store(msg_id, (f"{STREAM}.kb", b"junk", {wire.MAC: "0" * 64}))


class StandIn(Publisher):
    """A ``Publisher`` on the stand-in stream (a subclass: the owner sets these attributes)."""

    def __init__(self, stream: Stream) -> None:
        self.config = JetStreamConfig(servers=["nats://127.0.0.1:1"], stream=STREAM)
        self.stream = STREAM
        self.signer = wire.Signer(b"a cluster secret of enough bytes")
        self._js = stream
        self._nc = SimpleNamespace(max_payload=1 << 20)
        self.store = SimpleNamespace(carrier=None)  # no local model: no vectors shipped
        self._msg_ids("node")

    def delivery(self) -> tuple[str, bytes, dict[str, str]]:
        return asyncio.run(self._message("kb", [upsert("a/b")], None, set()))

    async def publish(self, subject: str, payload: bytes, headers: dict, claim=None) -> int:
        return await self._publish(subject, payload, headers, claim or (lambda msg_id: None))

    async def publish_once(self, subject: str, payload: bytes, headers: dict) -> tuple[int, bool]:
        return await self._publish_once(subject, payload, headers, float("inf"))

    async def stored_is(self, seq: int, subject: str, payload: bytes, headers: dict) -> bool:
        return await self._stored_is(seq, subject, payload, headers)

    def new_msg_id(self) -> str:
        return self._new_msg_id()


@pytest.mark.parametrize("squat", [0, 1, PUBLISH_ATTEMPTS - 1])
def test_a_squatted_msg_id_is_published_again_under_a_new_one(squat: int) -> None:
    stream = Stream({})
    pub = StandIn(stream)
    subject, payload, headers = pub.delivery()
    claimed: list[str] = []
    squatter = Squatter(stream, squat)

    def claim(msg_id: str) -> None:
        claimed.append(msg_id)
        squatter(msg_id)

    seq = asyncio.run(pub.publish(subject, payload, headers, claim))
    assert len(claimed) == squat + 1 and len(set(claimed)) == squat + 1
    assert stream.messages[seq - 1] == (subject, payload, headers)  # its own message
    assert headers[wire.MSG_ID] == claimed[-1]


def test_ids_taken_every_time_are_a_503_never_an_acknowledgement() -> None:
    stream = Stream({})
    pub = StandIn(stream)
    subject, payload, headers = pub.delivery()
    squatter = Squatter(stream, PUBLISH_ATTEMPTS)
    with pytest.raises(LogUnavailable, match="other messages in place of this delivery"):
        asyncio.run(pub.publish(subject, payload, headers, squatter))
    assert all(data == b"junk" for _, data, _ in stream.messages)


def test_its_own_earlier_copy_is_its_acknowledgement() -> None:
    """A re-publish after a lost acknowledgement: the duplicate is its own message."""
    stream = Stream({})
    pub = StandIn(stream)
    subject, payload, headers = pub.delivery()
    first = asyncio.run(pub.publish(subject, payload, headers))
    again = asyncio.run(pub.publish_once(subject, payload, headers))
    assert again == (first, True)
    assert asyncio.run(pub.stored_is(first, subject, payload, headers))
    other = dict(headers, **{wire.MAC: "1" * 64})
    assert not asyncio.run(pub.stored_is(first, subject, payload, other))


class LeaderChanged(Stream):
    """The first publish meets a new leader still storing an earlier attempt's copy."""

    def __init__(self) -> None:
        super().__init__({})
        self.asked: list[str] = []

    async def publish(self, subject: str, payload: bytes, timeout: float, headers: dict) -> Any:
        self.asked.append(headers[wire.MSG_ID])
        if len(self.asked) == 1:
            raise nats.js.errors.APIError(
                code=409, err_code=10158, description="duplicate message id is in process"
            )
        return await super().publish(subject, payload, timeout, headers)


def test_a_publish_in_process_is_asked_again_not_refused() -> None:
    """JetStream answers a re-publish "duplicate message id is in process" (10158) when the
    leader changed while an earlier attempt with the same Msg-Id was being stored: its outcome
    is this delivery's, so the node asks again (the same Msg-Id) rather than answer 503."""
    stream = LeaderChanged()
    pub = StandIn(stream)
    subject, payload, headers = pub.delivery()
    headers[wire.MSG_ID] = pub.new_msg_id()
    assert asyncio.run(pub.publish_once(subject, payload, headers)) == (1, False)
    assert stream.asked == [headers[wire.MSG_ID]] * 2 and pub.answered_at > 0


def test_msg_ids_are_random_and_long() -> None:
    pub = StandIn(Stream({}))
    ids = {pub.new_msg_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(msg_id.rpartition("-")[2]) == 32 for msg_id in ids)


class Awaiting(StreamConsumer):
    """A follower with one delivery awaiting its message (a subclass: its owner sets these)."""

    def __init__(self, msg_id: str, mac: str) -> None:
        self._waiters = {msg_id: (mac, concurrent.futures.Future())}  # type: ignore[dict-item]

    def awaited(self, headers: dict[str, str]) -> str | None:
        return self._awaited(SimpleNamespace(headers=headers))  # type: ignore[arg-type]


def test_only_the_awaited_id_with_the_deliverys_own_mac_settles_it() -> None:
    """Another's message under the awaited id (unsigned, a wrong MAC, another delivery's valid
    MAC) settles nothing: its position is noted, the delivery waits for its own message."""
    pub = StandIn(Stream({}))
    subject, payload, headers = pub.delivery()
    mine = dict(headers, **{wire.MSG_ID: "node-abc-1"})
    follower = Awaiting("node-abc-1", mine[wire.MAC])
    assert follower.awaited(mine) == "node-abc-1"
    other: dict[str, str] = {}
    pub.signer.sign(subject, payload + b"x", other)  # a valid MAC, of another payload
    for forged in (
        {wire.MSG_ID: "node-abc-1"},
        {wire.MSG_ID: "node-abc-1", wire.MAC: "0" * 64},
        {wire.MSG_ID: "node-abc-1", wire.MAC: other[wire.MAC]},
        {wire.MSG_ID: "node-abc-2", wire.MAC: mine[wire.MAC]},
    ):
        assert follower.awaited(forged) is None


def test_an_outcome_not_applied_in_time_is_a_503_and_stays_its_owners(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wait a node's worker and each worker beside an applier share: the outcome once
    applied; past ``APPLY_WAIT_SECONDS``, a 503 that says to retry, the outcome left pending
    for whoever applies (it is theirs to settle or drop, not cancelled by the wait)."""
    monkeypatch.setattr(publisher, "APPLY_WAIT_SECONDS", 0.05)
    result = DeliveryResult(accepted=1, applied=1, duplicates=0, stale=0, ignored=0, seq=7)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        late: asyncio.Future[DeliveryResult] = loop.create_future()
        with pytest.raises(LogUnavailable, match="not yet applied on this node: retry"):
            await applied_outcome(late)
        assert not late.done()
        soon: asyncio.Future[DeliveryResult] = loop.create_future()
        loop.call_soon(soon.set_result, result)
        assert await applied_outcome(soon) == result

    asyncio.run(main())
