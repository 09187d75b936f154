"""The store's lookups by a JSON list of ids walk the list and seek each id: a plan that scans
the table for every call costs the whole KB per batch (reading a million stored vectors back,
512 at a time, took hours that way). Read from SQLite's own ``EXPLAIN QUERY PLAN``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kbgraph.store import Store
from kbgraph.store import statements as sql


@pytest.mark.parametrize(
    ("statement", "params", "seek", "key"),
    [
        (sql.VECTORS_GET, ("kb", "model", "[]"), "SEARCH v USING ", "concept=?"),
        (sql.SEEN.json, ("[]", 1), "SEARCH a USING ", ""),
    ],
)
def test_a_lookup_by_ids_seeks_each_id(
    tmp_path: Path, statement: str, params: tuple[object, ...], seek: str, key: str
) -> None:
    path = tmp_path / "kb.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    try:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", params)]
    finally:
        conn.close()
    assert plan[0].startswith("SCAN j"), plan  # the ids outer, each one looked up
    assert any(step.startswith(seek) and key in step for step in plan[1:]), plan
