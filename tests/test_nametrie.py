"""The name trie's compiled walk (kbgraph.search.nametrie) against a plain oracle: every
window of the tokens looked up among the names held; added and discarded in any order
(through its rebuilds, and through its saved arrays, as a checkpoint carries it) equals the
trie built from the names held at the end."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.search import nametrie, tokenize
from kbgraph.search.analysis import folded
from kbgraph.search.nametrie import NAME_SEP, NameTrie, mentionable
from kbgraph.store.columns import StringColumn, encode_strings

WORDS = ["a", "b", "c", "the", "of", "d"]
name_st = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(NAME_SEP.join)
tokens_st = st.lists(st.sampled_from([*WORDS, "zz"]), max_size=20)


def oracle(held: dict[str, int], tokens: list[str]) -> list[tuple[int, int, str]]:
    names = {k for k, count in held.items() if count > 0 and mentionable(k)}
    return [
        (i, j, NAME_SEP.join(tokens[i:j]))
        for i in range(len(tokens))
        for j in range(i + 1, len(tokens) + 1)
        if NAME_SEP.join(tokens[i:j]) in names
    ]


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.booleans(), name_st), max_size=60),
    st.lists(tokens_st, min_size=1, max_size=4),
    st.integers(0, 3),
    st.booleans(),
    st.sets(st.integers(0, 30), max_size=3),
)
def test_matches_equal_the_oracle_through_adds_discards_and_rebuilds(
    steps: list[tuple[bool, str]],
    texts: list[list[str]],
    rebuild_after: int,
    collide: bool,
    saved_at: set[int],
) -> None:
    """``collide``: tokens' ids two bits of their hash, so most of them collide (six words
    and "zz" walk at most four edges from a node): the matches are the same. Before each step
    of ``saved_at`` the trie goes through its saved arrays (``reloaded``) and goes on from
    there."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nametrie, "MIN_DEAD_REBUILD", rebuild_after)  # rebuilds often
        if collide:
            patch.setattr(nametrie, "TOKEN_HASH_MASK", 3)
        trie = NameTrie()
        held: dict[str, int] = {}
        for at, (added, key) in enumerate(steps):
            if at in saved_at:
                trie = reloaded(trie)
            if added:
                trie.add(key)
                held[key] = held.get(key, 0) + 1
            else:
                trie.discard(key)
                held[key] = max(0, held.get(key, 0) - 1)
            assert matches(trie, texts[0]) == oracle(held, texts[0])
        fresh = NameTrie(k for k, count in held.items() for _ in range(count))
        folded = [" ".join(text).encode() for text in texts]
        expected = [(k, *m) for k, t in enumerate(texts) for m in oracle(held, t)]
        assert trie.match_texts(folded) == expected
        assert reloaded(trie).match_texts(folded) == expected
        assert fresh.match_texts(folded) == expected
        assert reloaded(fresh).match_texts(folded) == expected


def reloaded(trie: NameTrie) -> NameTrie:
    """``trie`` through its saved arrays, as a checkpoint writes and maps them (its nodes'
    keys a lazily read column): saved again, the same arrays."""
    node_keys, shared_keys, arrays = trie.saved()
    copies = {name: a.copy() for name, a in arrays.items()}
    again = NameTrie.from_arrays(copies, StringColumn(*encode_strings(node_keys)), shared_keys)
    node_keys_again, shared_again, arrays_again = again.saved()
    assert (node_keys_again, shared_again) == (node_keys, shared_keys)
    assert arrays_again.keys() == arrays.keys()
    for name, a in arrays.items():
        assert np.array_equal(arrays_again[name], a) and arrays_again[name].dtype == a.dtype
    return again


def test_names_sharing_a_node_go_through_the_saved_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names whose tokens all hash alike share a node: saved and loaded, the node still holds
    each of them with its count, so a collision neither adds nor hides a name after a load."""
    monkeypatch.setattr(nametrie, "TOKEN_HASH_MASK", 3)  # "a", "the", "of" hash alike
    keys = [NAME_SEP.join([w, "b"]) for w in ("a", "the", "of", "the")]
    trie = NameTrie(keys)
    trie.discard(keys[0])
    held = {keys[0]: 0, keys[1]: 2, keys[2]: 1}
    text = ["a", "b", "the", "b", "of", "b"]
    assert matches(trie, text) == oracle(held, text)
    trie = reloaded(trie)
    assert trie.saved()[1] == [keys[2], keys[1]]  # one node, its keys by name
    assert matches(trie, text) == oracle(held, text)
    for key in (keys[1], keys[2], keys[0]):
        trie.discard(key)
        held[key] = max(0, held[key] - 1)
        assert matches(trie, text) == oracle(held, text)
    trie.add(keys[0])
    held[keys[0]] += 1
    assert matches(reloaded(trie), text) == oracle(held, text)


def test_the_saved_edge_table_is_sized_for_the_nodes() -> None:
    """A build sizes its table for every name's tokens; names sharing their first token make
    fewer nodes, and the saved table is the size those need (at most half full)."""
    trie = NameTrie(NAME_SEP.join(["x", str(i)]) for i in range(100))
    assert len(trie) == 102
    edges = trie.saved()[2]["edges"]
    assert edges.shape == (256, 4) and np.count_nonzero(edges[:, 0] >= 0) == 101
    again = reloaded(trie)
    text = [b"x 7 x 99 x 100"]
    assert (
        again.match_texts(text)
        == trie.match_texts(text)
        == [(0, 0, 2, "x\x1f7"), (0, 2, 4, "x\x1f99")]
    )
    again.add(NAME_SEP.join(["x", "100"]))
    assert again.match_texts(text)[-1] == (0, 4, 6, "x\x1f100")


def test_saved_arrays_that_make_no_trie_are_refused() -> None:
    """A checkpoint's trie whose arrays do not fit together (a header edited, a mask of
    another build) raises ``ValueError``: the checkpoint is not used."""
    trie = NameTrie(["a", NAME_SEP.join(["b", "c"])])
    node_keys, shared_keys, arrays = trie.saved()
    keys = StringColumn(*encode_strings(node_keys))
    broken = {
        "mask": {**arrays, "meta": np.array([len(trie), 0, 3], np.int64)},
        "nodes": {**arrays, "meta": np.array([len(trie) + 1, 0, -1], np.int64)},
        "table": {**arrays, "edges": arrays["edges"][:3]},
        "dtype": {**arrays, "through": arrays["through"].astype(np.int64)},
        "shared": {**arrays, "shared_node": np.array([1], np.int64)},
    }
    for why, parts in broken.items():
        with pytest.raises(ValueError, match="name trie"):
            NameTrie.from_arrays(parts, keys, shared_keys)
            pytest.fail(why)
    assert reloaded(trie).match_texts([b"a b c"]) == trie.match_texts([b"a b c"])


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.booleans(), name_st), max_size=60),
    st.lists(tokens_st, min_size=1, max_size=4),
    st.lists(name_st, max_size=10),
    st.booleans(),
)
def test_adds_gathered_and_made_at_once_equal_the_oracle(
    steps: list[tuple[bool, str]], texts: list[list[str]], first: list[str], collide: bool
) -> None:
    """As ``SearchIndex`` patches the trie over a batch: its adds gathered (a discard takes
    back a gathered add of its key first, else discards from the trie), then made by one
    ``add_many``; the matches are those of the names held at the end."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nametrie, "MIN_DEAD_REBUILD", 0)  # rebuilds often
        if collide:
            patch.setattr(nametrie, "TOKEN_HASH_MASK", 3)
        trie = NameTrie(first)
        held: dict[str, int] = {}
        for key in first:
            held[key] = held.get(key, 0) + 1
        gathered: list[str] = []
        for added, key in steps:
            if added:
                gathered.append(key)
                held[key] = held.get(key, 0) + 1
                continue
            if key in gathered:
                gathered.remove(key)
            else:
                trie.discard(key)
            held[key] = max(0, held.get(key, 0) - 1)
        trie.add_many(gathered)
        folded = [" ".join(text).encode() for text in texts]
        assert trie.match_texts(folded) == [
            (k, *m) for k, t in enumerate(texts) for m in oracle(held, t)
        ]
        for key in [k for k, count in held.items() for _ in range(count)]:
            trie.discard(key)  # the counts held too: every name gone after as many discards
        assert trie.match_texts(folded) == []


def matches(trie: NameTrie, tokens: list[str]) -> list[tuple[int, int, str]]:
    return [(i, j, key) for _, i, j, key in trie.match_texts([" ".join(tokens).encode()])]


@settings(max_examples=300)
@given(
    st.text(max_size=40)
    | st.text("aB1 ,.-_\t\x1f\x00éÉ™ßİ東京\u0301\u034f\u0327ﬁ–“\u20d7ǅ\xa0", max_size=40)
)
def test_folded_bytes_part_the_tokens_of_tokenize(text: str) -> None:
    """The trie's kernel walks ``folded``'s bytes parted at every byte up to the space:
    those parts are the tokens ``tokenize`` makes."""
    parts = [part for part in re.split(rb"[\x00-\x20]+", folded(text)) if part]
    assert parts == [token.encode() for token in tokenize(text)]


def test_names_beyond_ascii_match_as_their_folded_bytes() -> None:
    names = ["東京 Tower", "Straße", "Zoë Saldaña", "a™"]
    trie = NameTrie(NAME_SEP.join(tokenize(name)) for name in names)
    text = "Zoe SALDANA saw the 東京 tower; a strasse, not a™ or atm."
    found = trie.match_texts([folded(text)])
    assert [key.split(NAME_SEP) for _, _, _, key in found] == [
        ["zoe", "saldana"],
        ["東京", "tower"],
        ["strasse"],
        ["atm"],
        ["atm"],
    ]


def test_a_short_output_is_called_again_with_room() -> None:
    """Every window of 300 "x"s is a name: 45,150 matches, past the first buffer."""
    trie = NameTrie(NAME_SEP.join(["x"] * n) for n in range(1, 301))
    found = matches(trie, ["x"] * 300)
    assert len(found) == 300 * 301 // 2
    assert found[:3] == [(0, 1, "x"), (0, 2, NAME_SEP.join("xx")), (0, 3, NAME_SEP.join("xxx"))]
    assert found[-1] == (299, 300, "x")


def test_readers_at_once_build_the_trie_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers share the projection's read lock: a second reader asking for the name trie
    while the first builds it (seconds at a million names) waits for that build."""
    from kbgraph.search import SearchIndex
    from kbgraph.search import index as index_module

    built: list[NameTrie] = []
    entered, release = threading.Event(), threading.Event()

    class SlowTrie(NameTrie):
        def __init__(self, keys: Iterable[str]) -> None:
            built.append(self)
            entered.set()
            assert release.wait(30), "the test never released the first build"
            super().__init__(keys)

    monkeypatch.setattr(index_module, "NameTrie", SlowTrie)
    index = SearchIndex()
    index.put(0, "Alpha Beta", "text", ())
    tries: list[NameTrie] = []
    first = threading.Thread(target=lambda: tries.append(index.name_trie()))
    first.start()
    assert entered.wait(30)
    second = threading.Thread(target=lambda: tries.append(index.name_trie()))
    second.start()
    second.join(0.5)  # without the lock, the second reader starts a build of its own here
    release.set()
    first.join(30)
    second.join(30)
    assert len(built) == 1
    assert len(tries) == 2 and tries[0] is tries[1] is built[0]
