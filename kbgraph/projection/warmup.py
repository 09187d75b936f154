"""Compiling the projection's numba kernels at start-up (a small KB taken through the event
kinds, a cached mask patched on the way), not on the first request or event that needs one."""

from __future__ import annotations

from typing import Literal, TypedDict

import numpy as np

from kbgraph.events import ConceptDeleted, ConceptUpserted, DeleteData, UpsertData
from kbgraph.projection.adjacency import compact
from kbgraph.projection.kb import KBProjection
from kbgraph.projection.masks import masked_degrees
from kbgraph.search import postings


def warm_up() -> None:
    """Compile the numba kernels at start-up, not on the first narrowed request."""
    off = np.zeros(1, np.int64)
    ln = np.zeros(1, np.int32)
    pool = np.zeros(1, np.int32)
    masked_degrees(off, ln, pool, np.ones(1, np.uint8), np.zeros(1, np.int32))
    compact(off, ln, ln, pool, np.zeros(1, np.int64), np.zeros(1, np.int32))
    postings.warm_up()  # a new name's texts (kbgraph.projection.mentions)
    kb = KBProjection("warm-up")
    kb.mask(())  # cached: the events below patch it, compiling the mask kernels too
    kb.apply_event(_warm_up_event("a", ["b"]))
    kb.apply_event(_warm_up_event("b", ["a"]))
    kb.apply_event(_warm_up_event("a", []))
    kb.apply_event(ConceptDeleted(**_warm_up_envelope("b"), data=DeleteData(version=2)))


def _warm_up_event(subject: str, links: list[str]) -> ConceptUpserted:
    data = UpsertData(version=1, links=links)
    return ConceptUpserted(**_warm_up_envelope(subject), data=data)


class _Envelope(TypedDict):
    specversion: Literal["1.0"]
    id: str
    source: str
    subject: str


def _warm_up_envelope(subject: str) -> _Envelope:
    return {"specversion": "1.0", "id": "warm-up", "source": "warm-up", "subject": subject}
