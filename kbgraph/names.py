"""The naming rules (docs/events.md, Names): KB names, concept ids and collections."""

from __future__ import annotations

import re
import unicodedata
from typing import Final

KB_NAME_PATTERN: Final = "[a-z0-9][a-z0-9_-]{0,63}"  # also shown in the errors that refuse one
KB_NAME = re.compile(KB_NAME_PATTERN)
MAX_ID_LENGTH = 512
# Segments of non-control characters (C0, DEL, C1) joined by single slashes: the common case,
# checked in one regex call; only a failing id is walked character by character to say why.
_ID = r"[^/\x00-\x1f\x7f-\x9f]+(?:/[^/\x00-\x1f\x7f-\x9f]+)*"
_VALID_ID = re.compile(_ID)
# Ids joined by line breaks: a control character, so the separator is in no valid id.
_VALID_IDS = re.compile(rf"{_ID}(?:\n{_ID})*")


def is_kb_name(name: str) -> bool:
    return KB_NAME.fullmatch(name) is not None


def _is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F


def _is_format(ch: str) -> bool:
    return unicodedata.category(ch) == "Cf"


def concept_id_problem(concept_id: str) -> str | None:
    """Why ``concept_id`` is not a valid concept id, or None when it is.

    An id is 1-512 characters, segments separated by ``/``, none empty, no control characters
    and no format characters (Unicode category Cf: bidi overrides, zero-width marks).
    """
    if len(concept_id) <= MAX_ID_LENGTH and _VALID_ID.fullmatch(concept_id):
        if concept_id.isascii() or not any(map(_is_format, concept_id)):
            return None
        return "invalid concept id: format character (Unicode Cf)"
    if not concept_id:
        return "invalid concept id: empty"
    if len(concept_id) > MAX_ID_LENGTH:
        return f"invalid concept id: longer than {MAX_ID_LENGTH} characters"
    if any(_is_control(ch) for ch in concept_id):
        return "invalid concept id: control character"
    if "" in concept_id.split("/"):
        return "invalid concept id: empty segment"
    return None


def all_plain_ids(ids: list[str]) -> bool:
    """Whether every one of ``ids`` is a valid concept id made of ASCII characters only (so
    none needs NFC): a delivery's ids checked by one regex call over them joined, instead of
    ``concept_id_problem`` once an id (which says what is wrong with one that is not)."""
    if not ids:
        return True
    joined = "\n".join(ids)
    return (
        joined.isascii()
        and joined.count("\n") == len(ids) - 1  # no id holds the separator
        and (len(joined) <= MAX_ID_LENGTH or max(map(len, ids)) <= MAX_ID_LENGTH)
        and _VALID_IDS.fullmatch(joined) is not None
    )


def collection_of(concept_id: str) -> str:
    """The first id segment when the id has two or more segments, else the empty string."""
    head, sep, _ = concept_id.partition("/")
    return head if sep else ""
