"""The SQL a group of deliveries runs, and the two ways each statement takes many rows.

Bulk writes and lookups pass all their rows as ONE JSON parameter read with json_each: one
sqlite3_step per statement instead of one per row. That matters beyond SQLite's own cost: the
sqlite3 module releases and re-takes the GIL around every step, and each re-take can wait
behind the event loop or the projection thread. The JSON parameter is always text, never a
BLOB (``eventlog.json_text``: from SQLite 3.45 a BLOB is read as binary JSONB). SQLite's JSON
functions cut text at U+0000, so a payload holding one falls back to ``executemany``, row by
row.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final, NamedTuple

import msgspec

from kbgraph.store.decide import Subject
from kbgraph.store.eventlog import json_text

_CHUNK: Final = 5_000  # ids per json_each lookup
tags_encoder = msgspec.json.Encoder()  # tags, aliases and links (stored as text: .decode())
tags_decoder = msgspec.json.Decoder(list[str])
links_decoder = tags_decoder
rows_decoder = msgspec.json.Decoder(list[list[Any]])  # a row: whatever its columns hold


class Bulk(NamedTuple):
    """One write over many rows: ``json`` takes (?1 rows as JSON, ?2 kid); ``many`` (kid, *row).
    A row's items at ``lists`` are lists of strings stored as JSON text: arrays inside the rows'
    JSON (``json`` reads each with ``->``, SQLite's JSON text of it: msgspec's bytes, encoded
    once), encoded alone for ``many``."""

    json: str
    many: str
    json_takes_kid: bool = True
    lists: tuple[int, ...] = ()


class Lookup(NamedTuple):
    """Rows matching many keys: ``json`` answers one JSON array; ``one`` is per key."""

    json: str
    one: str


def bulk(conn: sqlite3.Connection, statement: Bulk, kid: int, rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    payload = json_text(rows)
    if payload is None:
        if statement.lists:
            rows = [_lists_as_text(row, statement.lists) for row in rows]
        conn.executemany(statement.many, [(kid, *row) for row in rows])
    else:
        conn.execute(statement.json, (payload, kid) if statement.json_takes_kid else (payload,))


def _lists_as_text(row: tuple[Any, ...], lists: tuple[int, ...]) -> tuple[Any, ...]:
    items = list(row)
    for at in lists:
        items[at] = tags_encoder.encode(items[at]).decode()
    return tuple(items)


def lookup(
    conn: sqlite3.Connection, statement: Lookup, kid: int, keys: list[str] | list[tuple[str, str]]
) -> list[list[Any]]:
    out: list[list[Any]] = []
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        payload = json_text(chunk)
        if payload is None:
            for key in chunk:
                params = (kid, *key) if isinstance(key, tuple) else (kid, key)
                out.extend(list(row) for row in conn.execute(statement.one, params))
        else:
            out.extend(
                rows_decoder.decode(conn.execute(statement.json, (payload, kid)).fetchone()[0])
            )
    return out


META_GET: Final = "SELECT value FROM meta WHERE key = ?"
META_SET: Final = "UPDATE meta SET value = ?2 WHERE key = ?1"
LOG_LAST: Final = "SELECT coalesce(max(gid), 0) FROM log"
LOG_MARK: Final = "SELECT kb, seq, event FROM log WHERE gid = ?"
LOG_CUT: Final = "DELETE FROM log WHERE gid < ?"
KB_GET: Final = "SELECT kid, seq FROM kb WHERE name = ?"
KB_ROW: Final = "SELECT kid, seq, keys FROM kb WHERE name = ?"
KB_SET_KEYS: Final = "UPDATE kb SET keys = ? WHERE kid = ?"
KB_COUNT: Final = "SELECT count(*) FROM kb"
MESSAGE_GET: Final = "SELECT kb, received_at FROM webhook_message WHERE id = ? AND digest = ?"
MESSAGES_GET: Final = (  # ?1: the webhook-ids as a JSON array (a row per body of each)
    "SELECT id, digest, kb, received_at FROM webhook_message"
    " WHERE id IN (SELECT value FROM json_each(?1))"
)
MESSAGE_PUT: Final = (
    "INSERT OR REPLACE INTO webhook_message (id, digest, kb, received_at) VALUES (?, ?, ?, ?)"
)
MESSAGE_PRUNE: Final = "DELETE FROM webhook_message WHERE received_at < ?"
KB_NEW: Final = "INSERT INTO kb (name, seq) VALUES (?, 0) RETURNING kid"
KB_SET_SEQ: Final = "UPDATE kb SET seq = ? WHERE kid = ?"
POSITION_GET: Final = "SELECT seq FROM log_position WHERE stream = ?"
POSITION_SET: Final = (
    "INSERT INTO log_position (stream, seq) VALUES (?, ?)"
    " ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq"
)
SEEN: Final = Lookup(
    "SELECT json_group_array(json_array(a.source, a.id, a.n)) FROM json_each(?1) AS j"
    " CROSS JOIN accepted AS a"
    " ON a.kid = ?2 AND a.source = j.value ->> 0 AND a.id = j.value ->> 1",
    "SELECT source, id, n FROM accepted WHERE kid = ?1 AND source = ?2 AND id = ?3",
)
SUBJECTS: Final = Lookup(
    "SELECT json_group_array(json_array(j.value, c.rid, c.version, t.version, json(c.links)))"
    " FROM json_each(?1) AS j"
    " LEFT JOIN concept AS c ON c.kid = ?2 AND c.id = j.value"
    " LEFT JOIN tombstone AS t ON t.kid = ?2 AND t.id = j.value"
    " WHERE c.rid IS NOT NULL OR t.version IS NOT NULL",
    "SELECT ?2, c.rid, c.version, t.version, c.links FROM (SELECT 1)"
    " LEFT JOIN concept AS c ON c.kid = ?1 AND c.id = ?2"
    " LEFT JOIN tombstone AS t ON t.kid = ?1 AND t.id = ?2"
    " WHERE c.rid IS NOT NULL OR t.version IS NOT NULL",
)
# A key past the retention may be accepted again: it takes its new number.
ACCEPT: Final = Bulk(
    "INSERT INTO accepted (kid, source, id, n)"
    " SELECT ?2, value ->> 0, value ->> 1, value ->> 2 FROM json_each(?1) WHERE true"
    " ON CONFLICT DO UPDATE SET n = excluded.n",
    "INSERT INTO accepted (kid, source, id, n) VALUES (?1, ?2, ?3, ?4)"
    " ON CONFLICT DO UPDATE SET n = excluded.n",
)
KB_KEYS: Final = "SELECT kid, keys FROM kb"
KEYS_FORGET: Final = "DELETE FROM accepted WHERE kid = ? AND n <= ?"
# New and rewritten concepts in one statement (an updated row keeps its rid). Links are the
# concept's declared out-links, a sorted JSON array (to missing concepts too).
UPSERT: Final = Bulk(
    "INSERT INTO concept (kid, id, version, title, type, status, tags, text, aliases, links)"
    " SELECT ?2, value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4,"
    " value -> 5, value ->> 6, value -> 7, value -> 8 FROM json_each(?1) WHERE true"
    " ON CONFLICT (kid, id) DO UPDATE SET version = excluded.version,"
    " title = excluded.title, type = excluded.type, status = excluded.status,"
    " tags = excluded.tags, text = excluded.text, aliases = excluded.aliases,"
    " links = excluded.links",
    "INSERT INTO concept (kid, id, version, title, type, status, tags, text, aliases, links)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
    " ON CONFLICT (kid, id) DO UPDATE SET version = excluded.version,"
    " title = excluded.title, type = excluded.type, status = excluded.status,"
    " tags = excluded.tags, text = excluded.text, aliases = excluded.aliases,"
    " links = excluded.links",
    lists=(5, 7, 8),
)
# Only link events: a new version and link list for an existing row.
SET_LINKS: Final = Bulk(
    "UPDATE concept SET version = j.value ->> 1, links = j.value -> 2 FROM json_each(?1) AS j"
    " WHERE concept.rid = j.value ->> 0",
    "UPDATE concept SET version = ?3, links = ?4 WHERE rid = ?2",
    json_takes_kid=False,
    lists=(2,),
)
DELETE_CONCEPT: Final = Bulk(
    "DELETE FROM concept WHERE rid IN (SELECT value ->> 0 FROM json_each(?1))",
    "DELETE FROM concept WHERE rid = ?2",
    json_takes_kid=False,
)
TOMBSTONE: Final = Bulk(
    "INSERT OR REPLACE INTO tombstone (kid, id, version)"
    " SELECT ?2, value ->> 0, value ->> 1 FROM json_each(?1)",
    "INSERT OR REPLACE INTO tombstone (kid, id, version) VALUES (?1, ?2, ?3)",
)
UNTOMBSTONE: Final = Bulk(
    "DELETE FROM tombstone WHERE kid = ?2 AND id IN (SELECT value ->> 0 FROM json_each(?1))",
    "DELETE FROM tombstone WHERE kid = ?1 AND id = ?2",
)


def write_subjects(conn: sqlite3.Connection, kid: int, subjects: dict[str, Subject]) -> None:
    """The net effect of the group on each touched concept, one statement per kind."""
    upsert_rows: list[tuple[str, int, str, str, str, list[str], str, list[str], list[str]]] = []
    set_links: list[tuple[int, int, list[str]]] = []
    delete_rows: list[tuple[int]] = []
    tombstones: list[tuple[str, int]] = []
    untombstone: list[tuple[str]] = []
    for cid, subject in subjects.items():
        if not subject.touched:
            continue
        version = subject.version
        assert version is not None
        rid = subject.rid
        if subject.exists:
            if subject.fields is not None:  # rewritten: its links are the upsert's, patched
                data = subject.fields.data
                upsert_rows.append(
                    (cid, version, data.title, data.type, data.status, data.tags, data.text,
                     data.aliases, sorted(subject.links))
                )  # fmt: skip
            else:  # only link events: the concept existed before and still does
                assert rid is not None
                links = set(subject.stored_links) - subject.removed | subject.added
                set_links.append((rid, version, sorted(links)))
            if subject.had_tombstone:
                untombstone.append((cid,))
        else:
            if rid is not None:
                delete_rows.append((rid,))
            tombstones.append((cid, version))
    bulk(conn, DELETE_CONCEPT, kid, delete_rows)
    bulk(conn, UPSERT, kid, upsert_rows)
    bulk(conn, SET_LINKS, kid, set_links)
    bulk(conn, TOMBSTONE, kid, tombstones)
    bulk(conn, UNTOMBSTONE, kid, untombstone)


# --- vectors (kbgraph.store.vectorrows) ------------------------------------------------------

# CROSS JOIN: the ids outer, each one seek (a plain JOIN let SQLite scan every row of the KB's
# model per call: reading 1M stored vectors back, 512 at a time, took hours)
VECTORS_GET: Final = (
    "SELECT v.concept, v.text_hash, v.vec, v.problem FROM json_each(?3) j"
    " CROSS JOIN vector v ON v.kb = ?1 AND v.model = ?2 AND v.concept = j.value"
)
# rows of another model, or of a concept the store no longer holds (deleted; or a KB unknown)
VECTORS_STALE: Final = (
    "SELECT v.kb, v.model, v.concept FROM vector v WHERE v.model IS NOT ?1 OR NOT EXISTS"
    " (SELECT 1 FROM kb k JOIN concept c ON c.kid = k.kid AND c.id = v.concept"
    " WHERE k.name = v.kb)"
)
# the same test again, per row, inside the deleting transaction (a concept re-created since)
VECTOR_PRUNE: Final = (
    "DELETE FROM vector WHERE kb = ?1 AND model = ?2 AND concept = ?3 AND (model IS NOT ?4"
    " OR NOT EXISTS (SELECT 1 FROM kb k JOIN concept c ON c.kid = k.kid AND c.id = ?3"
    " WHERE k.name = ?1))"
)
# what a stream's vectors are checked against: each concept's text now, and its stored row
VECTORS_CURRENT: Final = (
    "SELECT c.id, c.title, c.aliases, c.tags, c.text, v.text_hash FROM json_each(?3) j"
    " JOIN kb k ON k.name = ?1 JOIN concept c ON c.kid = k.kid AND c.id = j.value"
    " LEFT JOIN vector v ON v.kb = ?1 AND v.model = ?2 AND v.concept = c.id"
)
_VECTOR_SET: Final = (
    " ON CONFLICT (kb, model, concept) DO UPDATE SET text_hash = excluded.text_hash,"
    " vec = excluded.vec, problem = excluded.problem"
)
VECTOR_PUT: Final = (
    "INSERT INTO vector (kb, concept, model, text_hash, vec, problem) VALUES (?, ?, ?, ?, ?, ?)"
    + _VECTOR_SET
)
# many rows (kbgraph.store.vectorrows.write): ?1 kb, ?2 model, ?3 the hashes and ?4 the
# vectors one after another, ?5 each row's [concept, hash at, its length, vector at (0: none,
# refused), its length, problem]
VECTORS_PUT: Final = (
    "INSERT INTO vector (kb, concept, model, text_hash, vec, problem)"
    " SELECT ?1, value ->> 0, ?2, substr(?3, value ->> 1, value ->> 2),"
    " CASE WHEN value ->> 3 > 0 THEN substr(?4, value ->> 3, value ->> 4) END, value ->> 5"
    " FROM json_each(?5) WHERE true ORDER BY key" + _VECTOR_SET
)
# ``VECTORS_PUT`` for rows of one hash size (?6) and one vector size (?7), each holding a
# vector: ?5 the concepts, row i's hash and vector at i times their size
VECTORS_PUT_EVEN: Final = (
    "INSERT INTO vector (kb, concept, model, text_hash, vec, problem)"
    " SELECT ?1, value, ?2, substr(?3, key * ?6 + 1, ?6), substr(?4, key * ?7 + 1, ?7), NULL"
    " FROM json_each(?5) WHERE true ORDER BY key" + _VECTOR_SET
)
