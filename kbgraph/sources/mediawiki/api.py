"""A wiki's Action API (``api.php``) asked over httpx, as an anonymous reader.

Only what the follower needs: the site's namespaces and clock, recent changes from a time on
(``list=recentchanges``, ``rcdir=newer``), every title of a namespace (``list=allpages``), the
state of pages (``prop=info|revisions|redirects``: exists, readable by this reader through
``intestactions=read``, redirect or not, content and its model, the redirects to it), the first
hop of redirects (``redirects``) and the pages linking to one (``list=backlinks``). Every
``query`` follows the API's ``continue`` to the end, merging the parts of each page. Connection
errors and 5xx answers are retried with backoff; an API error is raised with its code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from kbgraph.events import ECHO_CHARS
from kbgraph.sources.mediawiki.titles import Namespace, Namespaces

TITLES_PER_QUERY: Final = 50  # the API's limit for a client without the apihighlimits right
RC_TYPES: Final = "edit|new|log"


class WikiError(Exception):
    """The wiki could not be asked, or refused: the message says which and why."""


@dataclass(slots=True)
class PageState:
    """A page as the API showed it to this reader."""

    title: str
    exists: bool = False
    readable: bool = True
    redirect: bool = False
    model: str = "wikitext"
    text: str = ""
    redirects_here: list[str] = field(default_factory=list)


def endpoint(url: str) -> str:
    """The ``api.php`` of a wiki's base URL (or the URL itself when it names it)."""
    url = url.rstrip("/")
    return url if url.endswith("/api.php") else f"{url}/api.php"


class WikiApi:
    def __init__(
        self,
        url: str,
        *,
        attempts: int = 4,
        backoff: float = 0.5,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = endpoint(url)
        self._attempts = max(1, attempts)
        self._backoff = backoff
        self._client = httpx.Client(
            timeout=timeout, transport=transport, headers={"user-agent": "kbgraph-mediawiki"}
        )

    def close(self) -> None:
        self._client.close()

    def call(self, params: dict[str, str]) -> dict[str, Any]:
        """One API request (GET, JSON format 2); raises ``WikiError``."""
        query = {"format": "json", "formatversion": "2", "errorformat": "plaintext", **params}
        problem = ""
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                response = self._client.get(self.url, params=query)
            except httpx.HTTPError as exc:
                problem = f"cannot reach {self.url}: {exc or exc.__class__.__name__}"
                continue
            if response.status_code >= 500:
                problem = f"{self.url} answered {response.status_code}"
                continue
            try:
                answer = response.json()
            except ValueError:
                raise WikiError(
                    f"{self.url} answered {response.status_code} without JSON: is it a"
                    " MediaWiki's api.php?"
                ) from None
            if not isinstance(answer, dict):
                raise WikiError(f"{self.url}: unexpected answer {str(answer)[:ECHO_CHARS]!r}")
            errors = answer.get("errors")
            if errors:
                first = errors[0]
                raise WikiError(f"{self.url}: {first.get('code')}: {first.get('text')}")
            return answer
        raise WikiError(f"{problem} (gave up after {self._attempts} attempts)")

    def query(self, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        """Each part of ``action=query`` with ``params``, following ``continue`` to the end."""
        more: dict[str, str] = {}
        while True:
            answer = self.call({"action": "query", **params, **more})
            yield answer.get("query", {})
            if "continue" not in answer:
                return
            more = {key: str(value) for key, value in answer["continue"].items()}

    def namespaces(self) -> Namespaces:
        info = self.call({"action": "query", "meta": "siteinfo", "siprop": "namespaces"})
        spaces = info["query"]["namespaces"].values()
        return Namespaces(
            Namespace(int(ns["id"]), ns.get("name", ""), ns.get("case", "first-letter"))
            for ns in spaces
        )

    def server_time(self) -> str:
        """The wiki's clock now (ISO 8601, UTC), as its recent changes are stamped."""
        info = self.call({"action": "query", "meta": "siteinfo", "siprop": "general"})
        return str(info["query"]["general"]["time"])

    def recent_changes(self, start: str) -> Iterator[list[dict[str, Any]]]:
        """The recent changes stamped ``start`` or later, oldest first, a part at a time."""
        params = {
            "list": "recentchanges",
            "rcdir": "newer",
            "rcstart": start,
            "rcprop": "title|ids|timestamp|loginfo",
            "rctype": RC_TYPES,
            "rclimit": "500",
        }
        for part in self.query(params):
            yield list(part.get("recentchanges", []))

    def all_titles(self, ns: int) -> list[str]:
        params = {"list": "allpages", "apnamespace": str(ns), "aplimit": "500"}
        return [page["title"] for part in self.query(params) for page in part.get("allpages", [])]

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
        for part in self.query(params):
            for pair in part.get("normalized", []):
                asked[pair["from"]] = pair["to"]
            for page in part.get("pages", []):
                _merge(found.setdefault(page["title"], PageState(page["title"])), page)
        return found, asked

    def redirect_hops(self, titles: list[str]) -> dict[str, str]:
        """For each of ``titles`` that is a redirect, the title it points to (one hop)."""
        hops: dict[str, str] = {}
        for start in range(0, len(titles), TITLES_PER_QUERY):
            chunk = titles[start : start + TITLES_PER_QUERY]
            named: dict[str, str] = {}
            pairs: dict[str, str] = {}
            for part in self.query({"titles": "|".join(chunk), "redirects": "1"}):
                named.update((p["from"], p["to"]) for p in part.get("normalized", []))
                pairs.update((p["from"], p["to"]) for p in part.get("redirects", []))
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
            for part in self.query(params):
                named.update((p["from"], p["to"]) for p in part.get("normalized", []))
                can.update(
                    p["title"] for p in part.get("pages", []) if p.get("actions", {}).get("read")
                )
            out.update(title for title in chunk if named.get(title, title) in can)
        return out

    def backlinks(self, title: str) -> list[str]:
        params = {"list": "backlinks", "bltitle": title, "bllimit": "500"}
        return [page["title"] for part in self.query(params) for page in part.get("backlinks", [])]


def _merge(state: PageState, page: dict[str, Any]) -> None:
    """One part of a page's answer merged into ``state`` (a long answer comes in parts)."""
    if "missing" not in page and "invalid" not in page and "pageid" in page:
        state.exists = True
    if "actions" in page:
        state.readable = bool(page["actions"].get("read"))
    if page.get("redirect"):
        state.redirect = True
    for revision in page.get("revisions", []):
        main = revision.get("slots", {}).get("main", {})
        state.model = str(main.get("contentmodel", "wikitext"))
        state.text = str(main.get("content", ""))
    state.redirects_here.extend(r["title"] for r in page.get("redirects", []))
