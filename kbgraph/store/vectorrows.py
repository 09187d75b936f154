"""Vectors as durable derived data: one row per (KB, model, concept) holding the vector of the
text whose hash it names, or the provider's refusal of that text.

A row answers a look-up only when its hash is the hash of the concept's text now, so a changed
text (or another model) is embedded again while an unchanged one never is, whichever process
asks, after a restart with or without a checkpoint. Rows of a deleted concept or of a model no
longer configured are pruned (``stale`` then ``prune``).

Rows from a replicated log (the cluster embedder's, ``kbgraph.log.jetstream.embedder``) are
``take``-n in the log's order, only for the concept's text as the store holds it at that
position, and only where no row for that text is held yet: a row for an older text (a message
published again after the text changed) is stale, and a second row for the same text (two
embedders at once, or a replay) changes nothing. So every store that applied the same log
holds the same rows, whatever was published again or by whom.
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

import msgspec
import numpy as np

from kbgraph.embeddings import concept_text, text_hash
from kbgraph.store import statements as sql
from kbgraph.store.eventlog import json_text

_ids = msgspec.json.Encoder()


class VectorRow(NamedTuple):
    concept: str
    text_hash: bytes
    vector: np.ndarray | None  # float32; None: refused
    problem: str


def read(conn: sqlite3.Connection, kb: str, model: str, concepts: list[str]) -> list[VectorRow]:
    """The stored rows of ``concepts`` (any hash: the caller compares)."""
    if not concepts:
        return []
    ids = _ids.encode(concepts).decode()
    return [
        VectorRow(
            concept,
            bytes(digest),
            None if vec is None else np.frombuffer(vec, "<f4").astype(np.float32),
            problem or "",
        )
        for concept, digest, vec, problem in conn.execute(sql.VECTORS_GET, (kb, model, ids))
    ]


def write(conn: sqlite3.Connection, kb: str, model: str, rows: list[VectorRow]) -> None:
    """Store ``rows`` (call inside a write transaction), in order: a concept's last row wins.

    One statement for them all (``VECTORS_PUT``): the hashes and the vectors travel as two
    blobs, each row cut out of them by offset and length, the rest as JSON text (row by row
    when a concept or a refusal holds U+0000, which SQLite's JSON functions cut at)."""
    if not rows or _write_even(conn, kb, model, rows):
        return
    vectors = [None if r.vector is None else np.asarray(r.vector, "<f4").tobytes() for r in rows]
    meta = []
    at = vec_at = 1  # substr() counts from 1; a vector at 0 is none (refused)
    for r, vec in zip(rows, vectors, strict=True):
        size = len(vec) if vec is not None else 0
        meta.append(
            (r.concept, at, len(r.text_hash), vec_at if vec is not None else 0, size,
             None if vec is not None else r.problem)
        )  # fmt: skip
        at += len(r.text_hash)
        vec_at += size
    payload = json_text(meta)
    if payload is None:
        conn.executemany(
            sql.VECTOR_PUT,
            [
                (kb, r.concept, model, r.text_hash, vec, None if vec is not None else r.problem)
                for r, vec in zip(rows, vectors, strict=True)
            ],
        )
        return
    # a byte after each: an empty bytes binds as NULL (no row holds none, a vector may be empty)
    hashes = b"".join(r.text_hash for r in rows) + b"\0"
    blob = b"".join(vec for vec in vectors if vec is not None) + b"\0"
    conn.execute(sql.VECTORS_PUT, (kb, model, hashes, blob, payload))


def _write_even(conn: sqlite3.Connection, kb: str, model: str, rows: list[VectorRow]) -> bool:
    """``write`` of rows that all hold a vector, each of one size and with a hash of one size
    (the carried vectors of a delivery): the vectors stacked into one blob in one step, each
    row's cut of the blobs found from its place in the concepts' JSON array (``key``), no
    per-row offsets. False (nothing written) for other rows."""
    hash_size = len(rows[0].text_hash)
    first = rows[0].vector
    if first is None or first.ndim != 1 or not first.size or not hash_size:
        return False
    shape = first.shape
    if any(r.vector is None or r.vector.shape != shape or len(r.text_hash) != hash_size
           for r in rows):  # fmt: skip
        return False
    ids = json_text([r.concept for r in rows])
    if ids is None:
        return False
    vectors = [r.vector for r in rows if r.vector is not None]  # every one (checked above)
    blob = np.stack(vectors).astype("<f4", copy=False).tobytes()
    hashes = b"".join(r.text_hash for r in rows)
    conn.execute(sql.VECTORS_PUT_EVEN, (kb, model, hashes, blob, ids, hash_size, 4 * shape[0]))
    return True


def take(
    conn: sqlite3.Connection, kb: str, model: str, max_chars: int, rows: list[VectorRow]
) -> tuple[int, int, int]:
    """Store those of ``rows`` computed from their concept's text now (its first ``max_chars``
    characters as embedded, ``kbgraph.embeddings.concept_text``) whose concept holds no row
    for that text yet (call inside the writer's transaction, in the log's order). Returns
    (taken, held already, stale): a row of another text, or of no concept, is stale."""
    current: dict[str, tuple[bytes, bytes | None]] = {}
    names = sql.tags_decoder.decode
    if max_chars > 0:  # 0: a message without its cut (older code) proves no text
        ids = _ids.encode(list({r.concept for r in rows})).decode()
        for cid, title, aliases, tags, text, held in conn.execute(
            sql.VECTORS_CURRENT, (kb, model, ids)
        ):
            embedded = concept_text(title, names(aliases), names(tags), text)
            current[cid] = (text_hash(embedded[:max_chars]), None if held is None else bytes(held))
    taken: list[VectorRow] = []
    held = stale = 0
    for row in rows:
        now = current.get(row.concept)
        if now is None or row.text_hash != now[0]:
            stale += 1
        elif now[1] == now[0]:
            held += 1
        else:
            taken.append(row)
            current[row.concept] = (now[0], now[0])  # a second row for it in this message
    write(conn, kb, model, taken)
    return len(taken), held, stale


def stale(conn: sqlite3.Connection, model: str | None) -> list[tuple[str, str, str]]:
    """(kb, model, concept) of the rows of another model than ``model`` (every row when
    None) or of a concept the store no longer holds."""
    return [tuple(row) for row in conn.execute(sql.VECTORS_STALE, (model,))]


def prune(conn: sqlite3.Connection, model: str | None, keys: list[tuple[str, str, str]]) -> int:
    """Delete the rows of ``keys`` that are still stale (call inside a write transaction)."""
    before = conn.total_changes
    conn.executemany(sql.VECTOR_PRUNE, [(*key, model) for key in keys])
    return conn.total_changes - before
