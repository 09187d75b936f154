"""The store's SQLite schema, its version and migrations, and the per-KB FTS5 tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

SCHEMA_VERSION: Final = 2  # 2: concept.aliases, FTS5 (title, aliases, text)

_TABLES: Final = """
CREATE TABLE IF NOT EXISTS kb (
    kid INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS log (
    gid INTEGER PRIMARY KEY,
    kb TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    last_in_delivery INTEGER NOT NULL,
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
    UNIQUE (kid, id)
);
CREATE TABLE IF NOT EXISTS tombstone (
    kid INTEGER NOT NULL,
    id TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (kid, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS link (
    kid INTEGER NOT NULL,
    src TEXT NOT NULL,
    dst TEXT NOT NULL,
    PRIMARY KEY (kid, src, dst)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS link_dst ON link (kid, dst, src);
CREATE TABLE IF NOT EXISTS accepted (
    kid INTEGER NOT NULL,
    source TEXT NOT NULL,
    id TEXT NOT NULL,
    PRIMARY KEY (kid, source, id)
) WITHOUT ROWID;
"""


def fts_table(kid: int) -> str:
    """The FTS5 table of one KB: one per KB, so BM25 statistics never mix KBs."""
    return f"fts_{int(kid)}"


FTS_COLUMNS: Final = "title, aliases, text"
FTS_WEIGHTS: Final = "10.0, 10.0, 1.0"  # aliases are searched like the title
# A concept's aliases as the FTS5 column holds them: one per line (a JSON escape such as
# ``\n`` must not become a token, so the JSON list is never indexed as it is).
FTS_ALIASES: Final = "(SELECT coalesce(group_concat(value, char(10)), '') FROM json_each({}))"


def fts_match(terms: list[str]) -> str:
    """An FTS5 MATCH expression that interprets no syntax: each term quoted, joined by OR."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def create_or_migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the file's schema to ``SCHEMA_VERSION`` (call inside a write transaction)."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise RuntimeError(
            f"{path}: store schema version {found} is newer than this kbgraph "
            f"understands ({SCHEMA_VERSION})"
        )
    for statement in _TABLES.split(";"):
        if statement.strip():
            conn.execute(statement)
    if found == 1:
        _migrate_from_1(conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _migrate_from_1(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2: concepts gain ``aliases``; each KB's FTS5 table gains the column."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(concept)")}
    if "aliases" not in columns:
        conn.execute("ALTER TABLE concept ADD COLUMN aliases TEXT NOT NULL DEFAULT '[]'")
    for (kid,) in conn.execute("SELECT kid FROM kb").fetchall():
        fts = fts_table(kid)
        conn.execute(f"DROP TABLE IF EXISTS {fts}")
        create_fts(conn, kid)
        conn.execute(
            f"INSERT INTO {fts} (rowid, {FTS_COLUMNS}) SELECT rid, title,"
            f" {FTS_ALIASES.format('aliases')}, text FROM concept WHERE kid = ?",
            (kid,),
        )


def create_fts(conn: sqlite3.Connection, kid: int) -> None:
    # Its own content (not external): a row leaves the index by rowid alone.
    conn.execute(
        f"CREATE VIRTUAL TABLE {fts_table(kid)} USING fts5({FTS_COLUMNS},"
        " tokenize = 'unicode61 remove_diacritics 2')"
    )
