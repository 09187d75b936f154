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
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import mwparserfromhell
from mwparserfromhell.nodes import Wikilink

from kbgraph.sources.mediawiki.titles import CATEGORY_NS, FILE_NS, MEDIA_NS, Namespaces, Title


@dataclass(frozen=True, slots=True)
class PageFields:
    links: list[Title]
    categories: list[str]  # the category names, without the namespace
    text: str
    first_link: Title | None  # a redirect's target, when the page is one


def parse(wikitext: str, namespaces: Namespaces) -> PageFields:
    code = mwparserfromhell.parse(wikitext)
    links: dict[Title, None] = {}
    categories: dict[str, None] = {}
    first: Title | None = None
    unread: list[Wikilink] = []
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
        elif title.ns >= 0:
            links.setdefault(title, None)
    for link in unread:
        with contextlib.suppress(ValueError):  # inside a link already removed (a caption)
            code.remove(link)
    text = code.strip_code(normalize=True, collapse=True).strip()
    return PageFields(list(links), list(categories), text, first)
