"""The local model's vectors made once per store and carried in the log rows
(``kbgraph.embeddings.carried``): a follower of such rows runs the model 0 times and ends with
the bytes of one that embeds every text itself; rows of another model's key, or of older code,
are embedded as before."""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbgraph.embeddings import carried, concept_text, text_hash
from kbgraph.embeddings.carried import Carrier
from kbgraph.events import Event
from kbgraph.projection import Projections
from kbgraph.projection.vectors import Vectors
from kbgraph.search import document
from kbgraph.store import Store
from tests.bulk_histories import history_event, history_events
from tests.embedders import HashEmbedder
from tests.kb_events import upsert

KB = "kb"
MAX_CHARS = 8000


class Counting(HashEmbedder):
    """The in-process model, counting the texts it is asked to embed (a public hook: an
    ``Embedder`` of the same name as the store's)."""

    def __init__(self) -> None:
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)


def vector_rows(p: Projections) -> dict[str, tuple[bytes, bytes, bytes]] | None:
    """Each concept's installed vector (int8 row, scale, code) by id; None without the KB."""
    kb = p.get(KB)
    if kb is None:
        return None
    v = kb.vectors
    assert v is not None
    ids = kb.nodes.ids
    return {
        ids[u]: (v.q8[u].tobytes(), v.scale[u].tobytes(), v.codes[u].tobytes())
        for u in range(len(ids))
        if u < v.cap and v.have[u]
    }


def follower(store: Store, embedder: Counting, *, max_chars: int = MAX_CHARS) -> Projections:
    """A follower loaded before the deliveries come (it reads them from the log)."""
    p = Projections(store, embedder=embedder, vector_max_chars=max_chars)
    p.load()
    return p


def follow(p: Projections) -> Projections:
    while p.follow_once():
        pass
    return p


def append_all(store: Store, events: list[Event], per_delivery: int) -> None:
    for at in range(0, len(events), per_delivery):
        store.append(KB, events[at : at + per_delivery])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(history_event, max_size=16), st.integers(1, 4))
def test_a_follower_of_carried_vectors_runs_the_model_zero_times_and_equals_one_embedding(
    steps: list[tuple], per_delivery: int
) -> None:
    """Random histories (re-creations, deletes, link events) appended through a store that
    carries the model's vectors: a follower installs them (0 texts embedded, every vector in
    place once its batch's seq is announced), with the bytes of a follower of a store that
    carries none and embeds each text itself, and of a build from the store (whose
    ``vector`` rows the writer wrote: 0 texts embedded either)."""
    events = history_events(steps)
    with tempfile.TemporaryDirectory() as tmp:
        with Store(Path(tmp) / "carried.db", carrier=Carrier(Counting(), MAX_CHARS)) as store:
            installing = Counting()
            p = follower(store, installing)
            append_all(store, events, per_delivery)
            got = vector_rows(follow(p))
            assert installing.texts == 0
            rebuilding = Counting()
            rebuilt = Projections(store, embedder=rebuilding)
            rebuilt.load()
            rebuilt.fill_vectors()
            assert rebuilding.texts == 0
            assert vector_rows(rebuilt) == got
        with Store(Path(tmp) / "plain.db") as plain:
            embedding = Counting()
            p = follower(plain, embedding)
            append_all(plain, events, per_delivery)
            assert vector_rows(follow(p)) == got
            assert embedding.texts > 0 or not got


def test_the_local_model_is_run_once_per_store() -> None:
    """With the real local model: two followers of one store (two workers) install what the
    store's analyser made; the model's counter (a wrapper of the same name) stays at 0, and
    the bytes are those the model gives each text alone."""
    local = pytest.importorskip("kbgraph.embeddings.local")
    model = local.LocalEmbedder()

    class CountingLocal:
        name = model.name
        remote = False
        texts = 0

        def embed(self, texts: list[str]) -> np.ndarray:
            CountingLocal.texts += len(texts)
            return model.embed(texts)

    events = [upsert(f"c/{i}", text=f"note {i} about routers and vlan {i % 7}") for i in range(60)]
    with tempfile.TemporaryDirectory() as tmp:
        with Store(Path(tmp) / "kb.db", carrier=Carrier(model, MAX_CHARS)) as store:
            workers = [follower(store, CountingLocal()) for _ in range(2)]  # type: ignore[arg-type]
            append_all(store, events, 25)
            for worker in workers:
                follow(worker)
        assert CountingLocal.texts == 0
        first = vector_rows(workers[0])
        assert first == vector_rows(workers[1])
        assert first is not None and len(first) == 60
        for event in events[:5]:
            d = event.data
            alone = carried.unpack(
                carried.pack(model.embed([concept_text(d.title, d.aliases, d.tags, d.text)]))
            )
            assert alone is not None
            q8, scale, codes = alone
            assert first[event.subject] == (q8[0].tobytes(), scale[0].tobytes(), codes[0].tobytes())


def test_rows_of_another_key_or_of_older_code_are_embedded_by_the_follower() -> None:
    """A store carrying the vectors of another cut (``max_chars``) or model, or none (rows of
    older code): the follower embeds every text, and ends with the bytes of a store that
    carried its own."""
    events = [upsert(f"c/{i}", text="word " * (30 + i)) for i in range(12)]
    with tempfile.TemporaryDirectory() as tmp:
        with Store(Path(tmp) / "own.db", carrier=Carrier(Counting(), 100)) as own:
            installing = Counting()
            p = follower(own, installing, max_chars=100)
            append_all(own, events, 5)
            want = vector_rows(follow(p))
            assert installing.texts == 0
        with Store(Path(tmp) / "cut.db", carrier=Carrier(Counting(), MAX_CHARS)) as cut:
            other_cut = Counting()
            p = follower(cut, other_cut, max_chars=100)
            append_all(cut, events, 5)
            assert vector_rows(follow(p)) == want
            assert other_cut.texts == len(events)

        class Other(Counting):
            name = "another-model"

        with Store(Path(tmp) / "other.db", carrier=Carrier(Other(), 100)) as other:
            other_model = Counting()
            p = follower(other, other_model, max_chars=100)
            append_all(other, events, 5)
            assert vector_rows(follow(p)) == want
            assert other_model.texts == len(events)
        with Store(Path(tmp) / "plain.db") as plain:
            older = Counting()
            p = follower(plain, older, max_chars=100)
            append_all(plain, events, 5)
            assert vector_rows(follow(p)) == want
            assert older.texts == len(events)


def test_the_writer_stores_the_vector_rows_and_a_row_decodes_for_older_code() -> None:
    """The ``vector`` rows written with the delivery name the hash of the text embedded; a
    carried row decodes for code that knows only the analysis (its trailing fields skipped),
    and a row without a vector decodes with none."""

    class Before(msgspec.Struct, array_like=True, frozen=True):  # the layout before them
        version: int
        terms: list[str]
        hits: list[int]
        names: list[str]
        tags: list[str]
        title_len: int
        text_len: int

    embedder = Counting()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Store(Path(tmp) / "kb.db", carrier=Carrier(embedder, MAX_CHARS)) as store,
    ):
        store.append(KB, [upsert("a", text="one two"), upsert("b", text="three")])
        store.append(KB, [upsert("a", version=2, text="one two four")])
        rows = {r.concept: r for r in store.read_vectors(KB, embedder.name, ["a", "b"])}
        records = store.read_log(0)
    d = records[-1].event.data
    assert rows["a"].text_hash == text_hash(concept_text(d.title, d.aliases, d.tags, d.text))
    assert rows["a"].vector is not None
    text = concept_text(d.title, d.aliases, d.tags, d.text)
    assert np.array_equal(rows["a"].vector, embedder.embed([text])[0])
    analysis = records[-1].analysis
    assert analysis is not None and analysis.vector_model == carried.key(embedder.name, MAX_CHARS)
    blob = msgspec.msgpack.encode(analysis)
    before = msgspec.msgpack.decode(blob, type=Before)
    assert (before.terms, before.text_len) == (analysis.terms, analysis.text_len)
    plain = document.encode(d.title, d.text, d.aliases, d.tags)
    assert msgspec.msgpack.decode(plain, type=Before).terms == analysis.terms
    decoded = document.decode(plain)
    assert decoded is not None and (decoded.vector_model, decoded.vector) == ("", b"")


@pytest.mark.parametrize(
    "blobs", [[], [b"\x01" * carried.EXTRA], [b"\x01" * 40, b"\x01" * 41]], ids=str
)
def test_rows_not_of_one_shape_are_never_installed(blobs: list[bytes]) -> None:
    assert carried.unpack(blobs) is None


def carrying(blob: bytes) -> document.Analysed:
    """A log row's analysis carrying ``blob`` as the local model's vector."""
    return document.Analysed(
        document.ANALYSIS_VERSION, [], [], [], [], 0, 0, carried.key("hash-64", MAX_CHARS), blob
    )


def installed(v: Vectors) -> tuple[int, dict[int, tuple[bytes, bytes, bytes]], set[int]]:
    """(the width taken, each installed row's bytes, the rows still waiting)."""
    rows = {
        u: (v.q8[u].tobytes(), v.scale[u].tobytes(), v.codes[u].tobytes())
        for u in range(v.cap)
        if v.have[u]
    }
    return v.dim, rows, set(v.dirty)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from([8, 12]), st.integers(0, 9))),
    st.lists(st.integers(1, 6)),
)
def test_what_is_installed_of_carried_rows_of_mixed_widths_does_not_depend_on_batching(
    changes: list[tuple[int, int, int]], sizes: list[int]
) -> None:
    """Rows of two widths (only a holder of the cluster's secret could ship such) are installed
    alike whether each change's batch ends after it or the changes come in batches of
    ``sizes``: the first carried row sets the KB's width, as it does one change at a time, and
    a row of another width waits for the model."""
    rng = np.random.default_rng(7)
    blobs = {
        (dim, seed): carried.pack(rng.normal(size=(1, dim)).astype(np.float32))[0]
        for dim in (8, 12)
        for seed in range(10)
    }
    one_by_one = Vectors(HashEmbedder(), carried_key=carried.key("hash-64", MAX_CHARS))
    for u, dim, seed in changes:
        one_by_one.changed(u, carrying(blobs[dim, seed]))
        one_by_one.install_carried()
    batched = Vectors(HashEmbedder(), carried_key=carried.key("hash-64", MAX_CHARS))
    at = 0
    for size in [*sizes, len(changes)]:
        for u, dim, seed in changes[at : at + size]:
            batched.changed(u, carrying(blobs[dim, seed]))
        batched.install_carried()
        at += size
    assert installed(batched) == installed(one_by_one)
