"""A BEIR corpus file read a line at a time: each line one passage, each passage a concept.

A line is one JSON object ``{"_id", "title", "text"}`` (BEIR's ``corpus.jsonl``; other keys,
such as ``metadata``, are ignored; blank lines are skipped). Its concept: id ``_id`` (held to
the concept id rules), the title and text as they are, no links. The file may be gzipped
(``.gz``). Nothing is held whole: ``check`` reads the file once to find every problem before
anything is sent, ``concepts`` reads it again to yield the concepts one by one.

A bad line is refused, never skipped: a line over ``MAX_LINE_BYTES``, not JSON, not an object
with a string ``_id``, a field of the wrong type, an id that breaks the id rules or that an
earlier line had, a title or text past the event bounds (docs/operations.md). Each problem
names its line number and field.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import msgspec

from kbgraph.events import MAX_TEXT_BYTES, Title, UpsertData
from kbgraph.names import concept_id_problem
from kbgraph.sources.deliver import SourceConcept

# A text at the bound written wholly as \uXXXX escapes, with a title and room to spare
MAX_LINE_BYTES: Final = 7 * MAX_TEXT_BYTES
MAX_PROBLEMS: Final = 20  # said before the check stops: enough to fix a file in one go


class CorpusError(Exception):
    """A corpus that cannot be imported: the message names the file, its lines and fields."""


class Passage(msgspec.Struct):
    """One line of ``corpus.jsonl``."""

    id: str = msgspec.field(name="_id")
    title: Title = ""
    text: str = ""


_decoder = msgspec.json.Decoder(Passage)


@dataclass(slots=True)
class Checked:
    """What ``check`` found: the passages, or the problems (the first ``MAX_PROBLEMS``)."""

    passages: int = 0
    problems: list[str] = field(default_factory=list)


@contextmanager
def _opened(path: Path) -> Iterator[IO[bytes]]:
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as file:
        yield file


def _lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line) for each line that is not blank; None for one over the bound."""
    try:
        with _opened(path) as file:
            number = 0
            while line := file.readline(MAX_LINE_BYTES + 1):
                number += 1
                if len(line) > MAX_LINE_BYTES:
                    while line and not line.endswith(b"\n"):  # the rest of it, unread
                        line = file.readline(MAX_LINE_BYTES)
                    yield number, None
                elif line.strip():
                    yield number, line
    except (OSError, EOFError) as exc:  # unreadable, or a .gz that is not gzip or cut short
        raise CorpusError(f"{path}: cannot read it ({exc})") from None


def _passage(number: int, line: bytes | None) -> Passage | str:
    """The passage of line ``number``, or what is wrong with it."""
    if line is None:
        return f"line {number}: longer than {MAX_LINE_BYTES:,} bytes"
    try:
        passage = _decoder.decode(line)
    except msgspec.ValidationError as exc:  # "Expected `str`, got `int` - at `$._id`"
        return f"line {number}: {exc}"
    except msgspec.DecodeError as exc:
        return f"line {number}: not a JSON object ({exc})"
    problem = concept_id_problem(passage.id)
    if problem:
        return f"line {number}: `_id` {passage.id[:80]!r}: {problem}"
    if len(passage.text) > MAX_TEXT_BYTES // 4 and len(passage.text.encode()) > MAX_TEXT_BYTES:
        return f"line {number}: `text` longer than {MAX_TEXT_BYTES:,} bytes"
    return passage


def check(path: Path) -> Checked:
    """Every line of the corpus at ``path`` read and checked, ids compared; nothing kept but
    the ids seen (and the line of each, to name a repeat)."""
    out = Checked()
    seen: dict[str, int] = {}
    for number, line in _lines(path):
        passage = _passage(number, line)
        if isinstance(passage, str):
            out.problems.append(passage)
        elif passage.id in seen:
            first = seen[passage.id]
            out.problems.append(f"line {number}: `_id` {passage.id[:80]!r} is line {first}'s too")
        else:
            seen[passage.id] = number
            out.passages += 1
        if len(out.problems) >= MAX_PROBLEMS:
            break
    return out


def concepts(path: Path) -> Iterator[SourceConcept]:
    """The concepts of the corpus at ``path``, in file order. Raises ``CorpusError`` at a bad
    line (the file changed since ``check`` read it)."""
    for number, line in _lines(path):
        passage = _passage(number, line)
        if isinstance(passage, str):
            raise CorpusError(f"{path}: {passage}")
        data = UpsertData(version=0, title=passage.title, text=passage.text)
        yield SourceConcept.of(passage.id, data)
