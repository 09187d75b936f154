"""Upgrading one machine: a store written by the previous schema version is migrated in place
when this kbgraph opens it, and answers; a store of a newer kbgraph is refused with a line
saying what to do (docs/install.md#upgrading-one-machine).

``tests/data/store-schema6.sql`` is such a store, as the previous version wrote it (how it was
made is at its top): four notes imported, then one deleted and one added by a sync, so it holds
the link rows schema 7 turned into a column, a tombstone, and the accepted event ids.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import httpx
import numpy as np
import pytest

from kbgraph.events import ConceptUpserted, UpsertData
from kbgraph.sources.sinks import WebhookSink
from kbgraph.store import Store
from kbgraph.store.schema import SCHEMA_VERSION
from kbgraph.store.vectorrows import VectorRow
from tests.support import ADMIN, ROOT, SECRET, bearer, running, served_config

pytestmark = pytest.mark.slow
FIXTURE = ROOT / "tests" / "data" / "store-schema6.sql"
KB = "homelab"
# the id of the first event the previous version's import sent (its log's gid 1)
FIRST_EVENT = "80da00ada6a680b4867897e9738995371c82e1fb"


def old_store(folder: Path) -> Path:
    """The config of a folder whose store (``kb.db``) is the schema 6 fixture."""
    config = served_config(folder)
    conn = sqlite3.connect(folder / "kb.db")
    conn.executescript(FIXTURE.read_text())
    conn.close()
    return config


def test_the_fixture_is_schema_6_with_link_rows(tmp_path: Path) -> None:
    old_store(tmp_path)
    conn = sqlite3.connect(tmp_path / "kb.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 6 == SCHEMA_VERSION - 1
    assert conn.execute("SELECT count(*) FROM link").fetchone()[0] == 5
    conn.close()


def test_serve_migrates_the_previous_schema_and_answers(tmp_path: Path) -> None:
    config = old_store(tmp_path)
    auth = bearer(ADMIN)
    with running(config) as url:
        kbs = httpx.get(f"{url}/v1/kbs", headers=auth, timeout=30).json()["kbs"]
        (homelab,) = (kb for kb in kbs if kb["kb"] == KB)
        # DNS-Router, Router-UPS, Power-UPS: the link rows, now each concept's column
        assert (homelab["concepts"], homelab["links"]) == (4, 3)
        path = httpx.post(
            f"{url}/v1/kbs/{KB}/tools/graph_path",
            headers=auth,
            json={"source": "Power", "target": "DNS"},
            timeout=30,
        ).json()
        assert path["hops"] == 3
        assert [step["id"] for step in path["path"]] == ["Power", "UPS", "Router", "DNS"]
        assert httpx.get(f"{url}/v1/kbs/{KB}/concepts/Backups", headers=auth).status_code == 404
        router = httpx.get(f"{url}/v1/kbs/{KB}/concepts/Router", headers=auth).json()
        assert router["links"] == ["DNS", "UPS"]
        sink = WebhookSink(url, SECRET, attempts=1)
        try:
            # an event the old version accepted is still known: a duplicate, not applied again
            again = ConceptUpserted(
                specversion="1.0", id=FIRST_EVENT, source="kbgraph-vault", subject="Backups",
                data=UpsertData(version=1, title="Backups", text="resent"),
            )  # fmt: skip
            assert sink.send(KB, [again]).duplicates == 1
            # a newer version than the tombstone's brings the deleted note back
            back = ConceptUpserted(
                specversion="1.0", id="after-upgrade", source="test", subject="Backups",
                data=UpsertData(version=2**53, title="Backups", text="back", links=["Power"]),
            )  # fmt: skip
            result = sink.send(KB, [back])
        finally:
            sink.close()
        assert (result.applied, result.seq) == (1, 7)
        kbs = httpx.get(f"{url}/v1/kbs", headers={**auth, "X-Min-Seq": "7"}, timeout=30)
        (homelab,) = (kb for kb in kbs.json()["kbs"] if kb["kb"] == KB)
        assert (homelab["concepts"], homelab["links"]) == (5, 4)
    conn = sqlite3.connect(tmp_path / "kb.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    assert "link" not in tables
    conn.close()


def test_a_store_of_a_newer_kbgraph_is_refused_and_left_alone(tmp_path: Path) -> None:
    config = old_store(tmp_path)
    conn = sqlite3.connect(tmp_path / "kb.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    done = subprocess.run(
        [sys.executable, "-m", "kbgraph", "serve", "--config", str(config), "--port", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"kbgraph: store {tmp_path / 'kb.db'}: store schema version {SCHEMA_VERSION + 1} is"
        f" newer than this kbgraph understands ({SCHEMA_VERSION}): a newer kbgraph wrote it;"
        " run that version, or restore the copy taken before the upgrade"
    )
    conn = sqlite3.connect(tmp_path / "kb.db")  # not migrated: its schema is as it was
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert conn.execute("SELECT count(*) FROM link").fetchone()[0] == 5
    assert "links" not in {row[1] for row in conn.execute("PRAGMA table_info(concept)")}
    conn.close()


# the vector table as schema 7 first had it: WITHOUT ROWID, each 1 KB row on an overflow page
VECTOR_WITHOUT_ROWID = """CREATE TABLE vector (
    kb TEXT NOT NULL,
    concept TEXT NOT NULL,
    model TEXT NOT NULL,
    text_hash BLOB NOT NULL,
    vec BLOB,
    problem TEXT,
    PRIMARY KEY (kb, model, concept)
) WITHOUT ROWID"""


def test_a_vector_table_without_rowid_is_rebuilt_with_its_rows(tmp_path: Path) -> None:
    """A file whose ``vector`` table is WITHOUT ROWID (as schema 7 first made it) is given the
    rowid table on opening, every row kept, read and rewritten as before."""
    path = tmp_path / "kb.db"
    Store(path).close()
    vec = np.arange(256, dtype="<f4").tobytes()
    rows = [("kb", "a", "m", b"h" * 16, vec, None), ("kb", "b", "m", b"g" * 16, None, "refused")]
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE vector")
        conn.execute(VECTOR_WITHOUT_ROWID)
        conn.executemany("INSERT INTO vector VALUES (?, ?, ?, ?, ?, ?)", rows)
        conn.commit()
    with Store(path) as store:
        read = sorted(store.read_vectors("kb", "m", ["a", "b"]))
        assert [(r.concept, r.text_hash, r.problem) for r in read] == [
            ("a", b"h" * 16, ""), ("b", b"g" * 16, "refused")
        ]  # fmt: skip
        assert read[0].vector is not None and read[0].vector.tobytes() == vec
        store.write_vectors("kb", "m", [VectorRow("b", b"n" * 16, np.ones(2, np.float32), "")])
    Store(path).close()  # opened again: nothing left to rebuild
    with closing(sqlite3.connect(path)) as conn:
        (table,) = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'vector'").fetchone()
        assert "WITHOUT ROWID" not in table.upper()
        left = conn.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'vector_before'")
        assert left.fetchone()[0] == 0
        got = conn.execute("SELECT * FROM vector ORDER BY concept").fetchall()
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert got == [rows[0], ("kb", "b", "m", b"n" * 16, np.ones(2, "<f4").tobytes(), None)]
