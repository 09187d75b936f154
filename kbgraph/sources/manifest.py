"""What sync sent where: a small SQLite file, durable before anything it vouches for is sent.

Kept in the vault's own ``.kbgraph/manifest.sqlite`` (a dot folder, so never read as notes;
``--manifest FILE`` puts it elsewhere, as the demo does for the repository's example vault),
per destination (the local store's file, or the remote URL) and KB:

- ``parsed``: a note's parsed fields by the hash of its file's content (a cache: a re-run
  parses only the files that changed);
- ``sent``: id -> (digest of the concept state sent, version sent), written after the
  destination acknowledged the delivery;
- ``clock``: the highest version handed out, and the destination's log position (``seq``)
  after the last acknowledged delivery. Versions are reserved here, and this commit is
  fsynced, BEFORE a delivery is sent; a reservation starts at least at the wall clock in
  microseconds: so versions only grow, across a crash mid-sync and even when the manifest is
  lost (as long as the clock does not go back). A local store whose KB is behind the recorded
  position was replaced (deleted, restored from an old copy): the record of what was sent to
  it is dropped and every note is sent again.

A crash after a send and before its record only means the next run sends those notes again
with higher versions: the same state applied once more, nothing lost, nothing resurrected.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from kbgraph.sources.vault.reader import NoteFields

_fields_decoder = msgspec.msgpack.Decoder(NoteFields)
MANIFEST_DIR: Final = ".kbgraph"
MANIFEST_FILE: Final = "manifest.sqlite"

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sent (
    dest TEXT NOT NULL, kb TEXT NOT NULL, id TEXT NOT NULL,
    digest TEXT NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (dest, kb, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS parsed (
    key TEXT PRIMARY KEY, fields BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS clock (
    dest TEXT NOT NULL, kb TEXT NOT NULL, version INTEGER NOT NULL,
    seq INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dest, kb)
) WITHOUT ROWID;
"""


def open_db(path: Path, schema: str) -> sqlite3.Connection:
    """The manifest's file (WAL, every commit synced), with ``schema``'s tables: the manifest's
    own, or a source's beside them (the MediaWiki follower's). One user at a time: a sync run,
    maybe on a watcher thread."""
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.executescript(schema)
    return conn


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction (taken at once, not on the first write), rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class Manifest:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = open_db(path, _SCHEMA)

    @staticmethod
    def default_path(root: Path) -> Path:
        return root / MANIFEST_DIR / MANIFEST_FILE

    @classmethod
    def for_vault(cls, root: Path) -> Manifest:
        return cls(cls.default_path(root))

    def sent(self, dest: str, kb: str) -> dict[str, tuple[str, int]]:
        rows = self._conn.execute(
            "SELECT id, digest, version FROM sent WHERE dest = ? AND kb = ?", (dest, kb)
        )
        return {cid: (digest, version) for cid, digest, version in rows}

    def reserve(self, dest: str, kb: str, count: int) -> int:
        """The first of ``count`` fresh versions, durably handed out before it is used."""
        now = time.time_ns() // 1000
        with write_transaction(self._conn):
            row = self._conn.execute(
                "SELECT version FROM clock WHERE dest = ? AND kb = ?", (dest, kb)
            ).fetchone()
            first = max(0 if row is None else row[0], now) + 1
            self._conn.execute(
                "INSERT INTO clock (dest, kb, version) VALUES (?, ?, ?)"
                " ON CONFLICT (dest, kb) DO UPDATE SET version = excluded.version",
                (dest, kb, first + count - 1),
            )
        return first

    def parse_cache(self) -> dict[str, NoteFields]:
        """Parsed fields by content hash, so that an unchanged note is not parsed again."""
        rows = self._conn.execute("SELECT key, fields FROM parsed").fetchall()
        return {key: _fields_decoder.decode(blob) for key, blob in rows}

    def update_parse_cache(self, added: dict[str, bytes], gone: set[str]) -> None:
        """Add the entries of ``added`` (fields as ``parse_cache`` decodes them, msgpack) and
        drop the keys of ``gone`` (contents no longer in the vault): the rows of the contents
        that stayed are left as they are, not written again."""
        with write_transaction(self._conn):
            self._conn.executemany(
                "DELETE FROM parsed WHERE key = ?", [(key,) for key in sorted(gone)]
            )
            self._conn.executemany(
                "INSERT OR REPLACE INTO parsed (key, fields) VALUES (?, ?)", sorted(added.items())
            )

    def forget_if_behind(self, dest: str, kb: str, seq: int) -> bool:
        """Drop the record of what was sent when the destination's KB is behind it."""
        with write_transaction(self._conn):
            row = self._conn.execute(
                "SELECT seq FROM clock WHERE dest = ? AND kb = ?", (dest, kb)
            ).fetchone()
            if row is None or seq >= row[0]:
                return False
            self._conn.execute("DELETE FROM sent WHERE dest = ? AND kb = ?", (dest, kb))
            self._conn.execute(
                "UPDATE clock SET seq = ? WHERE dest = ? AND kb = ?", (seq, dest, kb)
            )
        return True

    def record(
        self,
        dest: str,
        kb: str,
        upserted: list[tuple[str, str, int]],
        deleted: list[str],
        seq: int,
    ) -> None:
        """Remember an acknowledged delivery: (id, digest, version) upserted, ids deleted, and
        the destination's log position after it."""
        with write_transaction(self._conn):
            self._conn.execute(
                "UPDATE clock SET seq = max(seq, ?) WHERE dest = ? AND kb = ?", (seq, dest, kb)
            )
            self._conn.executemany(
                "INSERT OR REPLACE INTO sent (dest, kb, id, digest, version)"
                " VALUES (?, ?, ?, ?, ?)",
                [(dest, kb, cid, digest, version) for cid, digest, version in upserted],
            )
            self._conn.executemany(
                "DELETE FROM sent WHERE dest = ? AND kb = ? AND id = ?",
                [(dest, kb, cid) for cid in deleted],
            )

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Manifest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_manifest(path: Path) -> Manifest | str:
    """The manifest at ``path``, or why it cannot be opened (naming the option that moves it):
    every source's command opens its manifest this way, after its sink."""
    try:
        return Manifest(path)
    except (OSError, sqlite3.Error) as exc:
        return f"cannot open the manifest {path} ({exc}): try --manifest FILE"
