"""A wiki's Action API (``api.php``) asked over httpx, as an anonymous reader.

Only what the follower needs: the site's namespaces and clock, recent changes from a time on
(``list=recentchanges``, ``rcdir=newer``), every title of a namespace (``list=allpages``), the
state of pages (``prop=info|revisions|redirects``: exists, readable by this reader through
``intestactions=read``, redirect or not, content and its model, the redirects to it), the first
hop of redirects (``redirects``) and the pages linking to one (``list=backlinks``). Every
``query`` follows the API's ``continue``, merging the parts of each page.

A wiki's answers are not trusted: each request has a total deadline (connecting, waiting and
every byte of the answer: a wiki dripping a byte at a time is stopped at it), each answer a
size counted as its bytes arrive (refused past it, never read whole first), each ``query`` a
limit on its continuation parts (and a continuation that repeats itself ends it), and each
answer is decoded into the shapes of ``answers`` (another shape is refused, naming the call and
what was wrong). Connection errors and 5xx answers are retried with backoff; an API error is
raised with its code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Final, TypeVar

import anyio
import httpx
import msgspec
from anyio.from_thread import start_blocking_portal

from kbgraph.events import ECHO_CHARS
from kbgraph.sources.mediawiki.answers import (
    WIKITEXT,
    AllPages,
    Answer,
    Backlinks,
    Change,
    Page,
    Pages,
    RecentChanges,
    SiteGeneral,
    SiteNamespaces,
    Struct,
)
from kbgraph.sources.mediawiki.bounds import CALL_SECONDS
from kbgraph.sources.mediawiki.titles import Namespace, Namespaces
from kbgraph.sources.sync import printable

TITLES_PER_QUERY: Final = 50  # the API's limit for a client without the apihighlimits right
RC_TYPES: Final = "edit|new|log"
# MediaWiki keeps an answer's data under 8 MiB ($wgAPIMaxResultSize); JSON's escapes and keys
# can double it, so four times that is a wiki's answer, and more is not one
MAX_ANSWER_BYTES: Final = 32 << 20
MAX_PARTS: Final = 1000  # continuation parts of one query: 500,000 titles or changes
MAX_CONTINUE_CHARS: Final = 8192  # MediaWiki's continuation tokens are a title or two long

Q = TypeVar("Q", bound=Struct)


class WikiError(Exception):
    """The wiki could not be asked, or refused: the message says which and why."""


class _TooLarge(Exception):
    pass


@dataclass(slots=True)
class PageState:
    """A page as the API showed it to this reader."""

    title: str
    exists: bool = False
    readable: bool = True
    redirect: bool = False
    model: str = WIKITEXT
    text: str = ""
    redirects_here: list[str] = field(default_factory=list)


def endpoint(url: str) -> str:
    """The ``api.php`` of a wiki's base URL (or the URL itself when it names it)."""
    url = url.rstrip("/")
    return url if url.endswith("/api.php") else f"{url}/api.php"


class WikiApi:
    """A wiki's API; ``close`` it. Requests run on an event loop of their own (a blocking
    portal), so that a deadline can cancel one wherever it waits."""

    def __init__(
        self,
        url: str,
        *,
        attempts: int = 4,
        backoff: float = 0.5,
        deadline: float = CALL_SECONDS,
        max_bytes: int = MAX_ANSWER_BYTES,
        max_parts: int = MAX_PARTS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = endpoint(url)
        self._attempts = max(1, attempts)
        self._backoff = backoff
        self._deadline, self._max_bytes, self._max_parts = deadline, max_bytes, max_parts
        self._stack = ExitStack()
        self._portal = self._stack.enter_context(start_blocking_portal())
        self._client = httpx.AsyncClient(
            timeout=deadline, transport=transport, headers={"user-agent": "kbgraph-mediawiki"}
        )

    def close(self) -> None:
        try:
            self._portal.call(self._client.aclose)
        finally:
            self._stack.close()

    async def _get(self, query: dict[str, str]) -> tuple[int, bytes]:
        """One GET within the deadline: the status and the body, counted as it arrives."""
        with anyio.fail_after(self._deadline):
            async with self._client.stream("GET", self.url, params=query) as response:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self._max_bytes:
                        raise _TooLarge
                return response.status_code, bytes(body)

    def call(self, params: dict[str, str], kind: type[Q]) -> Answer[Q]:
        """One API request (GET, JSON format 2) decoded as ``Answer[kind]``; raises
        ``WikiError``."""
        query = {"format": "json", "formatversion": "2", "errorformat": "plaintext", **params}
        what = f"{self.url} ({_named(params)})"
        problem = ""
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                status, body = self._portal.call(self._get, query)
            except (TimeoutError, httpx.TimeoutException):
                raise WikiError(
                    f"{what}: no whole answer within {self._deadline:g} s: stopped"
                ) from None
            except _TooLarge:
                raise WikiError(
                    f"{what}: an answer over {self._max_bytes} bytes: refused"
                ) from None
            except httpx.HTTPError as exc:
                problem = f"cannot reach {self.url}: {exc or exc.__class__.__name__}"
                continue
            if status >= 500:
                problem = f"{self.url} answered {status}"
                continue
            try:
                answer = msgspec.json.decode(body, type=Answer[kind])  # type: ignore[valid-type]
            except msgspec.ValidationError as exc:
                raise WikiError(
                    f"{what}: not an answer of MediaWiki's shape ({_cut(str(exc))})"
                ) from None
            except msgspec.DecodeError:
                raise WikiError(
                    f"{what} answered {status} without JSON: is it a MediaWiki's api.php?"
                ) from None
            if answer.errors:
                first = answer.errors[0]
                raise WikiError(f"{what}: {_cut(first.code)}: {_cut(first.text)}")
            return answer
        raise WikiError(f"{problem} (gave up after {self._attempts} attempts)")

    def query(self, params: dict[str, str], kind: type[Q]) -> Iterator[Q]:
        """Each part of ``action=query`` with ``params``, following ``continue`` to the end
        (at most ``max_parts`` parts, never the same continuation twice)."""
        what = f"{self.url} ({_named(params)})"
        more: dict[str, str] = {}
        seen: set[int] = set()
        for _ in range(self._max_parts):
            answer = self.call({"action": "query", **params, **more}, kind)
            yield kind() if answer.query is None else answer.query
            if not answer.continue_:
                return
            more = {key: str(value) for key, value in answer.continue_.items()}
            if sum(len(k) + len(v) for k, v in more.items()) > MAX_CONTINUE_CHARS:
                raise WikiError(f"{what}: a continuation over {MAX_CONTINUE_CHARS} characters")
            token = hash(tuple(sorted(more.items())))
            if token in seen:
                raise WikiError(f"{what}: the same continuation twice: stopped")
            seen.add(token)
        raise WikiError(
            f"{what}: more than {self._max_parts} parts (a continuation without end?): stopped"
        )

    def namespaces(self) -> Namespaces:
        params = {"action": "query", "meta": "siteinfo", "siprop": "namespaces"}
        info = self.call(params, SiteNamespaces).query or SiteNamespaces()
        return Namespaces(Namespace(ns.id, ns.name, ns.case) for ns in info.namespaces.values())

    def server_time(self) -> str:
        """The wiki's clock now (ISO 8601, UTC), as its recent changes are stamped."""
        params = {"action": "query", "meta": "siteinfo", "siprop": "general"}
        info = self.call(params, SiteGeneral).query
        if info is None:
            raise WikiError(f"{self.url} (meta=siteinfo): no general site information")
        return info.general.time

    def recent_changes(self, start: str) -> Iterator[list[Change]]:
        """The recent changes stamped ``start`` or later, oldest first, a part at a time."""
        params = {
            "list": "recentchanges",
            "rcdir": "newer",
            "rcstart": start,
            "rcprop": "title|ids|timestamp|loginfo",
            "rctype": RC_TYPES,
            "rclimit": "500",
        }
        for part in self.query(params, RecentChanges):
            yield part.recentchanges

    def all_titles(self, ns: int) -> list[str]:
        params = {"list": "allpages", "apnamespace": str(ns), "aplimit": "500"}
        return [page.title for part in self.query(params, AllPages) for page in part.allpages]

    def pages(self, titles: list[str]) -> dict[str, PageState]:
        """The state of each of ``titles`` (by the title asked for). Asked in two steps: which
        exist and may be read, then the content of those (the API refuses a whole query that
        asks the content of one page this reader may not read)."""
        out: dict[str, PageState] = {}
        for start in range(0, len(titles), TITLES_PER_QUERY):
            chunk = titles[start : start + TITLES_PER_QUERY]
            info = {"titles": "|".join(chunk), "prop": "info", "intestactions": "read"}
            found, asked = self._merged(chunk, info)
            readable = [t for t, state in found.items() if state.exists and state.readable]
            if readable:
                content = {
                    "titles": "|".join(readable),
                    "prop": "revisions|redirects",
                    "rvprop": "content",
                    "rvslots": "main",
                    "rdprop": "title",
                    "rdlimit": "max",
                }
                more, _ = self._merged(readable, content)
                for title, state in more.items():
                    state.redirect = found[title].redirect
                    found[title] = state
            for title in chunk:
                out[title] = found.get(asked[title], PageState(title, exists=False))
        return out

    def _merged(
        self, titles: list[str], params: dict[str, str]
    ) -> tuple[dict[str, PageState], dict[str, str]]:
        """The pages of one query by the wiki's title, and each title asked for -> that."""
        found: dict[str, PageState] = {}
        asked = {title: title for title in titles}
        for part in self.query(params, Pages):
            for pair in part.normalized:
                asked[pair.from_] = pair.to
            for page in part.pages:
                _merge(found.setdefault(page.title, PageState(page.title)), page)
        return found, asked

    def redirect_hops(self, titles: list[str]) -> dict[str, str]:
        """For each of ``titles`` that is a redirect, the title it points to (one hop)."""
        hops: dict[str, str] = {}
        for start in range(0, len(titles), TITLES_PER_QUERY):
            chunk = titles[start : start + TITLES_PER_QUERY]
            named: dict[str, str] = {}
            pairs: dict[str, str] = {}
            for part in self.query({"titles": "|".join(chunk), "redirects": "1"}, Pages):
                named.update((p.from_, p.to) for p in part.normalized)
                pairs.update((p.from_, p.to) for p in part.redirects)
            for title in chunk:
                target = pairs.get(named.get(title, title))
                if target is not None:
                    hops[title] = target
        return hops

    def readable(self, titles: list[str]) -> set[str]:
        """Those of ``titles`` this reader may read (existing or not)."""
        out: set[str] = set()
        for start in range(0, len(titles), TITLES_PER_QUERY):
            chunk = titles[start : start + TITLES_PER_QUERY]
            params = {"titles": "|".join(chunk), "prop": "info", "intestactions": "read"}
            named: dict[str, str] = {}
            can: set[str] = set()
            for part in self.query(params, Pages):
                named.update((p.from_, p.to) for p in part.normalized)
                can.update(p.title for p in part.pages if p.actions and p.actions.get("read"))
            out.update(title for title in chunk if named.get(title, title) in can)
        return out

    def backlinks(self, title: str) -> list[str]:
        params = {"list": "backlinks", "bltitle": title, "bllimit": "500"}
        return [page.title for part in self.query(params, Backlinks) for page in part.backlinks]


def _named(params: dict[str, str]) -> str:
    """The call as the messages name it: ``list=allpages``, ``meta=siteinfo``, ``prop=info``."""
    named = [f"{key}={params[key]}" for key in ("list", "meta", "siprop", "prop") if key in params]
    return "&".join(named) or ("redirects" if "redirects" in params else "query")


def _cut(text: str) -> str:
    """A wiki's text in one of our lines: cut, and nothing that could forge another line."""
    return printable(text[:ECHO_CHARS])


def _merge(state: PageState, page: Page) -> None:
    """One part of a page's answer merged into ``state`` (a long answer comes in parts)."""
    if not page.missing and not page.invalid and page.pageid is not None:
        state.exists = True
    if page.actions is not None:
        state.readable = bool(page.actions.get("read"))
    if page.redirect:
        state.redirect = True
    for revision in page.revisions:
        main = revision.slots.get("main")
        if main is not None:
            state.model = main.contentmodel
            state.text = main.content
    state.redirects_here.extend(r.title for r in page.redirects)
