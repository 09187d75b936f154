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

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np


def encode_strings(values: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(blob uint8, off int64[n + 1]) of the strings, each followed by a NUL."""
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


def _decode(blob: np.ndarray, off: np.ndarray, i: int) -> str:
    return blob[off[i] : off[i + 1] - 1].tobytes().decode("utf-8", "surrogatepass")


class StringColumn(Sequence[Any]):
    """A list over an encoded column: read lazily (each string through ``decode``, if given),
    changed and appended in memory."""

    __slots__ = ("_base", "_blob", "_changed", "_decode", "_off", "_tail")

    def __init__(
        self, blob: np.ndarray, off: np.ndarray, decode: Callable[[str], Any] | None = None
    ) -> None:
        self._blob = blob
        self._off = off
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
            value = _decode(self._blob, self._off, i)
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
        for i in range(len(self)):
            yield self[i]

    def append(self, value: Any) -> None:
        self._tail.append(value)


def key_hash(key: str) -> int:
    """A 64-bit hash of ``key``, the same in every process (``hash`` is salted per process)."""
    raw = key.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def key_hashes(keys: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hashes sorted, each one's position in ``keys``): what ``KeyIndex`` searches."""
    hashes = np.fromiter(map(key_hash, keys), np.uint64)
    order = np.argsort(hashes, kind="stable")
    return hashes[order], order.astype(np.int32)


class KeyIndex:
    """str -> position, like a dict, for the strings of a column (found by their sorted 64-bit
    hashes, each candidate checked against the string itself, so a collision costs a second
    look, never a wrong answer) plus the keys set since (a dict)."""

    __slots__ = ("_added", "_column", "_hashes", "_order")

    def __init__(self, column: Sequence[str], hashes: np.ndarray, order: np.ndarray) -> None:
        self._column = column
        self._hashes = hashes
        self._order = order
        self._added: dict[str, int] = {}

    def get(self, key: str, default: int | None = None) -> int | None:
        found = self._added.get(key)
        if found is not None:
            return found
        h = np.uint64(key_hash(key))
        hashes = self._hashes
        i = int(np.searchsorted(hashes, h))
        while i < len(hashes) and hashes[i] == h:
            position = int(self._order[i])
            if self._column[position] == key:
                return position
            i += 1
        return default

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __setitem__(self, key: str, value: int) -> None:
        self._added[key] = value
