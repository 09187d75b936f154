"""Where this store stands in a replicated log (NATS JetStream): one position per stream,
recorded in the same transaction as the state it produced, so a restart resumes exactly after
the last message applied and a gap or a repeat is refused.

A message that applies nothing still takes its position, with a note saying why
(``stream_note``): a message skipped by an operator's decision recorded in the stream, the
decision itself, a message refused for a missing or wrong MAC. Every node notes the same
message the same way, so the notes are part of what nodes hold alike.

What each delivery answered (its ``DeliveryResult``, or its own refusal) is kept with the
position for the last ``RESULTS_KEPT`` positions (``stream_result``): a node whose workers
publish deliveries while one applier process applies the stream (``kbgraph.log.jetstream.worker``)
answers each sender from it."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final, Protocol

import msgspec

from kbgraph.store import statements as sql
from kbgraph.store.model import DeliveryResult, KBLimitReached, ReplayRefused, WebhookMessage

DECIDED: Final = (ReplayRefused, KBLimitReached)  # a delivery's own refusal: a decision


NOTE_PUT: Final = (
    "INSERT INTO stream_note (stream, seq, kind, detail, message_id, message_digest)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
SKIPPED_MESSAGES: Final = (
    "SELECT message_id, message_digest FROM stream_note"
    " WHERE stream = ? AND kind = 'skipped' AND message_id IS NOT NULL"
)
NOTE_GET: Final = "SELECT kind, detail FROM stream_note WHERE stream = ? AND seq = ?"
NOTES: Final = "SELECT seq, kind, detail FROM stream_note WHERE stream = ? ORDER BY seq"
RESULTS_KEPT: Final = 50_000  # positions whose answer is kept: minutes of deliveries
RESULT_PUT: Final = (  # a store set back to an earlier position may hold the row already
    "INSERT OR REPLACE INTO stream_result (stream, seq, result, refusal, detail)"
    " VALUES (?, ?, ?, ?, ?)"
)
RESULT_PRUNE: Final = "DELETE FROM stream_result WHERE stream = ? AND seq <= ?"
RESULTS_GET: Final = (
    "SELECT seq, result, refusal, detail FROM stream_result WHERE stream = ? AND seq IN ({})"
)
NOTES_AT: Final = "SELECT seq, kind, detail FROM stream_note WHERE stream = ? AND seq IN ({})"
_encode = msgspec.json.Encoder().encode


class LogOutOfOrder(RuntimeError):
    """A delivery from a replicated log does not follow the position the store recorded."""


class MessageFailed(RuntimeError):
    """The store could not apply the message at ``seq`` of ``stream`` (for a reason another
    node may share: I/O, a bug, an SQLite difference); nothing of its group committed."""

    def __init__(self, stream: str, seq: int, kb: str, cause: BaseException) -> None:
        super().__init__(f"stream {stream} position {seq} (kb {kb}): {cause!r}")
        self.stream = stream
        self.seq = seq
        self.kb = kb
        self.cause = cause


class Positioned(Protocol):
    kb: str
    position: tuple[str, int] | None  # (stream, sequence) of a delivery from a replicated log
    note: tuple[str, str] | None  # (kind, detail) of a message that applies nothing
    message: WebhookMessage | None


def check(conn: sqlite3.Connection, group: Sequence[Positioned]) -> dict[str, int]:
    """The last log position per stream in ``group``, after checking that its deliveries
    follow the stored position one by one (none skipped, none applied twice)."""
    last: dict[str, int] = {}
    for pending in group:
        if pending.position is None:
            continue
        stream, seq = pending.position
        if stream not in last:
            row = conn.execute(sql.POSITION_GET, (stream,)).fetchone()
            last[stream] = 0 if row is None else row[0]
        if seq != last[stream] + 1:
            raise LogOutOfOrder(f"stream {stream}: sequence {seq} after {last[stream]}")
        last[stream] = seq
    return last


def record(
    conn: sqlite3.Connection,
    group: Sequence[Positioned],
    outcomes: list[tuple[DeliveryResult | None, BaseException | None]],
    last: dict[str, int],
) -> None:
    """Store the positions (and the notes) with the state, unless a logged delivery failed for
    a reason that is not its own refusal (I/O, a bug): then the whole group must not commit,
    and ``MessageFailed`` names the message."""
    for pending, (_, exc) in zip(group, outcomes, strict=True):
        if pending.position is not None and exc is not None and not isinstance(exc, DECIDED):
            raise MessageFailed(*pending.position, pending.kb, exc) from exc
    for pending, (result, exc) in zip(group, outcomes, strict=True):
        if pending.position is None:
            continue
        if pending.note is not None:
            message = pending.message or (None, None)
            conn.execute(NOTE_PUT, (*pending.position, *pending.note, *message))
        elif exc is not None:
            refusal = "replay" if isinstance(exc, ReplayRefused) else "kb_limit"
            conn.execute(RESULT_PUT, (*pending.position, None, refusal, str(exc)))
        else:
            conn.execute(RESULT_PUT, (*pending.position, _encode(result), None, None))
    for stream, seq in last.items():
        conn.execute(sql.POSITION_SET, (stream, seq))
        conn.execute(RESULT_PRUNE, (stream, seq - RESULTS_KEPT))


def position(conn: sqlite3.Connection, stream: str) -> int:
    """The last sequence of ``stream`` applied to ``conn``'s store (0: none, or a file from
    before positions were kept, with no table for them)."""
    try:
        row = conn.execute(sql.POSITION_GET, (stream,)).fetchone()
    except sqlite3.OperationalError:  # no table yet
        return 0
    return 0 if row is None else int(row[0])


Outcomes = tuple[
    int, list[tuple[int, bytes | None, str | None, str | None]], list[tuple[int, str, str]]
]


def outcomes(conn: sqlite3.Connection, stream: str, seqs: Sequence[int]) -> Outcomes:
    """The stream position, with the results and the notes of those of ``seqs`` up to it."""
    at = position(conn, stream)
    reached = [seq for seq in seqs if seq <= at]
    if not reached:
        return at, [], []
    marks = ",".join("?" * len(reached))
    results = conn.execute(RESULTS_GET.format(marks), (stream, *reached)).fetchall()
    notes = conn.execute(NOTES_AT.format(marks), (stream, *reached)).fetchall()
    return at, results, notes
