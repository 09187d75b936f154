"""The cluster embedder's vectors messages (``kbgraph.log.jetstream.wire``, ``embedder.payloads``):
every node reads back exactly the rows the holder computed, whatever the split; what is not
float32 values is refused, never written."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.log.jetstream.embedder import payloads
from kbgraph.log.jetstream.wire import StreamVectors, decode_vectors, encode_vectors
from kbgraph.store.vectorrows import VectorRow

finite = st.floats(-1, 1, width=32, allow_nan=False)
row = st.builds(
    VectorRow,
    st.text(min_size=1, max_size=30),
    st.binary(min_size=16, max_size=16),
    st.one_of(st.none(), st.lists(finite, min_size=1, max_size=64).map(np.float32)),
    st.text(max_size=20),
)


def as_bytes(rows: list[VectorRow]) -> list[tuple[str, bytes, bytes | None, str]]:
    return [
        (r.concept, r.text_hash, None if r.vector is None else r.vector.tobytes(), r.problem)
        for r in rows
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(row, max_size=40), st.integers(600, 4000))
def test_rows_read_back_byte_for_byte_whatever_the_split(rows: list[VectorRow], limit: int) -> None:
    parts = payloads("kb", "m", rows, limit)
    assert all(len(p) <= limit for p in parts)
    read: list[VectorRow] = []
    for payload in parts:
        kb, model, got = decode_vectors(payload)
        assert (kb, model) == ("kb", "m")
        read += got
    assert as_bytes(read) == as_bytes(rows)


def test_one_row_over_the_limit_is_refused() -> None:
    big = VectorRow("c", b"h" * 16, np.ones(1024, np.float32), "")
    with pytest.raises(ValueError, match="over the stream's limit"):
        payloads("kb", "m", [big], 1000)


@pytest.mark.parametrize(
    "payload",
    [
        msgspec.msgpack.encode(StreamVectors("kb", "m", [("c", b"h" * 16, b"abc", "")])),
        msgspec.msgpack.encode(StreamVectors("kb", "m", [("c", b"h" * 16, b"", "")])),
        msgspec.msgpack.encode(StreamVectors("Bad KB", "m", [])),
        encode_vectors("kb", "m", [])[:-1] + b"\xc1",
    ],
)
def test_what_is_not_vectors_is_refused(payload: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_vectors(payload)
