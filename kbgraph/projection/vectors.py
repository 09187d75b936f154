"""One KB's concept vectors: derived data, kept beside the projection, never on an event's path.

Rows are the projection's node ints. ``have[u]`` says row u holds the vector of concept u's
current names and text; ``failed[u]`` that the provider refused that text (it is served by its
words). A concept whose names or text changed (or that appeared) is ``dirty`` until either is
settled. Applying an event only marks it dirty (``changed``, under the write lock): nothing
remote is called there; an event whose log row carries its vector of this model
(``kbgraph.embeddings.carried``: the local model, made once by the store) has it installed at
the end of the batch instead (``install_carried``), the model never run here. The filler
thread (``kbgraph.projection.filler``) settles dirty rows from the store's vector rows,
embedding only what no row holds.

Status (``/status``, ``GET /v1/kbs``, computed over the caller's visible rows only): ``off``
(no provider), ``complete``, ``filling``. Checkpoints carry the arrays and the model's name; a
checkpoint of another model is loaded with every row dirty. Refusals are not checkpointed: the
store's rows hold them, and a loaded row without a vector is looked up there again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbgraph.embeddings import Embedder, EmbeddingUnavailable, carried
from kbgraph.graphalgo.nearest import CODE_BITS, quantize
from kbgraph.search.document import Analysed

ARRAYS = ("q8", "scale", "codes", "have")


class Vectors:
    def __init__(self, embedder: Embedder, dim: int = 0, carried_key: str = "") -> None:
        self.embedder = embedder
        self.model = embedder.name
        # the key (``carried.key``) of the vectors a log row may carry for this model ("": none)
        self.carried_key = carried_key
        self._carried: dict[int, bytes] = {}  # row -> packed vector, installed with the batch
        self._width = 0  # the bytes of a carried row this KB takes (``_takes``); 0: not yet
        self.dim = dim  # 0 until the first vector arrives (an openai model's size is its own)
        self.cap = 0
        self.q8 = np.zeros((0, 0), np.int8)
        self.scale = np.zeros(0, np.float32)
        self.codes = np.zeros((0, 0), np.uint64)
        self.have = np.zeros(0, np.uint8)
        self.failed = np.zeros(0, np.uint8)
        self.dirty: set[int] = set()

    # --- state (changed under the KB's write lock) ---------------------------------------

    def status(self) -> str:
        return "filling" if self.dirty else "complete"

    def _ensure(self, u: int, dim: int) -> None:
        if self.dim == 0:
            self.dim = dim
        if dim != self.dim:
            raise EmbeddingUnavailable(f"the model answered {dim} dimensions, not {self.dim}")
        if u < self.cap and self.q8.shape[1] == dim:
            return
        cap = max(64, 1 << u.bit_length(), self.cap, len(self.failed))
        words = CODE_BITS // 64
        q8 = np.zeros((cap, dim), np.int8)
        codes = np.zeros((cap, words), np.uint64)
        scale = np.zeros(cap, np.float32)
        have = np.zeros(cap, np.uint8)
        failed = np.zeros(cap, np.uint8)
        if self.cap and self.q8.shape[1] == dim:
            q8[: self.cap], codes[: self.cap] = self.q8, self.codes
            scale[: self.cap], have[: self.cap] = self.scale, self.have
        failed[: len(self.failed)] = self.failed
        self.q8, self.codes, self.scale, self.have = q8, codes, scale, have
        self.failed = failed
        self.cap = cap

    def install(self, rows: Sequence[int], vectors: np.ndarray) -> None:
        """Rows' vectors."""
        if not len(rows):
            return
        self._put(rows, *quantize(vectors))

    def _put(
        self, rows: Sequence[int], q8: np.ndarray, scale: np.ndarray, codes: np.ndarray
    ) -> None:
        self._ensure(max(rows), q8.shape[1])
        r = np.asarray(rows, np.int64)
        self.q8[r], self.scale[r], self.codes[r] = q8, scale, codes
        self.have[r] = 1
        self.failed[r] = 0
        self.dirty.difference_update(rows)

    def install_carried(self) -> None:
        """The vectors the batch's log rows carried (``changed``: all of one width), in one
        step; of another size than this KB's rows, they stay waiting for the filler."""
        if not self._carried:
            return
        rows, blobs = list(self._carried), list(self._carried.values())
        self._carried = {}
        unpacked = carried.unpack(blobs)
        if unpacked is not None and self.dim in (0, unpacked[0].shape[1]):
            self._put(rows, *unpacked)

    def refuse(self, rows: Sequence[int]) -> None:
        """Rows whose text the provider refused: no vector, served by their words."""
        if not len(rows):
            return
        top = max(rows)
        if top >= len(self.failed):
            failed = np.zeros(max(64, 1 << top.bit_length(), self.cap), np.uint8)
            failed[: len(self.failed)] = self.failed
            self.failed = failed
        r = np.asarray(rows, np.int64)
        self.failed[r] = 1
        if self.cap:
            self.have[r[r < self.cap]] = 0
        self.dirty.difference_update(rows)

    def _clear(self, u: int) -> None:
        if u < self.cap:
            self.have[u] = 0
        if u < len(self.failed):
            self.failed[u] = 0

    def remove(self, u: int) -> None:
        self._clear(u)
        self.dirty.discard(u)
        self._carried.pop(u, None)

    def changed(self, u: int, analysis: Analysed | None = None) -> None:
        """Concept u's names or text changed: its vector is computed again, in the background,
        unless its log row carried it (``analysis``, of this model's key): then it is
        installed with the batch (``install_carried``)."""
        self._clear(u)
        self.dirty.add(u)
        blob = b""
        if analysis is not None and analysis.vector_model == self.carried_key:
            blob = analysis.vector
        if blob and self._takes(len(blob)):
            self._carried[u] = blob
        else:
            self._carried.pop(u, None)

    def _takes(self, width: int) -> bool:
        """Whether a carried row of ``width`` bytes is taken: of the KB's vectors' size, or,
        before it has one, of the first carried row's. Decided per event, in log order, so
        rows of mixed widths (only a holder of the cluster's secret could ship them) are
        installed alike however the events are batched."""
        if not self._width:
            if not self.dim:
                if width <= carried.EXTRA:
                    return False
                self.dim = width - carried.EXTRA  # as the first vector installed would
            self._width = self.dim + carried.EXTRA
        return width == self._width

    def mark_missing(self, alive: np.ndarray, n: int) -> None:
        """Every alive row of the first n without a vector becomes dirty (after build or load)."""
        rows = np.flatnonzero(alive[:n])
        if self.cap:
            inside = rows[rows < self.cap]
            rows = np.concatenate((inside[self.have[inside] == 0], rows[rows >= self.cap]))
        self.dirty.update(rows.tolist())

    # --- reading (read lock held) --------------------------------------------------------

    def searchable(self, mask: np.ndarray) -> np.ndarray:
        """``mask`` restricted to the rows holding a vector (rows past ``cap`` have none)."""
        m = min(len(mask), self.cap)
        return mask[:m] & self.have[:m]

    def refused(self, mask: np.ndarray) -> np.ndarray:
        """The rows of ``mask`` whose text the provider refused."""
        m = min(len(mask), len(self.failed))
        return np.flatnonzero(mask[:m] & self.failed[:m])

    def pending(self) -> list[int]:
        """The dirty rows, in order (the filler goes through all of them each round)."""
        return sorted(self.dirty)

    # --- checkpoints ---------------------------------------------------------------------

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAYS}

    @classmethod
    def from_arrays(
        cls,
        embedder: Embedder,
        model: str,
        dim: int,
        arrays: dict[str, np.ndarray],
        carried_key: str = "",
    ) -> Vectors:
        """Stored vectors of the same model are kept; another model's are dropped."""
        vectors = cls(embedder, carried_key=carried_key)
        if model == embedder.name and arrays:
            vectors.dim = dim
            for name in ARRAYS:
                setattr(vectors, name, np.array(arrays[name]))  # writable, private copy
            vectors.cap = len(vectors.have)
            vectors.failed = np.zeros(vectors.cap, np.uint8)
        return vectors
