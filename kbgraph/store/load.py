"""Loading: every KB's current state and the log position it reflects, for a first build."""

from __future__ import annotations

import sqlite3

from kbgraph.store.model import ConceptState, KBState, StoreSnapshot
from kbgraph.store.statements import tags_decoder


def load_snapshot(conn: sqlite3.Connection) -> StoreSnapshot:
    """The state of every KB with seq >= 1 and the gid it reflects (call in a read transaction)."""
    gid = conn.execute("SELECT coalesce(max(gid), 0) FROM log").fetchone()[0]
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
