"""Random histories of a KB for the bulk build's tests: ``history_event`` draws one step (an
upsert, a delete, a link added or removed; ids and words with non-ASCII, empty and odd pieces),
``history_events`` makes the steps events with rising versions, and ``by_id`` reads everything a
KB answers from by concept id, so a bulk build and the events applied one by one compare."""

from __future__ import annotations

from hypothesis import strategies as st

from kbgraph.projection import KBProjection
from tests.kb_events import delete, link_added, link_removed, upsert

IDS = ["a", "b", "notes/c", "notes/é", "Z", "ü/x", "日本", "a-b", "zz/zz", "\U0001f600"]


WORDS = ["dns", "résolveur", "the", "Backups", "wi-fi", "", "x y", "Ωmega", "E-Mail_x", "a\0b"]


texts = st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join)


words = st.lists(st.sampled_from(WORDS), max_size=3)


concept = st.tuples(
    st.sampled_from(IDS),
    texts,
    texts,
    words,
    words,
    st.lists(st.sampled_from([*IDS, "missing/1", "missing/ü"]), max_size=4),
    st.booleans(),
)


TYPES = ["", "Note", "Secret"]


history_event = st.one_of(
    st.tuples(st.just("upsert"), concept, st.sampled_from(TYPES)),
    st.tuples(st.just("delete"), st.sampled_from(IDS)),
    st.tuples(st.just("link+"), st.sampled_from(IDS), st.sampled_from([*IDS, "missing/1"])),
    st.tuples(st.just("link-"), st.sampled_from(IDS), st.sampled_from([*IDS, "missing/1"])),
)


def history_events(steps: list[tuple]) -> list:
    events = []
    for version, step in enumerate(steps, 1):
        if step[0] == "upsert":
            (cid, title, text, tags, aliases, links, _), ctype = step[1], step[2]
            events.append(
                upsert(
                    cid,
                    version,
                    title=title,
                    text=text,
                    tags=tags,
                    aliases=aliases,
                    links=links,
                    type=ctype,
                )
            )
        elif step[0] == "delete":
            events.append(delete(step[1], version))
        else:
            make = link_added if step[0] == "link+" else link_removed
            events.append(make(step[1], step[2], version))
    return events


def by_id(kb: KBProjection) -> dict:
    """Everything a KB answers from, keyed by concept id (node numbers differ between a build
    and the events applied one by one): fields, declared links, edges, the search index."""
    with kb.read() as snap:
        ids = snap.ids
        alive = [u for u in range(len(ids)) if snap.node(ids[u]) == u]
        index = kb.index
        view = snap.view(None)
        return {
            "nodes": {
                ids[u]: (
                    snap.titles[u],
                    snap.types[u],
                    list(snap.tags[u]),
                    list(snap.aliases[u]),
                    snap.texts[u],
                    snap.versions[u],
                    snap.declared_links(u),
                    index.doc_terms(u),
                    index.doc_tags(u),
                    index.names.node_keys_of(u),
                    index.lengths(u),
                )
                for u in alive
            },
            "und": {
                frozenset((ids[u], ids[v])) for u in alive for v in kb.links.und.block(u).tolist()
            },
            "out": {(ids[u], ids[v]) for u in alive for v in kb.links.out.block(u).tolist()},
            "pending": {(ids[u], ids[t]) for u, ts in kb.links.missing_out.items() for t in ts},
            "terms": {
                k: {ids[u]: h for u, h in d.items()} for k, d in index.terms.as_dict().items()
            },
            "names": {k: {ids[u] for u in d} for k, d in index.names.as_dict().items()},
            "tags": {k: {ids[u] for u in d} for k, d in index.tags.as_dict().items()},
            "name_lengths": dict(index.name_lengths),
            "count": (len(index), snap.counts(view)),
            "search": [
                sorted(zip(map(ids.__getitem__, r[0].tolist()), r[1].tolist(), strict=True))
                for q in ("dns backups", "wi-fi résolveur", "x")
                for r in [index.search(q, view.mask)]
            ],
        }
