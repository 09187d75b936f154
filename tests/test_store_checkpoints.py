"""The store's WAL is checkpointed by a thread of its own (``kbgraph.store.checkpoints``),
woken after the writer's commits: a delivery's pages reach the main file soon after it is
acknowledged, though the writer's own automatic checkpoint would wait for 1,000 pages (the
delivery below writes far fewer); and the thread ends with the store."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from kbgraph.store import Store
from tests.kb_events import upsert

DEADLINE_SECONDS = 30.0


def test_a_delivery_reaches_the_main_file_without_the_writers_checkpoint(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kb.db"
    with Store(path) as store:
        before = path.stat().st_size
        store.append("kb", [upsert(f"c{i}", text="words " * 200) for i in range(100)])
        deadline = time.monotonic() + DEADLINE_SECONDS
        while path.stat().st_size <= before:  # the pages are in the WAL until checkpointed
            assert time.monotonic() < deadline, "the WAL was never checkpointed"
            time.sleep(0.01)
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM concept").fetchone()[0] == 100


def test_the_checkpoint_thread_ends_with_the_store(tmp_path: Path) -> None:
    name = "kbgraph-store-checkpoints:ends-with-its-store.db"
    with Store(tmp_path / "ends-with-its-store.db") as store:
        store.append("kb", [upsert("a")])
        assert name in {t.name for t in threading.enumerate()}
    assert name not in {t.name for t in threading.enumerate()}
