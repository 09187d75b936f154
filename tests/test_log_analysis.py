"""Text analysis once per event: the store's writer carries each upsert's analysis in its log
row (``kbgraph.search.document``), and a follower applying it answers exactly as one that
analyses the text itself."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.events import ConceptUpserted
from kbgraph.projection import Projections
from kbgraph.search import document
from kbgraph.search import index as search_index
from kbgraph.store import Store, eventlog
from tests.bulk_histories import by_id, history_event, history_events
from tests.kb_events import upsert


def expected(event: object) -> document.Analysed | None:
    """The oracle: the analysis the follower would make of the event itself."""
    if not isinstance(event, ConceptUpserted):
        return None
    d = event.data
    freq, names, tags, title_len, text_len = document.parts(d.title, d.text, d.aliases, d.tags)
    return document.Analysed(
        document.ANALYSIS_VERSION, list(freq), list(freq.values()), names, list(tags),
        title_len, text_len,
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.lists(history_event, max_size=16), st.integers(1, 4), st.booleans())
def test_a_follower_applying_the_carried_analysis_equals_one_analysing(
    steps, per_delivery, row_by_row
) -> None:
    """Random histories appended in deliveries of a few events (the bulk insert, or row by
    row as for a delivery whose JSON holds U+0000): every upsert's row carries its analysis,
    other rows none; a follower that never analyses (``parts`` raises) ends equal, concept by
    concept and in its search answers, to one given no analysis."""
    events = history_events(steps)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "kb.db") as store:
        carried, analysing = Projections(store), Projections(store)
        carried.load()
        analysing.load()
        with pytest.MonkeyPatch.context() as patch:
            if row_by_row:
                patch.setattr(eventlog, "json_text", lambda value: None)
            for at in range(0, len(events), per_delivery):
                store.append("kb", events[at : at + per_delivery])
        records = store.read_log(0)
        assert [r.analysis for r in records] == [expected(r.event) for r in records]

        def analysed_here(*args: object) -> None:
            raise AssertionError("the follower analysed a text the log carried")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(search_index, "parts", analysed_here)
            while carried.follow_once():
                pass
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(document, "decode", lambda blob: None)
            while analysing.follow_once():
                pass
        a, b = carried.get("kb"), analysing.get("kb")
        assert (a is None) == (b is None)
        if a is not None:
            assert by_id(a) == by_id(b)


def test_rows_without_an_analysis_of_this_version_are_analysed_by_the_follower(
    tmp_path: Path,
) -> None:
    """A store older code wrote (no ``analysis`` column: read read-only as it is, given the
    column when opened to write), and rows carrying another version or bytes that do not
    decode: read as no analysis, and the follower analyses them; new rows carry it."""
    path = tmp_path / "kb.db"
    with Store(path) as store:
        store.append("kb", [upsert("a", title="Resolver", text="dns backups")])
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE log DROP COLUMN analysis")
    with Store(path, read_only=True) as old:
        assert [r.analysis for r in old.read_log(0)] == [None]
    with Store(path) as store:
        projections = Projections(store)
        projections.load()  # a first build from the store's rows: "a"
        store.append("kb", [upsert("b", title="Router", text="wi-fi backups")])
        store.append("kb", [upsert("c", title="Mail", text="backups of mail")])
        store.append("kb", [upsert("d", title="Disk", text="backups of disks")])
        with sqlite3.connect(path) as conn:
            other = document.Analysed(document.ANALYSIS_VERSION + 1, ["x"], [1], [], [], 0, 1)
            conn.execute(
                "UPDATE log SET analysis = ? WHERE seq = 3", (msgspec.msgpack.encode(other),)
            )
            conn.execute("UPDATE log SET analysis = x'c1' WHERE seq = 4")  # not msgpack
        records = store.read_log(0)
        assert [r.analysis is None for r in records] == [True, False, True, True]
        assert records[1].analysis == expected(records[1].event)
        while projections.follow_once():
            pass
        kb = projections.get("kb")
        assert kb is not None
        with kb.read() as snap:
            nodes, _ = snap.index.search("backups", snap.view(None).mask)
            assert sorted(snap.ids[u] for u in nodes) == ["a", "b", "c", "d"]
            assert snap.index.doc_terms(snap.node("c")) == ["backup", "mail"]
