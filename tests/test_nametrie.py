"""The name trie's compiled walk (kbgraph.search.nametrie) against a plain oracle: every
window of the tokens looked up among the names held; added and discarded in any order
(through its rebuilds) equals the trie built from the names held at the end."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.search import nametrie, tokenize
from kbgraph.search.analysis import folded
from kbgraph.search.nametrie import NAME_SEP, NameTrie, mentionable

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
)
def test_matches_equal_the_oracle_through_adds_discards_and_rebuilds(
    steps: list[tuple[bool, str]], texts: list[list[str]], rebuild_after: int, collide: bool
) -> None:
    """``collide``: tokens' ids two bits of their hash, so most of them collide (six words
    and "zz" walk at most four edges from a node): the matches are the same."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nametrie, "MIN_DEAD_REBUILD", rebuild_after)  # rebuilds often
        if collide:
            patch.setattr(nametrie, "TOKEN_HASH_MASK", 3)
        trie = NameTrie()
        held: dict[str, int] = {}
        for added, key in steps:
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
        assert fresh.match_texts(folded) == expected


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
