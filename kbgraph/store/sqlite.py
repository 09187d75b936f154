"""The embedded store: one SQLite file holding the event log and every KB's current state.

One file in WAL mode with ``synchronous=FULL``. Every commit fsyncs the WAL before ``append``
returns, so an acknowledged delivery survives an OS crash or a power loss, not only the death
of the process (a small commit measures 0.35-0.5 ms here; group commit spreads that fsync
over every delivery that arrived meanwhile).

- ``append(kb, events)`` applies one delivery atomically: all of it or none of it, decided by
  ``kbgraph.store.decide``, and returns only after the commit is durable. Only applied events
  enter the log, each taking the next gapless ``seq`` of its KB (and the next global ``gid``).
- The log is followed by every process (``read_log``); ``load`` gives a consistent snapshot of
  the current state together with the ``gid`` it reflects, for a projection's first build.

Group commit: one fsync per delivery caps a disk at a few thousand deliveries per second at
best, and far less once HTTP shares the CPU. So each Store runs ONE writer thread that drains
the queue of pending deliveries, applies the whole group in one pass and commits once, then
resolves every caller. Should anything in the group raise, the transaction is rolled back and
the group replayed one delivery per SAVEPOINT, so only the failing delivery is refused. What a
group does inside the transaction is ``kbgraph.store.group``.

Only what must be durable is written: the log, the current state (declared links are a column
of the concept's row), tombstones and accepted keys. Search is answered from memory
(``kbgraph.search``, built from the state at start-up), so the store keeps no full-text index
(schema 3 dropped the FTS5 tables).

Several processes may share the file: writers serialize on SQLite's write lock (``BEGIN
IMMEDIATE`` with a busy timeout and retries), fronted by an advisory file lock so a waiting
writer wakes the moment the other commits instead of polling.

The log itself is ``kbgraph.store.eventlog`` (append / read of ``LogRecord``), kept apart from the
state tables; beyond one machine, a NATS JetStream stream orders the deliveries and each node's
store applies them from it (``kbgraph.log.jetstream``, ``submit_from_log``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final, TypeVar

from kbgraph.embeddings import carried, shipped
from kbgraph.events import Event
from kbgraph.store import logcut, positions, schema, vectorrows
from kbgraph.store import statements as sql
from kbgraph.store.eventlog import LogRecord, SqliteLog, read_transaction
from kbgraph.store.group import GroupWriter, LoggedVectors, MadeAhead, Pending, analyser
from kbgraph.store.load import load_columns, load_snapshot
from kbgraph.store.model import (
    ColumnSnapshot,
    DeliveryResult,
    LogCut,
    StoreBusy,
    StoreClosed,
    StoreSnapshot,
    WebhookMessage,
)
from kbgraph.store.vectorrows import VectorRow
from kbgraph.threads import LoopSettle, settle_groups

try:  # POSIX only; elsewhere the writers rely on SQLite's busy handler alone.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

BUSY_TIMEOUT_MS: Final = 5_000
DEDUPE_KEYS: Final = 1_000_000  # a KB's accepted keys remembered: its last million
BUSY_RETRY_SECONDS: Final = 60.0  # give up on the write lock after this long (then 503)
MAX_GROUP_DELIVERIES: Final = 512
MAX_GROUP_EVENTS: Final = 20_000  # bounds one group's transaction (and its latency)
_T = TypeVar("_T")


class Store:
    """One SQLite file in WAL mode; safe to share between threads and between processes."""

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        max_kbs: int | None = None,
        named_kbs: frozenset[str] = frozenset(),
        dedupe_keys: int = DEDUPE_KEYS,
        carrier: carried.Carrier | None = None,
    ) -> None:
        """Open (creating) the store; ``read_only`` opens an existing one for reading only
        (``load``, ``read_log``: what a process that only follows the log needs). A delivery
        that would create a KB beyond ``max_kbs`` is refused with ``KBLimitReached``, unless
        the config names that KB (``named_kbs``: a flood of new KBs cannot lock them out).
        ``carrier`` (the local model): each upsert's vector is made once, here, and carried
        in its log row (``kbgraph.embeddings.carried``)."""
        self.path = Path(path)
        self.read_only = read_only
        self.max_kbs = max_kbs
        self.clock: Callable[[], float] = time.time  # webhook-id bindings' time (tests move it)
        self.named_kbs = named_kbs
        self.dedupe_keys = dedupe_keys
        self.carrier = carrier
        self._group = GroupWriter(self)
        self._closed = False
        self._inbox: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()  # to analyse
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()  # to write
        self._idle_readers: list[sqlite3.Connection] = []
        self._all_readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._lock_file = None
        self.log = SqliteLog(self._reader)
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"no store at {self.path}")
            self._thread: threading.Thread | None = None
            self._analyser: threading.Thread | None = None
            with self._reader() as conn:
                conn.execute(sql.KB_COUNT).fetchone()
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
        self._analyser = threading.Thread(  # group.analyser: each delivery's analysis
            target=analyser,
            args=(self._inbox, self._queue, carrier),
            name=f"kbgraph-store-analyser:{self.path.name}",
            daemon=True,
        )
        self._analyser.start()

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
        if not self.read_only:
            # a read-only connection reads the WAL the writers keep; auto_vacuum goes before
            # WAL: a new file takes it only then
            schema.set_auto_vacuum(conn)
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

    reading = _reader  # for a caller that reads the file's SQL itself (a test of the pragmas)

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        with self._write_lock():
            self._begin_immediate(conn)
            try:
                schema.create_or_migrate(conn)
                self._retry_busy(lambda: conn.execute("COMMIT"))
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

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

    def append(
        self,
        kb: str,
        events: list[Event],
        *,
        message: WebhookMessage | None = None,
        ahead: Sequence[MadeAhead | None] = (),
    ) -> DeliveryResult:
        """Apply one delivery atomically and durably (blocking; thread-safe).

        ``message`` (a signed delivery's) binds the delivery to its KB: the same message for
        another KB within ``BINDING_SECONDS``, or new events under a message accepted before for
        this KB, raise ``ReplayRefused``, storing nothing. ``ahead``: ``MadeAhead`` per event."""
        if not events:
            return self._empty_result(kb)
        future: concurrent.futures.Future[DeliveryResult] = concurrent.futures.Future()

        def resolve(result: DeliveryResult | None, exc: BaseException | None) -> None:
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        self._submit(Pending(kb, list(events), resolve, message, ahead=ahead))
        return future.result()

    async def append_async(
        self, kb: str, events: list[Event], *, message: WebhookMessage | None = None
    ) -> DeliveryResult:
        """``append`` for the event loop: never blocks it (the writer thread resolves a future)."""
        if not events:
            return self._empty_result(kb)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[DeliveryResult] = loop.create_future()
        self._submit(Pending(kb, list(events), LoopSettle(loop, future), message))
        # Shielded: a caller cancelled while waiting (a client that hung up) does not undo the
        # delivery; its outcome is then consumed here so that nothing is logged as unretrieved.
        future.add_done_callback(_consume)
        return await asyncio.shield(future)

    def submit_from_log(
        self,
        kb: str,
        events: list[Event],
        message: WebhookMessage | None,
        at: float,
        position: tuple[str, int],
        resolve: Callable[[DeliveryResult | None, BaseException | None], None],
        vectors: shipped.Shipped | None = None,
    ) -> None:
        """Queue one delivery read from a replicated log at ``position`` (stream, sequence).

        Decided as ``append`` decides, with ``at`` (the log's timestamp) as the time of the
        webhook-id binding. The position commits with the state it produced; a group whose
        first position does not follow the stored one, or that fails for a reason other than
        the delivery's own refusal (``ReplayRefused``, ``KBLimitReached``), commits nothing
        and resolves every member with the error: the caller reads on from ``log_position``.
        ``vectors``: the local model's, shipped in its message (``kbgraph.embeddings.shipped``).
        """
        pending = Pending(kb, list(events), resolve, message, at=at, position=position)
        pending.shipped = vectors
        self._submit(pending)

    def submit_note_from_log(
        self,
        position: tuple[str, int],
        kind: str,
        detail: str,
        resolve: Callable[[DeliveryResult | None, BaseException | None], None],
        message: WebhookMessage | None = None,
    ) -> None:
        """Queue a message of a replicated log that applies nothing: its position is taken and
        ``(kind, detail)`` noted with it (``stream_note``), in order with the deliveries, with
        the signed webhook message of a delivery it skips."""
        self._submit(Pending("", [], resolve, message, position=position, note=(kind, detail)))

    def submit_vectors_from_log(
        self,
        position: tuple[str, int],
        kb: str,
        vectors: LoggedVectors,
        resolve: Callable[[DeliveryResult | None, BaseException | None], None],
    ) -> None:
        """Queue a replicated log's vectors message: its rows are taken in order with the
        deliveries, for the concepts' texts at its position (``vectorrows.take``), and noted
        with the position (kind ``vectors``) in the same transaction."""
        self._submit(Pending(kb, [], resolve, position=position, vectors=vectors))

    def skipped_messages(self, stream: str) -> set[WebhookMessage]:
        """The signed webhook messages of the deliveries skipped in ``stream``."""
        with self._reader() as conn:
            rows = conn.execute(positions.SKIPPED_MESSAGES, (stream,)).fetchall()
        return {WebhookMessage(row[0], row[1]) for row in rows}

    def stream_note(self, stream: str, seq: int) -> tuple[str, str] | None:
        """(kind, detail) noted at ``seq`` of ``stream``, or None (it applied, or not reached)."""
        with self._reader() as conn:
            row = conn.execute(positions.NOTE_GET, (stream, seq)).fetchone()
        return None if row is None else (row[0], row[1])

    def stream_notes(self, stream: str) -> list[tuple[int, str, str]]:
        """Every (seq, kind, detail) noted for ``stream``, in order."""
        with self._reader() as conn:
            return [tuple(row) for row in conn.execute(positions.NOTES, (stream,))]

    def stream_outcomes(self, stream: str, seqs: list[int]) -> positions.Outcomes:
        """The last sequence of ``stream`` applied here, with what the deliveries at ``seqs``
        (those applied) answered (seq, result JSON or None, refusal, detail) and the notes
        among them (seq, kind, detail), read at one instant (``kbgraph.store.positions``)."""
        with self._reader() as conn, read_transaction(conn):
            return positions.outcomes(conn, stream, seqs)

    def log_position(self, stream: str) -> int:
        """The last sequence of ``stream`` whose delivery this store applied (0: none)."""
        with self._reader() as conn:
            return positions.position(conn, stream)

    def _empty_result(self, kb: str) -> DeliveryResult:
        if self._closed:
            raise StoreClosed("store closed")
        return DeliveryResult(0, 0, 0, 0, 0, self.kb_seq(kb))

    def _submit(self, pending: Pending) -> None:
        if self._closed:
            raise StoreClosed("store closed")
        if self.read_only:
            raise StoreClosed("store opened read-only")
        self._inbox.put(pending)

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
        for waiting in (self._queue, self._inbox):  # the analyser has stopped before the writer
            while True:
                try:
                    late = waiting.get_nowait()
                except queue.Empty:
                    break
                if late is not None:
                    with contextlib.suppress(Exception):
                        late.resolve(None, StoreClosed("store closed"))

    def commit_group(self, group: list[Pending]) -> None:
        """The writer's commit of ``group``, in this thread: only while nothing is appended."""
        self._commit_group(self._writer_conn, group)

    def _commit_group(self, conn: sqlite3.Connection, group: list[Pending]) -> None:
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
                    last_positions = positions.check(conn, group)
                    try:
                        results = self._group.apply(conn, group)
                        outcomes = [(result, None) for result in results]
                    except Exception:
                        conn.execute("ROLLBACK")
                        self._begin_immediate(conn)
                        outcomes = [self._apply_alone(conn, p) for p in group]
                    if last_positions:
                        positions.record(conn, group, outcomes, last_positions)
                    self._group.prune_messages(conn, group)
                    self._retry_busy(lambda: conn.execute("COMMIT"))
                except BaseException:
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    raise
        except Exception as exc:  # the group did not commit: nobody's delivery is stored
            outcomes = [(None, exc)] * len(group)
        # One wake-up per event loop for the whole group; a closed loop must not stop the writer.
        settle_groups(
            [(p.resolve, result, exc) for p, (result, exc) in zip(group, outcomes, strict=True)]
        )

    def _apply_alone(
        self, conn: sqlite3.Connection, pending: Pending
    ) -> tuple[DeliveryResult | None, BaseException | None]:
        conn.execute("SAVEPOINT delivery")
        try:
            (result,) = self._group.apply(conn, [pending])
        except Exception as exc:
            conn.execute("ROLLBACK TO delivery")
            conn.execute("RELEASE delivery")
            return None, exc
        conn.execute("RELEASE delivery")
        return result, None

    # -- reading -----------------------------------------------------------------------------

    def read_log(self, after_gid: int, limit: int = 10_000) -> list[LogRecord]:
        """Applied events with gid > after_gid in gid order, whole deliveries only;
        ``LogCut`` when some of them were cut away (follow from a newer state instead)."""
        records = self.log.read(after_gid, limit)
        # The cut keeps the newest record, so records cut from under a reader show as a gap
        # before the first one read; nothing read means nothing was missed (an idle poll).
        if records and records[0].gid != after_gid + 1:
            start = self.log_start()
            if after_gid + 1 < start:
                raise LogCut(f"the log starts at gid {start}, after {after_gid + 1}")
        return records

    @functools.cached_property
    def store_id(self) -> str:
        """A random id made with the file: checkpoints name the store they were made from."""
        with self._reader() as conn:
            store_id: str = conn.execute(sql.META_GET, ("store_id",)).fetchone()[0]
            return store_id

    def log_mark(self, gid: int) -> tuple[str, int, str] | None:
        """(kb, seq, digest of the event) of the log record at ``gid``; None when the log does
        not hold it."""
        with self._reader() as conn:
            return logcut.mark_at(conn, gid)

    def log_start(self) -> int:
        """The first gid the log may still hold: every record before it was cut."""
        with self._reader() as conn:
            return logcut.log_start(conn)

    def checkpoint_problem(
        self, store_id: str, gid: int, mark: tuple[str, int, str] | None
    ) -> str | None:
        """Why a checkpoint at ``gid`` made from ``store_id`` (whose log record at ``gid`` was
        ``mark``: kb, seq, digest) cannot be followed from this store, or None when it can."""
        if store_id != self.store_id:
            return "made from another store"
        with self._reader() as conn, read_transaction(conn):
            return logcut.follow_problem(conn, gid, mark)

    def cut_log(self, before_gid: int) -> int:
        """Delete the log's records before ``before_gid`` and the accepted keys past each KB's
        retention (``dedupe_keys``), and free their pages; returns the rows deleted
        (``kbgraph.store.logcut.cut``)."""
        if self.read_only:
            raise StoreClosed("store opened read-only")
        conn = self._connect()
        try:
            deleted = self._immediately(
                conn, lambda: logcut.cut(conn, before_gid, self.dedupe_keys)
            )
            if deleted:
                logcut.free_pages(conn)
                self._retry_busy(lambda: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
            return deleted
        finally:
            conn.close()

    def load(self) -> StoreSnapshot:
        """The state of every KB with seq >= 1 and the gid it reflects, in one read snapshot."""
        with self._reader() as conn, read_transaction(conn):
            return load_snapshot(conn)

    def load_columns(self) -> ColumnSnapshot:
        """``load`` as columns, for a first build (``kbgraph.store.load.load_columns``)."""
        with self._reader() as conn, read_transaction(conn):
            return load_columns(conn)

    def read_vectors(self, kb: str, model: str, concepts: list[str]) -> list[VectorRow]:
        """The stored vectors of ``concepts`` under ``model`` (``kbgraph.store.vectorrows``)."""
        with self._reader() as conn:
            return vectorrows.read(conn, kb, model, concepts)

    def write_vectors(self, kb: str, model: str, rows: list[VectorRow]) -> None:
        """Store computed vectors (and refusals) in their own short transaction."""
        if self.read_only:
            raise StoreClosed("store opened read-only")
        conn = self._connect()
        try:
            self._immediately(conn, lambda: vectorrows.write(conn, kb, model, rows))
        finally:
            conn.close()

    def prune_vectors(self, model: str | None, chunk: int = 1000) -> int:
        """Delete the vector rows of deleted concepts and of models other than ``model``
        (None: every model); found by a reader, deleted in short transactions of ``chunk``
        rows, so the writer is never held up for long. Returns the rows deleted."""
        with self._reader() as reader:
            keys = vectorrows.stale(reader, model)
        if not keys or self.read_only:
            return 0
        conn = self._connect()
        deleted = 0
        try:
            for start in range(0, len(keys), chunk):
                work = functools.partial(vectorrows.prune, conn, model, keys[start : start + chunk])
                deleted += self._immediately(conn, work)
        finally:
            conn.close()
        return deleted

    def _immediately(self, conn: sqlite3.Connection, work: Callable[[], _T]) -> _T:
        """``work`` in one IMMEDIATE transaction of ``conn`` outside the writer thread:
        committed (retried while busy), or rolled back when it raises."""
        self._begin_immediate(conn)
        try:
            result = work()
            self._retry_busy(lambda: conn.execute("COMMIT"))
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    def kb_seq(self, kb: str) -> int:
        """The KB's current log position (0 for a KB with no applied event)."""
        with self._reader() as conn:
            row = conn.execute(sql.KB_GET, (kb,)).fetchone()
        return 0 if row is None else row[1]

    def close(self) -> None:
        """Finish the queued deliveries, stop the writer, close every connection."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._analyser is not None:
            self._inbox.put(None)  # through the analyser to the writer, in order
            self._analyser.join()
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


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text
