"""String columns (a checkpoint's flat UTF-8) read back exactly, NULs and lone surrogates
included; ``KeyIndex`` answers as a dict does, even when hashes collide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kbgraph.store.columns as columns
from kbgraph.store.columns import (
    KeyIndex,
    StringColumn,
    StringTable,
    decode_strings,
    encode_strings,
    key_hashes,
    process_hashes,
)

texts = st.lists(st.text(st.characters(codec=None, exclude_categories=()), max_size=8), max_size=20)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_strings_read_back_exactly(values: list[str]) -> None:
    blob, off = encode_strings(values)
    assert decode_strings(blob, off) == values
    column = StringColumn(blob, off)
    assert list(column) == values and len(column) == len(values)
    column.append("new")
    if values:
        column[0] = "changed"
        assert column[0] == "changed" and column[-1] == "new"
        assert list(column)[1:-1] == values[1:]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=4), unique=True, max_size=30), st.lists(st.text(max_size=4)))
def test_key_index_answers_as_a_dict_even_when_hashes_collide(
    keys: list[str], probes: list[str]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns, "key_hash", lambda key: len(key) % 3)  # collisions galore
        blob, off = encode_strings(keys)
        index = KeyIndex(StringColumn(blob, off), *key_hashes(keys))
        want = {key: i for i, key in enumerate(keys)}
        index["added"] = want.setdefault("added", len(keys))
        for key in [*keys, *probes, "added"]:
            assert index.get(key) == want.get(key)
            assert (key in index) == (key in want)


def test_key_hash_is_the_same_in_every_process() -> None:
    """Checkpoints store these hashes: another process (another hash seed) must agree."""
    code = "from kbgraph.store.columns import key_hash; print(key_hash('infra/dns'), key_hash('é'))"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    assert [int(h) for h in other] == [columns.key_hash("infra/dns"), columns.key_hash("é")]
    hashes, order = key_hashes(["b", "a", "c"])
    assert hashes.tolist() == sorted(hashes.tolist())
    assert [hashes.tolist()[order.tolist().index(i)] for i in range(3)] == [
        columns.key_hash(k) for k in "bac"
    ]


@settings(max_examples=200, deadline=None)
@given(
    texts,
    st.lists(st.tuples(st.integers(0, 30), st.text(max_size=3))),
    st.lists(st.text(max_size=3), max_size=5),
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_a_column_range_reads_as_the_list_does(values, changes, appended, start, stop) -> None:
    """``strings`` (the column's iterator, a first build's reads) sees changes and appends."""
    column = StringColumn(*encode_strings(values))
    want = list(values)
    for value in appended:
        column.append(value)
        want.append(value)
    for i, value in changes:
        if i < len(want):
            column[i] = want[i] = value
    assert column.strings(start, stop) == want[start:stop]
    assert list(column) == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=4), unique=True, max_size=30), st.lists(st.text(max_size=4)))
def test_key_index_by_the_process_hash_answers_as_a_dict(keys, probes) -> None:
    """A first build finds ids by Python's own ``hash`` (never stored)."""
    index = KeyIndex(StringColumn(*encode_strings(keys)), *process_hashes(keys), hasher=hash)
    want = {key: i for i, key in enumerate(keys)}
    for key in [*keys, *probes]:
        assert index.get(key) == want.get(key)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=4), unique=True, max_size=40), st.lists(st.text(max_size=4)))
def test_string_table_finds_rows_as_a_dict_does(keys, probes) -> None:
    """The first build's link targets: every string found at its row, any other at -1 (the
    queries repeated, so groups of look-ups start and end anywhere among them)."""
    table = StringTable(*encode_strings(keys))
    queries = [*keys, *probes, *reversed(keys)] * 3
    want = {key: i for i, key in enumerate(keys)}
    found = table.find_all(*encode_strings(queries)) if queries else []
    assert list(found) == [want.get(q, -1) for q in queries]
