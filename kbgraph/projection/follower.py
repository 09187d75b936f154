"""The follower: one thread per process that keeps every KB's projection current.

Each process builds its projections once from ``Store.load()`` (one consistent snapshot and
the global log position ``gid`` it reflects) and then follows the store's log from that
position in a single follower thread (``Projections``). The store is the source of truth; the
projection is derived state, never rebuilt per call.

Consistency: each KB has a writer-preferring readers-writer lock (``kbgraph.projection.rwlock``).
The follower applies WHOLE deliveries, in batches, under the write lock; a request holds the read
lock for its whole duration (``KBProjection.read()``), so it only ever sees states between
deliveries. A batch ends after the delivery that reaches ``MAX_BATCH_EVENTS`` (2,000) events or
``MAX_BATCH_SECONDS`` (5 ms); a single delivery is never split. Worst-case reader wait: the
requests already holding the read lock when the follower asked for the write lock (writer
preference queues new readers behind it) plus one batch: at most 5 ms plus the apply time of the
delivery that crosses the bound. Measured (loadtest/bench_projection.py, mean degree 16, two cached
masks) at 13-45 us per event on a shared 2-core machine, so a typical delivery of a few events adds
well under 1 ms and a 1,000-event delivery 13-45 ms (a delivery is atomic by contract, so that is
its price). Releasing the write lock hands off to every reader queued meanwhile before the follower
may write again, so a backlog cannot starve readers: they interleave with it batch by batch.

Checkpoints (``kbgraph.projection.checkpoint``): with a checkpoint folder, ``load`` starts
from the newest usable checkpoint and follows the log from its ``gid``; once the log has grown
``checkpoint_every`` records past the newest checkpoint, the follower forks a child that writes
the state of that instant (one process at a time, under a file lock) while the follower goes
on, and once the child is done cuts the log before it, keeping ``log_retain`` records for
followers just behind. A follower that finds its next records cut (``LogCut``) loads again.

Vectors (``kbgraph.projection.filler``): applying an event only marks its concept's vector as
waiting; the filler's own thread settles it from the store's vector rows or the provider, and
is kicked after each batch that changed something. Nothing remote runs in this thread; a model
that runs in this process (the local one) is settled here, after the batch and before its seq
is announced, so that an answer asked at that seq (``X-Min-Seq``) and a checkpoint written
after it hold the batch's vectors; the store's log rows carry those vectors, made once by the
store (``kbgraph.embeddings.carried``), so this settles only rows that came without one.

Failure: if reading the log raises (SQLite busy, I/O), nothing was applied and the follower
retries with a growing pause (up to 1 s). If applying a record raises (a bug), the follower
logs it, stores it in ``Projections.error`` and stops following: a projection that missed an
event must not pretend to be current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Final

try:  # POSIX only; elsewhere every process may write checkpoints
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

from numba.core.compiler_lock import global_compiler_lock

from kbgraph.config import EmbeddingsConfig
from kbgraph.embeddings import Embedder, carried
from kbgraph.projection import checkpoint
from kbgraph.projection.bulk import gc_paused
from kbgraph.projection.filler import Filler
from kbgraph.projection.hold import Hold
from kbgraph.projection.kb import KBProjection
from kbgraph.projection.warmup import warm_up
from kbgraph.search import SearchIndex
from kbgraph.store import LogCut, LogRecord, Store

log = logging.getLogger(__name__)

READ_LOG_LIMIT: Final = 10_000
# A forked checkpoint writer still running by then is killed: a million concepts take ~15 s
WRITER_SECONDS: Final = 600.0
MAX_FD: Final = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536


def fork() -> int:
    """``os.fork()``, deliberately past Python 3.12's DeprecationWarning about forking a process
    that runs threads (the server always does: uvicorn, the store's writer, this follower). The
    warning is about a child that needs a lock another thread held at the fork. One such lock
    the child may need is numba's compiler lock: a kernel the parent never ran (the postings'
    fold, in a process that started empty or from a checkpoint) is compiled, or loaded from
    numba's cache, in the child, under that lock; another thread compiling at the instant of the
    fork (the local model's first batch, a request's first narrowed walk) would leave the
    child's copy held for good, the child hung, and checkpoints and the log's cut stopped. So
    the fork happens holding that lock (waiting for a compile under way to end): the child's
    copy is then its own thread's, released as it returns. Otherwise the child takes no lock: it
    reads the projection's arrays (the follower, which forks, is between batches, so nothing is
    half-applied; the vector filler's thread may be installing vectors at that instant, but a
    row's ``have`` byte is set after its vector and a grown array is swapped in before ``have``,
    so the child sees a row with its whole vector or without it), writes one new file with its
    own descriptors, reports a failure with ``os.write`` on fd 2 and leaves with ``os._exit``;
    it logs nothing and touches no SQLite connection and no KB lock
    (``tests/test_checkpoint_writer.py`` runs it while another thread holds a KB's read lock).
    What the fork buys, a copy-on-write instant of every array without stopping the follower for
    the ~15 s a million concepts take, has no thread-safe equivalent short of copying the
    projection. Only that warning, only around this call, is silenced."""
    with warnings.catch_warnings(), global_compiler_lock:
        warnings.filterwarnings(
            "ignore", r".*multi-threaded, use of fork\(\) may lead to deadlocks", DeprecationWarning
        )
        return os.fork()


class Projections:
    """Every KB of this process, kept current by one follower thread reading the store's log."""

    def __init__(
        self,
        store: Store,
        *,
        poll_interval: float = 0.005,
        index_factory: Callable[[], SearchIndex] = SearchIndex,
        checkpoints: Path | None = None,
        checkpoint_every: int = 100_000,
        log_retain: int = 10_000,
        embedder: Embedder | None = None,
        vector_max_chars: int = EmbeddingsConfig().max_chars,
        mentions: Callable[[str], bool] = lambda kb: True,
        hold: float = 0.0,
    ) -> None:
        self.store = store
        self.hold = Hold(hold)  # seconds a small batch waits for more commits
        self.mentions = mentions  # which KBs keep mention edges (kbgraph.projection.mentions)
        self.embedder = embedder  # vectors for every KB (kbgraph.projection.vectors)
        # the key of the vectors the store's log rows carry (the local model's), if any
        self.carried_key = (
            carried.key(embedder.name, vector_max_chars)
            if embedder is not None and not embedder.remote
            else ""
        )
        self.filler = (
            None
            if embedder is None
            else Filler(store, embedder, lambda: list(self._kbs.values()), vector_max_chars)
        )
        self.poll_interval = poll_interval
        self.gid = 0  # global log position applied
        self.checkpoints = checkpoints if index_factory is SearchIndex else None
        self.checkpoint_every = checkpoint_every
        self.log_retain = log_retain
        self.loaded_from: Path | None = None  # the checkpoint the last load started from
        self.checkpoint_gid = 0  # the newest checkpoint's gid, as far as this process knows
        # (pid, gid, time.monotonic() at its start) of a forked checkpoint writer
        self._writer: tuple[int, int, float] | None = None
        self.error: BaseException | None = None
        self._index_factory = index_factory
        self._kbs: dict[str, KBProjection] = {}
        self._kick = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[str, int], None]] = []
        self._reload_listeners: list[Callable[[], None]] = []
        self._waiters_lock = threading.Lock()
        # per KB, the seq announced to X-Min-Seq waiters: a batch's, once it is applied and
        # (with an in-process model) its vectors settled
        self._announced: dict[str, int] = {}
        self._waiters: dict[
            str, list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[bool]]]
        ] = {}

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Build every KB from one consistent snapshot (or the newest usable checkpoint), apply
        the log past it, then follow the log in a thread."""
        if self.checkpoints is not None and not hasattr(os, "fork"):
            log.warning(
                "no os.fork on this platform: checkpoints are written by the follower thread,"
                " which lags behind the log while it writes one"
            )
        self.load()
        self._catch_up()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="kbgraph-follower", daemon=True)
        self._thread.start()
        if self.filler is not None:
            self.filler.start()
            self.filler.kick()  # what the load left waiting

    def load(self) -> None:
        """Build every KB from ``store.load()`` without following (``start`` = load + follow).

        Tests and tools may then call ``follow_once`` themselves.
        """
        warm_up()
        kbs, self.gid = self._fresh_kbs()
        self._kbs.update(kbs)
        with self._waiters_lock:
            self._announced.update((name, kb.seq) for name, kb in kbs.items())

    def _catch_up(self) -> None:
        """Apply what the log holds past the loaded state before the service answers: a
        restart from a checkpoint then answers with all the store acknowledged before it, not
        the checkpoint's older state until the thread has followed. A failed read is left to
        the thread, which retries it."""
        start, applied = time.perf_counter(), 0
        while True:
            try:
                batch = self.follow_once()
            except LogCut:
                self.reload()
                continue
            except _ReadFailed as exc:
                log.warning("reading the log failed (the follower retries): %r", exc.__cause__)
                return
            applied += batch
            if batch < READ_LOG_LIMIT:
                break
        if applied:
            log.info(
                "%d log records past the loaded state applied in %.2f s",
                applied,
                time.perf_counter() - start,
            )

    def _fresh_kbs(self) -> tuple[dict[str, KBProjection], int]:
        """Every KB from the newest usable checkpoint, else built from the store."""
        start = time.perf_counter()
        kbs, gid = self._checkpointed_or_built()
        for name, kb in kbs.items():
            kb.attach_vectors(self.embedder, self.carried_key)
            kb.attach_mentions(self.mentions(name))
        log.info(
            "projection of %d KB(s) at gid %d %s in %.2f s",
            len(kbs),
            gid,
            f"loaded from checkpoint {self.loaded_from.name}"
            if self.loaded_from is not None
            else "built from the store",
            time.perf_counter() - start,
        )
        return kbs, gid

    def _checkpointed_or_built(self) -> tuple[dict[str, KBProjection], int]:
        self.loaded_from = None
        if self.checkpoints is not None:
            store = self.store

            def problem(header: checkpoint.Header) -> str | None:
                mark = header.mark
                at = None if mark is None else (mark.kb, mark.seq, mark.digest)
                return store.checkpoint_problem(header.store_id, header.gid, at)

            loaded = checkpoint.newest_usable(self.checkpoints, problem)
            if loaded is not None:
                self.loaded_from = loaded.path
                self.checkpoint_gid = loaded.gid
                return loaded.kbs, loaded.gid
        # Columns, no object per concept; the cyclic GC paused meanwhile (it would walk every
        # list the build is making, again and again, for nothing: no cycle is made).
        with gc_paused():
            snapshot = self.store.load_columns()
            kbs = {}
            for name, columns in snapshot.kbs.items():
                kb = KBProjection(name, index_factory=self._index_factory)
                kb.build_columns(columns)
                kbs[name] = kb
        return kbs, snapshot.gid

    def reload(self) -> None:
        """Start again from the newest state (the follower's next records were cut)."""
        kbs, gid = self._fresh_kbs()
        for name, kb in kbs.items():  # requests holding an old KB finish on it
            self._kbs[name] = kb
            self._notify(name, kb.seq)
        self.gid = gid
        if self.filler is not None:
            self.filler.kick()
        for fn in self._reload_listeners:
            try:
                fn()
            except Exception:
                log.exception("projection reload listener failed")

    def write_checkpoint(self, min_progress: int = 1) -> Path | None:
        """Write a checkpoint at ``gid`` and cut the log before it (keeping ``log_retain``
        records); None when another process holds the checkpoint lock, or wrote one fewer than
        ``min_progress`` records behind ``gid``. Call from the thread that applies the log (or
        with it stopped)."""
        claim = self._claim_checkpoint(min_progress)
        if claim is None:
            return None
        folder, lock, store_id, mark = claim
        try:
            path = checkpoint.write(folder, store_id, self.gid, mark, self._kbs)
        finally:
            lock.close()
        self._checkpoint_written(self.gid)
        return path

    def _claim_checkpoint(
        self, min_progress: int
    ) -> tuple[Path, BinaryIO, str, checkpoint.LogMark | None] | None:
        """(the checkpoint folder; its lock, held; the store's id; the log record at ``gid``)
        when this process should write a checkpoint now, else None."""
        folder = self.checkpoints
        if folder is None or self.store.read_only:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "a+b")  # noqa: SIM115 - handed to the caller
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    lock.close()
                    return None
            newest = next(checkpoint.iter_headers(folder), None)
            if newest is not None and self.gid - newest[1].gid < min_progress:
                self.checkpoint_gid = newest[1].gid
                lock.close()
                return None
            mark = self.store.log_mark(self.gid) if self.gid else None
            at = None if mark is None else checkpoint.LogMark(*mark)
            return folder, lock, self.store.store_id, at
        except BaseException:
            lock.close()
            raise

    def _checkpoint_written(self, gid: int) -> None:
        self.checkpoint_gid = gid
        self.store.cut_log(gid - self.log_retain)

    def _fork_checkpoint(self) -> None:
        """Write a checkpoint in a forked child: it sees this instant's state (copy-on-write
        pages) while this process goes on following (at a million concepts a checkpoint takes
        ~15 s, which in the follower thread would be 15 s of lag). The child keeps only the
        checkpoint lock and stdio, and touches no SQLite connection, log handler or thread lock
        of ours: it writes the file and exits."""
        claim = self._claim_checkpoint(self.checkpoint_every)
        if claim is None:
            return
        folder, lock, store_id, mark = claim
        gid = self.gid
        pid = fork()
        if pid == 0:  # pragma: no cover - the child (coverage does not follow it)
            code = 1
            try:
                # Every descriptor but the lock and stdio goes: a client connection the parent
                # closes must not stay open here until the file is written (the mapped arrays
                # need no descriptor).
                held = lock.fileno()
                os.closerange(3, held)
                os.closerange(held + 1, MAX_FD)
                checkpoint.write(folder, store_id, gid, mark, self._kbs)
                code = 0
            except BaseException:
                # straight to fd 2: sys.stderr's lock may have been held by another thread
                os.write(2, f"checkpoint writer (pid {os.getpid()}):\n".encode())
                os.write(2, traceback.format_exc().encode(errors="replace"))
            finally:
                os._exit(code)
        lock.close()  # the child's copy of it holds the lock until the child exits
        self._writer = (pid, gid, time.monotonic())

    def reap_checkpoint(self) -> bool:
        """True while a forked writer is still writing; once it exits, cut the log. A writer
        still running after ``WRITER_SECONDS`` is killed (whatever held it, the checkpoints
        and the log's cut must not stop for good); another is tried after as many records."""
        if self._writer is None:
            return False
        pid, gid, started = self._writer
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            if time.monotonic() - started < WRITER_SECONDS:
                return True
            self._kill_writer()
            log.warning(
                "the checkpoint writer (pid %d) was still writing after %.0f s: killed",
                pid,
                WRITER_SECONDS,
            )
            self.checkpoint_gid = gid  # try again after as many records
            return False
        self._writer = None
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            self._checkpoint_written(gid)
            log.info("checkpoint at gid %d written (pid %d); log cut before it", gid, pid)
        else:
            log.warning("the checkpoint writer (pid %d) exited with %d", pid, code)
            self.checkpoint_gid = gid  # try again after as many records
        return False

    @property
    def checkpoint_writer(self) -> tuple[int, int] | None:
        """(pid, gid) of the forked checkpoint writer still to be reaped, or None."""
        return None if self._writer is None else self._writer[:2]

    def maybe_checkpoint(self) -> None:
        """What the follower thread does between batches: reap a finished checkpoint writer,
        and start one when ``checkpoint_every`` records have passed since the last (forked, or
        here without ``os.fork``). Call from the thread that applies the log (or with it
        stopped)."""
        if self.reap_checkpoint() or (
            self.checkpoints is None
            or self.store.read_only
            or self.gid - self.checkpoint_gid < self.checkpoint_every
        ):
            return
        try:
            if hasattr(os, "fork"):
                self._fork_checkpoint()
            else:  # no fork (start() said so): write it here, lagging meanwhile
                self.write_checkpoint(self.checkpoint_every)
        except Exception:  # a failed checkpoint costs a slower restart, nothing else
            log.exception("writing a checkpoint failed")
            self.checkpoint_gid = self.gid  # try again after as many records

    def stop(self) -> None:
        self._stopping.set()
        self._kick.set()
        self.hold.end()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.filler is not None:
            self.filler.stop()
        self._kill_writer()  # a checkpoint being written: not worth the wait

    def _kill_writer(self) -> None:
        """Kill the forked checkpoint writer and remove what it left half-written."""
        if self._writer is None:
            return
        pid = self._writer[0]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        self._writer = None
        if self.checkpoints is not None:
            checkpoint.remove_partial(self.checkpoints, pid)

    def kick(self) -> None:
        """A local commit happened: follow now instead of at the next poll."""
        self._kick.set()

    def get(self, kb: str) -> KBProjection | None:
        return self._kbs.get(kb)

    def names(self) -> list[str]:
        return sorted(self._kbs)

    def seq(self, kb: str) -> int:
        """The KB's announced log position (0 if it has none): applied, and with an in-process
        model its vectors settled."""
        return self._announced.get(kb, 0)

    def add_listener(self, fn: Callable[[str, int], None]) -> None:
        """``fn(kb, seq)`` runs in the follower thread after each applied batch."""
        self._listeners.append(fn)

    def add_reload_listener(self, fn: Callable[[], None]) -> None:
        """``fn()`` runs after each ``reload``, once the new KBs are in place and the old ones
        dropped (by the follower thread, when the log was cut past this process)."""
        self._reload_listeners.append(fn)

    def waiting(self) -> dict[str, int]:
        """Each KB with ``wait_for`` calls waiting at this instant: how many."""
        with self._waiters_lock:
            return {kb: len(waiters) for kb, waiters in self._waiters.items()}

    async def wait_for(self, kb: str, seq: int, timeout: float) -> bool:
        """True once ``kb`` has applied ``seq``; False after ``timeout`` seconds."""
        self.hold.asked()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        waiter = (seq, loop, future)
        with self._waiters_lock:
            if self.seq(kb) >= seq:
                return True
            self._waiters.setdefault(kb, []).append(waiter)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return self.seq(kb) >= seq
        finally:
            with self._waiters_lock:
                waiting = self._waiters.get(kb)
                if waiting and waiter in waiting:
                    waiting.remove(waiter)
                    if not waiting:
                        del self._waiters[kb]

    # --- following ----------------------------------------------------------------------

    def follow_once(self) -> int:
        """Read and apply what the log holds after ``gid``; returns the records applied. The
        cyclic GC is paused for the batch (``gc_paused``: its records and patches make no
        cycle): it walks the young objects once a batch instead of every 700 allocations, and
        its full collections (the whole heap: a million concepts' lists) come that much
        rarer; what fell due runs at the next allocation after it, in any thread."""
        with gc_paused():
            return self._follow_batch()

    def _follow_batch(self) -> int:
        try:
            records = self.store.read_log(self.gid, READ_LOG_LIMIT)
        except LogCut:
            raise
        except Exception as exc:  # nothing applied: safe to try again
            raise _ReadFailed from exc
        if not records:
            return 0
        by_kb: dict[str, list[LogRecord]] = {}
        for r in records:
            by_kb.setdefault(r.kb, []).append(r)
        for name, recs in by_kb.items():
            kb = self._kbs.get(name)
            if kb is None:
                kb = KBProjection(name, index_factory=self._index_factory)
                kb.attach_vectors(self.embedder, self.carried_key)
                kb.attach_mentions(self.mentions(name))
            deliveries = _deliveries(recs)
            while deliveries:
                done = kb.apply(deliveries)
                deliveries = deliveries[done:]
                if name not in self._kbs:
                    self._kbs[name] = kb
                if self.filler is not None and not self.filler.embedder.remote:
                    self.filler.settle(kb, here=True)  # an in-process model: vectors first
                self._notify(name, kb.seq)
        self.gid = records[-1].gid
        if self.filler is not None:
            self.filler.kick()
        return len(records)

    def fill_vectors(self) -> int:
        """One round of the vector filler in this thread (tools and tests; ``start`` runs it
        in its own); returns how many vectors (or refusals) were settled."""
        return 0 if self.filler is None else self.filler.round()

    def _run(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            self._kick.wait(max(self.poll_interval, backoff))
            self._kick.clear()
            if self._stopping.is_set():
                break
            try:
                while (n := self.follow_once()) >= READ_LOG_LIMIT and not self._stopping.is_set():
                    pass
                backoff = 0.0
                self.maybe_checkpoint()
                self.hold.after(n, self._stopping)  # kbgraph.projection.hold
            except LogCut as exc:
                log.warning("the log was cut past this process (%s): loading again", exc)
                self.reload()
            except _ReadFailed as exc:  # e.g. SQLite busy or I/O: retry, slower each time
                backoff = min(1.0, max(0.01, 2 * backoff))
                log.warning(
                    "reading the log failed (retrying in %.2f s): %r", backoff, exc.__cause__
                )
            except Exception as exc:
                log.exception("projection follower stopped: applying the log failed")
                self.error = exc
                return

    def _notify(self, kb: str, seq: int) -> None:
        with self._waiters_lock:
            self._announced[kb] = seq
            waiting = self._waiters.get(kb, ())
            ready = [w for w in waiting if w[0] <= seq]
        for _, loop, future in ready:
            with contextlib.suppress(RuntimeError):  # the waiter's loop is closed
                loop.call_soon_threadsafe(_resolve, future)
        for fn in self._listeners:
            try:
                fn(kb, seq)
            except Exception:
                log.exception("projection listener failed")


class _ReadFailed(Exception):
    """``read_log`` raised: nothing was applied, the follower retries."""


def _resolve(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(True)


def _deliveries(records: list[LogRecord]) -> list[list[LogRecord]]:
    """Split one KB's records into deliveries (``read_log`` returns whole deliveries only)."""
    out: list[list[LogRecord]] = []
    start = 0
    for i, r in enumerate(records):
        if r.last_in_delivery:
            out.append(records[start : i + 1])
            start = i + 1
    if start < len(records):  # an unterminated tail: read_log promises it never happens
        out.append(records[start:])
    return out
