"""The store's WAL checkpoints, off the writer's serial path.

SQLite checkpoints in the committing connection once the WAL holds ``wal_autocheckpoint``
pages (1,000): the writer thread copied the WAL's pages into the main file and fsynced it
inside a group's ``COMMIT``, holding every delivery of the group (and the next) for it; a
500-event delivery writes ~400 pages, so one in three waited on a checkpoint (~12 % of the
writer's wall time). A ``Checkpointer`` thread, woken after each commit, runs a PASSIVE
checkpoint on a connection of its own at most every ``CHECKPOINT_SECONDS``: it copies what
the readers no longer need while the writer goes on (the WAL's own fsync at each commit is
what makes a delivery durable, so nothing acknowledged waits on it). The writer keeps
SQLite's automatic checkpoint: with this thread ahead of it, it finds the pages copied and
only lets the WAL start over, so the WAL stays as short as before.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Final

CHECKPOINT_SECONDS: Final = 0.25


class Checkpointer:
    """A thread checkpointing the store's WAL after commits (``wake``), until ``close``."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str) -> None:
        self._connect = connect
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"kbgraph-store-checkpoints:{name}", daemon=True
        )
        self._thread.start()

    def wake(self) -> None:
        """Pages were committed: checkpoint them soon."""
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (a checkpoint under way finishes first) and close its connection."""
        self._stopping.set()
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping.is_set():
                    return
                # busy (a checkpoint of another process, a backup): the next wake tries again
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if self._stopping.wait(CHECKPOINT_SECONDS):
                    return
        finally:
            conn.close()
