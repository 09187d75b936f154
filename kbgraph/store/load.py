"""Loading: every KB's current state and the log position it reflects, for a first build."""

from __future__ import annotations

import sqlite3
from typing import Final

import numpy as np

from kbgraph.store import statements as sql
from kbgraph.store.columns import StringColumn, encode_strings, joined_columns, split_json_arrays
from kbgraph.store.model import ColumnSnapshot, ConceptState, KBColumns, KBState, StoreSnapshot
from kbgraph.store.statements import tags_decoder, tags_encoder

EMPTY: Final[list[str]] = []  # every empty tags/aliases list of a columnar load: never mutated
FETCH_ROWS: Final = 1 << 15
_COLUMNS: Final = (
    "SELECT id, version, title, type, status, tags, text, aliases, links FROM concept"
    " WHERE kid = ? ORDER BY id"
)


def load_snapshot(conn: sqlite3.Connection) -> StoreSnapshot:
    """The state of every KB with seq >= 1 and the gid it reflects (call in a read transaction)."""
    gid = conn.execute(sql.LOG_LAST).fetchone()[0]
    kbs = conn.execute("SELECT kid, name, seq FROM kb WHERE seq > 0").fetchall()
    rows = conn.execute(
        "SELECT kid, id, version, title, type, status, tags, text, aliases, links FROM concept"
    ).fetchall()
    concepts: dict[int, list[ConceptState]] = {}
    decode = tags_decoder.decode
    for kid, cid, version, title, ctype, status, tags, text, aliases, links in rows:
        concepts.setdefault(kid, []).append(
            ConceptState(
                id=cid,
                version=version,
                title=title,
                type=ctype,
                status=status,
                tags=decode(tags),
                text=text,
                links=sorted(decode(links)),
                aliases=decode(aliases),
            )
        )
    return StoreSnapshot(
        gid=gid,
        kbs={
            name: KBState(seq=seq, concepts=sorted(concepts.get(kid, []), key=_by_id))
            for kid, name, seq in sorted(kbs, key=lambda row: row[1])
        },
    )


def _by_id(concept: ConceptState) -> str:
    return concept.id


def load_columns(conn: sqlite3.Connection) -> ColumnSnapshot:
    """``load_snapshot`` as columns, without an object per concept (call in a read
    transaction). Rows come in ``(kid, id)`` index order: SQLite compares TEXT as UTF-8 bytes,
    which orders strings as Python does (by code point). Each chunk of rows is turned into
    its columns as it comes (ids, titles and texts encoded, the links split into an encoded column
    of target ids, types and statuses shared, empty lists the shared ``EMPTY``), so a million
    rows' raw values never live at once."""
    gid = conn.execute(sql.LOG_LAST).fetchone()[0]
    kbs = conn.execute("SELECT kid, name, seq FROM kb WHERE seq > 0").fetchall()
    out: dict[str, KBColumns] = {}
    for kid, name, seq in sorted(kbs, key=lambda row: row[1]):
        ids: list[tuple[np.ndarray, np.ndarray]] = []
        versions: list[int] = []
        titles: list[tuple[np.ndarray, np.ndarray]] = []
        types: list[str] = []
        statuses: list[str] = []
        tags: list[list[str]] = []
        texts: list[tuple[np.ndarray, np.ndarray]] = []
        aliases: list[list[str]] = []
        links: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        shared: dict[str, str] = {}
        cursor = conn.execute(_COLUMNS, (kid,))
        while rows := cursor.fetchmany(FETCH_ROWS):  # a chunk of row tuples at a time
            chunk = list(zip(*rows, strict=True))
            del rows
            ids.append(encode_strings(list(chunk[0])))
            versions.extend(chunk[1])
            titles.append(encode_strings(list(chunk[2])))
            types.extend(map(shared.setdefault, chunk[3], chunk[3]))
            statuses.extend(map(shared.setdefault, chunk[4], chunk[4]))
            tags.extend(_lists(chunk[5]))
            texts.append(encode_strings(list(chunk[6])))
            aliases.extend(_lists(chunk[7]))
            links.append(split_json_arrays(chunk[8]))
        out[name] = KBColumns(
            seq=seq,
            ids=StringColumn(*joined_columns(ids)),
            versions=versions,
            titles=StringColumn(*joined_columns(titles)),
            types=types,
            statuses=statuses,
            tags=tags,
            texts=StringColumn(*joined_columns(texts)),
            aliases=aliases,
            links=links,
        )
    return ColumnSnapshot(gid=gid, kbs=out)


def _lists(texts: tuple[str, ...]) -> list[list[str]]:
    """Stored JSON lists decoded, each empty one the shared ``EMPTY``."""
    if texts.count("[]") == len(texts):  # the common chunk: no list holds anything
        return [EMPTY] * len(texts)
    decode = tags_decoder.decode
    return [EMPTY if t == "[]" else decode(t) for t in texts]


def columns_of(state: KBState) -> KBColumns:
    """A ``KBState`` as the columns ``load_columns`` gives (for stores kept in memory)."""
    concepts = state.concepts
    encode = tags_encoder.encode
    return KBColumns(
        seq=state.seq,
        ids=StringColumn(*encode_strings([c.id for c in concepts])),
        versions=[c.version for c in concepts],
        titles=StringColumn(*encode_strings([c.title for c in concepts])),
        types=[c.type for c in concepts],
        statuses=[c.status for c in concepts],
        tags=[list(c.tags) for c in concepts],
        texts=StringColumn(*encode_strings([c.text for c in concepts])),
        aliases=[list(c.aliases) for c in concepts],
        links=[split_json_arrays([encode(c.links).decode() for c in concepts])],
    )
