"""The flat inverted lists: a base plus an overlay of changes reads as the lists rebuilt from
the final contents, and folding them into arrays (a checkpoint) and back changes nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.search.postings import Postings

KEYS = ["a", "b", "c", "dd", "é", "f g"]
items = st.dictionaries(st.sampled_from(KEYS), st.integers(1, 1 << 40), max_size=4).map(
    lambda d: list(d.items())
)
ops = st.lists(st.tuples(st.integers(0, 9), st.none() | items), max_size=40)


def contents(p: Postings) -> tuple[dict, dict, int]:
    nodes = {u: p.node_keys_of(u) for u in range(12) if p.holds(u)}
    return p.as_dict(), nodes, p.count


@settings(max_examples=300, deadline=None)
@given(base=st.dictionaries(st.integers(0, 9), items, max_size=8), changes=ops)
def test_base_and_overlay_read_as_a_build_of_the_final_contents(base, changes) -> None:
    p = Postings.built(sorted(base.items()))
    final = dict(base)
    for node, new in changes:
        if new is None:
            assert p.remove(node) == (node in final)
            final.pop(node, None)
        else:
            p.put(node, new)
            final[node] = new
        for key in KEYS[::2]:  # read between changes: the holders cached meanwhile follow them
            want = sorted((u, h) for u, pairs in final.items() for k, h in pairs if k == key)
            nodes, hits = p.holders(key)
            assert sorted(zip(nodes.tolist(), hits.tolist(), strict=True)) == want
        for key in [*KEYS, "absent"]:  # counted, cached or not
            assert p.held_by(key) == sum(k == key for pairs in final.items() for k, _ in pairs[1])
    rebuilt = Postings.built(sorted(final.items()))
    assert contents(p) == contents(rebuilt)
    for node, pairs in final.items():  # each node's keys in the order it put them
        assert p.node_keys_of(node) == [key for key, _ in pairs]
    keys, arrays = p.arrays()
    loaded = Postings.from_arrays(list(keys), None, arrays)
    assert contents(loaded) == contents(rebuilt)
    loaded.found = {key: k for k, key in enumerate(keys)} | {"absent": -1}  # found ahead
    for key in [*KEYS, "absent"]:
        assert loaded.held_by(key) == p.held_by(key)
    loaded.put(11, [("zz", 3)])  # a loaded base takes changes as any other
    assert loaded.holders("zz")[0].tolist() == [11]


@settings(max_examples=300, deadline=None)
@given(
    base=st.dictionaries(st.integers(0, 9), items, max_size=8),
    changes=ops,
    keys=st.lists(st.sampled_from([*KEYS, "absent"]), max_size=3),
    mask=st.sampled_from([1, 0xFFFFFFFF, 1 << 33, (1 << 41) - 1]),
)
def test_holding_all_is_the_intersection_of_the_masked_holders(base, changes, keys, mask) -> None:
    """``holding_all`` (merged in kernels over the base and the overlay) against the final
    contents read directly."""
    p = Postings.built(sorted(base.items()))
    final = dict(base)
    for node, new in changes:
        if new is None:
            p.remove(node)
            final.pop(node, None)
        else:
            p.put(node, new)
            final[node] = new
    expected = sorted(
        u for u, pairs in final.items() if all(dict(pairs).get(k, 0) & mask for k in keys)
    )
    got = p.holding_all(keys, mask)
    assert got.tolist() == (expected if keys else [])
    keys_, arrays = p.arrays()
    for array in arrays.values():  # as a checkpoint maps them
        array.flags.writeable = False
    loaded = Postings.from_arrays(list(keys_), None, arrays)
    assert loaded.holding_all(keys, mask).tolist() == got.tolist()
