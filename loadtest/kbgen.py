"""KB generator for the load test: concepts with Zipf text, and the deliveries a KB would send.

- ``make_kb(kind, n, seed)``: ``"seed"`` (the seed's 1,000-concept shape, ``synthetic.seed_kb``)
  or ``"hub"`` (preferential attachment, ``synthetic.hub_kb``), each concept given a body
  ``text`` of words drawn from a Zipf-distributed vocabulary, a ``status`` and ``tags``.
  Deterministic for ``(kind, n, seed)``.
- ``queries(...)``: agent questions drawn from the same vocabulary (with the odd search
  syntax character, which the service must treat as plain text).
- ``initial_load(...)``: the KB as batches of ``concept.upserted`` (version 1).
- ``WriterStream``: one webhook writer's endless, seeded stream of deliveries over the
  concepts it owns: upserts, deletes, re-creations, ``link.added`` / ``link.removed`` with
  increasing per-concept versions, plus deliberate duplicates (a delivery re-sent with the
  same event ids), stale events (older versions after newer; late upserts after a delete),
  out-of-order pairs (version v+2 sent before v+1), events for concepts that never existed
  (ignored) and small mixed batches. The stream keeps the source KB's truth (``truth``).
- ``Signer``: Standard Webhooks headers for a delivery, signed at send time.

Writers own disjoint sets of concepts and send one delivery at a time, so the effect of
every acknowledged delivery is fully determined by the order each writer sent its own.
"""

from __future__ import annotations

import bisect
import itertools
import random
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from standardwebhooks.webhooks import Webhook

from loadtest import synthetic

VOCAB_SIZE: Final = 4000
ZIPF_S: Final = 1.07
TEXT_WORDS: Final = (30, 140)
STATUSES: Final = (
    "", "active", "active", "active", "draft", "disputed", "deprecated", "superseded",
)  # fmt: skip
BATCH_CT: Final = "application/cloudevents-batch+json"
SINGLE_CT: Final = "application/cloudevents+json"

_encode = msgspec.json.Encoder().encode
_ONSETS: Final = ("b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
                  "br", "st", "tr", "pl", "gr", "sh", "ch")  # fmt: skip
_VOWELS: Final = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS: Final = ("", "n", "r", "s", "t", "l", "x", "nd", "st")


def vocabulary(size: int = VOCAB_SIZE, seed: int = 42) -> list[str]:
    """``size`` distinct pronounceable words; the seed's topic words come first (most common)."""
    rng = random.Random(seed * 7 + 1)
    words = list(synthetic.WORDS)
    seen = set(words)
    for _ in range(size * 50):
        if len(words) >= size:
            break
        syllables = rng.choice((1, 2, 2, 3, 3, 4))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class Zipf:
    """Words drawn with probability proportional to ``1 / rank**s`` (seeded, deterministic)."""

    def __init__(self, words: list[str], s: float = ZIPF_S) -> None:
        self.words = words
        weights = [1.0 / (rank**s) for rank in range(1, len(words) + 1)]
        self.cum = list(itertools.accumulate(weights))

    def draw(self, rng: random.Random, k: int) -> list[str]:
        total = self.cum[-1]
        cum = self.cum
        words = self.words
        return [words[bisect.bisect_left(cum, rng.random() * total)] for _ in range(k)]

    def text(self, rng: random.Random, low: int = TEXT_WORDS[0], high: int = TEXT_WORDS[1]) -> str:
        """A body of ``low..high`` words in sentences."""
        words = self.draw(rng, rng.randint(low, high))
        sentences = []
        start = 0
        while start < len(words):
            length = rng.randint(6, 16)
            chunk = words[start : start + length]
            sentences.append(" ".join(chunk).capitalize() + ".")
            start += length
        return " ".join(sentences)


def make_kb(kind: str = "seed", n: int = 1000, seed: int = 42) -> list[dict[str, Any]]:
    """Concepts ``{id, title, type, status, tags, text, links}`` of the ``kind`` KB."""
    if kind == "seed":
        concepts = synthetic.seed_kb(n, seed)
    elif kind == "hub":
        concepts = synthetic.hub_kb(n, seed)
    else:
        raise ValueError(f"unknown KB kind {kind!r}: expected seed or hub")
    zipf = Zipf(vocabulary(seed=seed))
    rng = random.Random(seed * 31 + 7)
    for concept in concepts:
        concept["status"] = rng.choice(STATUSES)
        concept["tags"] = sorted(set(zipf.draw(rng, rng.randint(0, 3))))
        concept["text"] = f"{concept['title']}. {zipf.text(rng)}"
    return concepts


def queries(count: int = 500, seed: int = 42) -> list[str]:
    """Agent questions: 1-4 Zipf words; a few carry search syntax characters or no match."""
    zipf = Zipf(vocabulary(seed=seed))
    rng = random.Random(seed * 13 + 5)
    out = []
    for i in range(count):
        words = zipf.draw(rng, rng.randint(1, 4))
        if i % 25 == 7:
            words = [f'"{words[0]}', "OR", f"{words[-1]}*", "(NEAR"]
        elif i % 25 == 19:
            words = ["zzqx-unknown", "-" + words[0]]
        out.append(" ".join(words))
    return out


# --- deliveries ----------------------------------------------------------------------------


@dataclass
class Delivery:
    """One webhook POST: the events as JSON objects and the exact body bytes sent."""

    kind: str
    events: list[dict[str, Any]]
    body: bytes
    content_type: str
    msg_id: str
    resend_of: str | None = None  # a duplicate: the msg_id of the delivery it repeats


def _delivery(kind: str, events: list[dict[str, Any]], msg_id: str, batch: bool) -> Delivery:
    if batch:
        return Delivery(kind, events, _encode(events), BATCH_CT, msg_id)
    assert len(events) == 1
    return Delivery(kind, events, _encode(events[0]), SINGLE_CT, msg_id)


def upsert_event(
    source: str, event_id: str, concept: dict[str, Any], version: int
) -> dict[str, Any]:
    data = {"version": version}
    for key in ("title", "type", "status", "tags", "text", "links"):
        if concept.get(key):
            data[key] = concept[key]
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": source,
        "type": "concept.upserted",
        "subject": concept["id"],
        "data": data,
    }


def initial_load(
    concepts: list[dict[str, Any]], source: str = "kbgen://load", batch: int = 100
) -> list[Delivery]:
    """The KB as batches of version-1 upserts."""
    out = []
    for start in range(0, len(concepts), batch):
        chunk = concepts[start : start + batch]
        events = [upsert_event(source, f"load-{start + k}", c, 1) for k, c in enumerate(chunk)]
        out.append(_delivery("load", events, f"msg_load_{start}", batch=True))
    return out


class Signer:
    """Standard Webhooks headers (``webhook-id``, ``-timestamp``, ``-signature``)."""

    def __init__(self, secret: str) -> None:
        self._webhook = Webhook(secret)

    def headers(self, delivery: Delivery) -> dict[str, str]:
        now = datetime.now(tz=UTC)
        signature = self._webhook.sign(delivery.msg_id, now, delivery.body.decode())
        return {
            "content-type": delivery.content_type,
            "webhook-id": delivery.msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
        }


@dataclass
class Truth:
    """The source KB's state of one concept (``exists`` False: deleted or never created)."""

    version: int = 0
    exists: bool = False
    concept: dict[str, Any] = field(default_factory=dict)


def owner_of(concept_id: str, writers: int) -> int:
    """The writer that owns a concept id (stable across runs)."""
    return zlib.crc32(concept_id.encode()) % writers


class WriterStream:
    """Writer ``index`` of ``writers``: a seeded stream of deliveries over its own concepts."""

    OPS: Final = (
        ("upsert", 30),
        ("link_added", 14),
        ("link_removed", 10),
        ("delete", 6),
        ("create", 7),
        ("duplicate", 10),
        ("stale", 8),
        ("reorder", 7),
        ("batch", 6),
        ("ghost", 2),
        ("link_on_deleted", 3),
        ("dup_in_batch", 2),
    )

    def __init__(
        self,
        index: int,
        writers: int,
        concepts: list[dict[str, Any]],
        seed: int = 42,
        source: str | None = None,
    ) -> None:
        self.index = index
        self.source = source or f"kbgen://writer/{index}"
        self.rng = random.Random(seed * 1009 + index)
        self.zipf = Zipf(vocabulary(seed=seed))
        self.all_ids = [c["id"] for c in concepts]
        self.truth: dict[str, Truth] = {}
        for concept in concepts:
            if owner_of(concept["id"], writers) == index:
                self.truth[concept["id"]] = Truth(1, True, dict(concept))
        # ids linked to but never created: this writer may create the ones it owns
        known = {c["id"] for c in concepts}
        for concept in concepts:
            for target in concept.get("links", ()):
                if target not in known and owner_of(target, writers) == index:
                    self.truth.setdefault(target, Truth())
        self.owned = sorted(self.truth)
        self._new = 0
        self._event = 0
        self._msg = 0
        self._pending: list[Delivery] = []  # late halves of out-of-order pairs
        self.sent: list[Delivery] = []  # acknowledged deliveries (for duplicates)
        names, weights = zip(*self.OPS, strict=True)
        self._ops: tuple[str, ...] = names
        self._weights: tuple[int, ...] = weights

    # -- ids ---------------------------------------------------------------------------------

    def _event_id(self) -> str:
        self._event += 1
        return f"w{self.index}-e{self._event}"

    def _msg_id(self) -> str:
        self._msg += 1
        return f"msg_w{self.index}_{self._msg}"

    def acknowledged(self, delivery: Delivery) -> None:
        """The service answered 200: the delivery may be re-sent as a duplicate later."""
        if delivery.resend_of is None:
            self.sent.append(delivery)
            if len(self.sent) > 200:
                del self.sent[:100]

    # -- events ------------------------------------------------------------------------------

    def _random_links(self, concept_id: str) -> list[str]:
        links = self.rng.sample(self.all_ids, self.rng.randint(2, 10))
        return sorted({t for t in links if t != concept_id})

    def _new_state(self, concept_id: str, old: dict[str, Any]) -> dict[str, Any]:
        rng = self.rng
        title_words = self.zipf.draw(rng, rng.randint(1, 3))
        links = list(old.get("links") or [])
        if not links or rng.random() < 0.3:
            links = self._random_links(concept_id)
        return {
            "id": concept_id,
            "title": " ".join(title_words).capitalize() + f" {concept_id.rsplit('/', 1)[-1]}",
            "type": old.get("type") or rng.choice(synthetic.TYPES),
            "status": rng.choice(STATUSES),
            "tags": sorted(set(self.zipf.draw(rng, rng.randint(0, 3)))),
            "text": self.zipf.text(rng),
            "links": links,
        }

    def _upsert(self, concept_id: str) -> dict[str, Any]:
        """Advance the truth by one upsert of ``concept_id``; the event."""
        truth = self.truth[concept_id]
        truth.version += 1
        truth.exists = True
        truth.concept = self._new_state(concept_id, truth.concept)
        return upsert_event(self.source, self._event_id(), truth.concept, truth.version)

    def _delete(self, concept_id: str) -> dict[str, Any]:
        truth = self.truth[concept_id]
        truth.version += 1
        truth.exists = False
        return self._envelope("concept.deleted", concept_id, {"version": truth.version})

    def _link(self, concept_id: str, added: bool) -> dict[str, Any]:
        truth = self.truth[concept_id]
        links: list[str] = list(truth.concept.get("links") or [])
        if added or not links:
            target = self.rng.choice(self.all_ids)
            if target != concept_id and target not in links:
                links = sorted({*links, target})
            kind = "link.added"
        else:
            target = self.rng.choice(links)
            links = [t for t in links if t != target]
            kind = "link.removed"
        truth.version += 1
        truth.concept = {**truth.concept, "links": links}
        return self._envelope(kind, concept_id, {"version": truth.version, "target": target})

    def _envelope(self, kind: str, subject: str, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "specversion": "1.0",
            "id": self._event_id(),
            "source": self.source,
            "type": kind,
            "subject": subject,
            "data": data,
        }

    def _existing(self) -> str | None:
        for _ in range(20):
            concept_id = self.rng.choice(self.owned)
            if self.truth[concept_id].exists:
                return concept_id
        return None

    def _single(self, kind: str, event: dict[str, Any]) -> Delivery:
        return _delivery(kind, [event], self._msg_id(), batch=self.rng.random() < 0.3)

    def next(self) -> Delivery:
        """The next delivery to send."""
        if self._pending:
            return self._pending.pop()
        rng = self.rng
        for _ in range(10):
            op = rng.choices(self._ops, self._weights)[0]
            delivery = self._make(op)
            if delivery is not None:
                return delivery
        concept_id = rng.choice(self.owned)
        return self._single("upsert", self._upsert(concept_id))

    def _make(self, op: str) -> Delivery | None:
        rng = self.rng
        if op == "upsert":
            concept_id = self._existing()
            return None if concept_id is None else self._single(op, self._upsert(concept_id))
        if op in ("link_added", "link_removed"):
            concept_id = self._existing()
            if concept_id is None:
                return None
            return self._single(op, self._link(concept_id, op == "link_added"))
        if op == "delete":
            concept_id = self._existing()
            return None if concept_id is None else self._single(op, self._delete(concept_id))
        if op == "create":
            gone = [cid for cid in rng.sample(self.owned, min(20, len(self.owned)))]
            gone = [cid for cid in gone if not self.truth[cid].exists]
            if gone and rng.random() < 0.6:
                concept_id = gone[0]  # re-create a deleted or a never-created, linked-to id
            else:
                self._new += 1
                col = synthetic.COLLECTIONS[rng.randrange(len(synthetic.COLLECTIONS))]
                concept_id = f"{col}/new-w{self.index}-{self._new}"
                self.truth[concept_id] = Truth()
                self.owned.append(concept_id)
            return self._single(op, self._upsert(concept_id))
        if op == "duplicate":
            if not self.sent:
                return None
            original = rng.choice(self.sent[-50:])
            if rng.random() < 0.2:  # same event ids from another source: not duplicates
                mirror = f"kbgen://mirror/{self.index}"
                events = [{**e, "source": mirror} for e in original.events]
                kind = "mirror_source"
                return _delivery(kind, events, self._msg_id(), batch=len(events) > 1)
            return Delivery(
                "duplicate",
                original.events,
                original.body,
                original.content_type,
                original.msg_id,
                resend_of=original.msg_id,
            )
        if op == "stale":
            concept_id = rng.choice(self.owned)
            truth = self.truth[concept_id]
            if truth.version == 0:
                return None
            version = max(0, truth.version - rng.randint(0, 3))
            if rng.random() < 0.7:
                old = self._new_state(concept_id, truth.concept)
                event = upsert_event(self.source, self._event_id(), old, version)
            else:
                event = self._envelope("concept.deleted", concept_id, {"version": version})
            return self._single(op, event)
        if op == "reorder":
            concept_id = self._existing()
            if concept_id is None:
                return None
            first = self._upsert(concept_id)
            second = (
                self._link(concept_id, rng.random() < 0.5)
                if rng.random() < 0.5
                else self._upsert(concept_id)
            )
            self._pending.append(self._single("reorder_late", first))
            return self._single("reorder", second)
        if op == "batch":
            events = []
            for _ in range(rng.randint(2, 6)):
                concept_id = self._existing()
                if concept_id is None:
                    continue
                roll = rng.random()
                if roll < 0.5:
                    events.append(self._upsert(concept_id))
                elif roll < 0.8:
                    events.append(self._link(concept_id, roll < 0.7))
                else:
                    events.append(self._delete(concept_id))
            if len(events) >= 2 and rng.random() < 0.3:
                events[0], events[1] = events[1], events[0]  # out of order inside a delivery
            if not events:
                return None
            return _delivery("batch", events, self._msg_id(), batch=True)
        if op == "link_on_deleted":
            # a newer link event for a deleted concept: ignored, its version not remembered
            gone = [cid for cid in rng.sample(self.owned, min(20, len(self.owned)))]
            gone = [cid for cid in gone if self.truth[cid].version > 0]
            gone = [cid for cid in gone if not self.truth[cid].exists]
            if not gone:
                return None
            version = self.truth[gone[0]].version + 1
            data = {"version": version, "target": rng.choice(self.all_ids)}
            return self._single(op, self._envelope("link.added", gone[0], data))
        if op == "dup_in_batch":
            concept_id = self._existing()
            if concept_id is None:
                return None
            event = self._upsert(concept_id)
            return _delivery(op, [event, event], self._msg_id(), batch=True)
        if op == "ghost":
            ghost = f"ops/ghost-w{self.index}-{self._event}"
            event = self._envelope(
                "link.added", ghost, {"version": 1, "target": rng.choice(self.all_ids)}
            )
            return self._single(op, event)
        raise ValueError(op)
