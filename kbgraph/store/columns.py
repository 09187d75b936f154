"""Lists of strings as flat UTF-8 arrays (checkpoints), read back lazily, and found by value.

Layout: every string's UTF-8 bytes (surrogates passed through) followed by a NUL, in one
``uint8`` array, and ``int64`` offsets of each start plus the end. ``decode_strings`` turns the
whole column back into a list in one ``split`` when no string holds a NUL (the common case),
else string by string. ``StringColumn`` decodes a string when it is read, and ``KeyIndex``
finds a string's position by a sorted array of 64-bit hashes: so a restart maps a million ids,
titles, texts and index keys from a checkpoint instead of building a million Python strings
and the dicts that find them.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, overload

import msgspec
import numpy as np
from numba import njit


def encode_strings(values: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(blob uint8, off int64[n + 1]) of the strings, each followed by a NUL."""
    if not isinstance(values, list):
        values = list(values)
    if values:  # one join and one encode; the NULs give the offsets unless a string holds one
        blob = np.frombuffer(("\0".join(values) + "\0").encode("utf-8", "surrogatepass"), np.uint8)
        ends = np.flatnonzero(blob == 0)
        if len(ends) == len(values):
            off = np.empty(len(values) + 1, np.int64)
            off[0] = 0
            off[1:] = ends + 1
            return blob, off
    raw = [v.encode("utf-8", "surrogatepass") + b"\0" for v in values]
    off = np.zeros(len(raw) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, raw), np.int64, len(raw)), out=off[1:])
    return np.frombuffer(b"".join(raw), np.uint8), off


def decode_strings(blob: np.ndarray, off: np.ndarray) -> list[str]:
    n = len(off) - 1
    if n == 0:
        return []
    text = blob.tobytes().decode("utf-8", "surrogatepass")
    parts = text.split("\0")
    if len(parts) == n + 1:  # no string holds a NUL: the separators are the only ones
        parts.pop()
        return parts
    return [_decode(blob, off, i) for i in range(n)]


def joined_columns(
    parts: Sequence[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """One encoded column of these encoded columns, one after another."""
    off = np.zeros(sum(len(o) - 1 for _, o in parts) + 1, np.int64)
    row = at = 0
    for blob, part_off in parts:
        rows = len(part_off) - 1
        off[row + 1 : row + rows + 1] = part_off[1:] + at
        row += rows
        at += len(blob)
    blob = np.concatenate([b for b, _ in parts]) if parts else np.zeros(0, np.uint8)
    return blob, off


def decode_range(blob: np.ndarray, off: np.ndarray, start: int, stop: int) -> list[str]:
    """The strings of rows ``start:stop`` of an encoded column (one ``decode_strings``)."""
    if start >= stop:
        return []
    return decode_strings(blob[off[start] : off[stop]], off[start : stop + 1] - off[start])


def strings_at(blob: np.ndarray, off: np.ndarray, rows: Iterable[int]) -> list[str]:
    """The strings at these rows of an encoded column."""
    return [_decode(blob, off, i) for i in rows]


def _decode(blob: np.ndarray, off: np.ndarray, i: int) -> str:
    return blob[off[i] : off[i + 1] - 1].tobytes().decode("utf-8", "surrogatepass")


_ITER_ROWS: Final = 1 << 12  # rows a StringColumn's iterator decodes at once


def python_ints(values: np.ndarray) -> memoryview:
    """A view of a 1-D array of machine integers whose items read as Python ints: what a
    lookup on a request or follower path indexes (a numpy scalar costs ~10x more)."""
    char = values.dtype.char
    if char not in ("b", "B", "h", "H", "i", "I", "l", "L", "q", "Q"):
        raise TypeError(f"python_ints takes machine integers, not {values.dtype}")
    return np.ascontiguousarray(values).data.cast("B").cast(char)


class StringColumn(Sequence[Any]):
    """A list over an encoded column: read lazily (each string through ``decode``, if given),
    changed and appended in memory."""

    __slots__ = ("_base", "_blob", "_bytes", "_changed", "_decode", "_off", "_offs", "_tail")

    def __init__(
        self, blob: np.ndarray, off: np.ndarray, decode: Callable[[str], Any] | None = None
    ) -> None:
        self._blob = blob
        self._off = off
        self._bytes = np.ascontiguousarray(blob).data.cast("B")
        self._offs = python_ints(off)
        self._base = len(off) - 1
        self._decode = decode
        self._changed: dict[int, Any] = {}
        self._tail: list[Any] = []

    def __len__(self) -> int:
        return self._base + len(self._tail)

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        if i < 0:
            i += len(self)
        if i >= self._base:
            return self._tail[i - self._base]
        if i < 0:
            raise IndexError(i)
        value = self._changed.get(i)
        if value is None:
            offs = self._offs
            value = str(self._bytes[offs[i] : offs[i + 1] - 1], "utf-8", "surrogatepass")
            if self._decode is not None:
                value = self._decode(value)
        return value

    def __setitem__(self, i: int, value: Any) -> None:
        if i < 0:
            i += len(self)
        if i >= self._base:
            self._tail[i - self._base] = value
        elif i >= 0:
            self._changed[i] = value
        else:
            raise IndexError(i)

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, len(self), _ITER_ROWS):
            yield from self.strings(start, start + _ITER_ROWS)

    def strings(self, start: int, stop: int) -> list[Any]:
        """``list(self)[start:stop]`` (0 <= start), the base's rows decoded in one pass."""
        stop = min(stop, len(self))
        base_stop = min(stop, self._base)
        out = decode_range(self._blob, self._off, start, base_stop)
        if self._decode is not None:
            out = list(map(self._decode, out))
        changed = self._changed
        if len(changed) <= base_stop - start:
            for i, value in changed.items():
                if start <= i < base_stop:
                    out[i - start] = value
        else:
            for i in range(start, base_stop):
                value = changed.get(i)
                if value is not None:
                    out[i - start] = value
        out.extend(self._tail[max(start - self._base, 0) : max(stop - self._base, 0)])
        return out

    def append(self, value: Any) -> None:
        self._tail.append(value)

    @property
    def encoded(self) -> tuple[np.ndarray, np.ndarray]:
        """(blob, off) of the rows the column was made with (as made: changes not included)."""
        return self._blob, self._off


def key_hash(key: str) -> int:
    """A 64-bit hash of ``key``, the same in every process (``hash`` is salted per process)."""
    raw = key.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def key_hashes(keys: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hashes sorted, each one's position in ``keys``): what ``KeyIndex`` searches."""
    hashes = np.fromiter(map(key_hash, keys), np.uint64)
    order = np.argsort(hashes, kind="stable")
    return hashes[order], order.astype(np.int32)


def process_hashes(keys: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """``key_hashes`` by Python's own ``hash`` (salted per process: for a ``KeyIndex`` made
    with ``hasher=hash`` and never stored; about ten times cheaper than ``key_hash``)."""
    hashes = np.fromiter(map(hash, keys), np.int64)
    order = np.argsort(hashes, kind="stable")
    return hashes[order], order.astype(np.int32)


class KeyIndex:
    """str -> position, like a dict, for the strings of a column (found by their sorted 64-bit
    hashes, each candidate checked against the string itself, so a collision costs a second
    look, never a wrong answer) plus the keys set since (a dict)."""

    __slots__ = ("_added", "_column", "_hash", "_rows", "_sorted")

    def __init__(
        self,
        column: Sequence[str],
        hashes: np.ndarray,
        order: np.ndarray,
        hasher: Callable[[str], int] | None = None,
    ) -> None:
        """``hashes``, ``order``: ``key_hashes`` of the column (``process_hashes`` with
        ``hasher=hash``)."""
        self._column = column
        self._hash = key_hash if hasher is None else hasher
        self._sorted, self._rows = python_ints(hashes), python_ints(order)
        self._added: dict[str, int] = {}

    @overload
    def get(self, key: str, default: None = None, /) -> int | None: ...
    @overload
    def get(self, key: str, default: int, /) -> int: ...
    def get(self, key: str, default: int | None = None, /) -> int | None:
        found = self._added.get(key)
        if found is not None:
            return found
        h = self._hash(key)
        hashes = self._sorted
        i = bisect.bisect_left(hashes, h)
        while i < len(hashes) and hashes[i] == h:
            position = self._rows[i]
            if self._column[position] == key:
                return position
            i += 1
        return default

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __setitem__(self, key: str, value: int) -> None:
        self._added[key] = value

    def added(self, key: str) -> int | None:
        """``get`` of a key known to be no string of the column: only those set since."""
        return self._added.get(key)


@njit(cache=True, nogil=True)
def _fnv1a(blob: np.ndarray, start: int, end: int) -> np.uint64:  # pragma: no cover - compiled
    h = np.uint64(0xCBF29CE484222325)
    for i in range(start, end):
        h = (h ^ np.uint64(blob[i])) * np.uint64(0x100000001B3)
    return h


@njit(cache=True, nogil=True)
def _same(
    a: np.ndarray, a_start: int, a_end: int, b: np.ndarray, b_start: int, b_end: int
) -> bool:  # pragma: no cover - compiled
    if a_end - a_start != b_end - b_start:
        return False
    for i in range(a_end - a_start):  # noqa: SIM110 (numba: a loop, not a generator)
        if a[a_start + i] != b[b_start + i]:
            return False
    return True


@njit(cache=True, nogil=True)
def _table_of(blob: np.ndarray, off: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Open addressing, linear probing, at most half full: slot -> the row's hash's top 31
    bits << 32 | row (-1 empty), so a probe compares bytes only when those bits agree."""
    n = len(off) - 1
    size = 16
    while size < 2 * n:
        size *= 2
    table = np.full(size, -1, np.int64)
    mask = np.uint64(size - 1)
    for row in range(n):
        h = _fnv1a(blob, off[row], off[row + 1] - 1)
        slot = h & mask
        while table[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        table[slot] = (np.int64(h >> np.uint64(33)) << np.int64(32)) | np.int64(row)
    return table


_GROUP: Final = 16  # look-ups whose table slots and rows ``_find_all`` reads together


@njit(cache=True, nogil=True)
def _find_all(
    table: np.ndarray,
    blob: np.ndarray,
    off: np.ndarray,
    qblob: np.ndarray,
    qoff: np.ndarray,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Each query's row (-1: none), ``_GROUP`` queries at a time: their hashes, then their
    first slots, then their candidate rows' offsets, each step a loop of independent reads,
    so the cache misses of a group overlap instead of coming one after another (3x faster
    at a million rows); then each compared byte for byte, probing on where it must."""
    mask = np.uint64(len(table) - 1)
    low = np.int64(0xFFFFFFFF)
    slots = np.empty(_GROUP, np.uint64)
    tops = np.empty(_GROUP, np.int64)
    entries = np.empty(_GROUP, np.int64)
    starts = np.empty(_GROUP, np.int64)
    queries = len(qoff) - 1
    for first in range(0, queries, _GROUP):
        size = min(_GROUP, queries - first)
        for j in range(size):
            h = _fnv1a(qblob, qoff[first + j], qoff[first + j + 1] - 1)
            slots[j] = h & mask
            tops[j] = np.int64(h >> np.uint64(33))
        for j in range(size):
            entries[j] = table[slots[j]]
        for j in range(size):
            entry = entries[j]
            starts[j] = off[entry & low] if entry >= 0 and entry >> 32 == tops[j] else -1
        for j in range(size):
            i = first + j
            start, end = qoff[i], qoff[i + 1] - 1
            out[i] = -1
            slot, top = slots[j], tops[j]
            if starts[j] >= 0:  # the first slot's row has the hash's bits: most often it
                row = entries[j] & low
                if _same(blob, starts[j], off[row + 1] - 1, qblob, start, end):
                    out[i] = row
                    continue
                slot = (slot + np.uint64(1)) & mask
            while table[slot] >= 0:
                entry = table[slot]
                if entry >> 32 == top:
                    row = entry & low
                    if _same(blob, off[row], off[row + 1] - 1, qblob, start, end):
                        out[i] = row
                        break
                slot = (slot + np.uint64(1)) & mask


class StringTable:
    """The rows of an encoded column of distinct strings, found by value many at a time: a
    hash table of their UTF-8 bytes (numba), every candidate compared byte for byte, so a
    million-row column answers eight million look-ups in about a second, where a dict of
    Python strings costs microseconds each (cache misses on its table, entries and keys)."""

    __slots__ = ("_blob", "_off", "_table")

    def __init__(self, blob: np.ndarray, off: np.ndarray) -> None:
        self._blob, self._off = blob, off
        self._table = _table_of(blob, off)

    def find_all(self, blob: np.ndarray, off: np.ndarray) -> np.ndarray:
        """int32 row of each string of the encoded column (blob, off); -1 where none."""
        out = np.empty(len(off) - 1, np.int32)
        _find_all(self._table, self._blob, self._off, blob, off, out)
        return out


@njit(cache=True, nogil=True)
def _split_arrays(
    text: np.ndarray, counts: np.ndarray, out: np.ndarray, ends: np.ndarray
) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """Every string of the JSON arrays in ``text`` (one after another, strings without a
    backslash) copied to ``out`` each followed by a NUL, its end (after the NUL) in ``ends``,
    and how many each array holds in ``counts``; returns (arrays, strings, bytes) written."""
    rows = -1
    strings = 0
    at = 0
    inside = False
    for i in range(len(text)):
        c = text[i]
        if inside:
            if c == 34:  # the closing quote (no backslash: no escaped one)
                out[at] = 0
                at += 1
                ends[strings] = at
                strings += 1
                counts[rows] += 1
                inside = False
            else:
                out[at] = c
                at += 1
        elif c == 34:
            inside = True
        elif c == 91:  # "[" outside a string: the next array
            rows += 1
            counts[rows] = 0
    return rows + 1, strings, at


_lists_decoder = msgspec.json.Decoder(list[list[str]])


def split_json_arrays(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counts int64[len(texts)], blob, off) of JSON arrays of strings (the store's links
    column): how many strings each array holds, and all their strings, in order, as an
    encoded column (``encode_strings``'s layout). Texts holding a backslash (an escape) are
    decoded by msgspec; the rest are split in one compiled pass, as their strings' UTF-8
    bytes are the text's own between the quotes."""
    joined = "".join(texts)
    if "\\" in joined:
        lists = _lists_decoder.decode("[" + ",".join(texts) + "]")
        counts = np.fromiter(map(len, lists), np.int64, len(lists))
        blob, off = encode_strings(list(itertools.chain.from_iterable(lists)))
        return counts, blob, off
    text = np.frombuffer(joined.encode("utf-8", "surrogatepass"), np.uint8)
    counts = np.zeros(len(texts), np.int64)
    blob = np.empty(len(text), np.uint8)
    ends = np.empty(len(text) // 2 + 1, np.int64)
    rows, strings, size = _split_arrays(text, counts, blob, ends)
    if rows != len(texts):
        raise ValueError(f"expected {len(texts)} JSON arrays, found {rows}")
    off = np.zeros(strings + 1, np.int64)
    off[1:] = ends[:strings]
    return counts, blob[:size].copy(), off
