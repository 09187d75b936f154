"""The store's analysis of a note made in the vault's parse workers, ahead of its delivery.

A local store analyses each upsert for its log (``kbgraph.search.document``) and, with the
local model, makes its vector (``kbgraph.embeddings.carried``), in its analyser thread: ~150 µs
a note of the importing process's CPU, on its one GIL, for a pure function of the note's
title, aliases, tags and text (link resolution does not touch them). On a large import the
pool's workers make them instead (``Maker``: ``Carrier.vectors`` and ``document.encode``, the
very calls of the store's analyser, so the same bytes), and the store takes them under its own
key (``kbgraph.store.group.MadeAhead``).

A worker that makes them loads the model: ~0.8 s of CPU and ~185 MB more RSS, paid back by the
importing process's ~150 µs a note after ~5,000 notes (``AHEAD_NOTES_PER_WORKER``). So only
an import with that many notes not sent before, per worker, has them made ahead (a first
import, a store replaced); notes whose state was sent before are never made ahead (a re-sync
sends none of them), nor anything for a remote destination, which analyses its own. And only
with at least ``AHEAD_MIN_CORES`` cores: the importing process uses one core at most (its
threads share one GIL), so on two cores it and the workers already keep both busy, and moving
its work to them only adds the models' start and each worker's word cache filling on its own
(20,000 notes on 2 cores: the importing process's CPU 0.50x, all processes' 1.17-1.27x, the
wall time 1.05-1.6x); with more cores it is the import's serial part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import msgspec

from kbgraph.sources.vault.notes import NoteState

if TYPE_CHECKING:  # imported by a worker that makes the analyses only: numba, the model
    from kbgraph.embeddings.carried import Carrier

AHEAD_NOTES_PER_WORKER: Final = 5_000  # new notes a worker must get to load the model
AHEAD_MIN_CORES: Final = 3  # cores the importing process may run on (see the module)

Made = tuple[bytes, bytes, bytes]  # (analysis, text hash, float32 vector): a ``MadeAhead``'s


class Ahead(msgspec.Struct, array_like=True, frozen=True):
    """What the workers are told: the store's key (``Carrier.key``; "" for a store without a
    model), the model's cut, the digests of the states sent before, and how many notes were
    never sent (whether making ahead pays: ``worth``)."""

    key: str
    max_chars: int
    sent: list[str]
    new_notes: int

    def worth(self, workers: int, cores: int) -> bool:
        """Whether ``workers`` workers should make the analyses, on ``cores`` cores."""
        return worth(self.new_notes, workers, cores)


def worth(new_notes: int, workers: int, cores: int) -> bool:
    """Whether ``workers`` workers should make the analyses of a sync with ``new_notes`` notes
    never sent, on ``cores`` cores (see the module)."""
    return cores >= AHEAD_MIN_CORES and new_notes >= AHEAD_NOTES_PER_WORKER * workers


class Maker:
    """A worker's: each read note's analysis (and vector) made as the store would make it;
    the model loaded at the first note that needs it."""

    def __init__(self, ahead: Ahead) -> None:
        self.ahead = ahead
        self.sent = frozenset(ahead.sent)
        self._carrier: Carrier | None = None
        self._loaded = not ahead.key  # a store without a model: the analysis alone

    def made(self, states: list[NoteState]) -> list[Made | None]:
        """Per state, its analysis made ahead, or None (sent before, or not made here: the
        store makes it)."""
        from kbgraph.search import document

        out: list[Made | None] = [None] * len(states)
        todo = [i for i, state in enumerate(states) if state.digest not in self.sent]
        carrier = self._model() if todo else None
        if todo and carrier is None and self.ahead.key:
            return out  # no model here of the store's key
        datas = [states[i].data for i in todo]
        try:
            vectors = [] if carrier is None else carrier.vectors(datas)
        except Exception:  # e.g. text the tokenizer refuses: the store's analyser decides
            return out
        for at, (i, d) in enumerate(zip(todo, datas, strict=True)):
            if carrier is None:
                out[i] = (document.encode(d.title, d.text, d.aliases, d.tags), b"", b"")
                continue
            one = vectors[at]
            analysis = document.encode(
                d.title, d.text, d.aliases, d.tags, (carrier.key, one.packed)
            )
            out[i] = (analysis, one.text_hash, one.vector.astype("<f4").tobytes())
        return out

    def _model(self) -> Carrier | None:
        """The store's model in this worker, None when there is none of its key."""
        if not self._loaded:
            self._loaded = True
            from kbgraph.config import EmbeddingsConfig
            from kbgraph.embeddings.carried import Carrier
            from kbgraph.embeddings.providers import make_embedder

            try:
                embedder = make_embedder(EmbeddingsConfig("local"))
            except ImportError:  # the model's package is not installed
                embedder = None
            if embedder is not None:
                carrier = Carrier(embedder, self.ahead.max_chars)
                self._carrier = carrier if carrier.key == self.ahead.key else None
        return self._carrier
