"""Strings found ahead (``kbgraph.projection.ahead``) against a list's own ``index``: a row of
the column as made or of its tail then, else -1, whatever was appended since."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.projection.ahead import Ahead
from kbgraph.store.columns import StringColumn, encode_strings

strings = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(strings, unique=True, max_size=40),
    st.data(),
)
def test_found_ahead_is_each_strings_row_or_minus_one(values: list[str], data) -> None:
    made = data.draw(st.integers(0, len(values)))  # the encoded rows; then a tail
    tail = data.draw(st.integers(made, len(values)))
    column = StringColumn(*encode_strings(values[:made]))
    for value in values[made:tail]:
        column.append(value)
    ahead = Ahead(column)
    for value in values[tail:]:  # appended after: the KeyIndex's own dict finds those
        column.append(value)
    others = data.draw(st.lists(strings, max_size=10))
    wanted = data.draw(st.lists(st.sampled_from(values + others) if values else strings))
    known = values[:tail]
    want = {s: known.index(s) if s in known else -1 for s in wanted}
    assert ahead.found(wanted) == want
    assert ahead.found(wanted) == want  # the table, made on first use, kept
