"""A concept row's JSON columns (tags, aliases, links) hold msgspec's JSON text of the
lists, whichever way the rows went in: inside the rows' JSON, each read back with SQLite's
``->`` (encoded once), or row by row when the rows' JSON holds U+0000 (each list encoded
alone); link events rewrite ``links`` the same way."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.store import Store
from kbgraph.store import statements as sql
from tests.kb_events import link_added, link_removed, upsert

names = st.text(
    st.characters(blacklist_categories=("Cs",)) | st.sampled_from('"\\/\n\t\x01\x1f\x7f\u2028é😀'),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.lists(names, max_size=3), st.lists(names, max_size=3),
                       st.lists(names, max_size=3), st.lists(names, max_size=2)),
             min_size=1, max_size=4),
    st.booleans(),
)  # fmt: skip
def test_the_columns_hold_msgspecs_json_of_the_lists(
    concepts: list[tuple[list[str], list[str], list[str], list[str]]], row_by_row: bool
) -> None:
    events = [
        upsert(f"c{i}", tags=tags, aliases=aliases, links=links)
        for i, (tags, aliases, links, _) in enumerate(concepts)
    ]
    added = [
        link_added(f"c{i}", target, 2 + at)
        for i, (*_, targets) in enumerate(concepts)
        for at, target in enumerate(targets)
    ]
    removed = [link_removed("c0", target, 10) for target in concepts[0][2][:1]]
    want = {}
    for i, (tags, aliases, links, targets) in enumerate(concepts):
        out = set(links) | set(targets)
        if i == 0 and links:
            out.discard(links[0])
        out.discard(f"c{i}")  # a self-link declares nothing
        want[f"c{i}"] = (tags, aliases, sorted(out))
    encode = msgspec.json.encode
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kb.db"
        with pytest.MonkeyPatch.context() as patch, Store(path) as store:
            if row_by_row:
                patch.setattr(sql, "json_text", lambda value: None)
            store.append("kb", events)
            for event in added + removed:  # each alone: a link event after its upsert
                store.append("kb", [event])
        with contextlib.closing(sqlite3.connect(path)) as conn:
            got = {
                cid: (tags, aliases, links)
                for cid, tags, aliases, links in conn.execute(
                    "SELECT id, tags, aliases, links FROM concept"
                )
            }
    assert got == {cid: tuple(encode(v).decode() for v in lists) for cid, lists in want.items()}
