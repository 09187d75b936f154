"""One page's wikitext read with mwparserfromhell: its links, categories and plain text.

- Links: every ``[[target]]`` and ``[[target|label]]``, those inside templates' arguments and
  tags included (``{{Infobox|capital=[[Berlin]]}}``), in order, each title once. Not links: a
  ``[[Category:X]]`` (a category of the page), a ``[[File:x.png]]`` or ``[[Media:x]]`` (an
  attachment), a ``[[Special:...]]`` page. ``[[:Category:X]]`` (a leading colon) is a link to
  the category's page, not a category. A template's use is not a link: what it transcludes is
  not in this page's wikitext.
- Categories: the ``[[Category:X|sort key]]`` written in the page (not those a template adds).
- Text: ``strip_code`` of the wikitext, the categories' and files' links taken out first, so
  what is left is what a reader reads (links as their labels, no templates, no markup).
- The redirect's target is not read here: the wiki says which pages are redirects (a dump's
  ``<redirect>``, the API's ``redirect`` flag); the target is the first link of its text.
- Bounds: mwparserfromhell's tree costs up to ~1 KB per piece of markup (a ``[``, ``{``, ``<``,
  ``&``, ``''``, URL or line), so 2 MB of ``''a'' `` would take 600 MB. A page with more than
  ``MAX_MARKUP`` of them is parsed in parts of at most ``PART_CHARS`` characters (cut at a line
  end where there is one), each part alone: memory stays that of a part, and a construct that
  spans a cut reads as text on either side of it. At most ``MAX_LINKS`` distinct links are
  kept (``links_cut`` says more were written).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import mwparserfromhell
from mwparserfromhell.nodes import Wikilink

from kbgraph.events import MAX_LINKS
from kbgraph.sources.mediawiki.titles import CATEGORY_NS, FILE_NS, MEDIA_NS, Namespaces, Title

MARKUP: Final = ("[", "{", "<", "&", "''", "://", "\n")  # what starts a node of the tree
MAX_MARKUP: Final = 50_000  # a page parsed whole: ~50 MB of tree at most
PART_CHARS: Final = 64 << 10


@dataclass(frozen=True, slots=True)
class PageFields:
    links: list[Title]
    categories: list[str]  # the category names, without the namespace
    text: str
    first_link: Title | None  # a redirect's target, when the page is one
    links_cut: bool = False  # more than MAX_LINKS distinct links were written


def markup(wikitext: str) -> int:
    """How many pieces of markup ``wikitext`` holds (an estimate of its tree's nodes)."""
    return sum(wikitext.count(piece) for piece in MARKUP)


def parts(wikitext: str) -> Iterator[str]:
    """``wikitext`` in parts of at most ``PART_CHARS``, each cut after a line end if it has
    one, else after a space, else where the size ends."""
    start = 0
    while start < len(wikitext):
        end = start + PART_CHARS
        if end < len(wikitext):
            cut = wikitext.rfind("\n", start, end)
            if cut <= start:
                cut = wikitext.rfind(" ", start, end)
            end = cut + 1 if cut > start else end
        yield wikitext[start:end]
        start = end


def parse(wikitext: str, namespaces: Namespaces) -> PageFields:
    if markup(wikitext) <= MAX_MARKUP:
        return _parse(wikitext, namespaces)
    links: dict[Title, None] = {}
    categories: dict[str, None] = {}
    texts: list[str] = []
    first: Title | None = None
    cut = False
    for part in parts(wikitext):
        fields = _parse(part, namespaces)
        first = first or fields.first_link
        cut = cut or fields.links_cut
        for link in fields.links:
            if len(links) < MAX_LINKS:
                links.setdefault(link, None)
            cut = cut or (link not in links)
        categories.update(dict.fromkeys(fields.categories))
        texts.append(fields.text)
    text = "\n".join(t for t in texts if t)
    return PageFields(list(links), list(categories), text, first, cut)


def _parse(wikitext: str, namespaces: Namespaces) -> PageFields:
    code = mwparserfromhell.parse(wikitext)
    links: dict[Title, None] = {}
    categories: dict[str, None] = {}
    first: Title | None = None
    unread: list[Wikilink] = []
    cut = False
    for link in code.filter_wikilinks():
        written = str(link.title)
        title = namespaces.parse(written)
        if title is None:
            continue
        if first is None:
            first = title
        explicit = written.lstrip().startswith(":")
        if title.ns == CATEGORY_NS and not explicit:
            categories.setdefault(title.text, None)
            unread.append(link)
        elif title.ns in (FILE_NS, MEDIA_NS) and not explicit:
            unread.append(link)
        elif title.ns >= 0 and title not in links:
            if len(links) < MAX_LINKS:
                links[title] = None
            else:
                cut = True
    for link in unread:
        with contextlib.suppress(ValueError):  # inside a link already removed (a caption)
            code.remove(link)
    text = code.strip_code(normalize=True, collapse=True).strip()
    return PageFields(list(links), list(categories), text, first, cut)
