"""``kbgraph backup``: a consistent, integrity-checked copy of the store while the service runs.

The copy is SQLite's online backup (``sqlite3.Connection.backup``) of the whole file in one
step: one read transaction on the source, so the copy is the store as of one commit (whole
deliveries, the log and the state together) while the service goes on serving and writing
(WAL: a reader never blocks the writer, and one step means a write cannot restart the copy).
The copy is written in a private folder made beside DEST (``mkdtemp``: a new name, mode 0700,
so nothing planted in DEST's folder, a symlink at a guessable name included, is written
through, and SQLite's own journal of the copy lives there too), its file created exclusively
without following links and with the store's permissions, switched to a single
self-contained file (journal mode DELETE; a service opening it turns WAL on again), checked
(``PRAGMA integrity_check``, the schema version, each KB's log end against its ``seq``),
fsynced, then hard-linked to DEST, which never replaces a file there (two backups to one DEST:
the first placed wins, the other fails naming DEST), and the folder fsynced: DEST is either the
whole checked copy or absent. DEST named like one of the store's own files (``-journal``,
``-wal``, ``-shm``, which SQLite deletes or rewrites, and the write lock) is refused.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kbgraph.store import statements as sql
from kbgraph.store.schema import SCHEMA_VERSION

# files SQLite and the store keep beside the store, named after it
OWN_SUFFIXES: Final = ("-journal", "-wal", "-shm", ".writelock")
# the copy's file, created exclusively (O_EXCL), never through a symlink (O_NOFOLLOW)
_CREATE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
PROGRESS_SECONDS: Final = 0.25  # how often a backup in progress says how far it is


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
    ``BackupError`` when that is the store itself or one of its own files, exists already, or
    its folder is missing or not writable."""
    target = dest / source.name if dest.is_dir() else dest
    if target.resolve() == source.resolve():
        raise BackupError(f"{target} is the store itself")
    for suffix in OWN_SUFFIXES:
        if target.resolve() == Path(f"{source.resolve()}{suffix}"):
            raise BackupError(f"{target} is the store's own {suffix} file: name another file")
    if target.exists() or target.is_symlink():
        raise BackupError(f"{target} exists: remove it or name another file")
    folder = target.parent
    if not folder.is_dir():
        raise BackupError(f"{target}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BackupError(f"{target}: the folder {folder} is not writable")
    return target


def backup(source: Path, dest: Path, on_copied: Callable[[int, int], None] | None = None) -> Backup:
    """Copy the store at ``source`` to ``dest`` (see ``destination``) and check the copy.
    ``on_copied(bytes, total)``: how far the copy is, every ``PROGRESS_SECONDS`` while SQLite
    writes it (from the copy file's size) and once at the end."""
    start = time.perf_counter()
    if not source.is_file():
        raise BackupError(f"store {source}: no such file")
    target = destination(source, dest)
    folder = None
    try:
        folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        temporary = folder / "copy.db"
        fd = os.open(temporary, _CREATE, 0o600)
        try:
            os.fchmod(fd, stat.S_IMODE(os.stat(source).st_mode))
        finally:
            os.close(fd)
        src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            copy = sqlite3.connect(temporary, isolation_level=None)
            try:
                with _watched(src, temporary, on_copied):
                    src.backup(copy, pages=-1)  # one step: one read transaction, one instant
                copy.execute("PRAGMA journal_mode = DELETE")
                gid, kbs = check(copy)
            finally:
                copy.close()
        finally:
            src.close()
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        place(temporary, target)
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
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return Backup(target, target.stat().st_size, gid, kbs, time.perf_counter() - start)


@contextmanager
def _watched(
    src: sqlite3.Connection, copy: Path, on_copied: Callable[[int, int], None] | None
) -> Iterator[None]:
    """Report the copy's growth while the one-step backup runs (SQLite writes it without the
    GIL): a thread reads its file's size; the copy itself is untouched."""
    if on_copied is None:
        yield
        return
    page_size = src.execute("PRAGMA page_size").fetchone()[0]
    total = page_size * src.execute("PRAGMA page_count").fetchone()[0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(PROGRESS_SECONDS):
            on_copied(min(copy.stat().st_size, total), total)

    watcher = threading.Thread(target=watch, name="kbgraph-backup-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
    size = copy.stat().st_size
    on_copied(size, max(size, total))


def place(temporary: Path, target: Path) -> None:
    """``temporary`` at ``target`` unless a file is there (``BackupError``, nothing replaced):
    ``link`` never replaces, where ``rename`` would."""
    try:
        os.link(temporary, target, follow_symlinks=False)
    except FileExistsError:
        raise BackupError(
            f"{target}: exists (written meanwhile, by another backup?): this copy was not placed"
        ) from None
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
            raise BackupError(
                f"{target}: its file system takes no hard link ({exc.strerror}), the one way"
                " to place the copy without replacing a file: back up to another folder"
            ) from None
        raise


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
    gid = conn.execute(sql.LOG_LAST).fetchone()[0]
    kbs = dict(conn.execute("SELECT name, seq FROM kb ORDER BY name").fetchall())
    for name, end in conn.execute("SELECT kb, max(seq) FROM log GROUP BY kb"):
        if kbs.get(name) != end:
            raise BackupError(f"the copy's log ends KB {name} at {end}, its seq is {kbs.get(name)}")
    return gid, kbs
