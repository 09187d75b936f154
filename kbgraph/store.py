"""The store: the event log and the current state of every KB, the source of truth.

Embedded implementation: one SQLite file in WAL mode with ``synchronous=FULL``. Every commit
fsyncs the WAL before ``append`` returns, so an acknowledged delivery survives an OS crash or
a power loss, not only the death of the process (a small commit measures 0.35-0.5 ms
here; group commit spreads that fsync over every delivery that arrived meanwhile).

Semantics (SPEC section 2):
- ``append(kb, events)`` applies one delivery atomically: all of it or none of it, and returns
  only after the commit is durable.
- Per event, in order: a (source, id) accepted before in this KB (or earlier in the same
  delivery) -> duplicate; a version not greater than the subject's known version (concept or
  tombstone) -> stale; a link event whose subject does not exist -> ignored; otherwise applied.
  Only applied events enter the log, each taking the next gapless ``seq`` of its KB (and the
  next global ``gid``).
- The log is followed by every process (``read_log``); ``load`` gives a consistent snapshot
  of the current state together with the ``gid`` it reflects, for a projection's first build.

Group commit: one fsync per delivery caps a disk at a few thousand deliveries per second at
best, and far less once HTTP shares the CPU. So each Store runs ONE writer thread that drains
the queue of pending deliveries, applies the whole group in one pass and commits once, then
resolves every caller. Should anything in the group raise, the transaction is rolled back and
the group replayed one delivery per SAVEPOINT, so only the failing delivery is refused (one
SAVEPOINT per delivery on the fast path would cost FTS5 an index segment each).

Several processes may share the file: writers serialize on SQLite's write lock (``BEGIN
IMMEDIATE`` with a busy timeout and retries), fronted by an advisory file lock so a waiting
writer wakes the moment the other commits instead of polling.

The log itself is ``kbgraph.eventlog`` (append / read of ``LogRecord``), kept apart from the
state tables so that a NATS JetStream log can take its place later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple, TypeVar

import msgspec

from kbgraph.eventlog import NUL_ESCAPE, LogRecord, SqliteLog, read_transaction
from kbgraph.events import ConceptDeleted, ConceptUpserted, Event, LinkAdded, LinkRemoved

__all__ = [
    "ConceptState",
    "DeliveryResult",
    "KBState",
    "LogRecord",
    "Store",
    "StoreBusy",
    "StoreClosed",
    "StoreSnapshot",
]

try:  # POSIX only; elsewhere the writers rely on SQLite's busy handler alone.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

SCHEMA_VERSION: Final = 2  # 2: concept.aliases, FTS5 (title, aliases, text)
BUSY_TIMEOUT_MS: Final = 5_000
BUSY_RETRY_SECONDS: Final = 60.0  # give up on the write lock after this long (then 503)
MAX_GROUP_DELIVERIES: Final = 512
MAX_GROUP_EVENTS: Final = 20_000  # bounds one group's transaction (and its latency)
_CHUNK: Final = 5_000  # ids per json_each lookup
_T = TypeVar("_T")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS kb (
    kid INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS log (
    gid INTEGER PRIMARY KEY,
    kb TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    last_in_delivery INTEGER NOT NULL,
    UNIQUE (kb, seq)
);
CREATE TABLE IF NOT EXISTS concept (
    rid INTEGER PRIMARY KEY,
    kid INTEGER NOT NULL,
    id TEXT NOT NULL,
    version INTEGER NOT NULL,
    title TEXT NOT NULL,
    aliases TEXT NOT NULL DEFAULT '[]',
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    tags TEXT NOT NULL,
    text TEXT NOT NULL,
    UNIQUE (kid, id)
);
CREATE TABLE IF NOT EXISTS tombstone (
    kid INTEGER NOT NULL,
    id TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (kid, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS link (
    kid INTEGER NOT NULL,
    src TEXT NOT NULL,
    dst TEXT NOT NULL,
    PRIMARY KEY (kid, src, dst)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS link_dst ON link (kid, dst, src);
CREATE TABLE IF NOT EXISTS accepted (
    kid INTEGER NOT NULL,
    source TEXT NOT NULL,
    id TEXT NOT NULL,
    PRIMARY KEY (kid, source, id)
) WITHOUT ROWID;
"""

_tags_encoder = msgspec.json.Encoder()  # tags, and the JSON rows of bulk statements
_tags_decoder = msgspec.json.Decoder(list[str])
_rows_decoder = msgspec.json.Decoder(list[list])


class DeliveryResult(msgspec.Struct, frozen=True):
    accepted: int
    applied: int
    duplicates: int
    stale: int
    ignored: int
    seq: int


class ConceptState(msgspec.Struct, frozen=True):
    id: str
    version: int
    title: str
    type: str
    status: str
    tags: list[str]
    text: str
    links: list[str]  # declared out-links, deduplicated, sorted, also to missing targets
    aliases: list[str] = []


class KBState(msgspec.Struct, frozen=True):
    seq: int
    concepts: list[ConceptState]  # existing concepts only, sorted by id


class StoreSnapshot(msgspec.Struct, frozen=True):
    gid: int  # the log position this state reflects; follow the log from here
    kbs: dict[str, KBState]  # every KB with seq >= 1


class StoreClosed(RuntimeError):
    """The store was closed: no more deliveries are taken."""


class StoreBusy(RuntimeError):
    """Another process held the write lock for longer than ``BUSY_RETRY_SECONDS``."""


def fts_table(kid: int) -> str:
    """The FTS5 table of one KB: one per KB, so BM25 statistics never mix KBs."""
    return f"fts_{int(kid)}"


FTS_COLUMNS: Final = "title, aliases, text"
FTS_WEIGHTS: Final = "10.0, 10.0, 1.0"  # aliases are searched like the title
# A concept's aliases as the FTS5 column holds them: one per line (a JSON escape such as
# ``\n`` must not become a token, so the JSON list is never indexed as it is).
_FTS_ALIASES: Final = "(SELECT coalesce(group_concat(value, char(10)), '') FROM json_each({}))"


def fts_match(terms: list[str]) -> str:
    """An FTS5 MATCH expression that interprets no syntax: each term quoted, joined by OR."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


# --------------------------------------------------------------------------------------------
# Applying deliveries


@dataclass(slots=True)
class _Subject:
    """A concept touched by the group: what the store knew, then what the events made of it."""

    rid: int | None  # concept row before the delivery (None: no concept)
    had_tombstone: bool
    version: int | None  # known version: concept's, else tombstone's, else None
    exists: bool
    touched: bool = False  # some event applied
    fields: ConceptUpserted | None = None  # last applied upsert (if not deleted after it)
    rewrite: bool = False  # fields / links replaced (upsert or delete applied)
    links: set[str] = field(default_factory=set)  # full link set when rewrite
    added: set[str] = field(default_factory=set)  # link.added since no rewrite
    removed: set[str] = field(default_factory=set)  # link.removed since no rewrite


@dataclass(slots=True)
class _KBWork:
    """One KB's part of a group being applied."""

    kid: int
    seq_before: int
    seq: int = -1
    seen: set[tuple[str, str]] = field(default_factory=set)  # accepted (source, id) keys
    subjects: dict[str, _Subject] = field(default_factory=dict)
    new_keys: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.seq < 0:
            self.seq = self.seq_before


@dataclass(slots=True)
class _Pending:
    kb: str
    events: list[Event]
    resolve: Callable[[DeliveryResult | None, BaseException | None], None]


class _Bulk(NamedTuple):
    """One write over many rows: ``json`` takes (?1 rows as JSON, ?2 kid); ``many`` (kid, *row)."""

    json: str
    many: str
    json_takes_kid: bool = True


class _Lookup(NamedTuple):
    """Rows matching many keys: ``json`` answers one JSON array; ``one`` is per key."""

    json: str
    one: str


def _bulk(conn: sqlite3.Connection, statement: _Bulk, kid: int, rows: list[tuple]) -> None:
    if not rows:
        return
    payload = _tags_encoder.encode(rows)
    if NUL_ESCAPE in payload:
        conn.executemany(statement.many, [(kid, *row) for row in rows])
    else:
        conn.execute(statement.json, (payload, kid) if statement.json_takes_kid else (payload,))


def _lookup(
    conn: sqlite3.Connection, statement: _Lookup, kid: int, keys: list[str] | list[tuple[str, str]]
) -> list[list]:
    out: list[list] = []
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        payload = _tags_encoder.encode(chunk)
        if NUL_ESCAPE in payload:
            for key in chunk:
                params = (kid, *key) if isinstance(key, tuple) else (kid, key)
                out.extend(list(row) for row in conn.execute(statement.one, params))
        else:
            out.extend(
                _rows_decoder.decode(conn.execute(statement.json, (payload, kid)).fetchone()[0])
            )
    return out


class Store:
    """One SQLite file in WAL mode; safe to share between threads and between processes."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        """Open (creating) the store; ``read_only`` opens an existing one for reading only
        (``load``, ``read_log``: what a process that only follows the log needs)."""
        self.path = Path(path)
        self.read_only = read_only
        self._closed = False
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._idle_readers: list[sqlite3.Connection] = []
        self._all_readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._lock_file = None
        self.log = SqliteLog(self._reader)
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"no store at {self.path}")
            self._thread: threading.Thread | None = None
            with self._reader() as conn:
                conn.execute("SELECT count(*) FROM kb").fetchone()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is not None:
            self._lock_file = open(  # noqa: SIM115 - held for the store's lifetime
                str(self.path) + ".writelock", "a+b"
            )
        self._writer_conn = self._connect()
        self._init_schema(self._writer_conn)
        self._thread = threading.Thread(
            target=self._writer_loop, name=f"kbgraph-store-writer:{self.path.name}", daemon=True
        )
        self._thread.start()

    # -- connections -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro" if self.read_only else str(self.path),
            isolation_level=None,  # we issue BEGIN / COMMIT ourselves
            check_same_thread=False,
            cached_statements=512,
            timeout=BUSY_TIMEOUT_MS / 1000,
            uri=self.read_only,
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not self.read_only:  # a read-only connection reads the WAL the writers keep
            self._retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL"))
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA cache_size = -32000")
        conn.execute("PRAGMA temp_store = MEMORY")
        return conn

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A pooled read connection (readers never block the writer in WAL mode)."""
        if self._closed:
            raise StoreClosed("store closed")
        with self._readers_lock:
            conn = self._idle_readers.pop() if self._idle_readers else None
        if conn is None:
            conn = self._connect()
            with self._readers_lock:
                self._all_readers.append(conn)
        try:
            yield conn
        finally:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            with self._readers_lock:
                self._idle_readers.append(conn)

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        with self._write_lock():
            self._begin_immediate(conn)
            try:
                found = conn.execute("PRAGMA user_version").fetchone()[0]
                if found > SCHEMA_VERSION:
                    raise RuntimeError(
                        f"{self.path}: store schema version {found} is newer than this kbgraph "
                        f"understands ({SCHEMA_VERSION})"
                    )
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                if found == 1:
                    self._migrate_from_1(conn)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                self._retry_busy(lambda: conn.execute("COMMIT"))
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @staticmethod
    def _migrate_from_1(conn: sqlite3.Connection) -> None:
        """Schema 1 -> 2: concepts gain ``aliases``; each KB's FTS5 table gains the column."""
        columns = {row[1] for row in conn.execute("PRAGMA table_info(concept)")}
        if "aliases" not in columns:
            conn.execute("ALTER TABLE concept ADD COLUMN aliases TEXT NOT NULL DEFAULT '[]'")
        for (kid,) in conn.execute("SELECT kid FROM kb").fetchall():
            fts = fts_table(kid)
            conn.execute(f"DROP TABLE IF EXISTS {fts}")
            Store._create_fts(conn, kid)
            conn.execute(
                f"INSERT INTO {fts} (rowid, {FTS_COLUMNS}) SELECT rid, title,"
                f" {_FTS_ALIASES.format('aliases')}, text FROM concept WHERE kid = ?",
                (kid,),
            )

    @staticmethod
    def _create_fts(conn: sqlite3.Connection, kid: int) -> None:
        # Its own content (not external): a row leaves the index by rowid alone.
        conn.execute(
            f"CREATE VIRTUAL TABLE {fts_table(kid)} USING fts5({FTS_COLUMNS},"
            " tokenize = 'unicode61 remove_diacritics 2')"
        )

    @staticmethod
    def _retry_busy(action: Callable[[], _T]) -> _T:
        deadline = time.monotonic() + BUSY_RETRY_SECONDS
        while True:
            try:
                return action()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    if _is_busy(exc):
                        raise StoreBusy(str(exc)) from exc
                    raise
                time.sleep(0.001)

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))

    @contextlib.contextmanager
    def _write_lock(self) -> Iterator[None]:
        """Cross-process writer lock (advisory): waiters wake at once instead of polling."""
        if self._lock_file is None:
            yield
            return
        fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)

    # -- appending ---------------------------------------------------------------------------

    def append(self, kb: str, events: list[Event]) -> DeliveryResult:
        """Apply one delivery atomically and durably (blocking; thread-safe)."""
        if not events:
            return self._empty_result(kb)
        future: concurrent.futures.Future[DeliveryResult] = concurrent.futures.Future()

        def resolve(result: DeliveryResult | None, exc: BaseException | None) -> None:
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        self._submit(_Pending(kb, list(events), resolve))
        return future.result()

    async def append_async(self, kb: str, events: list[Event]) -> DeliveryResult:
        """``append`` for the event loop: never blocks it (the writer thread resolves a future)."""
        if not events:
            return self._empty_result(kb)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[DeliveryResult] = loop.create_future()

        def settle(result: DeliveryResult | None, exc: BaseException | None) -> None:
            if future.cancelled():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        def resolve(result: DeliveryResult | None, exc: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, result, exc)

        self._submit(_Pending(kb, list(events), resolve))
        # Shielded: a caller cancelled while waiting (a client that hung up) does not undo the
        # delivery; its outcome is then consumed here so that nothing is logged as unretrieved.
        future.add_done_callback(_consume)
        return await asyncio.shield(future)

    def _empty_result(self, kb: str) -> DeliveryResult:
        if self._closed:
            raise StoreClosed("store closed")
        return DeliveryResult(0, 0, 0, 0, 0, self.kb_seq(kb))

    def _submit(self, pending: _Pending) -> None:
        if self._closed:
            raise StoreClosed("store closed")
        if self.read_only:
            raise StoreClosed("store opened read-only")
        self._queue.put(pending)

    def _writer_loop(self) -> None:
        conn = self._writer_conn
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            group = [first]
            events = len(first.events)
            while len(group) < MAX_GROUP_DELIVERIES and events < MAX_GROUP_EVENTS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                group.append(item)
                events += len(item.events)
            self._commit_group(conn, group)
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        # Deliveries that raced with close() behind the stop marker: refuse, never strand them.
        while True:
            try:
                late = self._queue.get_nowait()
            except queue.Empty:
                break
            if late is not None:
                with contextlib.suppress(Exception):
                    late.resolve(None, StoreClosed("store closed"))

    def _commit_group(self, conn: sqlite3.Connection, group: list[_Pending]) -> None:
        """One transaction, one fsync for the group; each caller gets its own outcome.

        Fast path: the whole group applied at once. Should that raise, the transaction is
        rolled back and the group replayed one delivery per SAVEPOINT, so that only the
        deliveries that fail are refused.
        """
        outcomes: list[tuple[DeliveryResult | None, BaseException | None]] = []
        try:
            with self._write_lock():
                self._begin_immediate(conn)
                try:
                    try:
                        results = self._apply_group(conn, [(p.kb, p.events) for p in group])
                        outcomes = [(result, None) for result in results]
                    except Exception:
                        conn.execute("ROLLBACK")
                        self._begin_immediate(conn)
                        outcomes = [self._apply_alone(conn, p) for p in group]
                    self._retry_busy(lambda: conn.execute("COMMIT"))
                except BaseException:
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    raise
        except Exception as exc:  # the group did not commit: nobody's delivery is stored
            outcomes = [(None, exc)] * len(group)
        for pending, (result, exc) in zip(group, outcomes, strict=True):
            # A closed event loop must not stop the writer.
            with contextlib.suppress(Exception):
                pending.resolve(result, exc)

    def _apply_alone(
        self, conn: sqlite3.Connection, pending: _Pending
    ) -> tuple[DeliveryResult | None, BaseException | None]:
        conn.execute("SAVEPOINT delivery")
        try:
            (result,) = self._apply_group(conn, [(pending.kb, pending.events)])
        except Exception as exc:
            conn.execute("ROLLBACK TO delivery")
            conn.execute("RELEASE delivery")
            return None, exc
        conn.execute("RELEASE delivery")
        return result, None

    # The statements of a group. Bulk writes and lookups pass all their rows as ONE JSON
    # parameter read with json_each: one sqlite3_step per statement instead of one per row.
    # That matters beyond SQLite's own cost: the sqlite3 module releases and re-takes the GIL
    # around every step, and each re-take can wait behind the event loop or the projection
    # thread. (SQLite's JSON functions cut text at U+0000, so a payload holding one falls back
    # to executemany, row by row.)
    _KB_GET: Final = "SELECT kid, seq FROM kb WHERE name = ?"
    _KB_NEW: Final = "INSERT INTO kb (name, seq) VALUES (?, 0) RETURNING kid"
    _KB_SET_SEQ: Final = "UPDATE kb SET seq = ? WHERE kid = ?"
    _SEEN: Final = _Lookup(
        "SELECT json_group_array(json_array(a.source, a.id)) FROM json_each(?1) AS j"
        " CROSS JOIN accepted AS a"
        " ON a.kid = ?2 AND a.source = j.value ->> 0 AND a.id = j.value ->> 1",
        "SELECT source, id FROM accepted WHERE kid = ?1 AND source = ?2 AND id = ?3",
    )
    _SUBJECTS: Final = _Lookup(
        "SELECT json_group_array(json_array(j.value, c.rid, c.version, t.version))"
        " FROM json_each(?1) AS j"
        " LEFT JOIN concept AS c ON c.kid = ?2 AND c.id = j.value"
        " LEFT JOIN tombstone AS t ON t.kid = ?2 AND t.id = j.value"
        " WHERE c.rid IS NOT NULL OR t.version IS NOT NULL",
        "SELECT ?2, c.rid, c.version, t.version FROM (SELECT 1)"
        " LEFT JOIN concept AS c ON c.kid = ?1 AND c.id = ?2"
        " LEFT JOIN tombstone AS t ON t.kid = ?1 AND t.id = ?2"
        " WHERE c.rid IS NOT NULL OR t.version IS NOT NULL",
    )
    _ACCEPT: Final = _Bulk(
        "INSERT INTO accepted (kid, source, id) SELECT ?2, value ->> 0, value ->> 1"
        " FROM json_each(?1)",
        "INSERT INTO accepted (kid, source, id) VALUES (?1, ?2, ?3)",
    )
    # New and rewritten concepts in one statement (an updated row keeps its rid).
    _UPSERT: Final = _Bulk(
        "INSERT INTO concept (kid, id, version, title, type, status, tags, text, aliases)"
        " SELECT ?2, value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4,"
        " value ->> 5, value ->> 6, value ->> 7 FROM json_each(?1) WHERE true"
        " ON CONFLICT (kid, id) DO UPDATE SET version = excluded.version,"
        " title = excluded.title, type = excluded.type, status = excluded.status,"
        " tags = excluded.tags, text = excluded.text, aliases = excluded.aliases",
        "INSERT INTO concept (kid, id, version, title, type, status, tags, text, aliases)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        " ON CONFLICT (kid, id) DO UPDATE SET version = excluded.version,"
        " title = excluded.title, type = excluded.type, status = excluded.status,"
        " tags = excluded.tags, text = excluded.text, aliases = excluded.aliases",
    )
    _SET_VERSION: Final = _Bulk(
        "UPDATE concept SET version = j.value ->> 1 FROM json_each(?1) AS j"
        " WHERE concept.rid = j.value ->> 0",
        "UPDATE concept SET version = ?3 WHERE rid = ?2",
        json_takes_kid=False,
    )
    _DELETE_CONCEPT: Final = _Bulk(
        "DELETE FROM concept WHERE rid IN (SELECT value ->> 0 FROM json_each(?1))",
        "DELETE FROM concept WHERE rid = ?2",
        json_takes_kid=False,
    )
    _TOMBSTONE: Final = _Bulk(
        "INSERT OR REPLACE INTO tombstone (kid, id, version)"
        " SELECT ?2, value ->> 0, value ->> 1 FROM json_each(?1)",
        "INSERT OR REPLACE INTO tombstone (kid, id, version) VALUES (?1, ?2, ?3)",
    )
    _UNTOMBSTONE: Final = _Bulk(
        "DELETE FROM tombstone WHERE kid = ?2 AND id IN (SELECT value ->> 0 FROM json_each(?1))",
        "DELETE FROM tombstone WHERE kid = ?1 AND id = ?2",
    )
    _LINKS_CLEAR: Final = _Bulk(
        "DELETE FROM link WHERE kid = ?2 AND src IN (SELECT value ->> 0 FROM json_each(?1))",
        "DELETE FROM link WHERE kid = ?1 AND src = ?2",
    )
    _LINK_ADD: Final = _Bulk(
        "INSERT OR IGNORE INTO link (kid, src, dst) SELECT ?2, value ->> 0, value ->> 1"
        " FROM json_each(?1)",
        "INSERT OR IGNORE INTO link (kid, src, dst) VALUES (?1, ?2, ?3)",
    )
    # link.removed is rare: row by row, each delete a primary-key seek
    _LINK_REMOVE: Final = "DELETE FROM link WHERE kid = ? AND src = ? AND dst = ?"

    @staticmethod
    def _fts_statements(kid: int) -> tuple[_Bulk, _Bulk]:
        fts = fts_table(kid)
        return (
            _Bulk(
                f"DELETE FROM {fts} WHERE rowid IN (SELECT value ->> 0 FROM json_each(?1))",
                f"DELETE FROM {fts} WHERE rowid = ?2",
                json_takes_kid=False,
            ),
            # indexed straight from the concept rows just written: the text travels once
            _Bulk(
                f"INSERT INTO {fts} (rowid, {FTS_COLUMNS}) SELECT c.rid, c.title,"
                f" {_FTS_ALIASES.format('c.aliases')}, c.text"
                " FROM json_each(?1) AS j CROSS JOIN concept AS c"
                " ON c.kid = ?2 AND c.id = j.value ->> 0",
                f"INSERT INTO {fts} (rowid, {FTS_COLUMNS})"
                f" SELECT rid, title, {_FTS_ALIASES.format('aliases')}, text FROM concept"
                " WHERE kid = ?1 AND id = ?2",
            ),
        )

    def _kb_row(self, conn: sqlite3.Connection, kb: str) -> tuple[int, int]:
        row = conn.execute(self._KB_GET, (kb,)).fetchone()
        if row is not None:
            return row[0], row[1]
        kid = conn.execute(self._KB_NEW, (kb,)).fetchone()[0]
        self._create_fts(conn, kid)
        return kid, 0

    def _load_kb(self, conn: sqlite3.Connection, kb: str, deliveries: list[list[Event]]) -> _KBWork:
        """What the store already knows about the keys and subjects these deliveries touch."""
        kid, seq = self._kb_row(conn, kb)
        work = _KBWork(kid, seq)
        keys = list({(event.source, event.id) for events in deliveries for event in events})
        work.seen.update(tuple(row) for row in _lookup(conn, self._SEEN, kid, keys))
        ids = list({event.subject for events in deliveries for event in events})
        known = {row[0]: row for row in _lookup(conn, self._SUBJECTS, kid, ids)}
        subjects = work.subjects
        for cid in ids:
            row = known.get(cid)
            if row is None:
                subjects[cid] = _Subject(None, False, None, False)
            elif row[1] is not None:  # an existing concept (a tombstone, if any, is older)
                subjects[cid] = _Subject(row[1], row[3] is not None, row[2], True)
            else:
                subjects[cid] = _Subject(None, True, row[3], False)
        return work

    def _apply_group(
        self, conn: sqlite3.Connection, group: list[tuple[str, list[Event]]]
    ) -> list[DeliveryResult]:
        """Apply deliveries in order in the open transaction; few statements for the group.

        Every event is decided in memory against what the store knew plus what the earlier
        events of the group did; then the net effect per concept is written with one
        ``executemany`` per statement. (FTS5 flushes its pending index at every savepoint, so
        one savepoint per delivery would also cost an index segment per delivery.)
        """
        per_kb: dict[str, list[list[Event]]] = {}
        for kb, events in group:
            per_kb.setdefault(kb, []).append(events)
        works = {kb: self._load_kb(conn, kb, deliveries) for kb, deliveries in per_kb.items()}
        entries: list[tuple[str, int, Event, bool]] = []
        results = []
        for kb, events in group:
            work = works[kb]
            applied, duplicates, stale, ignored = self._decide(work, events)
            last = len(applied) - 1
            for index, event in enumerate(applied):
                entries.append((kb, work.seq + 1 + index, event, index == last))
            work.seq += len(applied)
            results.append(
                DeliveryResult(len(events), len(applied), duplicates, stale, ignored, work.seq)
            )
        for work in works.values():
            _bulk(conn, self._ACCEPT, work.kid, work.new_keys)
            if work.seq != work.seq_before:
                self._write_subjects(conn, work.kid, work.subjects)
                conn.execute(self._KB_SET_SEQ, (work.seq, work.kid))
        if entries:
            SqliteLog.append(conn, entries)
        return results

    @staticmethod
    def _decide(work: _KBWork, events: list[Event]) -> tuple[list[Event], int, int, int]:
        """Decide each event in delivery order, folding its effect into its subject."""
        seen, subjects, new_keys = work.seen, work.subjects, work.new_keys
        applied: list[Event] = []
        duplicates = stale = ignored = 0
        for event in events:
            key = (event.source, event.id)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            new_keys.append(key)
            subject = subjects[event.subject]
            version = event.data.version
            if subject.version is not None and version <= subject.version:
                stale += 1
                continue
            if isinstance(event, (LinkAdded, LinkRemoved)):
                if not subject.exists:
                    ignored += 1
                    continue
                target = event.data.target
                if isinstance(event, LinkAdded):
                    if target != event.subject:  # a self-link declares nothing
                        if subject.rewrite:
                            subject.links.add(target)
                        else:
                            subject.added.add(target)
                            subject.removed.discard(target)
                elif subject.rewrite:
                    subject.links.discard(target)
                else:
                    subject.removed.add(target)
                    subject.added.discard(target)
            elif isinstance(event, ConceptUpserted):
                subject.exists = True
                subject.fields = event
                subject.rewrite = True
                subject.links = set(event.data.links)
                subject.links.discard(event.subject)
            elif isinstance(event, ConceptDeleted):
                subject.exists = False
                subject.fields = None
                subject.rewrite = True
                subject.links = set()
            else:  # pragma: no cover - decode_delivery admits only the four types
                raise TypeError(f"unknown event type {type(event).__name__}")
            subject.version = version
            subject.touched = True
            applied.append(event)
        return applied, duplicates, stale, ignored

    def _write_subjects(
        self, conn: sqlite3.Connection, kid: int, subjects: dict[str, _Subject]
    ) -> None:
        """The net effect of the group on each touched concept, one statement per kind."""
        fts_delete: list[tuple[int]] = []
        fts_insert: list[tuple[str]] = []
        upsert_rows: list[tuple[str, int, str, str, str, str, str, str]] = []
        set_version: list[tuple[int, int]] = []
        delete_rows: list[tuple[int]] = []
        tombstones: list[tuple[str, int]] = []
        untombstone: list[tuple[str]] = []
        clear_links: list[tuple[str]] = []
        add_links: list[tuple[str, str]] = []
        remove_links: list[tuple[int, str, str]] = []
        encode_tags = _tags_encoder.encode
        for cid, subject in subjects.items():
            if not subject.touched:
                continue
            version = subject.version
            assert version is not None
            rid = subject.rid
            if subject.exists:
                if subject.fields is not None:
                    data = subject.fields.data
                    tags = encode_tags(data.tags).decode()
                    aliases = encode_tags(data.aliases).decode()
                    upsert_rows.append(
                        (cid, version, data.title, data.type, data.status, tags, data.text,
                         aliases)
                    )  # fmt: skip
                    if rid is not None:
                        fts_delete.append((rid,))
                    fts_insert.append((cid,))
                else:  # only link events: the concept existed before and still does
                    assert rid is not None
                    set_version.append((rid, version))
                if subject.had_tombstone:
                    untombstone.append((cid,))
            else:
                if rid is not None:
                    delete_rows.append((rid,))
                    fts_delete.append((rid,))
                tombstones.append((cid, version))
            if subject.rewrite:
                if rid is not None:  # a concept new to the store has no links yet
                    clear_links.append((cid,))
                add_links.extend([(cid, dst) for dst in subject.links])
            else:
                remove_links.extend([(kid, cid, dst) for dst in subject.removed])
                add_links.extend([(cid, dst) for dst in subject.added])
        fts_delete_stmt, fts_insert_stmt = self._fts_statements(kid)
        # Old FTS rows leave before the concept rows change (own-content FTS reads its copy).
        _bulk(conn, fts_delete_stmt, kid, fts_delete)
        _bulk(conn, self._DELETE_CONCEPT, kid, delete_rows)
        _bulk(conn, self._UPSERT, kid, upsert_rows)
        _bulk(conn, fts_insert_stmt, kid, fts_insert)
        _bulk(conn, self._SET_VERSION, kid, set_version)
        _bulk(conn, self._TOMBSTONE, kid, tombstones)
        _bulk(conn, self._UNTOMBSTONE, kid, untombstone)
        _bulk(conn, self._LINKS_CLEAR, kid, clear_links)
        if remove_links:
            conn.executemany(self._LINK_REMOVE, remove_links)
        add_links.sort()  # key order: B-tree inserts with locality
        _bulk(conn, self._LINK_ADD, kid, add_links)

    # -- reading -----------------------------------------------------------------------------

    def read_log(self, after_gid: int, limit: int = 10_000) -> list[LogRecord]:
        """Applied events with gid > after_gid in gid order, whole deliveries only."""
        return self.log.read(after_gid, limit)

    def load(self) -> StoreSnapshot:
        """The state of every KB with seq >= 1 and the gid it reflects, in one read snapshot."""
        with self._reader() as conn, read_transaction(conn):
            gid = conn.execute("SELECT coalesce(max(gid), 0) FROM log").fetchone()[0]
            kbs = conn.execute("SELECT kid, name, seq FROM kb WHERE seq > 0").fetchall()
            rows = conn.execute(
                "SELECT kid, id, version, title, type, status, tags, text, aliases FROM concept"
            ).fetchall()
            link_rows = conn.execute("SELECT kid, src, dst FROM link").fetchall()
        links: dict[tuple[int, str], list[str]] = {}
        for kid, src, dst in link_rows:
            links.setdefault((kid, src), []).append(dst)
        concepts: dict[int, list[ConceptState]] = {}
        for kid, cid, version, title, ctype, status, tags, text, aliases in rows:
            concepts.setdefault(kid, []).append(
                ConceptState(
                    id=cid,
                    version=version,
                    title=title,
                    type=ctype,
                    status=status,
                    tags=_tags_decoder.decode(tags),
                    text=text,
                    links=sorted(links.get((kid, cid), ())),
                    aliases=_tags_decoder.decode(aliases),
                )
            )
        return StoreSnapshot(
            gid=gid,
            kbs={
                name: KBState(seq=seq, concepts=sorted(concepts.get(kid, []), key=_by_id))
                for kid, name, seq in sorted(kbs, key=lambda row: row[1])
            },
        )

    def kb_seq(self, kb: str) -> int:
        """The KB's current log position (0 for a KB with no applied event)."""
        with self._reader() as conn:
            row = conn.execute(self._KB_GET, (kb,)).fetchone()
        return 0 if row is None else row[1]

    def fts_search(self, kb: str, terms: list[str], limit: int) -> list[tuple[str, float]]:
        """(id, -bm25(title 10, aliases 10, text 1)) from the KB's FTS5 index, best first.

        Ties break by id. Every term is quoted, so no search syntax is ever interpreted.
        """
        terms = [term for term in terms if term]
        if not terms or limit <= 0:
            return []
        with self._reader() as conn:
            row = conn.execute(self._KB_GET, (kb,)).fetchone()
            if row is None:
                return []
            fts = fts_table(row[0])
            rows = conn.execute(
                f"SELECT c.id, -bm25({fts}, {FTS_WEIGHTS}) AS score FROM {fts}"
                f" JOIN concept AS c ON c.rid = {fts}.rowid"
                f" WHERE {fts} MATCH ? ORDER BY score DESC, c.id LIMIT ?",
                (fts_match(terms), limit),
            ).fetchall()
        return [(cid, float(score)) for cid, score in rows]

    def close(self) -> None:
        """Finish the queued deliveries, stop the writer, close every connection."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        with self._readers_lock:
            for conn in self._all_readers:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._all_readers.clear()
            self._idle_readers.clear()
        if self._lock_file is not None:
            self._lock_file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _consume(future: asyncio.Future[DeliveryResult]) -> None:
    if not future.cancelled():
        future.exception()


def _by_id(concept: ConceptState) -> str:
    return concept.id


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text
