"""The shapes of the Action API's answers the follower reads, as msgspec types.

Each answer is decoded into these types (``formatversion=2``), so JSON of another shape (a
``namespaces`` that is a number, a page without a title) is refused where it is decoded, with
the path of what was wrong, instead of failing later on a missing key. Fields the follower
does not read are ignored; those it may miss have MediaWiki's defaults.
"""

from __future__ import annotations

from typing import Any, Final, Generic, TypeVar

import msgspec

WIKITEXT: Final = "wikitext"  # MediaWiki's content model of wikitext pages (API and dumps)


class Struct(msgspec.Struct):
    """Every answer type."""


class ApiError(Struct):
    code: str = ""
    text: str = ""


Q = TypeVar("Q", bound=Struct)


class Answer(Struct, Generic[Q]):
    """What every ``api.php`` answer may hold: errors, the query's result, its continuation."""

    errors: list[ApiError] = []
    query: Q | None = None
    continue_: dict[str, str | int] = msgspec.field(default_factory=dict, name="continue")


class NamespaceInfo(Struct):
    id: int
    name: str = ""
    case: str = "first-letter"


class SiteNamespaces(Struct):
    namespaces: dict[str, NamespaceInfo] = {}


class General(Struct):
    time: str


class SiteGeneral(Struct):
    general: General


class LogParams(Struct):
    target_title: str = ""


class Change(Struct):
    """One recent change: only which page it touched, and when."""

    timestamp: str
    title: str = ""
    logtype: str = ""
    logparams: LogParams | list[Any] = []


class RecentChanges(Struct):
    recentchanges: list[Change] = []


class Titled(Struct):
    title: str


class AllPages(Struct):
    allpages: list[Titled] = []


class Backlinks(Struct):
    backlinks: list[Titled] = []


class Renamed(Struct):
    """A title the API read as another (``normalized``) or a redirect's one hop."""

    from_: str = msgspec.field(name="from")
    to: str


class Slot(Struct):
    content: str = ""
    contentmodel: str = WIKITEXT


class Revision(Struct):
    slots: dict[str, Slot] = {}


class Page(Struct):
    title: str
    pageid: int | None = None
    missing: bool = False
    invalid: bool = False
    redirect: bool = False
    actions: dict[str, bool] | None = None
    revisions: list[Revision] = []
    redirects: list[Titled] = []


class Pages(Struct):
    """``titles=`` queries: the pages, and how the titles asked for were read."""

    pages: list[Page] = []
    normalized: list[Renamed] = []
    redirects: list[Renamed] = []
