"""The event log: every applied event, in order, for every process to follow.

``LogRecord`` is what a follower reads (``SqliteLog.read``: ordered reads of whole
deliveries). ``SqliteLog`` is a table in the store's SQLite file, appended inside the very
transaction that changes the state, so one commit makes both durable. Beyond one machine
(``kbgraph.log.jetstream``), a NATS JetStream stream orders the deliveries and each node's
store applies it, keeping this local log too, so the projection follows the store the same
way on every node.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

import msgspec

from kbgraph.events import ConceptUpserted, Event, decode_from_log, encode_for_log
from kbgraph.search import document
from kbgraph.search.document import Analysed

NUL_ESCAPE: Final = "\\u0000"  # how msgspec writes U+0000 in JSON
_rows_encoder = msgspec.json.Encoder()


def json_text(value: object) -> str | None:
    """``value`` as JSON text for SQLite's JSON functions; None when it holds U+0000 (they cut
    text there: the caller falls back to a row-by-row statement). Always ``str``, never
    ``bytes``: SQLite binds bytes as a BLOB, and from 3.45 its JSON functions read a BLOB as
    binary JSONB, so a payload such as ``[[12]]`` fails as malformed (or, on some builds, the
    statement never returns)."""
    text = _rows_encoder.encode(value).decode()
    return None if NUL_ESCAPE in text else text


class LogRecord(NamedTuple):
    gid: int  # global position, over all KBs, strictly increasing
    kb: str
    seq: int  # the KB's log position after this event (1, 2, 3, ... gapless)
    event: Event  # an applied event, as delivered
    last_in_delivery: bool  # True on the last applied event of its delivery
    analysis: Analysed | None = None  # an upsert's text analysed once, by the appender


def analysis_of(event: Event, vector: tuple[str, bytes] | None = None) -> bytes | None:
    """What the log carries beside ``event`` for the projection: an upsert's analysis
    (``kbgraph.search.document``) and, with the local model, its vector (``vector``: the
    model's key and the packed row, ``kbgraph.embeddings.carried``), computed once by the
    process that appends it."""
    if not isinstance(event, ConceptUpserted):
        return None
    data = event.data
    return document.encode(data.title, data.text, data.aliases, data.tags, vector)


@contextlib.contextmanager
def read_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One WAL snapshot for every statement inside."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")


class SqliteLog:
    """The log table: one row per applied event, ``gid`` global, ``seq`` gapless per KB."""

    _INSERT: Final = (
        "INSERT INTO log (kb, seq, event, last_in_delivery, analysis) VALUES (?, ?, ?, ?, ?)"
    )
    _INSERT_BULK: Final = (
        "INSERT INTO log (kb, seq, event, last_in_delivery, analysis)"
        " SELECT value ->> 0, value ->> 1, substr(?2, value ->> 2, value ->> 3), value ->> 4,"
        " CASE WHEN value ->> 6 > 0 THEN substr(?3, value ->> 5, value ->> 6) END"
        " FROM json_each(?1) ORDER BY key"
    )
    _READ: Final = (
        "SELECT gid, kb, seq, event, last_in_delivery, analysis FROM log"
        " WHERE gid > ? ORDER BY gid LIMIT ?"
    )
    _READ_WITHOUT: Final = (  # a file older code made, opened read-only: no analysis column
        "SELECT gid, kb, seq, event, last_in_delivery, NULL FROM log"
        " WHERE gid > ? ORDER BY gid LIMIT ?"
    )

    def __init__(
        self, reader: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    ) -> None:
        self._reader = reader
        self._read_sql: str | None = None  # _READ, or _READ_WITHOUT for an older file

    @classmethod
    def append(
        cls, conn: sqlite3.Connection, entries: list[tuple[str, int, Event, bool, bytes | None]]
    ) -> None:
        """Append (kb, seq, event, last_in_delivery, analysis) rows in the caller's
        transaction; ``analysis`` is ``analysis_of(event)``, computed once by the appending
        process for every process following the log (the store's analyser thread).

        Rows go in in the order given (commit order), so ``gid`` order is delivery order. The
        encoded events travel as one blob (substr() of a BLOB counts bytes), each row cut out of
        it by offset and length, the analyses as a second; the rows' JSON travels as text
        (``json_text``).
        """
        if not entries:
            return
        payloads = [encode_for_log(entry[2]) for entry in entries]
        rows = []
        offset = at = 1  # substr() counts from 1
        for (kb, seq, _, last, analysis), payload in zip(entries, payloads, strict=True):
            size = len(analysis) if analysis else 0
            rows.append((kb, seq, offset, len(payload), int(last), at, size))
            offset += len(payload)
            at += size
        meta = json_text(rows)
        if meta is None:
            conn.executemany(
                cls._INSERT,
                [(e[0], e[1], p, e[3], e[4]) for e, p in zip(entries, payloads, strict=True)],
            )
        else:
            analyses = b"".join(entry[4] for entry in entries if entry[4])
            conn.execute(cls._INSERT_BULK, (meta, b"".join(payloads), analyses))

    def _read_statement(self, conn: sqlite3.Connection) -> str:
        if self._read_sql is None:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(log)")}
            self._read_sql = self._READ if "analysis" in columns else self._READ_WITHOUT
        return self._read_sql

    def read(self, after_gid: int, limit: int = 10_000) -> list[LogRecord]:
        """Records after ``after_gid``, whole deliveries only (one bigger than limit: whole)."""
        limit = max(1, limit)
        with self._reader() as conn, read_transaction(conn):
            read = self._read_statement(conn)
            rows = conn.execute(read, (after_gid, limit)).fetchall()
            if rows and not rows[-1][4]:
                cut = next((i for i in range(len(rows) - 1, -1, -1) if rows[i][4]), None)
                if cut is not None:
                    rows = rows[: cut + 1]
                else:  # one delivery longer than limit: read on to its end
                    while not rows[-1][4]:
                        more = conn.execute(read, (rows[-1][0], limit)).fetchall()
                        if not more:  # cannot happen: deliveries commit whole
                            break
                        end = next((i for i, row in enumerate(more) if row[4]), len(more) - 1)
                        rows.extend(more[: end + 1])
        decode = document.decode
        return [
            LogRecord(gid, kb, seq, decode_from_log(payload), bool(last), decode(analysis))
            for gid, kb, seq, payload, last, analysis in rows
        ]
