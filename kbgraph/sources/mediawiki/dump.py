"""An XML dump of a wiki (``dumpBackup.php``, the dumps of Wikimedia) read with mwxml.

The dump may be plain, ``.bz2`` or ``.gz``. Each page's last revision is read (a dump with
its history gives the same as one with ``--current``); the namespaces and their case come
from the dump's own ``<siteinfo>``. Redirects are known from each page's ``<redirect>``, so
the pages are read once, then turned into concepts (``concepts``) with their aliases and
links through redirects. A page whose content is not wikitext (CSS, JavaScript, JSON) is a
concept with its text as it is and no links.

Bounds, before anything is decompressed or parsed past them: the bytes decompressed from the
file (``max_bytes``: past it the import stops and sends nothing), a page's wikitext
(``max_page_bytes``: a longer page is skipped and reported, never parsed) and the XML of one
revision (``PAGE_XML_FACTOR`` times the page bound, since the parser holds it whole before it
is seen: past it the import stops).
"""

from __future__ import annotations

import bz2
import gzip
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import mwxml  # type: ignore[import-untyped]

from kbgraph.events import ECHO_CHARS
from kbgraph.sources.deliver import SourceConcept
from kbgraph.sources.mediawiki.answers import WIKITEXT
from kbgraph.sources.mediawiki.bounds import MAX_DUMP_BYTES, MAX_PAGE_BYTES
from kbgraph.sources.mediawiki.concepts import concept_of
from kbgraph.sources.mediawiki.titles import Namespace, Namespaces, Title
from kbgraph.sources.mediawiki.wikitext import PageFields, parse

PROGRESS_EVERY: Final = 500
PAGE_XML_FACTOR: Final = 16  # XML's escapes write a character of text in up to 6 bytes


class DumpError(Exception):
    """A file that cannot be read as a MediaWiki XML dump: the message says why."""


@dataclass(slots=True)
class WikiRead:
    """What reading a wiki gave: its concepts and what was left out, and why."""

    concepts: list[SourceConcept] = field(default_factory=list)
    redirects: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def links(self) -> int:
        """Pairs of concepts linked either way (the one meaning of a link count)."""
        ids = {c.id for c in self.concepts}
        pairs = {
            (a, b) if a < b else (b, a)
            for c in self.concepts
            for a, b in ((c.id, target) for target in c.data.links)
            if b in ids
        }
        return len(pairs)

    def summary(self) -> str:
        return (
            f"{len(self.concepts)} pages, {self.redirects} redirects (aliases of their"
            f" targets), {self.links} links between the pages"
        )


class _Counted(io.RawIOBase):
    """The decompressed file, its bytes counted as the XML parser reads them: a ``DumpError``
    past ``limit`` in all, or past ``window`` since the last ``mark``."""

    def __init__(self, file: IO[bytes], path: Path, limit: int, window: int) -> None:
        self._file, self._path, self._limit, self._window = file, path, limit, window
        self.total = self._marked = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(min(size, 1 << 20) if size > 0 else 1 << 20)
        self.total += len(data)
        if self.total > self._limit:
            raise DumpError(
                f"{self._path}: over {self._limit} bytes once decompressed (--max-dump-bytes):"
                " stopped, nothing sent"
            )
        if self.total - self._marked > self._window:
            raise DumpError(
                f"{self._path}: over {self._window} bytes of XML without a revision's end"
                f" ({PAGE_XML_FACTOR} times --max-page-bytes): stopped, nothing sent"
            )
        return data

    def mark(self) -> None:
        self._marked = self.total


@contextmanager
def _opened(path: Path) -> Iterator[IO[bytes]]:
    opener: Callable[..., Any] = open
    if path.suffix == ".bz2":
        opener = bz2.open
    elif path.suffix == ".gz":
        opener = gzip.open
    with opener(path, "rb") as file:
        yield file


def read_dump(
    path: Path,
    progress: Callable[[int], None] | None = None,
    *,
    max_page_bytes: int = MAX_PAGE_BYTES,
    max_bytes: int = MAX_DUMP_BYTES,
) -> WikiRead:
    """Every page of the dump at ``path`` as a concept (redirects as aliases), in title order.
    Raises ``DumpError`` when the file is not a dump, or passes a bound."""
    pages: dict[Title, PageFields] = {}
    redirects: dict[Title, Title] = {}
    warnings: list[str] = []
    try:
        with _opened(path) as file:
            counted = _Counted(file, path, max_bytes, PAGE_XML_FACTOR * max_page_bytes)
            dump = mwxml.Dump.from_file(counted)
            namespaces = Namespaces(
                Namespace(ns.id, ns.name or "", ns.case or "first-letter")
                for ns in dump.site_info.namespaces or ()
            )
            for count, page in enumerate(dump, 1):
                revision = None
                for revision in page:  # noqa: B007 (the last one is the page's current state)
                    counted.mark()
                _read_page(page, revision, namespaces, max_page_bytes, pages, redirects, warnings)
                if progress is not None and count % PROGRESS_EVERY == 0:
                    progress(count)
    except DumpError:
        raise
    except Exception as exc:  # OSError, bz2's, the XML parser's and mwxml's own errors
        kind = exc.__class__.__name__
        raise DumpError(f"{path}: not a MediaWiki XML dump ({kind}: {exc})") from None
    return build(pages, redirects, namespaces, warnings)


def over(text: str, limit: int) -> bool:
    """Whether ``text`` is over ``limit`` bytes in UTF-8 (encoded only when it may be)."""
    return len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit)


def _read_page(
    page: Any,
    revision: Any,
    namespaces: Namespaces,
    max_page_bytes: int,
    pages: dict[Title, PageFields],
    redirects: dict[Title, Title],
    warnings: list[str],
) -> None:
    title = namespaces.parse(page.title or "")
    if title is None or page.namespace is None or page.namespace < 0 or revision is None:
        shown = (page.title or "")[:ECHO_CHARS]
        warnings.append(f"page {shown!r}: no title or no revision: not imported")
        return
    text = revision.text or ""
    if page.redirect:
        target = namespaces.parse(page.redirect)
        if target is not None:
            redirects[title] = target
        return
    if over(text, max_page_bytes):
        warnings.append(
            f"{namespaces.display(title)}: over {max_page_bytes} bytes of wikitext"
            " (--max-page-bytes): not imported"
        )
        return
    if (revision.model or WIKITEXT) == WIKITEXT:
        pages[title] = parse(text, namespaces)
    else:
        pages[title] = PageFields([], [], text, None)


def build(
    pages: dict[Title, PageFields],
    redirects: dict[Title, Title],
    namespaces: Namespaces,
    warnings: list[str],
) -> WikiRead:
    """The concepts of a whole wiki: ``pages`` (not redirects) and ``redirects`` (source ->
    target). The dump import and the follower's first load both end here."""
    aliases: dict[Title, list[Title]] = {}
    for source, target in redirects.items():
        aliases.setdefault(target, []).append(source)

    def resolve(target: Title) -> Title:
        return redirects.get(target, target)

    out = WikiRead(redirects=len(redirects), warnings=warnings)
    for title in sorted(pages):
        concept = concept_of(
            title, pages[title], aliases.get(title, ()), resolve, namespaces, warnings
        )
        if concept is not None:
            out.concepts.append(concept)
    return out
