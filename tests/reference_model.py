"""Plain, obviously-correct models for the projection tests.

``ReferenceKB`` replays applied log records with dicts and sets and answers the projection's
questions (nodes, undirected edges, out-edges, visible nodes and degrees) by brute force.
``FakeStore`` is an in-memory store with ``kbgraph.store.Store``'s interface and the store
semantics of docs/events.md (duplicates, stale versions, tombstones, ignored link events), for
tests that must not depend on SQLite.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kbgraph.access import RuleSet, visible
from kbgraph.events import ConceptDeleted, ConceptUpserted, Event, LinkAdded, LinkRemoved
from kbgraph.names import collection_of
from kbgraph.store import ConceptState, DeliveryResult, KBState, LogRecord, StoreSnapshot
from kbgraph.store.load import columns_of
from kbgraph.store.model import ColumnSnapshot


@dataclass
class RefConcept:
    version: int
    title: str = ""
    type: str = ""
    status: str = ""
    tags: list[str] = field(default_factory=list)
    text: str = ""
    links: set[str] = field(default_factory=set)  # declared out-links, never itself


class ReferenceKB:
    """A KB as dicts and sets, fed applied log events in order."""

    def __init__(self) -> None:
        self.concepts: dict[str, RefConcept] = {}  # existing concepts only
        self.seq = 0

    def apply(self, event: Event, seq: int | None = None) -> None:
        subject = event.subject
        if isinstance(event, ConceptUpserted):
            d = event.data
            self.concepts[subject] = RefConcept(
                d.version, d.title, d.type, d.status, list(d.tags), d.text, set(d.links) - {subject}
            )
        elif isinstance(event, ConceptDeleted):
            self.concepts.pop(subject, None)
        elif isinstance(event, LinkAdded | LinkRemoved):
            concept = self.concepts.get(subject)
            if concept is not None:
                if event.data.target != subject:
                    if isinstance(event, LinkAdded):
                        concept.links.add(event.data.target)
                    else:
                        concept.links.discard(event.data.target)
                concept.version = event.data.version
        if seq is not None:
            self.seq = seq

    def nodes(self) -> set[str]:
        return set(self.concepts)

    def out_edges(self) -> set[tuple[str, str]]:
        return {(u, v) for u, c in self.concepts.items() for v in c.links if v in self.concepts}

    def und_edges(self) -> set[frozenset[str]]:
        return {frozenset(e) for e in self.out_edges()}

    def visible_nodes(self, rules: RuleSet | None) -> set[str]:
        return {u for u, c in self.concepts.items() if visible(rules, collection_of(u), c.type)}

    def visible_degrees(self, rules: RuleSet | None) -> dict[str, int]:
        seen = self.visible_nodes(rules)
        deg = dict.fromkeys(seen, 0)
        for e in self.und_edges():
            u, v = tuple(e)
            if u in seen and v in seen:
                deg[u] += 1
                deg[v] += 1
        return deg


class FakeStore:
    """In-memory ``Store``: one log for all KBs, store-side semantics of docs/events.md."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log: list[LogRecord] = []
        self._seen: dict[str, set[tuple[str, str]]] = {}
        self._versions: dict[str, dict[str, int]] = {}  # kb -> id -> version (tombstones too)
        self._state: dict[str, dict[str, ConceptState]] = {}
        self._seq: dict[str, int] = {}

    def append(self, kb: str, events: list[Event]) -> DeliveryResult:
        with self._lock:
            seen = self._seen.setdefault(kb, set())
            versions = self._versions.setdefault(kb, {})
            state = self._state.setdefault(kb, {})
            applied: list[Event] = []
            dup = stale = ignored = 0
            for e in events:
                key = (e.source, e.id)
                if key in seen:
                    dup += 1
                    continue
                seen.add(key)
                if e.data.version <= versions.get(e.subject, -1):
                    stale += 1
                    continue
                if isinstance(e, LinkAdded | LinkRemoved) and e.subject not in state:
                    ignored += 1
                    continue
                versions[e.subject] = e.data.version
                _apply_state(state, e)
                applied.append(e)
            seq = self._seq.get(kb, 0)
            for i, e in enumerate(applied):
                seq += 1
                gid = len(self._log) + 1
                self._log.append(LogRecord(gid, kb, seq, e, i == len(applied) - 1))
            self._seq[kb] = seq
            return DeliveryResult(len(events), len(applied), dup, stale, ignored, seq)

    # Vectors: like a process on a read-only store, the filler embeds for itself, reads no row
    read_only = True

    def read_vectors(self, kb: str, model: str, concepts: list[str]) -> list:
        return []

    def read_log(self, after_gid: int, limit: int = 10_000) -> list[LogRecord]:
        with self._lock:
            out = self._log[after_gid : after_gid + limit]
            while out and not out[-1].last_in_delivery:  # whole deliveries only
                out.pop()
            if not out and len(self._log) > after_gid:  # one delivery longer than limit
                end = after_gid
                while not self._log[end].last_in_delivery:
                    end += 1
                out = self._log[after_gid : end + 1]
            return out

    def load_columns(self) -> ColumnSnapshot:
        snapshot = self.load()
        kbs = {kb: columns_of(state) for kb, state in snapshot.kbs.items()}
        return ColumnSnapshot(snapshot.gid, kbs)

    def load(self) -> StoreSnapshot:
        with self._lock:
            return StoreSnapshot(
                len(self._log),
                {
                    kb: KBState(self._seq[kb], [state[k] for k in sorted(state)])
                    for kb, state in self._state.items()
                    if self._seq.get(kb, 0) >= 1
                },
            )

    def kb_seq(self, kb: str) -> int:
        return self._seq.get(kb, 0)

    def close(self) -> None:
        pass


def _apply_state(state: dict[str, ConceptState], e: Event) -> None:
    s = e.subject
    if isinstance(e, ConceptUpserted):
        d = e.data
        state[s] = ConceptState(
            s, d.version, d.title, d.type, d.status, list(d.tags), d.text, sorted(set(d.links)),
            list(d.aliases),
        )  # fmt: skip
    elif isinstance(e, ConceptDeleted):
        state.pop(s, None)
    else:
        c = state[s]
        links = set(c.links)
        if isinstance(e, LinkAdded):
            links.add(e.data.target)
        else:
            links.discard(e.data.target)
        state[s] = ConceptState(
            s, e.data.version, c.title, c.type, c.status, c.tags, c.text, sorted(links), c.aliases
        )
