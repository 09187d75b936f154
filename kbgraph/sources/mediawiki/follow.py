"""Follow a live wiki: its recent changes read through the Action API and sent as deliveries.

The recent changes only say which pages changed; what is sent is each page's state as the
API shows it now to an anonymous reader, so a change read twice sends nothing new (the
manifest's digests) and a change missed in between is covered by the state read later:

- an edit or a page made: the page's concept upserted;
- a deletion: its concept deleted; a restoration: upserted again;
- a move: the old title's concept goes (concept.deleted) and the new one comes. When the move
  leaves a redirect (the default), the old title is an alias of the new concept and links to
  it arrive there, as on the wiki; moved without one, the old title is gone;
- a protection (or any log entry): the page's state read again. A page this reader may not
  read (``intestactions=read``: core MediaWiki reads everything or, on a private wiki, what
  ``$wgWhitelistRead`` lists; an extension or hook that denies reading per page is honoured
  the same way) is not a concept: deleted when it was sent, sent again once readable;
- a redirect made, changed or removed: its old and new targets (their aliases) and the pages
  linking to it (their links through it) are read again.

The first run (no cursor) reads the whole wiki (``list=allpages``, every namespace) and marks
the wiki's clock before it starts. A stamp is parsed before it is believed: a change stamped
with no time, or later than the wiki's clock (read at each pass) or ours by more than
``CLOCK_TOLERANCE``, is refused with a warning and never becomes the cursor; a cursor of that
kind already saved (by an older version) is ignored with a warning and the whole wiki read
again. Each later run reads the changes from its cursor on, less
``OVERLAP_SECONDS`` (a change committed late with an earlier stamp is still read), part by
part: a part's deliveries are sent and acknowledged, and only then is its cursor written,
with what the follower knows of the redirects, in one transaction. A run stopped at any point
(a crash, a kill, a refusal) reads that part again: nothing acknowledged by the wiki is lost,
and a state sent twice is the same state (the deliveries are idempotent).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from kbgraph.events import ECHO_CHARS
from kbgraph.sources.deliver import Sent, SourceConcept, deliver
from kbgraph.sources.manifest import Manifest, open_db, write_transaction
from kbgraph.sources.mediawiki.answers import WIKITEXT, Change, LogParams
from kbgraph.sources.mediawiki.api import PageState, WikiApi, WikiError
from kbgraph.sources.mediawiki.bounds import MAX_PAGE_BYTES
from kbgraph.sources.mediawiki.concepts import SOURCE, concept_of
from kbgraph.sources.mediawiki.dump import build, over
from kbgraph.sources.mediawiki.titles import Namespaces, Title
from kbgraph.sources.mediawiki.wikitext import PageFields, parse
from kbgraph.sources.sinks import Sink

OVERLAP_SECONDS: Final = 60
STAMP_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"  # the API's timestamps (ISO 8601, UTC)
# how far a stamp may be ahead of the wiki's clock (changes made while a pass runs are later
# still: the pass's own time is added) and the wiki's clock ahead of ours
STAMP_SLACK: Final = timedelta(minutes=1)
CLOCK_TOLERANCE: Final = timedelta(hours=1)
MAX_REFUSED_KEPT: Final = 10_000  # refused changes remembered so as to warn of each once
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS mw_cursor (
    dest TEXT NOT NULL, kb TEXT NOT NULL, wiki TEXT NOT NULL, stamp TEXT NOT NULL,
    PRIMARY KEY (dest, kb, wiki)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mw_redirect (
    dest TEXT NOT NULL, kb TEXT NOT NULL, wiki TEXT NOT NULL, source TEXT NOT NULL,
    target TEXT NOT NULL,
    PRIMARY KEY (dest, kb, wiki, source)
) WITHOUT ROWID;
"""


class FollowState:
    """Where the follower is (the last recent change stamp sent) and the redirects it knows,
    per destination, KB and wiki: two tables beside the manifest's, in the same file."""

    def __init__(self, path: Path) -> None:
        self._conn = open_db(path, _SCHEMA)

    def cursor(self, key: tuple[str, str, str]) -> str | None:
        row = self._conn.execute(
            "SELECT stamp FROM mw_cursor WHERE dest = ? AND kb = ? AND wiki = ?", key
        ).fetchone()
        return None if row is None else str(row[0])

    def redirects(self, key: tuple[str, str, str]) -> dict[str, str]:
        rows = self._conn.execute(
            "SELECT source, target FROM mw_redirect WHERE dest = ? AND kb = ? AND wiki = ?", key
        )
        return {source: target for source, target in rows}

    def save(
        self,
        key: tuple[str, str, str],
        stamp: str,
        redirects: dict[str, str | None],
        *,
        replace: bool = False,
    ) -> None:
        """The cursor and the redirects' changes (None: no longer a redirect), durably at once;
        ``replace``: ``redirects`` is every redirect of the wiki."""
        with write_transaction(self._conn):
            if replace:
                self._conn.execute(
                    "DELETE FROM mw_redirect WHERE dest = ? AND kb = ? AND wiki = ?", key
                )
            self._conn.execute(
                "INSERT OR REPLACE INTO mw_cursor (dest, kb, wiki, stamp) VALUES (?, ?, ?, ?)",
                (*key, stamp),
            )
            for source, target in sorted(redirects.items()):
                if target is None:
                    self._conn.execute(
                        "DELETE FROM mw_redirect WHERE dest = ? AND kb = ? AND wiki = ?"
                        " AND source = ?",
                        (*key, source),
                    )
                else:
                    self._conn.execute(
                        "INSERT OR REPLACE INTO mw_redirect VALUES (?, ?, ?, ?, ?)",
                        (*key, source, target),
                    )

    def forget(self, key: tuple[str, str, str]) -> None:
        with write_transaction(self._conn):
            for table in ("mw_cursor", "mw_redirect"):
                self._conn.execute(
                    f"DELETE FROM {table} WHERE dest = ? AND kb = ? AND wiki = ?", key
                )

    def close(self) -> None:
        self._conn.close()


@dataclass(slots=True)
class FollowReport:
    full: bool = False  # the whole wiki was read (a first run, or a KB behind the manifest)
    changes: int = 0  # recent changes read
    pages: int = 0  # pages whose state was read
    sent: Sent = field(default_factory=Sent)
    cursor: str = ""
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        how = "read the whole wiki" if self.full else f"{self.changes} recent changes"
        return (
            f"{how}, {self.pages} pages read; sent {self.sent.upserted} upserts and"
            f" {self.sent.deleted} deletes, {self.sent.unchanged} pages unchanged; at {self.cursor}"
        )


class WikiFollower:
    """One wiki followed into one KB of one destination."""

    def __init__(
        self,
        api: WikiApi,
        kb: str,
        sink: Sink,
        manifest: Manifest,
        state: FollowState,
        overlap: int = OVERLAP_SECONDS,
        max_page_bytes: int = MAX_PAGE_BYTES,
    ) -> None:
        self.api, self.kb, self.sink, self.manifest, self.state = api, kb, sink, manifest, state
        self.overlap = overlap  # seconds of changes before the cursor read again
        self.max_page_bytes = max_page_bytes  # a longer page is skipped, never parsed
        self._refused: set[tuple[str, str]] = set()  # the changes refused and said so
        self.key = (sink.dest, kb, api.url)
        self._namespaces: Namespaces | None = None

    @property
    def namespaces(self) -> Namespaces:
        if self._namespaces is None:
            self._namespaces = self.api.namespaces()
        return self._namespaces

    def poll(self) -> FollowReport:
        """One pass: the whole wiki on a first run, else the changes since the cursor."""
        seq = self.sink.kb_seq(self.kb)
        if seq is not None and self.manifest.forget_if_behind(self.sink.dest, self.kb, seq):
            self.state.forget(self.key)  # the KB was replaced: send everything again
        saved = self.state.cursor(self.key)
        cursor = None if saved is None else canonical_stamp(saved, _now() + CLOCK_TOLERANCE)
        if saved is not None and cursor is None:
            warning = (
                f"the saved cursor {saved[:ECHO_CHARS]!r} is not a time before ours (saved by"
                " an older version?): ignored, the whole wiki read again"
            )
            return self._load_all([warning])
        if cursor is None:
            return self._load_all([])
        report = FollowReport(cursor=cursor)
        limit = self._limit()
        start = _earlier(cursor, self.overlap)
        for part in self.api.recent_changes(start):
            touched: dict[str, None] = {}
            newest = cursor
            for change in part:
                stamp = canonical_stamp(change.timestamp, limit())
                if stamp is None:
                    self._refuse(change, report)
                    continue
                newest = max(newest, stamp)
                for title in _titles_of(change):
                    touched.setdefault(title, None)
            report.changes += len(part)
            if touched:
                self._send_pages(list(touched), newest, report)
                report.cursor = cursor = newest
        return report

    def _refuse(self, change: Change, report: FollowReport) -> None:
        """Warn of a change whose stamp is refused, once per follower: it stays among the
        wiki's recent changes (read again by every pass) until the wiki drops it."""
        said = (change.title[:ECHO_CHARS], change.timestamp[:ECHO_CHARS])
        if said in self._refused:
            return
        if len(self._refused) >= MAX_REFUSED_KEPT:
            self._refused.clear()
        self._refused.add(said)
        report.warnings.append(
            f"a recent change of {said[0]!r} stamped {said[1]!r}: not a time before the"
            " wiki's clock: refused"
        )

    def _limit(self) -> Callable[[], datetime]:
        """The latest stamp believed at any moment of this pass: the wiki's clock now (no
        later than ours by ``CLOCK_TOLERANCE``), plus the time the pass has taken so far."""
        ours = _now()
        wiki = _parsed(self.api.server_time())
        clock = ours if wiki is None else min(wiki, ours + CLOCK_TOLERANCE)
        began = time.monotonic()
        return lambda: clock + STAMP_SLACK + timedelta(seconds=time.monotonic() - began)

    def _load_all(self, warnings: list[str]) -> FollowReport:
        told = self.api.server_time()  # marked first: a change made while reading is read again
        stamp = canonical_stamp(told, _now() + CLOCK_TOLERANCE)
        if stamp is None:
            raise WikiError(
                f"{self.api.url}: the wiki's clock says {told[:ECHO_CHARS]!r}: not a time"
                f" within {CLOCK_TOLERANCE} of ours, so no cursor to follow from"
            )
        spaces = self.namespaces
        titles = [t for ns in sorted(spaces.by_id) if ns >= 0 for t in self.api.all_titles(ns)]
        states = self.api.pages(titles)
        pages: dict[Title, PageFields] = {}
        redirects: dict[Title, Title] = {}
        for state in states.values():
            self._read(state, pages, redirects, warnings)
        read = build(pages, redirects, spaces, warnings)
        sent = deliver(
            self.kb, self.sink, self.manifest, read.concepts, source=SOURCE, everything=True
        )
        known = {spaces.display(s): spaces.display(t) for s, t in redirects.items()}
        self.state.save(self.key, stamp, dict(known), replace=True)
        return FollowReport(True, 0, len(states), sent, stamp, warnings)

    def _read(
        self,
        state: PageState,
        pages: dict[Title, PageFields],
        redirects: dict[Title, Title],
        warnings: list[str],
    ) -> Title | None:
        """Add a page's state to ``pages`` or ``redirects`` (nothing when it is not there for
        this reader, or over ``max_page_bytes``); its title."""
        title = self.namespaces.parse(state.title)
        if title is None or title.ns < 0 or not state.exists or not state.readable:
            return title
        if over(state.text, self.max_page_bytes):
            warnings.append(
                f"{self.namespaces.display(title)}: over {self.max_page_bytes} bytes of"
                " wikitext (--max-page-bytes): not imported"
            )
            return title
        if state.model != WIKITEXT:
            pages[title] = PageFields([], [], state.text, None)
            return title
        fields = parse(state.text, self.namespaces)
        if state.redirect:
            if fields.first_link is not None:
                redirects[title] = fields.first_link
        else:
            pages[title] = fields
        return title

    def _send_pages(self, titles: list[str], stamp: str, report: FollowReport) -> None:
        """Read ``titles`` and every page their changes reach, send what changed, then write
        the cursor ``stamp``."""
        spaces = self.namespaces
        known = self.state.redirects(self.key)
        states = self.api.pages(titles)
        again: dict[str, None] = {}
        changed: dict[str, str | None] = {}
        pages: dict[Title, PageFields] = {}
        redirects: dict[Title, Title] = {}
        for state in states.values():
            self._read(state, pages, redirects, report.warnings)
        for asked, state in states.items():
            title = spaces.parse(state.title)
            if title is None:
                continue
            shown = spaces.display(title)
            target = redirects.get(title)
            now = None if target is None else spaces.display(target)
            before = known.get(shown) or known.get(asked)
            if now != before:
                changed[shown] = now
                for other in (before, now):
                    if other is not None:
                        again.setdefault(other, None)
                for linking in self.api.backlinks(shown):
                    again.setdefault(linking, None)
        more = [t for t in again if t not in states]
        read_too = self.api.pages(more)
        for state in read_too.values():
            self._read(state, pages, redirects, report.warnings)
        report.pages += len(titles) + len(more)
        seen = {state.title: state for state in [*states.values(), *read_too.values()]}
        concepts = self._concepts(pages, seen, report.warnings)
        gone = [
            spaces.concept_id(title)
            for title in (spaces.parse(t) for t in [*titles, *more])
            if title is not None and title not in pages
        ]
        report.sent.add(deliver(self.kb, self.sink, self.manifest, concepts, gone, source=SOURCE))
        self.state.save(self.key, stamp, changed)

    def _concepts(
        self, pages: dict[Title, PageFields], seen: dict[str, PageState], warnings: list[str]
    ) -> list[SourceConcept]:
        """The concepts of ``pages`` (read as ``seen``, by the wiki's title): their aliases
        (the readable redirects to each, by the wiki's redirect table) and links through
        redirects (one hop) asked of the API."""
        spaces = self.namespaces
        targets = sorted({spaces.display(t) for fields in pages.values() for t in fields.links})
        hops = self.api.redirect_hops(targets)
        resolved: dict[Title, Title] = {}
        for source, target in hops.items():
            s, t = spaces.parse(source), spaces.parse(target)
            if s is not None and t is not None:
                resolved[s] = t
        here = {title: seen.get(spaces.display(title)) for title in pages}
        sources = sorted({r for state in here.values() if state for r in state.redirects_here})
        readable = self.api.readable(sources)
        out: list[SourceConcept] = []
        for title in sorted(pages):
            state = here[title]
            aliases = _titles(spaces, [] if state is None else state.redirects_here, readable)
            concept = concept_of(
                title, pages[title], aliases, lambda t: resolved.get(t, t), spaces, warnings
            )
            if concept is not None:
                out.append(concept)
        return out


def _titles(spaces: Namespaces, written: Iterable[str], allowed: set[str]) -> list[Title]:
    """The titles of ``written`` that are in ``allowed``, parsed."""
    parsed = (spaces.parse(w) for w in written if w in allowed)
    return [title for title in parsed if title is not None]


def _titles_of(change: Change) -> list[str]:
    """The titles a recent change touches: its page, and a move's new title."""
    titles = [change.title] if change.title else []
    params = change.logparams
    if change.logtype == "move" and isinstance(params, LogParams) and params.target_title:
        titles.append(params.target_title)
    return titles


def _now() -> datetime:
    return datetime.now(UTC)


def _parsed(stamp: str) -> datetime | None:
    try:
        return datetime.strptime(stamp, STAMP_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def canonical_stamp(stamp: str, limit: datetime) -> str | None:
    """``stamp`` written as the API writes one, or None when it is no time or after
    ``limit``."""
    moment = _parsed(stamp)
    if moment is None or moment > limit:
        return None
    return moment.strftime(STAMP_FORMAT)


def _earlier(stamp: str, seconds: int) -> str:
    moment = datetime.strptime(stamp, STAMP_FORMAT).replace(tzinfo=UTC)
    try:
        moment -= timedelta(seconds=seconds)
    except OverflowError:  # a wiki whose clock said year 1
        moment = datetime.min.replace(tzinfo=UTC)
    return moment.strftime(STAMP_FORMAT)


def follow(
    poll: Callable[[], object],
    interval: float,
    on_error: Callable[[Exception], None],
    stop_event: threading.Event,
) -> None:
    """``poll`` every ``interval`` seconds until ``stop_event`` is set; an error is reported
    and the next poll tries again (from the cursor, which a failed poll did not move)."""
    while not stop_event.is_set():
        try:
            poll()
        except Exception as exc:
            on_error(exc)
        stop_event.wait(interval)
