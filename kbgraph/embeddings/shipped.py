"""The local model's vectors shipped in a JetStream delivery, made once for the cluster.

In a cluster every node's store applies every delivery, so the store's analyser
(``kbgraph.embeddings.carried``) would run the model once per node. Instead the process that
takes a delivery embeds its upserts before publishing (``ship``), and the delivery's message
carries each one's vector (``kbgraph.log.jetstream.wire``) as its int8 values and float32
scale, under the model's key (``carried.key``). The message's MAC covers them: whoever lacks
the cluster secret can neither forge nor alter one, and a replayed message applies no event,
so its vectors install nothing. Every node, the publishing one too, takes the vector the
message carries in place of running the model (``carried``), as the vector it dequantises to
(``int8 x scale``, float32): the ``vector`` row it stores, the log row's packed bytes and a
build from that row are all the same function of the message's bytes, so every node holds the
same bytes whichever way it starts. A message without them (too big to carry them, another
model's key, older code) leaves each store to run the model as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kbgraph.embeddings import concept_text, text_hash
from kbgraph.embeddings.carried import EXTRA, Carried, Carrier, pack
from kbgraph.events import ConceptUpserted, Event, UpsertData

SCALE_BYTES = 4  # a shipped vector: its int8 values, then its scale (float32, little-endian)


class Shipped(NamedTuple):
    """The vectors a delivery's message carries: the model's key, and per event its shipped
    vector (None for an event that is not an upsert)."""

    key: str
    vectors: list[bytes | None]


def ship(carrier: Carrier, events: Sequence[Event]) -> Shipped | None:
    """The vectors of the upserts of ``events``, as a message carries them (None: no upsert)."""
    upserts = [(i, e.data) for i, e in enumerate(events) if isinstance(e, ConceptUpserted)]
    if not upserts:
        return None
    made = carrier.vectors([data for _, data in upserts])
    vectors: list[bytes | None] = [None] * len(events)
    for (i, _), one in zip(upserts, made, strict=True):
        vectors[i] = one.packed[: len(one.packed) - EXTRA + SCALE_BYTES]
    return Shipped(carrier.key, vectors)


def wire(vectors: Shipped | None, key: str, index: int) -> bytes | None:
    """The shipped vector of the event at ``index``, if ``vectors`` are of the model ``key``."""
    if vectors is None or vectors.key != key or index >= len(vectors.vectors):
        return None
    return vectors.vectors[index]


def landed(wires: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The float32 rows shipped vectors of one width stand for (int8 values times their
    scale), and which of them may be taken: those with a finite, positive scale."""
    width = len(wires[0])
    rows = np.frombuffer(b"".join(wires), np.uint8).reshape(len(wires), width)
    values = rows[:, : width - SCALE_BYTES].view(np.int8).astype(np.float32)
    scale = rows[:, width - SCALE_BYTES :].copy().view("<f4").reshape(-1).astype(np.float32)
    ok = np.isfinite(scale) & (scale > 0)
    return values * np.where(ok, scale, 0)[:, None], ok


def carried(
    carrier: Carrier, upserts: Sequence[UpsertData], wires: Sequence[bytes | None]
) -> list[Carried]:
    """Each upsert's vector for its store (``Carrier.vectors``' answer): the shipped one where
    its message carried one (``wires``), the model run only for the others. Each shipped
    vector is judged alone (the same however deliveries are grouped): one without values or
    without a finite, positive scale is made again."""
    widths: dict[int, list[tuple[int, bytes]]] = {}
    for i, w in enumerate(wires):
        if w is not None and len(w) > SCALE_BYTES:
            widths.setdefault(len(w), []).append((i, w))
    out: dict[int, Carried] = {}
    cut = carrier.max_chars
    for group in widths.values():
        rows, ok = landed([w for _, w in group])
        kept = [i for (i, _), good in zip(group, ok, strict=True) if good]
        if not kept:
            continue
        for i, row, packed in zip(kept, rows[ok], pack(rows[ok]), strict=True):
            d = upserts[i]
            digest = text_hash(concept_text(d.title, d.aliases, d.tags, d.text)[:cut])
            out[i] = Carried(digest, row, packed)
    rest = [i for i in range(len(upserts)) if i not in out]
    out.update(zip(rest, carrier.vectors([upserts[i] for i in rest]), strict=True))
    return [out[i] for i in range(len(upserts))]
