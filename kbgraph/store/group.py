"""Applying a group of deliveries in the writer's open transaction: the decision of each event
(``kbgraph.store.decide``) against what the store knew plus what the group did before it, then
the net effect per concept in one statement per kind of change (``statements.write_subjects``).

``Store`` (``kbgraph.store.sqlite``) owns the transaction, the fsync and the callers; this
module owns what a group does inside it: the webhook-id bindings, the KB rows, the keys and
subjects it loads, the decisions and the writes.
"""

from __future__ import annotations

import queue
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

import numpy as np

from kbgraph.embeddings import shipped
from kbgraph.embeddings.carried import Carrier
from kbgraph.embeddings.shipped import Shipped
from kbgraph.events import ConceptUpserted, Event
from kbgraph.store import statements as sql
from kbgraph.store import vectorrows
from kbgraph.store.decide import AcceptedKeys, Subject, decide
from kbgraph.store.eventlog import SqliteLog, analysis_of, json_text
from kbgraph.store.model import DeliveryResult, KBLimitReached, ReplayRefused, WebhookMessage
from kbgraph.store.statements import links_decoder
from kbgraph.store.vectorrows import VectorRow

REPLAY_WINDOW_SECONDS: Final = 300.0  # Standard Webhooks' timestamp tolerance
# A signed delivery verifies while its timestamp is within the tolerance of now, and it was
# within the tolerance of its acceptance: a replay can come up to twice the tolerance later.
BINDING_SECONDS: Final = 2 * REPLAY_WINDOW_SECONDS


class DecisionSettings(Protocol):
    """What a group's decisions depend on besides the store's rows (``Store`` has them)."""

    max_kbs: int | None
    named_kbs: frozenset[str]
    dedupe_keys: int

    def clock(self) -> float: ...


@dataclass(slots=True)
class KBWork:
    """One KB's part of a group being applied."""

    kid: int
    seq_before: int
    keys: AcceptedKeys
    seq: int = -1
    subjects: dict[str, Subject] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.seq < 0:
            self.seq = self.seq_before


@dataclass(frozen=True, slots=True)
class LoggedVectors:
    """A replicated log's vectors message (``vectorrows.take``): its model, the cut of the
    texts embedded, the rows."""

    model: str
    max_chars: int
    rows: list[VectorRow]


class MadeAhead(NamedTuple):
    """One upsert's log analysis made before its delivery reached the store, where there were
    cores to spare (``kbgraph.sources.vault.ahead``: a vault's parse workers): its
    ``document.encode`` bytes and, under a model, the vector ``Carrier.vectors`` made (text
    hash, float32 row), the same calls as the analyser's. Taken where ``key`` is the store's
    (``Carrier.key``; "" for a store without a model), else made again here."""

    key: str
    analysis: bytes
    text_hash: bytes = b""
    vector: bytes = b""  # float32, little-endian


@dataclass(slots=True)
class Pending:
    kb: str
    events: list[Event]
    resolve: Callable[[DeliveryResult | None, BaseException | None], None]
    message: WebhookMessage | None = None
    resent: bool = False  # its message was accepted for its KB before: a retry
    # From a replicated log (kbgraph.log.jetstream): the decision's time is the message's, never
    # this machine's clock, and (stream, sequence) is recorded in the same transaction.
    at: float | None = None
    position: tuple[str, int] | None = None
    note: tuple[str, str] | None = None  # (kind, detail): a logged message that applies nothing
    vectors: LoggedVectors | None = None  # its note is made when its rows are taken
    analyses: dict[int, bytes] = field(default_factory=dict)  # id(event) -> its log analysis
    # id(event) -> its carried vector's row for the store's ``vector`` table (the local
    # model's, kbgraph.embeddings.carried), under ``carried_model``
    carried_rows: dict[int, vectorrows.VectorRow] = field(default_factory=dict)
    carried_model: str = ""
    # the local model's vectors its message shipped (kbgraph.embeddings.shipped): those of
    # the store's model's key are taken in place of running the model
    shipped: Shipped | None = None
    ahead: Sequence[MadeAhead | None] = ()  # per event: its analysis made by the caller


ANALYSE_EVENTS: Final = 2_000  # deliveries analysed together, until they hold this many events


def take_waiting(inbox: queue.SimpleQueue[Pending | None]) -> list[Pending | None]:
    """The next delivery and those waiting behind it, until they hold ``ANALYSE_EVENTS``
    events, in order (a None, the store closing, ends the list): analysed together."""
    batch = [inbox.get()]
    events = 0 if batch[0] is None else len(batch[0].events)
    while batch[-1] is not None and events < ANALYSE_EVENTS:
        try:
            batch.append(inbox.get_nowait())
        except queue.Empty:
            break
        events += 0 if batch[-1] is None else len(batch[-1].events)
    return batch


def analyser(
    inbox: queue.SimpleQueue[Pending | None],
    out: queue.SimpleQueue[Pending | None],
    carrier: Carrier | None,
) -> None:
    """The store's analyser thread: deliveries' text analysis (with the local model,
    vectors) for the log, on their way to the writer: a stage of its own, run while the
    writer waits on SQLite and the disk (the GIL released), not on its serial path; those
    waiting are analysed together (``take_waiting``: one model call for their texts). A
    None (the store closing) is passed on after what came before it."""
    while True:
        batch = take_waiting(inbox)
        analyse([p for p in batch if p is not None], carrier)
        for pending in batch:
            out.put(pending)
        if batch[-1] is None:
            return


def analyse(group: list[Pending], carrier: Carrier | None = None) -> None:
    """Each upsert's text analysis for the log (``eventlog.analysis_of``) and, with
    ``carrier`` (the local model), its vector (the one its stream message shipped, if any:
    ``kbgraph.embeddings.shipped``), the group's other texts embedded in one call; by the
    store's analyser thread before the writer takes the deliveries: never inside a transaction
    other processes' writers wait for, nor on the writer's serial path. An analysis its caller
    made ahead under the store's key (``MadeAhead``) is taken as it is. Never a refusal: a
    delivery whose analysis raises is decided by its writes alone, its rows carrying none (a
    vector that fails leaves the rows without one: the followers embed them as before)."""
    upserts: list[tuple[Pending, int, ConceptUpserted]] = []
    for pending in group:
        if pending.note is None:
            ahead = _made_ahead(pending, carrier)
            upserts += [
                (pending, i, e)
                for i, e in enumerate(pending.events)
                if isinstance(e, ConceptUpserted) and id(e) not in ahead
            ]
    carried: list[tuple[str, bytes] | None] = [None] * len(upserts)
    if carrier is not None and upserts:
        try:
            wires = [shipped.wire(pending.shipped, carrier.key, i) for pending, i, _ in upserts]
            made = shipped.carried(carrier, [e.data for *_, e in upserts], wires)
        except Exception:  # e.g. text the tokenizer refuses: the followers' fallback
            made = []
        for i, ((pending, _, event), one) in enumerate(zip(upserts, made, strict=False)):
            carried[i] = (carrier.key, one.packed)
            pending.carried_model = carrier.model
            pending.carried_rows[id(event)] = vectorrows.VectorRow(
                event.subject, one.text_hash, one.vector, ""
            )
    failed: set[int] = set()
    for (pending, _, event), vector in zip(upserts, carried, strict=True):
        if id(pending) in failed:
            continue
        try:
            analysis = analysis_of(event, vector)
        except Exception:  # e.g. a value its write refuses too: the transaction says so
            failed.add(id(pending))
            pending.analyses.clear()
            pending.carried_rows.clear()
            continue
        if analysis is not None:
            pending.analyses[id(event)] = analysis


def _made_ahead(pending: Pending, carrier: Carrier | None) -> set[int]:
    """The upserts of ``pending`` whose analysis its caller made (``MadeAhead``) under this
    store's key, taken as they are: their ids."""
    key = "" if carrier is None else carrier.key
    taken: set[int] = set()
    for event, made in zip(pending.events, pending.ahead, strict=False):
        if made is None or made.key != key or not isinstance(event, ConceptUpserted):
            continue
        if carrier is not None:
            if not made.vector:
                continue
            vector = np.frombuffer(made.vector, "<f4")
            pending.carried_model = carrier.model
            pending.carried_rows[id(event)] = VectorRow(event.subject, made.text_hash, vector, "")
        pending.analyses[id(event)] = made.analysis
        taken.add(id(event))
    return taken


class GroupWriter:
    """The writes of one group of deliveries, decided in order (writer thread only)."""

    def __init__(self, settings: DecisionSettings) -> None:
        self.settings = settings
        self._pruned_at = 0.0

    def kb_row(self, conn: sqlite3.Connection, kb: str) -> tuple[int, int, int]:
        """(kid, seq, keys accepted so far) of the KB, created when new."""
        row = conn.execute(sql.KB_ROW, (kb,)).fetchone()
        if row is not None:
            return row[0], row[1], row[2]
        if self.settings.max_kbs is not None and kb not in self.settings.named_kbs:
            count = conn.execute(sql.KB_COUNT).fetchone()[0]
            if count >= self.settings.max_kbs:
                raise KBLimitReached(
                    f"kb {kb} not created: {count} KBs exist, the limit ([limits] max_kbs)"
                )
        kid = conn.execute(sql.KB_NEW, (kb,)).fetchone()[0]
        return kid, 0, 0

    def bind_messages(self, conn: sqlite3.Connection, group: list[Pending]) -> None:
        """A signed message (webhook-id and body) seen for another KB within ``BINDING_SECONDS``
        refuses its delivery (a signature does not cover the URL, so a captured delivery could
        be replayed into another KB); seen for the same KB, the delivery is a retry
        (``Pending.resent``). The group's messages are looked up in one statement and bound in
        one, decided in order as if each were bound before the next was looked up."""
        clock = self.settings.clock()
        signed: list[tuple[Pending, WebhookMessage]] = []
        for pending in group:
            pending.resent = False
            if pending.message is not None and pending.note is None:
                signed.append((pending, pending.message))
        if not signed:
            return
        known = self.messages_known(conn, [message for _, message in signed])
        bound: dict[WebhookMessage, tuple[str, bytes, str, float]] = {}
        for pending, message in signed:
            now = clock if pending.at is None else pending.at
            row = known.get(message)
            if row is not None and row[1] >= now - BINDING_SECONDS:
                if row[0] != pending.kb:
                    raise ReplayRefused(
                        f"webhook-id {message.id[:64]!r} was accepted for another KB:"
                        " refused as a replay"
                    )
                pending.resent = True
                continue
            known[message] = (pending.kb, now)
            bound[message] = (*message, pending.kb, now)
        conn.executemany(sql.MESSAGE_PUT, list(bound.values()))

    @staticmethod
    def messages_known(
        conn: sqlite3.Connection, messages: list[WebhookMessage]
    ) -> dict[WebhookMessage, tuple[str, float]]:
        """message -> (kb, received_at) of those the store holds."""
        payload = json_text(list({m.id for m in messages}))
        if payload is None:  # a webhook-id holding U+0000: one look-up each
            found = ((m, conn.execute(sql.MESSAGE_GET, m).fetchone()) for m in messages)
            return {m: (row[0], row[1]) for m, row in found if row is not None}
        wanted = set(messages)
        rows = conn.execute(sql.MESSAGES_GET, (payload,))
        return {
            m: (kb, at)
            for id_, digest, kb, at in rows
            if (m := WebhookMessage(id_, bytes(digest))) in wanted
        }

    def prune_messages(self, conn: sqlite3.Connection, group: list[Pending]) -> None:
        """Forget messages past the binding time, at most once a minute.

        Deliveries from a replicated log are timed by the log, so the horizon is their time,
        less a minute's margin for a log whose leader moved to a clock slightly behind:
        a row is pruned only once no later message can still be bound by it."""
        now = time.monotonic()
        if now - self._pruned_at >= 60.0:
            self._pruned_at = now
            logged = [p.at for p in group if p.at is not None]
            horizon = max(logged) - 60.0 if logged else self.settings.clock()
            conn.execute(sql.MESSAGE_PRUNE, (horizon - BINDING_SECONDS,))

    def load_kb(self, conn: sqlite3.Connection, kb: str, deliveries: list[list[Event]]) -> KBWork:
        """What the store already knows about the keys and subjects these deliveries touch."""
        kid, seq, count = self.kb_row(conn, kb)
        work = KBWork(kid, seq, AcceptedKeys(count, self.settings.dedupe_keys))
        keys = list({(event.source, event.id) for events in deliveries for event in events})
        work.keys.seen.update(
            ((source, id_), n) for source, id_, n in sql.lookup(conn, sql.SEEN, kid, keys)
        )
        ids = list({event.subject for events in deliveries for event in events})
        known = {row[0]: row for row in sql.lookup(conn, sql.SUBJECTS, kid, ids)}
        subjects = work.subjects
        for cid in ids:
            row = known.get(cid)
            if row is None:
                subjects[cid] = Subject(None, False, None, False)
            elif row[1] is not None:  # an existing concept (a tombstone, if any, is older)
                links = row[4] if isinstance(row[4], list) else links_decoder.decode(row[4])
                subjects[cid] = Subject(row[1], row[3] is not None, row[2], True, links)
            else:
                subjects[cid] = Subject(None, True, row[3], False)
        return work

    def apply(self, conn: sqlite3.Connection, group: list[Pending]) -> list[DeliveryResult]:
        """Apply deliveries in order in the open transaction; few statements for the group.

        Every event is decided in memory against what the store knew plus what the earlier
        events of the group did; then the net effect per concept is written with one
        statement per kind of change (``kbgraph.store.statements.write_subjects``). A
        vectors message cuts the group: what comes before it is written first, so that its
        rows are checked against the texts at its position in the log.
        """
        self.bind_messages(conn, group)
        results: list[DeliveryResult] = []
        start = 0
        for index, pending in enumerate(group):
            if pending.vectors is not None:
                results += self.apply_deliveries(conn, group[start:index])
                results.append(self.take_vectors(conn, pending, pending.vectors))
                start = index + 1
        return results + self.apply_deliveries(conn, group[start:])

    @staticmethod
    def take_vectors(
        conn: sqlite3.Connection, pending: Pending, vectors: LoggedVectors
    ) -> DeliveryResult:
        """Take a vectors message's rows (``vectorrows.take``); its note says what was taken."""
        taken, held, stale = vectorrows.take(
            conn, pending.kb, vectors.model, vectors.max_chars, vectors.rows
        )
        pending.note = (
            "vectors",
            f"{len(vectors.rows)} rows of kb {pending.kb}, model {vectors.model[:200]}:"
            f" {taken} taken, {held} held already, {stale} stale",
        )
        return DeliveryResult(0, 0, 0, 0, 0, 0)

    def apply_deliveries(
        self, conn: sqlite3.Connection, group: list[Pending]
    ) -> list[DeliveryResult]:
        """``apply`` for a part of the group without vectors."""
        if not group:
            return []
        per_kb: dict[str, list[list[Event]]] = {}
        for pending in group:
            if pending.note is None:
                per_kb.setdefault(pending.kb, []).append(pending.events)
        works = {kb: self.load_kb(conn, kb, deliveries) for kb, deliveries in per_kb.items()}
        entries: list[tuple[str, int, Event, bool, bytes | None]] = []
        vectors: dict[tuple[str, str], list[vectorrows.VectorRow]] = {}
        results = []
        for pending in group:
            if pending.note is not None:  # recorded with the positions, applies nothing
                results.append(DeliveryResult(0, 0, 0, 0, 0, 0))
                continue
            kb, events = pending.kb, pending.events
            work = works[kb]
            applied, duplicates, stale, ignored = decide(events, work.keys, work.subjects)
            if pending.resent and len(applied) + stale + ignored:
                # A retry repeats events already accepted. New ones under an old webhook-id are
                # a replay with changed attributes: binary mode's ce-* headers are not signed.
                shown = pending.message.id[:64] if pending.message else ""
                raise ReplayRefused(
                    f"webhook-id {shown!r} was accepted before for other"
                    " events: refused as a replay (a retry must repeat the delivery)"
                )
            last = len(applied) - 1
            analyses = pending.analyses
            for index, event in enumerate(applied):
                entries.append(
                    (kb, work.seq + 1 + index, event, index == last, analyses.get(id(event)))
                )
            if pending.carried_rows:
                rows = vectors.setdefault((kb, pending.carried_model), [])
                carried = pending.carried_rows
                rows.extend(v for e in applied if (v := carried.get(id(e))) is not None)
            work.seq += len(applied)
            results.append(
                DeliveryResult(len(events), len(applied), duplicates, stale, ignored, work.seq)
            )
        for work in works.values():
            if work.keys.new:
                sql.bulk(conn, sql.ACCEPT, work.kid, work.keys.new)
                conn.execute(sql.KB_SET_KEYS, (work.keys.count, work.kid))
            if work.seq != work.seq_before:
                sql.write_subjects(conn, work.kid, work.subjects)
                conn.execute(sql.KB_SET_SEQ, (work.seq, work.kid))
        if entries:
            SqliteLog.append(conn, entries)
        for (kb, model), rows in vectors.items():  # in order: a concept's last text wins
            vectorrows.write(conn, kb, model, rows)
        return results
