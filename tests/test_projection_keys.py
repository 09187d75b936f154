"""The patch kernels order ids as Python ``str`` does, long shared prefixes and non-ASCII too.

The kernels compare ids by 16-byte prefixes and, on a tie, by their whole UTF-8 bytes; the
differential tests in ``test_projection`` use short ASCII ids, which never reach the tie path.
"""

from __future__ import annotations

import bisect

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbgraph.projection.adjacency import find
from kbgraph.projection.keys import Keys, utf8
from tests.histories import KB, dump, reference_dump, reference_from_log
from tests.kb_events import delete, link_added, link_removed, upsert
from tests.reference_model import FakeStore, ReferenceKB

# Ids tying on their first 16 UTF-8 bytes, one exactly 16 bytes long, non-ASCII in and after
# the prefix (é as one code point and as e + combining accent, 4-byte UTF-8).
LONG_IDS = [
    "shared/prefix-lo",
    "shared/prefix-long/a",
    "shared/prefix-long/b",
    "shared/prefix-long/ab",
    "shared/prefix-long",
    "shared/prefix-lo\u00e9",
    "shared/prefix-lo\U0001f600",
    "shared/prefix-lo\uffff/x",
    "shared/pr\u00e9fix",
    "zz/\u00e9",
    "zz/e\u0301",
    "\u00e4",
    "a",
]

id_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=24)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(id_text, st.sampled_from(LONG_IDS)), min_size=1, unique=True))
def test_find_lands_where_bisect_on_the_strings_does(ids: list[str]) -> None:
    keys = Keys(ids, len(ids))
    block = sorted(range(len(ids)), key=ids.__getitem__)
    names = [ids[v] for v in block]
    for v in range(len(ids)):
        others = [w for w in block if w != v]
        pool = np.array(others or [0], np.int32)
        off = np.zeros(len(ids), np.int64)
        ln = np.full(len(ids), len(others), np.int32)
        pos, found = find(off, ln, pool, keys.pre, keys.data, keys.off, 0, v)
        assert not found
        assert pos == bisect.bisect_left([n for n in names if n != ids[v]], ids[v])
        pool = np.array(block, np.int32)
        ln[:] = len(block)
        assert find(off, ln, pool, keys.pre, keys.data, keys.off, 0, v) == (block.index(v), True)


def test_utf8_keys_order_as_strings_even_with_surrogates() -> None:
    ids = ["a\ud800", "a\ud7ff", "a\ue000", "a", "a\U00010000", "b", "\x7f", "\x80"]
    assert sorted(ids) == sorted(ids, key=utf8)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(id_text, st.sampled_from(LONG_IDS)), unique=True, max_size=60))
def test_ids_interned_one_by_one_equal_ids_interned_at_once(more: list[str]) -> None:
    """``add`` (one id, through memoryviews) keeps what the constructor makes of all the ids
    at once (``prefixes``, in numpy), growing as it goes."""
    ids = [f"grow/{'x' * (i % 40)}{i}" for i in range(300)] + more
    keys = Keys([], 1)
    for u, concept_id in enumerate(ids):
        keys.add(u, concept_id)
    at_once = Keys(ids, len(ids))
    n = len(ids)
    assert keys.pre[:n].tolist() == at_once.pre[:n].tolist()
    assert keys.off[: n + 1].tolist() == at_once.off[: n + 1].tolist()
    assert bytes(keys.data[: keys.end]) == bytes(at_once.data[: at_once.end])
    for u, concept_id in enumerate(ids):
        assert bytes(keys.data[keys.off[u] : keys.off[u + 1]]) == utf8(concept_id)


@st.composite
def long_id_deliveries(draw: st.DrawFn) -> list[list]:
    out = []
    version = 0
    for _ in range(draw(st.integers(1, 25))):
        delivery = []
        for _ in range(draw(st.integers(1, 4))):
            version += 1
            subject = draw(st.sampled_from(LONG_IDS))
            kind = draw(st.sampled_from(["up", "up", "del", "add", "rm"]))
            if kind == "up":
                links = draw(st.lists(st.sampled_from(LONG_IDS), max_size=6))
                delivery.append(upsert(subject, version, links=links))
            elif kind == "del":
                delivery.append(delete(subject, version))
            else:
                make = link_added if kind == "add" else link_removed
                delivery.append(make(subject, draw(st.sampled_from(LONG_IDS)), version))
        out.append(delivery)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_id_deliveries(), st.data())
def test_long_and_non_ascii_ids_match_reference_and_rebuild(deliveries, data) -> None:
    from kbgraph.projection import Projections

    store = FakeStore()
    split = data.draw(st.integers(0, len(deliveries)))
    for delivery in deliveries[:split]:
        store.append(KB, delivery)
    live = Projections(store)
    live.load()
    for delivery in deliveries[split:]:
        store.append(KB, delivery)
        live.follow_once()
    fresh = Projections(store)
    fresh.load()
    got = dump(live.get(KB), [None])
    assert got == dump(fresh.get(KB), [None])
    ref: ReferenceKB | None = reference_from_log(store)
    assert got == (reference_dump(ref, [None]) if ref is not None else None)
