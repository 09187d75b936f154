"""Strings of an encoded column found by value, many at once, before a batch is applied.

Past ``DICT_IDS`` ids, and in every vocabulary of the search index loaded from a checkpoint,
a string's position is found by a ``KeyIndex`` (a hash, a bisect over sorted hashes, the
candidate decoded and compared: ~3 µs, most of it cache misses and Python). The follower
knows a batch's ids and, from the analyses its log rows carry, its terms, names and tags
before taking the write lock, so it finds them all in one compiled pass over the column's
bytes (``StringTable``, made on first use) and hands the answers to the part as a small dict.
A column's rows never move, so a hit stays right; a string that is no row of it (-1) is one
set since the column was made, or a new one: the part looks only among those set since
(``KeyIndex.added``), with no hash and no bisect.
"""

from __future__ import annotations

from collections.abc import Iterable

from kbgraph.store.columns import StringColumn, StringTable, encode_strings


class Ahead:
    """A column of distinct strings, found by value a batch at a time."""

    __slots__ = ("_table", "_tail", "column")

    def __init__(self, column: StringColumn, table: StringTable | None = None) -> None:
        """``column``: every string a ``KeyIndex`` of it was made with, and those set since
        in the ``KeyIndex``'s own dict (``KeyIndex.added``); ``table``: its encoded rows'
        ``StringTable``, when one was made already (else made on first use: ~0.4 s a
        million rows)."""
        self.column = column
        self._table = table
        # the strings appended to the column before now (a first build's link targets that
        # are no concept): not its encoded rows, yet found by its KeyIndex's hashes
        made, rows = len(column.encoded[1]) - 1, len(column)
        self._tail = dict(zip(column.strings(made, rows), range(made, rows), strict=True))

    def found(self, wanted: Iterable[str]) -> dict[str, int]:
        """Each of ``wanted``: its row, or -1 when it is no row of the column as made (nor
        of its tail then), so one set since or a new one."""
        distinct = list(dict.fromkeys(wanted))
        if not distinct:
            return {}
        if self._table is None:
            self._table = StringTable(*self.column.encoded)
        rows = self._table.find_all(*encode_strings(distinct)).tolist()
        if self._tail:
            tail = self._tail
            rows = [
                tail.get(s, -1) if row < 0 else row for s, row in zip(distinct, rows, strict=True)
            ]
        return dict(zip(distinct, rows, strict=True))
