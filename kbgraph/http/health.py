"""Can the store write? Checked once before serving, and by ``/readyz`` while serving.

``store_problem`` opens the store as the service will (schema, WAL, lock file) and turns any
failure into one line naming the path and the cause, so ``kbgraph serve`` can exit 2 without
a traceback. ``WriteProbe`` answers ``/readyz``: at most once per ``interval`` it asks the
kernel whether the store file and its folder are writable (permissions, the immutable flag and
read-only mounts are checked at open, so the store's long-lived connections cannot tell; SQLite
creates ``-wal``/``-shm`` files in the folder), then writes a page on a new connection and rolls
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

_BUSY: Final = ("SQLITE_BUSY", "SQLITE_LOCKED")
# Which SQLite this process's store runs on: its JSON functions changed in 3.45 (a BLOB is
# read as JSONB), so an operator comparing nodes or reading a bug report wants to see it.
SQLITE_INFO: Final = Info("kbgraph_sqlite", "The SQLite library the store runs on")
SQLITE_INFO.info({"version": sqlite3.sqlite_version})


def describe(exc: BaseException) -> str:
    """The cause of a store failure in a few words (no traceback, no repr)."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    return str(exc) or type(exc).__name__


def store_folder_problem(path: str) -> str | None:
    """Why the store at ``path`` has no folder to live in, or None: kbgraph creates the store
    file, never its folder (a mistyped path would quietly make a new, empty store)."""
    target = Path(path)
    for folder in target.parents:
        if folder.exists():
            if not folder.is_dir():
                return f"store {path}: {folder} is not a directory"
            break
    if not target.parent.is_dir():
        return f"store {path}: the folder {target.parent} does not exist (create it first)"
    return None


def store_problem(path: str) -> str | None:
    """None when the store at ``path`` opens for writing, else "store <path>: <cause>"."""
    from kbgraph.store import Store

    if Path(path).is_dir():
        return f"store {path}: is a directory"
    problem = store_folder_problem(path)
    if problem:
        return problem
    try:
        Store(path).close()
    except (OSError, sqlite3.Error) as exc:
        return f"store {path}: {describe(exc)}"
    return None


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
