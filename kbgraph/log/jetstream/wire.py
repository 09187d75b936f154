"""What the stream carries: deliveries (MessagePack, deflated when big) on ``<stream>.<kb>``,
operators' decisions on ``<stream>._decision`` and the cluster's embedder's vectors on
``<stream>._vectors`` (no KB name starts with ``_``), each with a
MAC (HMAC-SHA256 with the cluster's secret, header ``Kbgraph-Mac``) over exactly what a node
reads of it: the subject, the encoding and the payload. A NATS password alone cannot write."""

from __future__ import annotations

import hashlib
import hmac
import zlib
from typing import Final, NamedTuple

import msgspec
import numpy as np

from kbgraph.embeddings.shipped import Shipped
from kbgraph.events import Event, decode_from_log, encode_for_log
from kbgraph.names import is_kb_name
from kbgraph.store import WebhookMessage
from kbgraph.store.vectorrows import VectorRow

MSG_ID: Final = "Nats-Msg-Id"
ENCODING: Final = "Kbgraph-Encoding"  # "deflate": the payload is zlib-compressed
COMPRESS_ABOVE: Final = 32 << 10  # bytes; batched deliveries of text shrink 3-5x
DECISION_TOKEN: Final = "_decision"  # the subject token of operators' decisions
VECTORS_TOKEN: Final = "_vectors"  # the subject token of the cluster's embedder's vectors
MAC: Final = "Kbgraph-Mac"
MIN_SECRET_BYTES: Final = 16


class Signer:
    """Signs and checks messages with the cluster's secret (``[log.jetstream]``
    ``mac_secret_file`` or ``mac_secret_env``)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the cluster's MAC secret is under {MIN_SECRET_BYTES} bytes")
        self._key = secret

    def begin(self, subject: str, headers: dict[str, str]) -> hmac.HMAC:
        """The MAC of a payload fed to it piece by piece (``update``), for ``matches``."""
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        mac.update(f"{subject}\n{headers.get(ENCODING, '')}\n".encode())
        return mac

    def _mac(self, subject: str, payload: bytes, headers: dict[str, str]) -> str:
        mac = self.begin(subject, headers)
        mac.update(payload)
        return mac.hexdigest()

    def sign(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        headers[MAC] = self._mac(subject, payload, headers)

    def valid(self, subject: str, payload: bytes, headers: dict[str, str]) -> bool:
        mac = self.begin(subject, headers)
        mac.update(payload)
        return self.matches(mac, headers)

    @staticmethod
    def matches(mac: hmac.HMAC, headers: dict[str, str]) -> bool:
        """Does ``headers``' MAC equal ``mac`` (``begin``'s, fed the whole payload)?"""
        given = headers.get(MAC)
        return isinstance(given, str) and hmac.compare_digest(given, mac.hexdigest())

    def fingerprint(self) -> str:
        """Which secret, without saying it: nodes with other secrets would refuse each
        other's messages, so it is one of the stream's decision rules."""
        return hmac.new(self._key, b"kbgraph cluster secret", hashlib.sha256).hexdigest()[:16]


def decision_subject(stream: str) -> str:
    return f"{stream}.{DECISION_TOKEN}"


def vectors_subject(stream: str) -> str:
    return f"{stream}.{VECTORS_TOKEN}"


class StreamVectors(msgspec.Struct, array_like=True, frozen=True):
    """Vectors (or refusals) the cluster's embedder computed, for every node's store: each row
    (concept, text hash, float32 little-endian bytes or None when refused, the refusal)."""

    kb: str
    model: str
    rows: list[tuple[str, bytes, bytes | None, str]]


class StreamDelivery(msgspec.Struct, array_like=True, frozen=True):
    """One delivery as the stream carries it (MessagePack). Older code reads the fields it
    knows and ignores those after them (the vectors), and reads a message without them."""

    kb: str
    events: list[bytes]  # each ``encode_for_log(event)``
    message_id: str | None = None  # the signed webhook message, if any
    message_digest: bytes | None = None
    # the local model's vectors of its upserts (``kbgraph.embeddings.shipped``): the model's
    # key ("" none), per event its vector or None
    vector_key: str = ""
    vectors: list[bytes | None] = msgspec.field(default_factory=list)


class Unpacked(NamedTuple):
    """A delivery as a node reads it from its message."""

    kb: str
    events: list[Event]
    message: WebhookMessage | None
    vectors: Shipped | None  # the local model's, when the message carries them


class Skip(msgspec.Struct, tag="skip", frozen=True, forbid_unknown_fields=True):
    """An operator's decision: the message at ``position`` applies nothing on any node."""

    position: int
    reason: str


Decision = Skip

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StreamDelivery)
_decision_decoder = msgspec.json.Decoder(Decision)
_vectors_decoder = msgspec.msgpack.Decoder(StreamVectors)


class NotPublishable(ValueError):
    """A delivery that the nodes could not read back as it was taken (a bug, never input)."""


def encode_message(
    kb: str, events: list[Event], message: WebhookMessage | None, vectors: Shipped | None = None
) -> bytes:
    return _encoder.encode(
        StreamDelivery(
            kb,
            [encode_for_log(event) for event in events],
            message.id if message else None,
            message.digest if message else None,
            vectors.key if vectors else "",
            vectors.vectors if vectors else [],
        )
    )


def decode_message(payload: bytes) -> Unpacked:
    delivery = _decoder.decode(payload)
    message = None
    if delivery.message_id is not None and delivery.message_digest is not None:
        message = WebhookMessage(delivery.message_id, delivery.message_digest)
    events = [decode_from_log(raw) for raw in delivery.events]
    vectors = Shipped(delivery.vector_key, delivery.vectors) if delivery.vector_key else None
    return Unpacked(delivery.kb, events, message, vectors)


def pack(
    kb: str, events: list[Event], message: WebhookMessage | None, vectors: Shipped | None = None
) -> tuple[bytes, dict[str, str]]:
    """The payload and headers of a delivery, checked before it is published: every node
    decodes exactly this payload, so a delivery it would not read back as taken (an invalid
    KB name, an event that does not survive the log's encoding) never reaches the stream."""
    if not is_kb_name(kb):
        raise NotPublishable(f"kb name {kb!r} is not one the stream's nodes accept")
    payload = encode_message(kb, events, message, vectors)
    if decode_message(payload) != (kb, events, message, vectors):
        raise NotPublishable(f"a delivery to kb {kb} does not read back as it was taken")
    headers: dict[str, str] = {}
    if len(payload) > COMPRESS_ABOVE:
        payload = zlib.compress(payload, 1)
        headers[ENCODING] = "deflate"
    return payload, headers


def pack_within(
    kb: str,
    events: list[Event],
    message: WebhookMessage | None,
    vectors: Shipped | None,
    limit: int,
) -> tuple[bytes, dict[str, str]]:
    """``pack`` with ``vectors`` if that is at most ``limit`` bytes, else without them (every
    node then runs its own model): a delivery is never refused for its vectors."""
    payload, headers = pack(kb, events, message, vectors)
    if vectors is not None and len(payload) > limit:
        payload, headers = pack(kb, events, message)
    return payload, headers


def unpack(payload: bytes, headers: dict[str, str]) -> Unpacked:
    if headers.get(ENCODING) == "deflate":
        payload = zlib.decompress(payload)
    return decode_message(payload)


def encode_decision(decision: Decision) -> bytes:
    return msgspec.json.encode(decision)


def decode_decision(payload: bytes) -> Decision:
    return _decision_decoder.decode(payload)


def encode_vectors(kb: str, model: str, rows: list[VectorRow]) -> bytes:
    """The payload of one vectors message (never deflated: float bytes do not shrink)."""
    return _encoder.encode(
        StreamVectors(
            kb,
            model,
            [
                (
                    r.concept,
                    r.text_hash,
                    None if r.vector is None else np.asarray(r.vector, "<f4").tobytes(),
                    r.problem,
                )
                for r in rows
            ],
        )
    )


def decode_vectors(payload: bytes) -> tuple[str, str, list[VectorRow]]:
    """(kb, model, rows) of a vectors message; raises msgspec's errors on anything else."""
    message = _vectors_decoder.decode(payload)
    if not is_kb_name(message.kb):
        raise msgspec.ValidationError(f"kb name {message.kb!r} is not one nodes accept")
    if any(vec is not None and (not vec or len(vec) % 4) for _, _, vec, _ in message.rows):
        raise msgspec.ValidationError("a vector that is not float32 values")
    rows = [
        VectorRow(
            concept,
            digest,
            None if vec is None else np.frombuffer(vec, "<f4").astype(np.float32),
            problem,
        )
        for concept, digest, vec, problem in message.rows
    ]
    return message.kb, message.model, rows
