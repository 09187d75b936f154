"""The store: the event log and the current state of every KB, the source of truth.

INTERFACE STUB — filled in by the ingest work (issue 2). Other modules code against exactly
these names and shapes.

Semantics (SPEC section 2):
- ``append(kb, events)`` applies one delivery atomically: all of it or none of it, in one
  transaction (group-committed with concurrent deliveries, each under its own SAVEPOINT), and
  returns only after the commit is durable (WAL, ``synchronous=FULL``).
- Per event, in order: a (source, id) accepted before in this KB -> duplicate; a version not
  greater than the subject's known version (concept or tombstone) -> stale; a link event whose
  subject does not exist -> ignored; otherwise applied. Only applied events enter the log, each
  taking the next gapless ``seq`` of its KB (and the next global ``gid``).
- The log is followed by every process (``read_log``); ``load`` gives a consistent snapshot
  of the current state together with the ``gid`` it reflects, for a projection's first build.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import msgspec

from kbgraph.events import Event


class DeliveryResult(msgspec.Struct, frozen=True):
    accepted: int
    applied: int
    duplicates: int
    stale: int
    ignored: int
    seq: int


class LogRecord(NamedTuple):
    gid: int  # global position, over all KBs, strictly increasing
    kb: str
    seq: int  # the KB's log position after this event (1, 2, 3, ... gapless)
    event: Event  # an applied event, as delivered
    last_in_delivery: bool  # True on the last applied event of its delivery


class ConceptState(msgspec.Struct, frozen=True):
    id: str
    version: int
    title: str
    type: str
    status: str
    tags: list[str]
    text: str
    links: list[str]  # declared out-links, deduplicated, sorted, also to missing targets


class KBState(msgspec.Struct, frozen=True):
    seq: int
    concepts: list[ConceptState]  # existing concepts only, sorted by id


class StoreSnapshot(msgspec.Struct, frozen=True):
    gid: int  # the log position this state reflects; follow the log from here
    kbs: dict[str, KBState]  # every KB with seq >= 1


class Store:
    """One SQLite file in WAL mode; safe to share between threads and between processes."""

    def __init__(self, path: str | Path) -> None:
        raise NotImplementedError

    def append(self, kb: str, events: list[Event]) -> DeliveryResult:
        """Apply one delivery atomically and durably (blocking; thread-safe)."""
        raise NotImplementedError

    async def append_async(self, kb: str, events: list[Event]) -> DeliveryResult:
        """``append`` for the event loop: never blocks it."""
        raise NotImplementedError

    def read_log(self, after_gid: int, limit: int = 10_000) -> list[LogRecord]:
        """Applied events with gid > after_gid in gid order, whole deliveries only."""
        raise NotImplementedError

    def load(self) -> StoreSnapshot:
        raise NotImplementedError

    def kb_seq(self, kb: str) -> int:
        """The KB's current log position (0 for a KB with no applied event)."""
        raise NotImplementedError

    def fts_search(self, kb: str, terms: list[str], limit: int) -> list[tuple[str, float]]:
        """(id, -bm25(title 10, text 1)) from the KB's FTS5 index, best first (an oracle)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
