"""The store's SQLite schema, its version and migrations."""

from __future__ import annotations

import sqlite3
import uuid
from typing import Final

from kbgraph.store.model import NewerSchema

# 2: concept.aliases; 3: no FTS5 tables (search is answered from memory, kbgraph.search);
# 4: webhook_id (which KB a signed delivery's webhook-id was accepted for); 5: webhook_message,
# keyed by webhook-id and body digest (independent senders may pick the same webhook-id);
# 6: meta (the store's id, where the log starts after a cut); no link_dst index (nothing read
# it; every link write paid for it); kb.keys and accepted.n (the retention of dedupe keys);
# 7: a concept's declared links are a column of its row (a JSON array, sorted), not link rows;
# stream_note (the messages of a replicated log that applied nothing, and why) is added to 7
# as it is: a new table that older code never reads, so no version of its own; so is
# stream_result (what each recent delivery of the stream answered, read by a node's workers);
# and log.analysis (an upsert's text analysed once by the writer, kbgraph.search.document): a
# nullable column older code neither writes nor reads, a row without it analysed by the reader;
# and vector (a concept's vector per model with the hash of the text it was computed from,
# or the provider's refusal of that text: kbgraph.store.vectorrows), a rowid table since a
# WITHOUT ROWID one put each 1 KB row on an overflow page of its own (4.7 KB written a vector;
# ``_vector_rowid`` rebuilds an older file's: the same columns and key, so older code reads
# and writes it as before)
SCHEMA_VERSION: Final = 7

_TABLES: Final = """
CREATE TABLE IF NOT EXISTS kb (
    kid INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    seq INTEGER NOT NULL DEFAULT 0,
    keys INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS log (
    gid INTEGER PRIMARY KEY,
    kb TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    last_in_delivery INTEGER NOT NULL,
    analysis BLOB,
    UNIQUE (kb, seq)
);
CREATE TABLE IF NOT EXISTS concept (
    rid INTEGER PRIMARY KEY,
    kid INTEGER NOT NULL,
    id TEXT NOT NULL,
    version INTEGER NOT NULL,
    title TEXT NOT NULL,
    aliases TEXT NOT NULL DEFAULT '[]',
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    tags TEXT NOT NULL,
    text TEXT NOT NULL,
    links TEXT NOT NULL DEFAULT '[]',
    UNIQUE (kid, id)
);
CREATE TABLE IF NOT EXISTS tombstone (
    kid INTEGER NOT NULL,
    id TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (kid, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS accepted (
    kid INTEGER NOT NULL,
    source TEXT NOT NULL,
    id TEXT NOT NULL,
    n INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (kid, source, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS webhook_message (
    id TEXT NOT NULL,
    digest BLOB NOT NULL,
    kb TEXT NOT NULL,
    received_at REAL NOT NULL,
    PRIMARY KEY (id, digest)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS webhook_message_received ON webhook_message (received_at);
CREATE TABLE IF NOT EXISTS log_position (
    stream TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS stream_note (
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    message_id TEXT,  -- a skipped delivery's signed webhook message: its re-sends are skipped
    message_digest BLOB,
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stream_result (
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    result BLOB,  -- the DeliveryResult as JSON, or NULL with the refusal
    refusal TEXT,  -- 'replay' or 'kb_limit': the delivery's own refusal (401, 403)
    detail TEXT,
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS vector (
    kb TEXT NOT NULL,
    concept TEXT NOT NULL,
    model TEXT NOT NULL,
    text_hash BLOB NOT NULL,  -- of the text embedded (kbgraph.embeddings.text_hash)
    vec BLOB,  -- float32 little-endian, unit length, or NULL: the provider refused the text
    problem TEXT,  -- the refusal, when vec is NULL
    UNIQUE (kb, model, concept)
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value NOT NULL
) WITHOUT ROWID;
"""


def create_or_migrate(conn: sqlite3.Connection) -> None:
    """Bring the file's schema to ``SCHEMA_VERSION`` (call inside a write transaction)."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise NewerSchema(
            f"store schema version {found} is newer than this kbgraph understands"
            f" ({SCHEMA_VERSION}): a newer kbgraph wrote it; run that version, or restore the"
            " copy taken before the upgrade"
        )
    for statement in _TABLES.split(";"):
        if statement.strip():
            conn.execute(statement)
    if 0 < found < SCHEMA_VERSION:
        _migrate(conn)
    _vector_rowid(conn)
    if "analysis" not in {row[1] for row in conn.execute("PRAGMA table_info(log)")}:
        conn.execute("ALTER TABLE log ADD COLUMN analysis BLOB")  # see SCHEMA_VERSION
    conn.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', ?), ('log_start', 1)",
        (uuid.uuid4().hex,),
    )
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def set_auto_vacuum(conn: sqlite3.Connection) -> None:
    """A new file frees the pages a log cut empties (``PRAGMA incremental_vacuum``); SQLite
    takes this only before the first table exists (an older file keeps its setting)."""
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")


_VECTOR_COLUMNS: Final = "kb, concept, model, text_hash, vec, problem"


def _vector_rowid(conn: sqlite3.Connection) -> None:
    """An older file's ``vector`` table, WITHOUT ROWID, rebuilt as the rowid table of
    ``_TABLES`` with its rows: in an index b-tree a row of over ~1,000 bytes (a 256-float
    vector and its key) spills to an overflow page of its own, in a table b-tree's leaf it
    fits."""
    row = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'vector'").fetchone()
    if row is None or "WITHOUT ROWID" not in row[0].upper():
        return
    conn.execute("ALTER TABLE vector RENAME TO vector_before")
    for statement in _TABLES.split(";"):
        if "TABLE IF NOT EXISTS vector (" in statement:
            conn.execute(statement)
    conn.execute(
        f"INSERT INTO vector ({_VECTOR_COLUMNS}) SELECT {_VECTOR_COLUMNS} FROM vector_before"
        " ORDER BY kb, model, concept"
    )
    conn.execute("DROP TABLE vector_before")


def _migrate(conn: sqlite3.Connection) -> None:
    """Schema 1-4 -> 5: concepts gain ``aliases`` (2); the per-KB FTS5 tables go (3); the
    ``webhook_message`` table (5) is created with the others and replaces ``webhook_id`` (4),
    whose rows (at most ten minutes of deliveries) are forgotten; ``meta`` (6) is created with
    the others and filled by the caller, the unread ``link_dst`` index goes and accepted keys
    are numbered (6: the keys of an older file count as accepted before every new one); each
    concept's link rows become its ``links`` column and the link table goes (7)."""
    conn.execute("DROP TABLE IF EXISTS webhook_id")
    for table, column in (("kb", "keys"), ("accepted", "n")):
        if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
    if "links" not in {row[1] for row in conn.execute("PRAGMA table_info(concept)")}:
        conn.execute("ALTER TABLE concept ADD COLUMN links TEXT NOT NULL DEFAULT '[]'")
    if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'link'").fetchone():
        conn.execute(
            "UPDATE concept SET links = (SELECT json_group_array(dst) FROM"
            " (SELECT dst FROM link WHERE link.kid = concept.kid AND link.src = concept.id"
            " ORDER BY dst)) WHERE EXISTS (SELECT 1 FROM link"
            " WHERE link.kid = concept.kid AND link.src = concept.id)"
        )
        conn.execute("DROP TABLE link")  # its index link_dst goes with it
    columns = {row[1] for row in conn.execute("PRAGMA table_info(concept)")}
    if "aliases" not in columns:
        conn.execute("ALTER TABLE concept ADD COLUMN aliases TEXT NOT NULL DEFAULT '[]'")
    fts_tables = conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name GLOB 'fts_[0-9]*'"
        " AND sql LIKE 'CREATE VIRTUAL TABLE%'"
    ).fetchall()
    for (name,) in fts_tables:
        conn.execute(f'DROP TABLE "{name}"')
