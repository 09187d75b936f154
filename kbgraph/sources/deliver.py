"""Send the concepts of a source that changed since the manifest's record, through a sink.

The sources that read their concepts whole (a MediaWiki dump or follower, a BEIR corpus) send
them here, through the manifest and sinks every source shares (``manifest``, ``sinks``); they
do the same job as for a folder: per delivery, its versions are reserved in the manifest
(fsynced; they start at the wall clock in microseconds, so they only grow), then it is sent,
then recorded once acknowledged. Event ids are derived from (KB, concept id, version, state
digest) and the webhook sink's ``webhook-id`` from the body, so a delivery sent again after a
lost answer is all duplicates; a crash between a send and its record only means those concepts
are sent again, with higher versions: the same state applied once more, nothing lost.

The concepts are read as they come (an iterator is never held whole): a delivery is sent as
soon as it is full, and the deletes, known only at the end, go last.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from kbgraph.events import ConceptDeleted, ConceptUpserted, DeleteData, Event, UpsertData
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import Sink
from kbgraph.sources.sync import BATCH_BYTES, BATCH_EVENTS, event_id

_hash_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class SourceConcept:
    """One concept as a source read it: its data without a version, and the hash of that data."""

    id: str
    data: UpsertData  # version 0; the sender sets the real one
    digest: str

    @classmethod
    def of(cls, concept_id: str, data: UpsertData) -> SourceConcept:
        return cls(concept_id, data, hashlib.sha256(_hash_encoder.encode(data)).hexdigest())


@dataclass(slots=True)
class Sent:
    upserted: int = 0
    deleted: int = 0
    unchanged: int = 0

    def add(self, other: Sent) -> None:
        self.upserted += other.upserted
        self.deleted += other.deleted
        self.unchanged += other.unchanged


def deliver(
    kb: str,
    sink: Sink,
    manifest: Manifest,
    concepts: Iterable[SourceConcept],
    gone: Iterable[str] = (),
    *,
    source: str,
    everything: bool = False,
    progress: Callable[[int, int | None], None] | None = None,
) -> Sent:
    """Upsert each of ``concepts`` whose state differs from what was sent, and delete each
    id of ``gone`` that was sent. ``everything``: ``concepts`` is the whole source, so every id
    sent before and not among them is deleted too. ``source``: the events' CloudEvents source.
    Raises ``SyncError`` on a refusal (what was acknowledged before it is recorded).
    ``progress(done, total)`` after each delivery: the events sent so far, and how many there
    are in all once the last is sent (None before: the concepts are still being read)."""
    sent = manifest.sent(sink.dest, kb)
    out = Sent()
    present: set[str] = set()
    batch: list[SourceConcept | str] = []
    size = 0
    done = 0

    def send(total: int | None = None) -> None:
        nonlocal done
        out.add(_send(kb, sink, manifest, batch, source))
        done += len(batch)
        if progress is not None:
            progress(done, total)

    for concept in concepts:
        present.add(concept.id)
        if sent.get(concept.id, ("",))[0] == concept.digest:
            out.unchanged += 1
            continue
        weight = 400 + 2 * len(concept.data.text)
        if batch and (len(batch) >= BATCH_EVENTS or size + weight > BATCH_BYTES):
            send()
            batch, size = [], 0
        batch.append(concept)
        size += weight
    dropped = set(gone) - present
    if everything:
        dropped |= sent.keys() - present
    deletes = sorted(dropped & sent.keys())
    for cid in deletes:
        if batch and len(batch) >= BATCH_EVENTS:
            send()
            batch = []
        batch.append(cid)
    if batch:
        send(done + len(batch))
    return out


def _send(
    kb: str, sink: Sink, manifest: Manifest, batch: list[SourceConcept | str], source: str
) -> Sent:
    first = manifest.reserve(sink.dest, kb, len(batch))
    events: list[Event] = []
    upserted: list[tuple[str, str, int]] = []
    deleted: list[str] = []
    for version, item in enumerate(batch, first):
        if isinstance(item, str):
            events.append(
                ConceptDeleted(
                    specversion="1.0",
                    id=event_id(kb, item, version, "deleted"),
                    source=source,
                    subject=item,
                    data=DeleteData(version=version),
                )
            )
            deleted.append(item)
        else:
            events.append(
                ConceptUpserted(
                    specversion="1.0",
                    id=event_id(kb, item.id, version, item.digest),
                    source=source,
                    subject=item.id,
                    data=msgspec.structs.replace(item.data, version=version),
                )
            )
            upserted.append((item.id, item.digest, version))
    result = sink.send(kb, events)
    manifest.record(sink.dest, kb, upserted, deleted, result.seq)
    return Sent(len(upserted), len(deleted))
