"""The ``vector`` table's writes (``kbgraph.store.vectorrows.write``): rows written in one
statement, or row by row when a concept or a refusal holds U+0000, leave what an oracle
written from the rule holds: per concept, the last row written, its hash and its float32
bytes, or its refusal."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbgraph.store import Store
from kbgraph.store.vectorrows import VectorRow

KB, MODEL = "kb", "m"

row = st.tuples(
    st.sampled_from(["a", "b", "é/ü", "nul\x00in"]),
    st.binary(min_size=1, max_size=20),
    st.one_of(
        st.lists(st.floats(-1, 1, width=32), min_size=0, max_size=5),
        st.sampled_from(["", "too long", "cut\x00here"]),
    ),
)


def as_row(concept: str, digest: bytes, answer: list[float] | str) -> VectorRow:
    if isinstance(answer, str):
        return VectorRow(concept, digest, None, answer)
    return VectorRow(concept, digest, np.array(answer, np.float32), "")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(row, max_size=8), max_size=4))
def test_the_table_holds_each_concepts_last_row(writes: list[list[tuple]]) -> None:
    holds_each_concepts_last_row(writes)


def holds_each_concepts_last_row(writes: list[list[tuple]]) -> None:
    want: dict[str, tuple[bytes, bytes | None, str | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.db"
        with Store(path) as store:
            for rows in writes:
                store.write_vectors(KB, MODEL, [as_row(*r) for r in rows])
                for concept, digest, answer in rows:
                    if isinstance(answer, str):
                        want[concept] = (digest, None, answer)
                    else:
                        want[concept] = (digest, np.array(answer, "<f4").tobytes(), None)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            got = {
                c: (bytes(h), None if v is None else bytes(v), p)
                for c, h, v, p in conn.execute(
                    "SELECT concept, text_hash, vec, problem FROM vector"
                    " WHERE kb = ? AND model = ?",
                    (KB, MODEL),
                )
            }
    assert got == want


even_row = st.tuples(
    st.sampled_from(["a", "b", "é/ü", "nul\x00in", '"q"']),
    st.binary(min_size=3, max_size=3),
    st.lists(st.floats(-1, 1, width=32), min_size=2, max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(even_row, min_size=1, max_size=8), max_size=4))
def test_rows_of_one_size_are_written_as_any_rows(writes: list[list[tuple]]) -> None:
    """Rows that all hold a vector of one size and a hash of one size (a delivery's carried
    vectors) go in by their place in the statement: the same table as the rule says."""
    holds_each_concepts_last_row(writes)
