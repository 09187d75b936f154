"""A document analysed for the search index: the one-pass ``document.parts`` (each name
tokenised once, for its terms and its name key) equals the straightforward version it replaced,
kept here as the oracle, on random titles, texts, aliases and tags."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from kbgraph.search.analysis import analyze, fold, tokenize
from kbgraph.search.bulk import FIELD as _FIELD
from kbgraph.search.document import parts
from kbgraph.search.nametrie import NAME_SEP as _NAME_SEP


def oracle(title: str, text: str, aliases: list[str], tags: list[str]) -> tuple:
    names = [title, *aliases]
    title_terms = [t for name in names for t in analyze(name)]
    text_terms = analyze(text)
    freq = Counter(text_terms)
    for t in title_terms:
        freq[t] += _FIELD
    name_keys = list(dict.fromkeys(filter(None, (_NAME_SEP.join(tokenize(n)) for n in names))))
    tag_keys = tuple(dict.fromkeys(fold(tag) for tag in tags if tag))
    return list(freq.items()), name_keys, tag_keys, len(title_terms), len(text_terms)


# Words that exercise the analysis: stop words, stems, hyphens, accents, digits, symbols.
WORDS = ["the", "Backups", "backup", "Wi-Fi", "e-mail", "café", "CAFÉ", "x-1-y", "-", "--",
         "_", "ǅ", "ﬁle", "42", "a", "ünïcode", "Straße", "I'm", "running", "dns", " ",
         "é-e"]  # fmt: skip
texts = st.lists(st.sampled_from(WORDS) | st.text(max_size=6), max_size=12).map(" ".join)


@given(
    title=texts,
    text=texts,
    aliases=st.lists(texts, max_size=3),
    tags=st.lists(st.sampled_from(["", "Ops", "ops", "Café", "wi-fi"]), max_size=4),
)
def test_analysed_equals_the_oracle(
    title: str, text: str, aliases: list[str], tags: list[str]
) -> None:
    freq, name_keys, tag_keys, title_len, text_len = parts(title, text, aliases, tags)
    assert (list(freq.items()), name_keys, tag_keys, title_len, text_len) == oracle(
        title, text, aliases, tags
    )
