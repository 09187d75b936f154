"""JSON reaches SQLite's JSON functions as text, never as a BLOB (issue 23).

From SQLite 3.45 ``json_each(?)`` reads a BLOB parameter as binary JSONB: a 6-byte payload
such as ``[[12]]`` (the delete of the concept with row id 12) or ``["ab"]`` (the lookup of one
two-letter id) is then malformed, and on some builds the statement never returns. The first
test is red on the old code on every SQLite (it reads the bound parameters); the second on
3.45 and later (``scripts/test.sh`` runs it on 3.45.1 and on the newest release).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kbgraph.store import Store
from kbgraph.store.vectorrows import VectorRow
from tests.kb_events import delete, link_added, upsert

RUNAWAY_STEPS = 50_000  # progress-handler calls (of 10,000 VM steps each) before aborting


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement the store's connections run, with its parameters bound (SQLite's
    expanded SQL: a BLOB shows as x'..', text as '..'). A statement that runs away (the JSONB
    misreading loops on some builds) is interrupted instead of hanging the test."""
    statements: list[str] = []
    connect = sqlite3.connect

    def traced_connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)  # type: ignore[arg-type]
        conn.set_trace_callback(statements.append)
        steps = [0]

        def guard() -> bool:
            steps[0] += 1
            return steps[0] > RUNAWAY_STEPS

        conn.set_progress_handler(guard, 10_000)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced_connect)
    yield statements


def twelve_then_delete(store: Store) -> None:
    """Concepts c01..c12 (row ids 1..12, one per delivery), then the delete of c12 alone
    (rows ``[[12]]``), then a link event on a two-letter id alone (lookup ``["ab"]``)."""
    for i in range(1, 13):
        store.append("kb", [upsert(f"c{i:02d}")])
    store.append("kb", [delete("c12", 2)])
    store.append("kb", [upsert("ab")])
    store.append("kb", [link_added("ab", "c01", 2)])


def test_json_parameters_are_bound_as_text(tmp_path: Path, traced: list[str]) -> None:
    with Store(tmp_path / "kb.db") as store:
        twelve_then_delete(store)
        store.write_vectors("kb", "m", [VectorRow("ab", b"h" * 16, np.ones(2, np.float32), "")])
    json_statements = [s for s in traced if "json_each(" in s]
    assert json_statements, "the store ran no json_each statement: the test proves nothing"
    assert any(s.startswith("INSERT INTO vector") for s in json_statements)
    blobs = [s for s in json_statements if "json_each(x'" in s.lower()]
    assert blobs == [], f"JSON bound as a BLOB: {blobs[:3]}"


def test_short_payloads_apply_on_this_sqlite(tmp_path: Path, traced: list[str]) -> None:
    with Store(tmp_path / "kb.db") as store:
        twelve_then_delete(store)
        state = {c.id: c for c in store.load().kbs["kb"].concepts}
        assert sorted(state) == ["ab"] + [f"c{i:02d}" for i in range(1, 12)]
        assert state["ab"].links == ["c01"] and state["ab"].version == 2
        assert store.kb_seq("kb") == 15
    with Store(tmp_path / "kb.db") as again:  # the delete is durable, the tombstone refuses c12
        again.append("kb", [upsert("c12", 1)])
        assert "c12" not in {c.id for c in again.load().kbs["kb"].concepts}
