"""Vectors as durable derived data: one row per (KB, model, concept) holding the vector of the
text whose hash it names, or the provider's refusal of that text.

A row answers a look-up only when its hash is the hash of the concept's text now, so a changed
text (or another model) is embedded again while an unchanged one never is, whichever process
asks, after a restart with or without a checkpoint. Rows of a deleted concept or of a model no
longer configured are pruned (``stale`` then ``prune``).
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

import msgspec
import numpy as np

from kbgraph.store import statements as sql

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
    """Store ``rows`` (call inside a write transaction)."""
    conn.executemany(
        sql.VECTOR_PUT,
        [
            (
                kb,
                r.concept,
                model,
                r.text_hash,
                None if r.vector is None else np.asarray(r.vector, "<f4").tobytes(),
                None if r.vector is not None else r.problem,
            )
            for r in rows
        ],
    )


def stale(conn: sqlite3.Connection, model: str | None) -> list[tuple[str, str, str]]:
    """(kb, model, concept) of the rows of another model than ``model`` (every row when
    None) or of a concept the store no longer holds."""
    return [tuple(row) for row in conn.execute(sql.VECTORS_STALE, (model,))]


def prune(conn: sqlite3.Connection, model: str | None, keys: list[tuple[str, str, str]]) -> int:
    """Delete the rows of ``keys`` that are still stale (call inside a write transaction)."""
    before = conn.total_changes
    conn.executemany(sql.VECTOR_PRUNE, [(*key, model) for key in keys])
    return conn.total_changes - before
