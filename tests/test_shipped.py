"""The local model's vectors as a delivery's message ships them (``kbgraph.embeddings.shipped``):
what a store takes of them runs the model 0 times and is the same however deliveries are
grouped; a vector without values or scale is made again; older readers of the message ignore
them; a delivery too big with them is published without them, never refused for them."""

from __future__ import annotations

import math

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.embeddings import concept_text, text_hash
from kbgraph.embeddings.carried import Carrier, pack
from kbgraph.embeddings.shipped import SCALE_BYTES, Shipped, carried, landed, ship
from kbgraph.log.jetstream import wire
from tests.embedders import HashEmbedder
from tests.kb_events import delete, upsert

MAX_CHARS = 4000


class Counting(HashEmbedder):
    def __init__(self) -> None:
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)


def test_a_shipped_vector_lands_as_its_dequantised_row_without_the_model() -> None:
    events = [upsert("a", text="one"), delete("b", 1), upsert("c", text="two")]
    sent = ship(Carrier(Counting(), MAX_CHARS), events)
    assert sent is not None and sent.vectors[1] is None
    upserts = [events[0].data, events[2].data]
    wires = [sent.vectors[0], sent.vectors[2]]
    assert all(w is not None and len(w) == 64 + SCALE_BYTES for w in wires)
    model = Counting()
    got = carried(Carrier(model, MAX_CHARS), upserts, wires)
    assert model.texts == 0
    made = Carrier(Counting(), MAX_CHARS).vectors(upserts)
    for one, own, d in zip(got, made, upserts, strict=True):
        assert one.text_hash == own.text_hash == text_hash(concept_text(d.title, [], [], d.text))
        q8, scale = own.packed[:64], own.packed[64:68]
        dequantised = np.frombuffer(q8, np.int8).astype(np.float32) * np.frombuffer(scale, "<f4")
        assert one.vector.tobytes() == dequantised.tobytes()
        assert one.packed == pack(one.vector[None, :])[0] and one.packed[:64] == q8


BAD_SCALES = {"nan": math.nan, "inf": math.inf, "zero": 0.0, "negative": -1.0}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.sampled_from(["good", "nan", "inf", "zero", "negative", "short", "none"]), max_size=8
    ),
    st.integers(1, 8),
)
def test_each_shipped_vector_is_judged_alone_whatever_the_grouping(
    kinds: list[str], cut: int
) -> None:
    upserts = [upsert(f"c{i}", text=f"text {i}").data for i in range(len(kinds))]
    good = ship(
        Carrier(Counting(), MAX_CHARS),
        [upsert(f"c{i}", text=f"text {i}") for i in range(len(kinds))],
    )
    wires: list[bytes | None] = []
    for i, kind in enumerate(kinds):
        w = good.vectors[i] if good is not None else None
        assert w is not None
        if kind in BAD_SCALES:
            w = w[:-SCALE_BYTES] + np.float32(BAD_SCALES[kind]).astype("<f4").tobytes()
        elif kind == "short":
            w = w[:SCALE_BYTES]
        elif kind == "none":
            w = None
        wires.append(w)
    model = Counting()
    whole = carried(Carrier(model, MAX_CHARS), upserts, wires)
    assert model.texts == sum(k != "good" for k in kinds)  # only the unusable ones made again
    parts = [
        one
        for at in range(0, len(kinds), cut)
        for one in carried(
            Carrier(Counting(), MAX_CHARS), upserts[at : at + cut], wires[at : at + cut]
        )
    ]
    assert [(o.text_hash, o.vector.tobytes(), o.packed) for o in whole] == [
        (o.text_hash, o.vector.tobytes(), o.packed) for o in parts
    ]
    made = Carrier(Counting(), MAX_CHARS).vectors(upserts)
    for kind, one, own in zip(kinds, whole, made, strict=True):
        if kind != "good":
            assert one.packed == own.packed  # the model's own, as without shipping


def test_landed_marks_the_rows_it_may_take() -> None:
    rows, ok = landed(
        [b"\x01\x02" + np.float32(0.5).tobytes(), b"\x01\x02" + np.float32(-1).tobytes()]
    )
    assert ok.tolist() == [True, False] and rows[0].tolist() == [0.5, 1.0]


class OldDelivery(msgspec.Struct, array_like=True, frozen=True):
    """The message's layout before vectors were shipped."""

    kb: str
    events: list[bytes]
    message_id: str | None = None
    message_digest: bytes | None = None


def test_older_code_reads_a_message_with_vectors_and_new_code_one_without() -> None:
    events = [upsert("a", text="one")]
    sent = ship(Carrier(Counting(), MAX_CHARS), events)
    payload = wire.encode_message("kb", events, None, sent)
    old = msgspec.msgpack.decode(payload, type=OldDelivery)
    assert old.kb == "kb" and len(old.events) == 1
    assert wire.decode_message(payload).vectors == sent
    older = msgspec.msgpack.encode(OldDelivery("kb", old.events))
    assert wire.decode_message(older) == ("kb", events, None, None)


def test_vectors_that_would_make_a_delivery_too_big_are_left_out() -> None:
    events = [upsert(f"c{i}", text=f"text {i}") for i in range(20)]
    sent = ship(Carrier(Counting(), MAX_CHARS), events)
    bare, _ = wire.pack("kb", events, None)
    shipped, _ = wire.pack("kb", events, None, sent)
    assert len(shipped) > len(bare) + 20 * 64
    assert wire.pack_within("kb", events, None, sent, len(shipped))[0] == shipped
    assert wire.pack_within("kb", events, None, sent, len(shipped) - 1)[0] == bare


def test_shipped_is_what_the_message_carries() -> None:
    assert (
        Shipped("k", [None])
        == wire.decode_message(
            wire.encode_message("kb", [delete("a", 1)], None, Shipped("k", [None]))
        ).vectors
    )
