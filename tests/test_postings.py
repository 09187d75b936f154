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
    rebuilt = Postings.built(sorted(final.items()))
    assert contents(p) == contents(rebuilt)
    for node, pairs in final.items():  # each node's keys in the order it put them
        assert p.node_keys_of(node) == [key for key, _ in pairs]
    keys, arrays = p.arrays()
    loaded = Postings.from_arrays(list(keys), None, arrays)
    assert contents(loaded) == contents(rebuilt)
    loaded.put(11, [("zz", 3)])  # a loaded base takes changes as any other
    assert loaded.holders("zz")[0].tolist() == [11]
