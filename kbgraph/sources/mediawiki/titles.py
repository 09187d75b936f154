"""Page titles as MediaWiki reads them, and the concept id of each page.

A title is a namespace and a text: ``[[help:foo_bar#Usage]]`` is namespace 12 ("Help"), text
"Foo bar". The rules are MediaWiki's own (``MediaWikiTitleCodec``): underscores are spaces,
runs of spaces are one, a ``#fragment`` is not part of the title, a prefix before the first
colon names a namespace when it is one of the wiki's names (any case), and in a namespace
whose case is ``first-letter`` (the default) the first letter is upper case. Characters a
title may never hold (``[]{}|<>``) make it no title. Interwiki prefixes are not known here
(neither a dump nor this reader has the interwiki table): ``[[wikt:word]]`` reads as a page
"Wikt:word" of the main namespace.

The concept id of a page is ``{namespace}/{text}``, the main namespace called ``Main``, so the
namespace is the concept's collection (its first id segment) even when the text has a ``/``
(a subpage). Its title is the page's full title as the wiki shows it (``Help:Foo bar``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

MAIN: Final = "Main"  # the collection of namespace 0, which has no name
FILE_NS: Final = 6
MEDIA_NS: Final = -2
CATEGORY_NS: Final = 14
# MediaWiki's canonical (English) names, valid on every wiki beside its local names
CANONICAL: Final[dict[str, int]] = {
    "media": -2, "special": -1, "talk": 1, "user": 2, "user talk": 3, "project": 4,
    "project talk": 5, "file": 6, "image": 6, "file talk": 7, "image talk": 7, "mediawiki": 8,
    "mediawiki talk": 9, "template": 10, "template talk": 11, "help": 12, "help talk": 13,
    "category": 14, "category talk": 15,
}  # fmt: skip
_SPACES: Final = re.compile(r"[ _\u00a0\u1680\u180e\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_ILLEGAL: Final = re.compile(r"[\[\]{}|<>\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True, order=True)
class Title:
    ns: int
    text: str  # without the namespace prefix, normalised


@dataclass(frozen=True, slots=True)
class Namespace:
    id: int
    name: str  # "" for the main namespace
    case: str = "first-letter"  # or "case-sensitive"


class Namespaces:
    """The wiki's namespaces (from a dump's or the API's site info) and the rules of its titles."""

    def __init__(self, spaces: Iterable[Namespace]) -> None:
        self.by_id = {space.id: space for space in spaces}
        self.by_id.setdefault(0, Namespace(0, ""))
        self._by_name = {name: ns for name, ns in CANONICAL.items() if ns in self.by_id}
        for space in self.by_id.values():
            if space.name:
                self._by_name[_fold(space.name)] = space.id

    def parse(self, written: str) -> Title | None:
        """The title ``written`` names (a link target, a dump's ``<title>``), or None when it
        names none (empty, only a fragment, a character titles may not hold)."""
        text = _SPACES.sub(" ", html.unescape(written)).strip()
        text = text.partition("#")[0].strip().lstrip(":").strip()
        ns = 0
        prefix, colon, rest = text.partition(":")
        if colon and _fold(prefix) in self._by_name:
            ns, text = self._by_name[_fold(prefix)], rest.strip()
        if not text or _ILLEGAL.search(text):
            return None
        space = self.by_id.get(ns, Namespace(ns, ""))
        if space.case == "first-letter":
            text = text[0].upper() + text[1:]
        return Title(ns, text)

    def name(self, ns: int) -> str:
        return self.by_id[ns].name if ns in self.by_id else str(ns)

    def collection(self, ns: int) -> str:
        return self.name(ns) or MAIN

    def concept_id(self, title: Title) -> str:
        return f"{self.collection(title.ns)}/{title.text}"

    def display(self, title: Title) -> str:
        """The full title as the wiki shows it: ``Help:Foo bar``, ``Berlin``."""
        name = self.name(title.ns)
        return f"{name}:{title.text}" if name else title.text


def _fold(name: str) -> str:
    return _SPACES.sub(" ", name).strip().casefold()
