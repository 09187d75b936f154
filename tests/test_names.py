"""Naming rules: concept ids, KB names, collections."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from kbgraph.names import collection_of, concept_id_problem, is_kb_name


def valid_by_definition(concept_id: str) -> bool:
    """docs/events.md, Names, literally: 1-512 characters, '/'-separated segments, none empty, no
    control characters (C0, DEL, C1), no format characters (Cf)."""
    return (
        1 <= len(concept_id) <= 512
        and all(segment for segment in concept_id.split("/"))
        and not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in concept_id)
        and not any(unicodedata.category(ch) == "Cf" for ch in concept_id)
    )


ids = st.text(
    alphabet=st.sampled_from("ab/é \x00\x1f\x7f\x85\x9f\xa0\u200b\u202e\ufeff"), max_size=12
) | st.text(min_size=500, max_size=520, alphabet="ab/")


@given(ids)
def test_concept_id_rule_matches_the_definition(concept_id: str) -> None:
    assert (concept_id_problem(concept_id) is None) == valid_by_definition(concept_id)


def test_problems_are_named() -> None:
    assert concept_id_problem("") == "invalid concept id: empty"
    assert concept_id_problem("a//b") == "invalid concept id: empty segment"
    assert concept_id_problem("a\nb") == "invalid concept id: control character"
    assert concept_id_problem("bad\u200bname") == (
        "invalid concept id: format character (Unicode Cf)"
    )
    assert concept_id_problem("x" * 513) == "invalid concept id: longer than 512 characters"


def test_kb_names_and_collections() -> None:
    assert is_kb_name("homelab") and is_kb_name("a") and is_kb_name("0-x_y")
    assert not is_kb_name("Homelab") and not is_kb_name("-a") and not is_kb_name("a" * 65)
    assert collection_of("infra/rete/dns") == "infra"
    assert collection_of("README") == ""
