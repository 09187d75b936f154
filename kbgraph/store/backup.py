"""``kbgraph backup``: a consistent, integrity-checked copy of the store while the service runs.

The copy is SQLite's online backup (``sqlite3.Connection.backup``) of the whole file in one
step: one read transaction on the source, so the copy is the store as of one commit (whole
deliveries, the log and the state together) while the service goes on serving and writing
(WAL: a reader never blocks the writer, and one step means a write cannot restart the copy).
The copy is written under a temporary name beside DEST, switched to a single self-contained
file (journal mode DELETE; a service opening it turns WAL on again), checked (``PRAGMA
integrity_check``, the schema version, each KB's log end against its ``seq``), fsynced, then
renamed to DEST and the folder fsynced: DEST is either the whole checked copy or absent.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from kbgraph.store.schema import SCHEMA_VERSION


class BackupError(Exception):
    """The backup was not written; the message names what is wrong."""


@dataclass(frozen=True)
class Backup:
    path: Path
    bytes: int
    gid: int  # the copy's log end (global position)
    kbs: dict[str, int]  # each KB's seq in the copy
    seconds: float


def destination(source: Path, dest: Path) -> Path:
    """The file the copy goes to: DEST, or DEST/<store file name> when DEST is a folder.
    ``BackupError`` when that is the store itself, exists already, or its folder is missing
    or not writable."""
    target = dest / source.name if dest.is_dir() else dest
    if target.resolve() == source.resolve():
        raise BackupError(f"{target} is the store itself")
    if target.exists() or target.is_symlink():
        raise BackupError(f"{target} exists: remove it or name another file")
    folder = target.parent
    if not folder.is_dir():
        raise BackupError(f"{target}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BackupError(f"{target}: the folder {folder} is not writable")
    return target


def backup(source: Path, dest: Path) -> Backup:
    """Copy the store at ``source`` to ``dest`` (see ``destination``) and check the copy."""
    start = time.perf_counter()
    if not source.is_file():
        raise BackupError(f"store {source}: no such file")
    target = destination(source, dest)
    temporary = target.parent / f".{target.name}.{os.getpid()}.tmp"
    try:
        src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            copy = sqlite3.connect(temporary, isolation_level=None)
            try:
                src.backup(copy, pages=-1)  # one step: one read transaction, one instant
                copy.execute("PRAGMA journal_mode = DELETE")
                gid, kbs = check(copy)
            finally:
                copy.close()
        finally:
            src.close()
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, target)
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except sqlite3.Error as exc:
        raise BackupError(f"store {source}: {exc}") from None
    except OSError as exc:
        raise BackupError(f"{target}: {exc.strerror or exc}") from None
    finally:
        for leftover in (temporary, Path(f"{temporary}-journal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return Backup(target, target.stat().st_size, gid, kbs, time.perf_counter() - start)


def check(conn: sqlite3.Connection) -> tuple[int, dict[str, int]]:
    """(log end, each KB's seq) of a copy, after SQLite's integrity check and the store's own
    sanity: its schema version, and each KB whose events are still in the log ends there at
    its ``seq``. ``BackupError`` naming the first problem."""
    problems = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    if problems != ["ok"]:
        raise BackupError(f"the copy fails SQLite's integrity check: {'; '.join(problems[:5])}")
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found != SCHEMA_VERSION:
        raise BackupError(f"the copy has schema version {found}, this kbgraph {SCHEMA_VERSION}")
    gid = conn.execute("SELECT coalesce(max(gid), 0) FROM log").fetchone()[0]
    kbs = dict(conn.execute("SELECT name, seq FROM kb ORDER BY name").fetchall())
    for name, end in conn.execute("SELECT kb, max(seq) FROM log GROUP BY kb"):
        if kbs.get(name) != end:
            raise BackupError(f"the copy's log ends KB {name} at {end}, its seq is {kbs.get(name)}")
    return gid, kbs
