"""The append decision (docs/events.md), as a pure function of what is known and the events.

Per event, in order: a (source, id) accepted before in this KB (or earlier in the same
delivery) and among its last ``AcceptedKeys.retain`` accepted keys -> duplicate; a version not
greater
than the subject's known version (concept or tombstone) -> stale; a link event whose subject
does not exist -> ignored; otherwise applied, its effect folded into its ``Subject`` so that a
writer can store the net effect of a whole group at once. No I/O: the SQLite store calls it,
and so can any other log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kbgraph.events import ConceptDeleted, ConceptUpserted, Event, LinkAdded, LinkRemoved


@dataclass(slots=True)
class AcceptedKeys:
    """A KB's accepted (source, id) keys as far as the group needs them: each numbered in order
    of acceptance (1, 2, 3, ...), remembered while fewer than ``retain`` keys came after it.

    Numbers, not time, bound the retention: every process (every node of a replicated log)
    decides the same event the same way, whenever and wherever it applies it."""

    count: int  # keys accepted in this KB so far
    retain: int
    seen: dict[tuple[str, str], int] = field(default_factory=dict)  # key -> its number
    new: list[tuple[str, str, int]] = field(default_factory=list)  # accepted by this group

    def remembered(self, key: tuple[str, str]) -> bool:
        number = self.seen.get(key)
        return number is not None and number > self.count - self.retain

    def accept(self, key: tuple[str, str]) -> None:
        self.count += 1
        self.seen[key] = self.count
        self.new.append((*key, self.count))


@dataclass(slots=True)
class Subject:
    """A concept touched by the group: what the store knew, then what the events made of it."""

    rid: int | None  # concept row before the delivery (None: no concept)
    had_tombstone: bool
    version: int | None  # known version: concept's, else tombstone's, else None
    exists: bool
    stored_links: list[str] = field(default_factory=list)  # the concept row's, when it exists
    touched: bool = False  # some event applied
    fields: ConceptUpserted | None = None  # last applied upsert (if not deleted after it)
    rewrite: bool = False  # fields / links replaced (upsert or delete applied)
    links: set[str] = field(default_factory=set)  # full link set when rewrite
    added: set[str] = field(default_factory=set)  # link.added since no rewrite
    removed: set[str] = field(default_factory=set)  # link.removed since no rewrite


def decide(
    events: list[Event], keys: AcceptedKeys, subjects: dict[str, Subject]
) -> tuple[list[Event], int, int, int]:
    """Decide each event in delivery order, folding its effect into its subject.

    ``keys`` (accepted keys) and ``subjects`` (every subject the events name) are what the log
    knew before plus what earlier events did; both are updated (each newly accepted key lands
    in ``keys.new``). Returns (applied events, duplicates, stale, ignored).
    """
    applied: list[Event] = []
    duplicates = stale = ignored = 0
    for event in events:
        key = (event.source, event.id)
        if keys.remembered(key):
            duplicates += 1
            continue
        keys.accept(key)
        subject = subjects[event.subject]
        version = event.data.version
        if subject.version is not None and version <= subject.version:
            stale += 1
            continue
        if isinstance(event, (LinkAdded, LinkRemoved)):
            if not subject.exists:
                ignored += 1
                continue
            target = event.data.target
            if isinstance(event, LinkAdded):
                if target != event.subject:  # a self-link declares nothing
                    if subject.rewrite:
                        subject.links.add(target)
                    else:
                        subject.added.add(target)
                        subject.removed.discard(target)
            elif subject.rewrite:
                subject.links.discard(target)
            else:
                subject.removed.add(target)
                subject.added.discard(target)
        elif isinstance(event, ConceptUpserted):
            subject.exists = True
            subject.fields = event
            subject.rewrite = True
            subject.links = set(event.data.links)
            subject.links.discard(event.subject)
        elif isinstance(event, ConceptDeleted):
            subject.exists = False
            subject.fields = None
            subject.rewrite = True
            subject.links = set()
        else:  # pragma: no cover - decode_delivery admits only the four types
            raise TypeError(f"unknown event type {type(event).__name__}")
        subject.version = version
        subject.touched = True
        applied.append(event)
    return applied, duplicates, stale, ignored
