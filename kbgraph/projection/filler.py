"""The vector filler: one thread per process giving every KB's concepts their vectors, off the
path of events and of questions.

A round goes through every KB's waiting rows (``Vectors.dirty``) in chunks of ``FILL_BATCH``:

1. the chunk's texts, under the KB's read lock, each with its hash (``text_hash``);
2. the store's vector rows of the same model and hash settle them: what any process of this
   store computed once is never computed again (after a restart, with or without a checkpoint);
3. the rest are embedded under the store's embedder lock (``flock`` on ``<store>.embedder``: one
   process at a time per store, so ``serve --workers N`` embeds each text once): looked up again
   once it is held (another process may have written them meanwhile), embedded (``embed_each``:
   a text the provider refuses is recorded alone, as refused, and served by its words), written
   to the store, the lock released (a process on a read-only store embeds for itself alone);
4. installed under the KB's write lock for each row whose text is still the one embedded.

When several stores follow one log (a JetStream cluster) and the provider is outside the
process, a ``VectorShare`` (``share_with``) says who embeds: only the process holding the
cluster's lease calls the provider, and it publishes its rows for every node's store instead
of writing them here; every process, the embedder's too, settles its rows from its store once
the log delivered them (what the store took for the texts at that position, the same bytes on
every node), and tells the share each round whether rows wait without any settling
(``VectorShare.progress``: a holder producing nothing is routed around).

A provider that is down or slow pauses the embedding with a growing pause (``BACKOFF_*``);
events are applied meanwhile, and text search serves the concepts without a vector.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final, Protocol

try:  # POSIX only; elsewhere each process embeds for itself
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

import numpy as np
from prometheus_client import Counter

from kbgraph.embeddings import Embedder, EmbeddingUnavailable, embed_each, text_hash
from kbgraph.store import Store
from kbgraph.store.vectorrows import VectorRow

if TYPE_CHECKING:
    from kbgraph.projection.kb import KBProjection

log = logging.getLogger(__name__)

FILL_BATCH: Final = 512
BACKOFF_START: Final = 0.5
BACKOFF_MAX: Final = 30.0
POLL_SECONDS: Final = 0.5  # a round at least this often (a pause ending, another's rows)
LOCK_WAIT: Final = 0.02  # between tries of the embedder lock (the thread must stay stoppable)
STOP_WAIT: Final = 5.0  # seconds a stop waits for a round to end
PRUNE_SECONDS: Final = 3600.0  # the store's stale vector rows pruned at start, then this often
AWAIT_SECONDS: Final = 30.0  # rows published for the cluster are not embedded again meanwhile
SHARE_BATCH: Final = 64  # texts embedded and published at a time for the cluster

REFUSED: Final = Counter(
    "kbgraph_vectors_refused_total",
    "Concept texts the embedding provider refused (each served by its words alone).",
)

Settled = list[tuple[int, bytes, np.ndarray | None]]


class VectorShare(Protocol):
    """One embedder for several stores (``kbgraph.log.jetstream.embedder.ClusterEmbedder``)."""

    def may_embed(self) -> bool:
        """Whether this process is the one that calls the provider now."""
        ...

    def publish(self, kb: str, model: str, rows: list[VectorRow]) -> None:
        """Hand computed rows to every store (this one included); raises if not taken."""
        ...

    def progress(self, waiting: int, settled: int) -> None:
        """After each round: rows still waiting here, and rows settled in the round."""
        ...


class Filler:
    """Every KB's missing vectors, from the store's rows or the provider (one per process)."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder,
        kbs: Callable[[], list[KBProjection]],
        max_chars: int,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.max_chars = max_chars
        self._kbs = kbs
        self._retry_at = 0.0
        self._backoff = 0.0
        self._kick = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._share: VectorShare | None = None
        self._pruned_at: float | None = None  # time.monotonic() of the last prune
        # (kb, concept) -> (text hash, time.monotonic()) of rows published for the cluster
        self._awaited: dict[tuple[str, str], tuple[bytes, float]] = {}
        # rows the follower computed (an in-process model), for this thread to store
        self._unwritten: queue.SimpleQueue[tuple[str, str, list[VectorRow]]] = queue.SimpleQueue()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="kbgraph-vectors", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; one inside a provider call is left to end alone (a daemon)."""
        self._stopping.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
            self._thread = None
        with contextlib.suppress(Exception):  # best effort: a row not stored is computed again
            self._write_computed()

    def share_with(self, share: VectorShare) -> None:
        """Embed only while ``share`` says so, and publish the rows through it."""
        self._share = share

    def kick(self) -> None:
        """Rows may be waiting (events were applied): a round now, not at the next poll."""
        self._kick.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            kicked = self._kick.wait(POLL_SECONDS)
            self._kick.clear()
            if self._stopping.is_set():
                break
            if not kicked and self.pausing() and self._share is None:
                continue  # nothing new, and the provider is still paused (with a share,
                # another process's rows may arrive through the log meanwhile)
            try:
                self.round()
            except Exception:  # the store busy, say: the next round tries again
                log.exception("filling vectors failed (tried again in the next round)")

    # --- a round -------------------------------------------------------------------------

    def pausing(self) -> bool:
        return time.monotonic() < self._retry_at

    def round(self) -> int:
        """Store what the follower computed, then one pass over every KB's waiting rows;
        returns how many were settled. The store's stale rows are pruned when due."""
        self._write_computed()
        kbs = self._kbs()
        settled = sum(self.settle(kb) for kb in kbs)
        now = time.monotonic()
        if self._share is not None:
            self._share.progress(sum(len(kb.vector_pending()) for kb in kbs), settled)
            self._awaited = {k: v for k, v in self._awaited.items() if now - v[1] < AWAIT_SECONDS}
        if self._pruned_at is None or now - self._pruned_at >= PRUNE_SECONDS:
            self._pruned_at = now
            self.prune()
        return settled

    def prune(self) -> int:
        """Delete the store's vector rows of deleted concepts and of other models than this
        one (``Store.prune_vectors``); returns how many. Every process of a store has the
        same ``[embeddings]``, so another model is one no longer configured."""
        if self.store.read_only:
            return 0
        pruned = self.store.prune_vectors(self.embedder.name)
        if pruned:
            log.info("pruned %d stale vector rows (deleted concepts, other models)", pruned)
        return pruned

    def settle(self, kb: KBProjection, *, here: bool = False) -> int:
        """One pass over ``kb``'s waiting rows; returns how many were settled.

        ``here``: the follower's own call, before a batch's seq is announced, when the model
        runs in this process (``Embedder.remote`` false), so that the answers at a seq are
        those of its texts' vectors whenever they are asked, and a checkpoint holds them. The
        rows the store lacks are then embedded without the store's embedder lock and stored
        by this filler's thread, so the follower never waits on a lock or a write."""
        done = 0
        pending = kb.vector_pending()
        for start in range(0, len(pending), FILL_BATCH):
            if self._stopping.is_set():
                return done
            rows = pending[start : start + FILL_BATCH]
            done += self._chunk(kb, rows, here)
        return done

    def _write_computed(self) -> None:
        """Store the rows the follower computed (their own short transactions)."""
        while True:
            try:
                kb, model, rows = self._unwritten.get_nowait()
            except queue.Empty:
                return
            self.store.write_vectors(kb, model, rows)

    def _chunk(self, kb: KBProjection, rows: list[int], here: bool) -> int:
        work = kb.vector_texts(rows, self.max_chars)
        if not work:
            return 0
        model = self.embedder.name
        digests = {u: text_hash(text) for u, _, text in work}
        settled, missing = self._stored(kb.name, model, work, digests)
        if self._awaited:  # published for the cluster: they come back through the log
            awaited = self._awaited
            missing = [
                w for w in missing if awaited.get((kb.name, w[1]), (b"",))[0] != digests[w[0]]
            ]
        if here:  # the follower's call: no lock, no write (this thread stores them)
            computed, stored = self._compute(kb.name, missing, digests)
            settled += computed
            if stored and not self.store.read_only:
                self._unwritten.put((kb.name, model, stored))
                self._kick.set()
        elif missing and not self.pausing() and self.store.read_only:
            settled += self._embed(kb.name, model, missing, digests)  # for itself alone
        elif missing and not self.pausing() and self._may_embed():
            with self._embedder_lock() as held:
                if held:
                    found, missing = self._stored(kb.name, model, missing, digests)
                    settled += found
                    settled += self._embed(kb.name, model, missing, digests)
        return kb.settle_vectors(settled, self.max_chars)

    def _stored(
        self, kb: str, model: str, work: list[tuple[int, str, str]], digests: dict[int, bytes]
    ) -> tuple[Settled, list[tuple[int, str, str]]]:
        """The rows the store settles, and the rest."""
        rows = {r.concept: r for r in self.store.read_vectors(kb, model, [c for _, c, _ in work])}
        settled: Settled = []
        missing = []
        for u, concept, text in work:
            row = rows.get(concept)
            if row is not None and row.text_hash == digests[u]:
                settled.append((u, digests[u], row.vector))
            else:
                missing.append((u, concept, text))
        return settled, missing

    def _embed(
        self, kb: str, model: str, work: list[tuple[int, str, str]], digests: dict[int, bytes]
    ) -> Settled:
        """Embed each distinct text once, store the vectors and refusals, return them; for
        the cluster (``share_with``), publish them instead, ``SHARE_BATCH`` at a time (each
        a sign of progress to the processes waiting for them), and return none."""
        if self._share is not None:
            for start in range(0, len(work), SHARE_BATCH):
                part = work[start : start + SHARE_BATCH]
                if not self._may_embed() or not self._publish(kb, model, part, digests):
                    break
            return []
        settled, rows = self._compute(kb, work, digests)
        if rows and not self.store.read_only:
            self.store.write_vectors(kb, model, rows)
        return settled

    def _publish(
        self, kb: str, model: str, work: list[tuple[int, str, str]], digests: dict[int, bytes]
    ) -> bool:
        """Embed and publish ``work`` for every node's store, this one too; whether it was."""
        assert self._share is not None
        _, rows = self._compute(kb, work, digests)
        if not rows:  # the provider unavailable: paused
            return False
        try:
            self._share.publish(kb, model, rows)
        except Exception as exc:  # not published: computed again after a pause
            self._pause(f"publishing vectors failed: {exc!r}")
            return False
        now = time.monotonic()  # settled once this store took them, as on every node
        self._awaited.update(((kb, r.concept), (r.text_hash, now)) for r in rows)
        return True

    def _may_embed(self) -> bool:
        return self._share is None or self._share.may_embed()

    def _pause(self, why: str) -> None:
        """Leave the provider alone for a growing pause."""
        self._backoff = min(BACKOFF_MAX, max(BACKOFF_START, 2 * self._backoff))
        self._retry_at = time.monotonic() + self._backoff
        log.warning("%s (next try in %.1f s)", why, self._backoff)

    def _compute(
        self, kb: str, work: list[tuple[int, str, str]], digests: dict[int, bytes]
    ) -> tuple[Settled, list[VectorRow]]:
        """Embed each distinct text once: what settles the rows, and the store's rows of it
        (none when the provider is unavailable: it is left alone for a growing pause)."""
        if not work:
            return [], []
        texts = list(dict.fromkeys(text for _, _, text in work))
        try:
            answers = dict(zip(texts, embed_each(self.embedder, texts), strict=True))
        except EmbeddingUnavailable as exc:
            self._pause(f"embeddings unavailable: {exc}")
            return [], []
        self._backoff = 0.0
        rows = []
        for u, concept, text in work:
            answer = answers[text]
            if isinstance(answer, str):
                rows.append(VectorRow(concept, digests[u], None, answer))
                REFUSED.inc()
                log.warning("the embedding provider refused %s in %s: %s", concept, kb, answer)
            else:
                rows.append(VectorRow(concept, digests[u], answer, ""))
        settled = [(u, digests[u], row.vector) for (u, _, _), row in zip(work, rows, strict=True)]
        return settled, rows

    @contextlib.contextmanager
    def _embedder_lock(self) -> Iterator[bool]:
        """Hold the store's embedder lock (True), or False when stopping meanwhile."""
        if fcntl is None:  # pragma: no cover
            yield True
            return
        with open(Path(str(self.store.path) + ".embedder"), "a+b") as handle:
            while not self._try_lock(handle):
                if self._stopping.wait(LOCK_WAIT):
                    yield False
                    return
            try:
                yield True
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    @staticmethod
    def _try_lock(handle: BinaryIO) -> bool:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
