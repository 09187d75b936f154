"""``aliases`` (docs/events.md): decoded with bounds, stored, migrated, searched like
the title, and returned by ``GET concepts/{id}``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import numpy as np
import pytest

from kbgraph.events import (
    MAX_ALIAS_CHARS,
    MAX_ALIASES,
    ConceptUpserted,
    DeliveryError,
    UpsertData,
    decode_delivery,
)
from kbgraph.projection import KBProjection
from kbgraph.store import Store
from kbgraph.store.schema import SCHEMA_VERSION
from tests.kb_events import link_added


def upsert(subject: str, version: int = 1, **data: object) -> ConceptUpserted:
    return ConceptUpserted(
        specversion="1.0",
        id=f"{subject}-{version}",
        source="test://aliases",
        subject=subject,
        data=UpsertData(version=version, **data),  # type: ignore[arg-type]
    )


def body(aliases: object) -> bytes:
    return msgspec.json.encode(
        {
            "specversion": "1.0",
            "id": "1",
            "source": "s",
            "type": "concept.upserted",
            "subject": "a",
            "data": {"version": 1, "aliases": aliases},
        }
    )


def test_aliases_decode_within_bounds() -> None:
    (event,) = decode_delivery(body(["Pi-hole", "x" * MAX_ALIAS_CHARS]), "application/json")
    assert event.data.aliases == ["Pi-hole", "x" * MAX_ALIAS_CHARS]
    (plain,) = decode_delivery(body([]), "application/json")
    assert plain.data.aliases == []


@pytest.mark.parametrize(
    ("aliases", "where"),
    [
        (["a"] * (MAX_ALIASES + 1), "event.data.aliases: Expected `array` of length <= 64"),
        (["x" * (MAX_ALIAS_CHARS + 1)], "event.data.aliases[0]: Expected `str` of length <= 1024"),
        ("one", "event.data.aliases: Expected `array`, got `str`"),
        ([1], "event.data.aliases[0]: Expected `str`, got `int`"),
    ],
)
def test_aliases_out_of_bounds_are_422_naming_the_field(aliases: object, where: str) -> None:
    with pytest.raises(DeliveryError) as info:
        decode_delivery(body(aliases), "application/json")
    assert info.value.status == 422
    assert info.value.message == where.replace("`", "")


def test_aliases_are_stored_and_searched_like_the_title(tmp_path: Path) -> None:
    with Store(tmp_path / "kb.db") as store:
        store.append("kb", [upsert("dns", title="DNS", aliases=["Pi-hole", "sinkhole\nresolver"])])
        store.append("kb", [upsert("other", title="Other", text="pihole sinkhole sinkhole")])
        (dns, other) = store.load().kbs["kb"].concepts
        assert dns.aliases == ["Pi-hole", "sinkhole\nresolver"] and other.aliases == []
        # the in-memory index (BM25F, aliases in the title's field) ranks the alias first
        projection = KBProjection("kb")
        projection.build(store.load().kbs["kb"])
        with projection.read() as snap:
            mask = np.ones(len(snap.ids), np.uint8)
            nodes, scores = snap.index.search("sinkhole", mask)
            ours = {snap.ids[n]: s for n, s in zip(nodes.tolist(), scores.tolist(), strict=True)}
        assert sorted(ours, key=ours.__getitem__, reverse=True) == ["dns", "other"]
        # a re-upsert without aliases clears them, in the state and in the index
        store.append("kb", [upsert("dns", 2, title="DNS")])
        assert store.load().kbs["kb"].concepts[0].aliases == []


def test_schema_1_store_is_migrated(tmp_path: Path) -> None:
    """A schema 1 file (no aliases, an FTS5 table per KB) opens at the current schema: aliases
    added, the full-text tables and their shadow tables gone, the state as it was."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE kb (kid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                         seq INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE concept (rid INTEGER PRIMARY KEY, kid INTEGER NOT NULL, id TEXT NOT NULL,
            version INTEGER NOT NULL, title TEXT NOT NULL, type TEXT NOT NULL,
            status TEXT NOT NULL, tags TEXT NOT NULL, text TEXT NOT NULL, UNIQUE (kid, id));
        CREATE VIRTUAL TABLE fts_1 USING fts5(title, text,
            tokenize = 'unicode61 remove_diacritics 2');
        INSERT INTO kb VALUES (1, 'kb', 1);
        INSERT INTO concept VALUES (1, 1, 'a', 1, 'Router', '', '', '[]', 'old text');
        INSERT INTO fts_1 (rowid, title, text) VALUES (1, 'Router', 'old text');
        PRAGMA user_version = 1;
        """
    )
    conn.close()
    with Store(path) as store:
        (a,) = store.load().kbs["kb"].concepts
        assert (a.title, a.aliases, a.text) == ("Router", [], "old text")
        store.append("kb", [upsert("a", 2, title="Router", aliases=["Gateway"])])
        store.append("new", [upsert("b", 1)])
    with Store(path) as store:  # reopening a migrated file changes nothing
        assert store.load().kbs["kb"].concepts[0].aliases == ["Gateway"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    assert not {name for name in tables if name.startswith("fts")}, tables
    assert "webhook_message" in tables


def test_schema_6_link_rows_become_the_links_column(tmp_path: Path) -> None:
    """A schema 6 file kept declared links as rows of a link table: they become each concept's
    ``links`` column (to missing concepts too), the table goes, and the state reads the same."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE kb (kid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                         seq INTEGER NOT NULL DEFAULT 0, keys INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE concept (rid INTEGER PRIMARY KEY, kid INTEGER NOT NULL, id TEXT NOT NULL,
            version INTEGER NOT NULL, title TEXT NOT NULL, aliases TEXT NOT NULL DEFAULT '[]',
            type TEXT NOT NULL, status TEXT NOT NULL, tags TEXT NOT NULL, text TEXT NOT NULL,
            UNIQUE (kid, id));
        CREATE TABLE link (kid INTEGER NOT NULL, src TEXT NOT NULL, dst TEXT NOT NULL,
            PRIMARY KEY (kid, src, dst)) WITHOUT ROWID;
        INSERT INTO kb VALUES (1, 'kb', 3, 0);
        INSERT INTO concept VALUES (1, 1, 'a', 1, 'A', '[]', '', '', '[]', '');
        INSERT INTO concept VALUES (2, 1, 'b', 1, 'B', '[]', '', '', '[]', '');
        INSERT INTO concept VALUES (3, 1, 'café', 1, 'C', '[]', '', '', '[]', '');
        INSERT INTO link VALUES (1, 'a', 'b'), (1, 'a', 'ghost'), (1, 'a', 'café'),
                                (1, 'café', 'a');
        PRAGMA user_version = 6;
        """
    )
    conn.close()
    with Store(path) as store:
        concepts = {c.id: c.links for c in store.load().kbs["kb"].concepts}
        assert concepts == {"a": ["b", "café", "ghost"], "b": [], "café": ["a"]}
        store.append("kb", [link_added("b", "a", 2)])  # a link event patches the column
        concepts = {c.id: c.links for c in store.load().kbs["kb"].concepts}
        assert concepts["b"] == ["a"]
    conn = sqlite3.connect(path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    assert "link" not in tables and "link_dst" not in tables
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
