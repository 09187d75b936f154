"""The SQLite the tests ran on is the one they were meant to (``scripts/test.sh``'s matrix).

``scripts/test.sh`` runs the store, ingest, crash and JetStream tests again with another
SQLite swapped in for ``sqlite3`` (``tests/sqlite_swap/sitecustomize.py``) and names the
release it expects in ``KBGRAPH_TEST_SQLITE_VERSION``. These tests make sure the swap really
reached the store's connections, in this process and in a ``kbgraph serve`` it starts, so a
green matrix run cannot be a run on the machine's SQLite in disguise.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import httpx

from kbgraph.store import Store
from tests.support import ADMIN, bearer, running, served_config

EXPECTED = os.environ.get("KBGRAPH_TEST_SQLITE_VERSION")  # unset: the machine's own SQLite


def test_the_module_is_the_expected_sqlite() -> None:
    if EXPECTED is None:
        assert "KBGRAPH_TEST_SQLITE" not in os.environ, "a swap without an expected version"
        assert sqlite3.__name__ == "sqlite3"
    else:
        assert sqlite3.__name__ == "sqlean", f"not swapped: {sqlite3.__file__}"
        assert sqlite3.sqlite_version == EXPECTED


def test_the_store_connection_reports_it(tmp_path: Path) -> None:
    with Store(tmp_path / "kb.db") as store, store.reading() as conn:
        reported = conn.execute("SELECT sqlite_version()").fetchone()[0]
    assert reported == (EXPECTED or sqlite3.sqlite_version)


def test_a_server_subprocess_runs_on_it(tmp_path: Path) -> None:
    with running(served_config(tmp_path)) as url:
        auth = bearer(ADMIN)  # /metrics spans every KB: admin only
        metrics = httpx.get(f"{url}/metrics", headers=auth, timeout=10).text
    found = re.search(r'^kbgraph_sqlite_info\{version="([^"]+)"\} 1\.0$', metrics, re.M)
    assert found is not None, "no kbgraph_sqlite_info in /metrics"
    assert found[1] == (EXPECTED or sqlite3.sqlite_version)
