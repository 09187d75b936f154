"""Keeping the log bounded: where it starts, the checks a checkpoint must pass before the log
after it is followed, and the cut (``Store.cut_log`` runs it in a write transaction).

The cut deletes the log's records before a checkpoint's gid, never the newest record (the next
``gid`` counts on it: SQLite gives a new row the largest rowid plus one), and the accepted keys
past each KB's retention; versions and tombstones live in the state tables and stay.
"""

from __future__ import annotations

import hashlib
import sqlite3

from kbgraph.store import statements as sql


def log_start(conn: sqlite3.Connection) -> int:
    """The first gid the log may still hold: every record before it was cut."""
    start: int = conn.execute(sql.META_GET, ("log_start",)).fetchone()[0]
    return start


def mark_at(conn: sqlite3.Connection, gid: int) -> tuple[str, int, str] | None:
    """(kb, seq, digest of the event) of the log record at ``gid``, None when it is not held."""
    row = conn.execute(sql.LOG_MARK, (gid,)).fetchone()
    return None if row is None else (row[0], row[1], _digest(row[2]))


def follow_problem(
    conn: sqlite3.Connection, gid: int, mark: tuple[str, int, str] | None
) -> str | None:
    """Why the log cannot be followed from ``gid`` by a state made at the record ``mark``, or
    None when it can (call in a read transaction)."""
    last = conn.execute(sql.LOG_LAST).fetchone()[0]
    start = log_start(conn)
    if gid > last:
        return f"at gid {gid}, beyond the log's last ({last}): the store is older"
    if gid + 1 < start:
        return f"at gid {gid}, before the log's start ({start}): its follow-up was cut"
    if gid and mark_at(conn, gid) != mark:
        return f"the log's record at gid {gid} is not the one it was made at"
    return None


def cut(conn: sqlite3.Connection, before_gid: int, dedupe_keys: int) -> int:
    """Delete the log before ``before_gid`` and the keys decide() no longer looks at (call in
    a write transaction); returns the rows deleted."""
    last = conn.execute(sql.LOG_LAST).fetchone()[0]
    start = log_start(conn)
    point = min(before_gid, last)
    deleted = 0
    if point > start:
        deleted = conn.execute(sql.LOG_CUT, (point,)).rowcount
        conn.execute(sql.META_SET, ("log_start", point))
    for kid, count in conn.execute(sql.KB_KEYS).fetchall():
        if count > dedupe_keys:
            deleted += conn.execute(sql.KEYS_FORGET, (kid, count - dedupe_keys)).rowcount
    return deleted


def free_pages(conn: sqlite3.Connection) -> None:
    """Give the pages a cut emptied back to the disk (a file made with auto_vacuum=INCREMENTAL;
    an older one keeps them for reuse). Outside a transaction."""
    conn.executescript("PRAGMA incremental_vacuum")  # steps to the end, unlike execute()


def _digest(event: bytes) -> str:
    return hashlib.blake2b(event, digest_size=16).hexdigest()
