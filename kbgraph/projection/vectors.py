"""One KB's concept vectors: derived data, kept beside the projection, never blocking an event.

Rows are the projection's node ints. ``have[u]`` says row u holds the vector of concept u's
current names and text; a concept whose names or text changed (or that appeared) is ``dirty``
until its vector is installed (computed once per such change, not per version).
Vectors are computed:

- with the events, before the write lock (``prepare``): the upserts of the coming batch are
  embedded in one call and installed as each upsert is applied, so with a provider that
  answers (the local model always does) a state's vectors are those of its own texts;
- by the filler (``fill``, from the follower thread between batches) for everything still
  dirty: after a build from the store, a checkpoint made with another model, or while the
  provider was down. A failing provider is left alone for a growing pause (``BACKOFF_*``);
  events are applied meanwhile without their vectors, and text search serves them.

Status (``/status``, ``GET /v1/kbs``): ``off`` (no provider), ``complete``, ``filling``.
Checkpoints carry the arrays and the model's name; a checkpoint of another model is loaded
with every row dirty.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from kbgraph.embeddings import Embedder, EmbeddingUnavailable, concept_text
from kbgraph.events import ConceptUpserted
from kbgraph.graphalgo.vectors import CODE_BITS, quantize

log = logging.getLogger(__name__)

FILL_BATCH: Final = 512
BACKOFF_START: Final = 0.5
BACKOFF_MAX: Final = 30.0
ARRAYS: Final = ("q8", "scale", "codes", "have")


class Vectors:
    def __init__(self, embedder: Embedder, dim: int = 0) -> None:
        self.embedder = embedder
        self.model = embedder.name
        self.dim = dim  # 0 until the first vector arrives (an openai model's size is its own)
        self.cap = 0
        self.q8 = np.zeros((0, 0), np.int8)
        self.scale = np.zeros(0, np.float32)
        self.codes = np.zeros((0, 0), np.uint64)
        self.have = np.zeros(0, np.uint8)
        self.dirty: set[int] = set()
        # The coming batch's vectors, quantised together: (subject, version) -> row of _quantised
        self._fresh: dict[tuple[str, int], int] = {}
        self._quantised: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._retry_at = 0.0
        self._backoff = 0.0

    # --- state ---------------------------------------------------------------------------

    def status(self) -> str:
        return "filling" if self.dirty else "complete"

    def _ensure(self, u: int, dim: int) -> None:
        if self.dim == 0:
            self.dim = dim
        if dim != self.dim:
            raise EmbeddingUnavailable(f"the model answered {dim} dimensions, not {self.dim}")
        if u < self.cap and self.q8.shape[1] == dim:
            return
        cap = max(64, 1 << u.bit_length(), self.cap)
        words = CODE_BITS // 64
        q8 = np.zeros((cap, dim), np.int8)
        codes = np.zeros((cap, words), np.uint64)
        scale = np.zeros(cap, np.float32)
        have = np.zeros(cap, np.uint8)
        if self.cap and self.q8.shape[1] == dim:
            q8[: self.cap], codes[: self.cap] = self.q8, self.codes
            scale[: self.cap], have[: self.cap] = self.scale, self.have
        self.q8, self.codes, self.scale, self.have = q8, codes, scale, have
        self.cap = cap

    def install(self, rows: Sequence[int], vectors: np.ndarray) -> None:
        """Rows' vectors (write lock held)."""
        if not len(rows):
            return
        q8, scale, codes = quantize(vectors)
        self._ensure(max(rows), vectors.shape[1])
        r = np.asarray(rows, np.int64)
        self.q8[r], self.scale[r], self.codes[r] = q8, scale, codes
        self.have[r] = 1
        self.dirty.difference_update(rows)

    def remove(self, u: int) -> None:
        if u < self.cap:
            self.have[u] = 0
        self.dirty.discard(u)

    def changed(self, u: int, subject: str, version: int) -> None:
        """Concept u's names or text changed at ``version`` (write lock held)."""
        row = self._fresh.pop((subject, version), None)
        if row is not None and self._quantised is not None:
            # one row copied in: the batch was quantised at once in ``prepare`` (per row, so
            # the same bytes as quantising this vector alone)
            q8, scale, codes = self._quantised
            self._ensure(u, q8.shape[1])
            self.q8[u], self.scale[u], self.codes[u] = q8[row], scale[row], codes[row]
            self.have[u] = 1
            self.dirty.discard(u)
        else:
            if u < self.cap:
                self.have[u] = 0
            self.dirty.add(u)

    def mark_missing(self, alive: np.ndarray, n: int) -> None:
        """Every alive row of the first n without a vector becomes dirty (after build or load)."""
        rows = np.flatnonzero(alive[:n])
        if self.cap:
            inside = rows[rows < self.cap]
            rows = np.concatenate((inside[self.have[inside] == 0], rows[rows >= self.cap]))
        self.dirty.update(rows.tolist())

    def searchable(self, mask: np.ndarray) -> np.ndarray:
        """``mask`` restricted to the rows holding a vector (rows past ``cap`` have none)."""
        m = min(len(mask), self.cap)
        return mask[:m] & self.have[:m]

    # --- computing -----------------------------------------------------------------------

    def _embed(self, texts: list[str]) -> np.ndarray | None:
        """The provider's vectors, or None while it is failing (then a growing pause)."""
        if time.monotonic() < self._retry_at:
            return None
        try:
            vectors = self.embedder.embed(texts)
        except EmbeddingUnavailable as exc:
            self._backoff = min(BACKOFF_MAX, max(BACKOFF_START, 2 * self._backoff))
            self._retry_at = time.monotonic() + self._backoff
            log.warning("embeddings unavailable (next try in %.1f s): %s", self._backoff, exc)
            return None
        self._backoff = 0.0
        return vectors

    def prepare(
        self, upserts: list[ConceptUpserted], unchanged: Callable[[ConceptUpserted], bool]
    ) -> None:
        """Embed the coming batch's upserts (before the write lock; follower thread)."""
        todo = [e for e in upserts if not unchanged(e)]
        if not todo:
            return
        texts = [concept_text(e.data.title, e.data.aliases, e.data.tags, e.data.text) for e in todo]
        vectors = self._embed(texts)
        if vectors is None:
            return
        self._quantised = quantize(vectors)
        self._fresh = {(e.subject, e.data.version): row for row, e in enumerate(todo)}

    def forget_fresh(self) -> None:
        self._fresh = {}
        self._quantised = None

    def take_dirty(self, limit: int = FILL_BATCH) -> list[int]:
        if not self.dirty or time.monotonic() < self._retry_at:
            return []
        # Any of them: the order they are filled in changes nothing once they are all in.
        return sorted(itertools.islice(self.dirty, limit))

    def compute(self, texts: list[str]) -> np.ndarray | None:
        return self._embed(texts)

    # --- checkpoints ---------------------------------------------------------------------

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAYS}

    @classmethod
    def from_arrays(
        cls, embedder: Embedder, model: str, dim: int, arrays: dict[str, np.ndarray]
    ) -> Vectors:
        """Stored vectors of the same model are kept; another model's are dropped."""
        vectors = cls(embedder)
        if model == embedder.name and arrays:
            vectors.dim = dim
            for name in ARRAYS:
                setattr(vectors, name, np.array(arrays[name]))  # writable, private copy
            vectors.cap = len(vectors.have)
        return vectors
