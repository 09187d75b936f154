"""Issue 48, cases 4 to 6: a wiki that answers with bombs (tests/hostile_wiki.py, on loopback).

Huge, dripping and endless answers are bounded (memory measured in a subprocess, as growth
over an honest wiki's pass), bad and future timestamps never become the cursor (one already
saved is ignored), and JSON of another shape is one clear line naming the call.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kbgraph.sources.manifest import Manifest
from kbgraph.sources.mediawiki.api import WikiApi, WikiError
from kbgraph.sources.mediawiki.follow import FollowState, WikiFollower, follow
from kbgraph.sources.sinks import LocalSink
from tests.hostile_wiki import (
    KB,
    Answer,
    FakeWiki,
    concepts,
    drip,
    endless_titles,
    huge,
    now,
    sync,
    wrong_shape,
)
from tests.peak_rss import peak_rss_of
from tests.support import HANG_GUARD, ROOT

PAGES = {"Main Page": "Hello [[World]].", "World": "Round. [[Main Page]]"}
# growth of the command's peak RSS over an honest wiki's pass: the 32 MiB answer cap and the
# 1,000 continuation parts' 500,000 titles fit in it; a 400 MB answer taken whole does not
PEAK_GROWTH_BOUND = 250 << 20


def one_clear_line(output: str) -> str:
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("kbgraph: ")]
    assert len(lines) == 1, output
    return lines[0]


def test_json_of_another_shape_is_one_clear_line(tmp_path: Path) -> None:
    wiki = FakeWiki(pages=dict(PAGES), hostile={"meta=siteinfo&siprop=namespaces": wrong_shape})
    with wiki.serve() as url:
        done = subprocess.run(sync(url, tmp_path), cwd=ROOT, capture_output=True, text=True,
                              timeout=HANG_GUARD)  # fmt: skip
    assert done.returncode == 1, done.stderr
    line = one_clear_line(done.stderr)
    assert "meta=siteinfo" in line and "Expected `object`, got `int`" in line, line
    assert "$.query.namespaces" in line, line


@pytest.mark.parametrize(
    ("call", "answer", "what"),
    [
        ("list=allpages", {"query": {"allpages": 5}}, "$.query.allpages"),
        ("list=allpages", {"query": {"allpages": [{"name": "x"}]}}, "`title`"),
        ("list=allpages", [1, 2], "Expected `object`, got `array`"),
        ("prop=info", {"query": {"pages": [{"title": 7}]}}, "$.query.pages[0].title"),
        ("meta=siteinfo&siprop=general", {"query": {"general": "x"}}, "$.query.general"),
        ("list=allpages", {"errors": [{"code": "x\ny", "text": "z\x1b"}]}, "x\\ny: z\\x1b"),
        ("list=allpages", {"continue": [], "query": {}}, "$.continue"),
    ],
)
def test_each_odd_answer_is_a_wiki_error(call: str, answer: Any, what: str) -> None:
    def odd(params: dict[str, str]) -> Answer:
        return answer if isinstance(answer, dict) else str(answer).encode()

    wiki = FakeWiki(pages=dict(PAGES), hostile={call: odd})
    with wiki.serve() as url:
        api = WikiApi(url, attempts=1)
        try:
            with pytest.raises(WikiError) as refused:
                if call.startswith("meta"):
                    api.server_time()
                elif call == "prop=info":
                    api.pages(["World"])
                else:
                    api.all_titles(0)
        finally:
            api.close()
    assert what in str(refused.value) and call in str(refused.value), refused.value
    assert "\n" not in str(refused.value)


def test_a_huge_answer_is_refused_as_it_arrives(tmp_path: Path) -> None:
    honest = FakeWiki(pages=dict(PAGES))
    (tmp_path / "honest").mkdir()
    with honest.serve() as url:
        code, baseline, output = peak_rss_of(sync(url, tmp_path / "honest"), HANG_GUARD)
    assert code == 0, output
    wiki = FakeWiki(pages=dict(PAGES), hostile={"meta=siteinfo&siprop=general": huge})
    with wiki.serve() as url:
        code, peak, output = peak_rss_of(sync(url, tmp_path), HANG_GUARD)
    assert code == 1, output
    assert "an answer over 33554432 bytes: refused" in one_clear_line(output)
    assert peak - baseline < PEAK_GROWTH_BOUND, (peak, baseline)


def test_an_endless_continuation_ends_the_pass(tmp_path: Path) -> None:
    honest = FakeWiki(pages=dict(PAGES))
    (tmp_path / "honest").mkdir()
    with honest.serve() as url:
        code, baseline, output = peak_rss_of(sync(url, tmp_path / "honest"), HANG_GUARD)
    assert code == 0, output
    wiki = FakeWiki(pages=dict(PAGES), hostile={"list=allpages": endless_titles})
    with wiki.serve() as url:
        code, peak, output = peak_rss_of(sync(url, tmp_path), HANG_GUARD)
    assert code == 1, output
    line = one_clear_line(output)
    assert "list=allpages" in line and "more than 1000 parts" in line, line
    assert peak - baseline < PEAK_GROWTH_BOUND, (peak, baseline)
    assert wiki.calls.count("list=allpages") == 1000


def test_a_continuation_repeating_itself_ends_the_pass() -> None:
    def loop(params: dict[str, str]) -> Answer:
        return {"continue": {"apcontinue": "same"}, "query": {"allpages": [{"title": "A"}]}}

    wiki = FakeWiki(hostile={"list=allpages": loop})
    with wiki.serve() as url:
        api = WikiApi(url, attempts=1)
        try:
            with pytest.raises(WikiError, match="the same continuation twice"):
                api.all_titles(0)
        finally:
            api.close()
    assert wiki.calls.count("list=allpages") == 2


def test_a_drip_ends_at_the_deadline(tmp_path: Path) -> None:
    """A byte a second, the deadline 3 s: httpx's per-read timeout alone never fires."""
    wiki = FakeWiki(pages=dict(PAGES), hostile={"meta=siteinfo&siprop=general": drip(1.0)})
    with wiki.serve() as url:
        api = WikiApi(url, attempts=1, deadline=3.0)
        began = time.monotonic()
        try:
            with pytest.raises(WikiError, match="no whole answer within 3 s: stopped"):
                api.server_time()
        finally:
            api.close()
        took = time.monotonic() - began
        assert took < 30, took  # the answer whole would take ~60 s; generous for a busy machine
        done = subprocess.run(sync(url, tmp_path, "--wiki-timeout", "2"), cwd=ROOT,
                              capture_output=True, text=True, timeout=HANG_GUARD)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "no whole answer within 2 s: stopped" in one_clear_line(done.stderr)


class Follower:
    """A follower of a fake wiki into a local store under ``folder``."""

    def __init__(self, url: str, folder: Path, **api: Any) -> None:
        folder.mkdir(exist_ok=True)
        self.sink = LocalSink(folder / "kb.db")
        self.manifest = Manifest(folder / "m.sqlite")
        self.state = FollowState(folder / "m.sqlite")
        self.api = WikiApi(url, attempts=1, **api)
        self.follower = WikiFollower(self.api, KB, self.sink, self.manifest, self.state)
        self.folder = folder

    def close(self) -> None:
        self.state.close()
        self.manifest.close()
        self.sink.close()
        self.api.close()

    def concepts(self) -> dict[str, str]:
        return concepts(self.folder / "kb.db")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[FakeWiki, Follower]]:
    wiki = FakeWiki(pages=dict(PAGES))
    with wiki.serve() as url:
        made = Follower(url, tmp_path / "follower")
        try:
            yield wiki, made
        finally:
            made.close()


def change(title: str, stamp: str) -> dict[str, Any]:
    return {"type": "edit", "title": title, "timestamp": stamp}


def test_bad_and_future_stamps_never_become_the_cursor(
    fake: tuple[FakeWiki, Follower],
) -> None:
    wiki, kit = fake
    first = kit.follower.poll()
    assert first.full and set(kit.concepts()) == {"Main/Main Page", "Main/World"}
    wiki.pages.update({"Bad": "stamped zzzz", "Future": "from 9999", "Good": "on time"})
    wiki.changes += [change("Bad", "zzzz"), change("Future", "9999-12-31T23:59:59Z"),
                     change("Good", now())]  # fmt: skip
    report = kit.follower.poll()
    refused = [w for w in report.warnings if w.endswith(": refused")]
    assert len(refused) == 2 and "'zzzz'" in refused[0] and "'9999-12-31T23:59:59Z'" in refused[1]
    held = kit.concepts()
    assert "Main/Good" in held and "Main/Bad" not in held and "Main/Future" not in held
    cursor = kit.state.cursor(kit.follower.key)
    assert cursor is not None and cursor < "9999" and cursor == report.cursor
    time.sleep(1.1)
    wiki.pages["Later"] = "written after the bad stamps"
    wiki.changes.append(change("Later", now()))
    again = kit.follower.poll()  # the refused changes are read again: said once, not each pass
    assert "Main/Later" in kit.concepts() and again.warnings == []


def test_a_wiki_clock_far_ahead_is_not_the_cursor(tmp_path: Path) -> None:
    wiki = FakeWiki(pages=dict(PAGES), clock="9999-12-31T23:59:59Z")
    with wiki.serve() as url:
        kit = Follower(url, tmp_path / "follower")
        try:
            with pytest.raises(WikiError, match="the wiki's clock says '9999-12-31T23:59:59Z'"):
                kit.follower.poll()
            assert kit.state.cursor(kit.follower.key) is None and kit.concepts() == {}
        finally:
            kit.close()


@pytest.mark.parametrize("poison", ["9999-12-31T23:59:59Z", "zzzz"])
def test_a_cursor_poisoned_by_an_older_version_is_ignored(
    fake: tuple[FakeWiki, Follower], poison: str
) -> None:
    wiki, kit = fake
    kit.follower.poll()
    kit.state.save(kit.follower.key, poison, {})  # what the older version saved
    wiki.pages["Later"] = "written after the cursor was poisoned"
    wiki.changes.append(change("Later", now()))
    report = kit.follower.poll()
    assert report.full, report  # the whole wiki read again
    assert report.warnings[0].startswith(f"the saved cursor {poison!r} is not a time before ours")
    assert "Main/Later" in kit.concepts()
    assert str(kit.state.cursor(kit.follower.key)) < "9999"


def test_watch_goes_on_after_an_endless_recent_changes_pass(tmp_path: Path) -> None:
    """A pass whose recent changes never end stops at the part limit with an error; the next
    pass (the wiki honest again) follows an edit."""
    endless = threading.Event()
    endless.set()

    def changes(params: dict[str, str]) -> Answer:
        if not endless.is_set():
            start = params["rcstart"]
            return {
                "query": {"recentchanges": [c for c in wiki.changes if c["timestamp"] >= start]}
            }
        n = int(params.get("rccontinue", "0"))
        return {"continue": {"rccontinue": str(n + 1)},
                "query": {"recentchanges": [change("World", now())]}}  # fmt: skip

    wiki = FakeWiki(pages=dict(PAGES), hostile={"list=recentchanges": changes})
    errors: list[Exception] = []
    stop = threading.Event()
    with wiki.serve() as url:
        kit = Follower(url, tmp_path / "follower", max_parts=20)
        kit.follower.poll()  # the first pass reads the whole wiki: no recent changes asked

        def failed(exc: Exception) -> None:
            errors.append(exc)
            endless.clear()  # the wiki honest from now on

        watcher = threading.Thread(target=follow, args=(kit.follower.poll, 0.1, failed, stop))
        watcher.start()
        try:
            deadline = time.monotonic() + HANG_GUARD
            while not errors and time.monotonic() < deadline:
                time.sleep(0.1)
            assert errors and "more than 20 parts" in str(errors[0]), errors
            wiki.pages["Later"] = "followed by the next pass"
            wiki.changes.append(change("Later", now()))
            while "Main/Later" not in kit.concepts() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "Main/Later" in kit.concepts()
        finally:
            stop.set()
            watcher.join(HANG_GUARD)
            kit.close()
    assert len(errors) == 1
