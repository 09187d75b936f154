"""Can the store write while serving? ``/readyz`` asks (the check before serving is
``kbgraph.store.opening.store_problem``).

``WriteProbe`` answers ``/readyz``: at most once per ``interval`` it asks the kernel whether
the store file and its folder are writable (permissions, the immutable flag and read-only
mounts are checked at open, so the store's long-lived connections cannot tell; SQLite creates
``-wal``/``-shm`` files in the folder), then writes a page on a new connection and rolls
it back (a missing or corrupt file). A store merely busy with another writer is writable;
a full disk is only seen when a delivery fails.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Final

import anyio.to_thread
from prometheus_client import Info

from kbgraph.store.opening import describe

_BUSY: Final = ("SQLITE_BUSY", "SQLITE_LOCKED")
# Which SQLite this process's store runs on: its JSON functions changed in 3.45 (a BLOB is
# read as JSONB), so an operator comparing nodes or reading a bug report wants to see it.
SQLITE_INFO: Final = Info("kbgraph_sqlite", "The SQLite library the store runs on")
SQLITE_INFO.info({"version": sqlite3.sqlite_version})


def write_problem(path: str) -> str | None:
    """None when the store file and its folder are writable and a new connection can write
    the store; else why not."""
    store = Path(path)
    for target, what in ((store, "store"), (store.parent, "store folder")):
        # access() sees permissions, the immutable flag and read-only mounts without opening
        # the file (closing an fd of it would drop this process's SQLite locks).
        if not os.access(target, os.W_OK):
            return f"{what} {target} cannot write: not writable"
    try:
        conn = sqlite3.connect(
            store.as_uri() + "?mode=rw", uri=True, timeout=0, isolation_level=None
        )
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute("BEGIN IMMEDIATE")
            try:  # a real write (the lock alone succeeds on a read-only file), rolled back
                conn.execute(f"PRAGMA user_version = {int(version)}")
            finally:
                conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorname", "") not in _BUSY:
            return f"store {path} cannot write: {describe(exc)}"
    return None


class WriteProbe:
    """``write_problem`` for ``/readyz``, run off the event loop, at most once per interval."""

    def __init__(self, path: str, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self._checked_at = -float("inf")
        self._problem: str | None = None

    async def problem(self) -> str | None:
        now = time.monotonic()
        if now - self._checked_at >= self.interval:
            self._checked_at = now
            self._problem = await anyio.to_thread.run_sync(write_problem, self.path)
        return self._problem
