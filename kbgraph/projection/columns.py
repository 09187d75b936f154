"""Lists of strings as flat UTF-8 arrays (checkpoints), and a list read from them lazily.

Layout: every string's UTF-8 bytes (surrogates passed through) followed by a NUL, in one
``uint8`` array, and ``int64`` offsets of each start plus the end. ``decode_strings`` turns the
whole column back into a list in one ``split`` when no string holds a NUL (the common case),
else string by string. ``StringColumn`` is for the large columns (concept texts): it decodes a
string when it is read, so a restart maps the file instead of building a million strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

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


class StringColumn(Sequence[str]):
    """A list of strings over an encoded column: read lazily, changed and appended in memory."""

    __slots__ = ("_base", "_blob", "_changed", "_off", "_tail")

    def __init__(self, blob: np.ndarray, off: np.ndarray) -> None:
        self._blob = blob
        self._off = off
        self._base = len(off) - 1
        self._changed: dict[int, str] = {}
        self._tail: list[str] = []

    def __len__(self) -> int:
        return self._base + len(self._tail)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if i < 0:
            i += len(self)
        if i >= self._base:
            return self._tail[i - self._base]
        value = self._changed.get(i)
        if value is None:
            if not i >= 0:
                raise IndexError(i)
            value = _decode(self._blob, self._off, i)
        return value

    def __setitem__(self, i: int, value: str) -> None:
        if i < 0:
            i += len(self)
        if i >= self._base:
            self._tail[i - self._base] = value
        elif i >= 0:
            self._changed[i] = value
        else:
            raise IndexError(i)

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    def append(self, value: str) -> None:
        self._tail.append(value)
