"""Vectors follow the log in the background (``kbgraph.projection.filler``), each row quantised
as a batch: the bytes must be those of quantising each vector alone, or answers would depend on
how the log was batched; applying events embeds nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kbgraph.events import Event
from kbgraph.graphalgo.nearest import quantize
from kbgraph.projection import Projections
from kbgraph.projection import kb as kb_module
from tests.embedders import HashEmbedder
from tests.histories import KB, deliveries_st
from tests.kb_events import upsert
from tests.reference_model import FakeStore

floats = st.floats(-4.0, 4.0, width=32, allow_subnormal=False) | st.sampled_from([0.0, -0.0])


@settings(max_examples=40)
@given(
    batch=st.integers(1, 6).flatmap(
        lambda n: st.sampled_from([3, 128, 200, 256]).flatmap(
            lambda d: arrays(np.float32, (n, d), elements=floats)
        )
    )
)
def test_a_batch_quantised_at_once_equals_each_row_alone(batch: np.ndarray) -> None:
    q8, scale, codes = quantize(batch)
    for row in range(len(batch)):
        alone = quantize(batch[row][None, :])
        assert q8[row].tobytes() == alone[0][0].tobytes()
        assert scale[row].tobytes() == alone[1][0].tobytes()
        assert codes[row].tobytes() == alone[2][0].tobytes()


def vector_rows(p: Projections) -> dict[str, tuple[bytes, bytes, bytes]] | None:
    kb = p.get(KB)
    if kb is None:
        return None
    vectors = kb.vectors
    assert vectors is not None
    out = {}
    for u, concept_id in enumerate(kb.nodes.ids):
        if u < vectors.cap and vectors.have[u]:
            out[concept_id] = (vectors.q8[u].tobytes(), vectors.scale[u].tobytes(),
                               vectors.codes[u].tobytes())  # fmt: skip
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries_st)
def test_a_batch_applied_at_once_gives_the_vectors_of_one_delivery_at_a_time(
    deliveries: list[list[Event]],
) -> None:
    """Random deliveries (duplicates, stale versions, deletes, links to missing concepts):
    followed in one batch, and followed after each delivery, the vectors are the same bytes,
    and the same as a build from the store filling every vector in."""
    store = FakeStore()
    embedder = HashEmbedder()
    one_by_one = Projections(store, embedder=embedder)
    one_by_one.load()
    batched = Projections(store, embedder=embedder)
    batched.load()
    for delivery in deliveries:
        store.append(KB, delivery)
        one_by_one.follow_once()
        one_by_one.fill_vectors()
    while batched.follow_once():
        pass
    batched.fill_vectors()
    got = vector_rows(batched)
    assert got == vector_rows(one_by_one)
    rebuilt = Projections(store, embedder=embedder)
    rebuilt.load()
    rebuilt.fill_vectors()
    assert got == vector_rows(rebuilt)


def test_applying_embeds_nothing_and_the_filler_embeds_each_text_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The follower applies deliveries without a call to the provider (batches cut by their
    time bound after each delivery, as a 500-event delivery is on any machine); the filler then
    embeds each text once."""
    monkeypatch.setattr(kb_module, "MAX_BATCH_SECONDS", 0.0)
    store = FakeStore()
    counting = CountingEmbedder()
    follower = Projections(store, embedder=counting)
    follower.load()
    size, count = 500, 12
    for d in range(count):
        store.append(KB, [upsert(f"c/{d}-{i}", text=f"text {d} {i}") for i in range(size)])
    while follower.follow_once():
        pass
    assert follower.seq(KB) == size * count
    assert counting.texts == 0
    assert follower.fill_vectors() == size * count
    assert counting.texts == size * count
    assert follower.fill_vectors() == 0 and counting.texts == size * count


class CountingEmbedder(HashEmbedder):
    remote = True  # a provider outside the process: the filler embeds, never the follower

    def __init__(self) -> None:
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)
