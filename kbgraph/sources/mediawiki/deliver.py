"""Send the concepts of a wiki that changed since the manifest's record, through a sink.

The vault connector's manifest and sinks (``kbgraph.sources.manifest``, ``kbgraph.sources.sinks``)
do the same job here: per delivery, its versions are reserved in the manifest (fsynced; they
start at the wall clock in microseconds, so they only grow), then it is sent, then recorded
once acknowledged. Event ids are derived from (KB, concept id, version, state digest) and the
webhook sink's ``webhook-id`` from the body, so a delivery sent again after a lost answer is
all duplicates; a crash between a send and its record only means those concepts are sent
again, with higher versions: the same state applied once more, nothing lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from kbgraph.events import ConceptDeleted, ConceptUpserted, DeleteData, Event
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.mediawiki.concepts import WikiConcept
from kbgraph.sources.sinks import Sink
from kbgraph.sources.sync import event_id

SOURCE: Final = "kbgraph-mediawiki"
BATCH_EVENTS: Final = 500
BATCH_BYTES: Final = 4 << 20


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
    concepts: Iterable[WikiConcept],
    gone: Iterable[str] = (),
    *,
    everything: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Sent:
    """Upsert each of ``concepts`` whose state differs from what was sent, and delete each
    id of ``gone`` that was sent. ``everything``: ``concepts`` is the whole wiki, so every id
    sent before and not among them is deleted too. Raises ``SyncError`` on a refusal (what was
    acknowledged before it is recorded). ``progress(done, total)`` after each delivery."""
    sent = manifest.sent(sink.dest, kb)
    out = Sent()
    todo: list[WikiConcept | str] = []
    present: set[str] = set()
    for concept in concepts:
        present.add(concept.id)
        if sent.get(concept.id, ("",))[0] == concept.digest:
            out.unchanged += 1
        else:
            todo.append(concept)
    dropped = set(gone) - present
    if everything:
        dropped |= sent.keys() - present
    deletes: list[WikiConcept | str] = [cid for cid in sorted(dropped) if cid in sent]
    todo = deletes + todo
    batch: list[WikiConcept | str] = []
    size = 0
    done = 0

    def send(batch: list[WikiConcept | str]) -> None:
        nonlocal done
        out.add(_send(kb, sink, manifest, batch))
        done += len(batch)
        if progress is not None:
            progress(done, len(todo))

    for item in todo:
        weight = 200 if isinstance(item, str) else 400 + 2 * len(item.data.text)
        if batch and (len(batch) >= BATCH_EVENTS or size + weight > BATCH_BYTES):
            send(batch)
            batch, size = [], 0
        batch.append(item)
        size += weight
    if batch:
        send(batch)
    return out


def _send(kb: str, sink: Sink, manifest: Manifest, batch: list[WikiConcept | str]) -> Sent:
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
                    source=SOURCE,
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
                    source=SOURCE,
                    subject=item.id,
                    data=msgspec.structs.replace(item.data, version=version),
                )
            )
            upserted.append((item.id, item.digest, version))
    result = sink.send(kb, events)
    manifest.record(sink.dest, kb, upserted, deleted, result.seq)
    return Sent(len(upserted), len(deleted))
