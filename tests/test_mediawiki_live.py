"""A real MediaWiki (Debian's package on ``php -S``, tests/mediawiki_server.py) followed into a
KB: edits, moves, deletions, restorations and read protections made through its API land as
documented; the follower resumes where it stopped and loses nothing when stopped between a
delivery and its cursor; a dump of the same wiki imports to the same state; and signed
deliveries reach a real ``kbgraph serve``."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kbgraph.cli import build_parser
from kbgraph.events import Event
from kbgraph.sources.deliver import deliver
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.mediawiki.api import WikiApi
from kbgraph.sources.mediawiki.concepts import SOURCE
from kbgraph.sources.mediawiki.dump import read_dump
from kbgraph.sources.mediawiki.follow import OVERLAP_SECONDS, FollowState, WikiFollower
from kbgraph.sources.sinks import SECRET_ENV, LocalSink
from kbgraph.store import DeliveryResult, Store
from tests.mediawiki_server import Wiki, require, running_wiki
from tests.support import ADMIN, ROOT, SECRET, bearer, running, served_config

pytestmark = pytest.mark.slow
KB = "wiki"


@pytest.fixture(scope="session")
def wiki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wiki]:
    require()
    started = time.monotonic()
    with running_wiki(tmp_path_factory.mktemp("mediawiki")) as running_one:
        took = time.monotonic() - started
        print(f"\nMediaWiki installed and answering in {took:.1f} s at {running_one.url}")
        yield running_one


class Kit:
    """A follower of the wiki into a local store, its files under ``folder`` (a restart is a
    new Kit on the same folder)."""

    def __init__(self, url: str, folder: Path, overlap: int = OVERLAP_SECONDS) -> None:
        folder.mkdir(exist_ok=True)
        self.folder = folder
        self.sink = LocalSink(folder / "kb.db")
        self.manifest = Manifest(folder / "manifest.sqlite")
        self.state = FollowState(folder / "manifest.sqlite")
        self.api = WikiApi(url)
        self.follower = WikiFollower(self.api, KB, self.sink, self.manifest, self.state, overlap)

    def close(self) -> None:
        self.state.close()
        self.manifest.close()
        self.sink.close()
        self.api.close()

    def concepts(self) -> dict[str, dict[str, object]]:
        return kb_state(self.sink.store)


def kb_state(store: Store) -> dict[str, dict[str, object]]:
    """Every concept of the KB without its version (which differs by who sent it)."""
    kbs = store.load().kbs
    if KB not in kbs:
        return {}
    return {
        c.id: {"title": c.title, "aliases": c.aliases, "tags": c.tags, "text": c.text,
               "links": c.links}
        for c in kbs[KB].concepts
    }  # fmt: skip


@pytest.fixture
def kit(wiki: Wiki, tmp_path: Path) -> Iterator[Kit]:
    made = Kit(wiki.url, tmp_path / "follower")
    yield made
    made.close()


def test_edits_moves_deletions_restorations_and_read_protection(wiki: Wiki, kit: Kit) -> None:
    wiki.edit(
        "Berlin",
        "Capital of [[germany|Germany]].\n{{Infobox city|river=[[Spree]]}}\n"
        "[[Category:Cities]] [[File:Berlin.png|thumb|The [[Reichstag]]]]",
    )
    wiki.edit("Germany", "A country. Its capital is [[Berlin]].")
    wiki.edit("Spree", "A river through [[Berlin]].")
    first = kit.follower.poll()
    assert first.full
    held = kit.concepts()
    berlin = held["Main/Berlin"]
    assert berlin["tags"] == ["Cities"]
    assert berlin["links"] == ["Main/Germany", "Main/Reichstag", "Main/Spree"]
    assert str(berlin["text"]).startswith("Capital of Germany.")
    assert "[[" not in str(berlin["text"]) and "Category" not in str(berlin["text"])
    assert "Main/Main Page" in held  # what install.php made, read on the first run

    wiki.edit("Germany", "A country in Europe. Its capital is [[Berlin]].")
    kit.follower.poll()
    assert "in Europe" in str(kit.concepts()["Main/Germany"]["text"])

    # moved with a redirect: the old concept goes, the new one has the old title as an alias,
    # and a page linking to the old title now links to the new concept (through the redirect)
    wiki.write("move", **{"from": "Berlin", "to": "Berlin (city)", "reason": "test"})
    kit.follower.poll()
    held = kit.concepts()
    assert "Main/Berlin" not in held
    assert held["Main/Berlin (city)"]["aliases"] == ["Berlin"]
    assert held["Main/Germany"]["links"] == ["Main/Berlin (city)"]
    # moved without a redirect: the old title is gone, links to it dangle as on the wiki
    wiki.write("move", **{"from": "Spree", "to": "Spree (river)", "noredirect": "1"})
    kit.follower.poll()
    held = kit.concepts()
    assert "Main/Spree" not in held and held["Main/Spree (river)"]["aliases"] == []
    assert "Main/Spree" in held["Main/Berlin (city)"]["links"]

    wiki.write("delete", title="Germany", reason="test")
    kit.follower.poll()
    assert "Main/Germany" not in kit.concepts()
    wiki.write("undelete", title="Germany", reason="test")
    kit.follower.poll()
    assert "in Europe" in str(kit.concepts()["Main/Germany"]["text"])

    # protected from readers: gone from the KB; readable again: back
    wiki.write("protect", title="Germany", protections="read=sysop", expiry="infinite")
    kit.follower.poll()
    assert "Main/Germany" not in kit.concepts()
    wiki.write("protect", title="Germany", protections="read=all")
    kit.follower.poll()
    assert "Main/Germany" in kit.concepts()
    # a redirect hidden from readers gives no alias (its title is not shown through another)
    wiki.edit("Deutschland", "#REDIRECT [[Germany]]")
    kit.follower.poll()
    assert kit.concepts()["Main/Germany"]["aliases"] == ["Deutschland"]
    wiki.write("protect", title="Deutschland", protections="read=sysop", expiry="infinite")
    kit.follower.poll()
    assert kit.concepts()["Main/Germany"]["aliases"] == []
    wiki.write("protect", title="Deutschland", protections="read=all")
    kit.follower.poll()
    assert kit.concepts()["Main/Germany"]["aliases"] == ["Deutschland"]

    # the same wiki as a dump, imported: the same state
    dump = wiki.dump(kit.folder / "dump.xml")
    read = read_dump(dump)
    other = LocalSink(kit.folder / "from-dump.db")
    try:
        with Manifest(kit.folder / "dump-manifest.sqlite") as manifest:
            deliver(KB, other, manifest, read.concepts, source=SOURCE, everything=True)
        assert kb_state(other.store) == kit.concepts()
    finally:
        other.close()


def test_a_redirect_made_or_removed_resends_the_pages_linking_to_it(
    wiki: Wiki, tmp_path: Path
) -> None:
    """No overlap, and a change a second later between: a poll re-reads only the second of its
    cursor, so only the follower's own reading (the redirect's old and new targets, its
    backlinks) can send the page linking to the redirect."""
    kit = Kit(wiki.url, tmp_path / "follower", overlap=0)

    def later(title: str) -> None:  # a change in a later second: the cursor moves past
        time.sleep(1.1)
        wiki.edit(title, "Another page.")
        kit.follower.poll()

    try:
        wiki.edit("Old name", "The page before its move.")
        wiki.edit("Link source", "Points at [[Old name]].")
        later("Filler one")
        assert kit.concepts()["Main/Link source"]["links"] == ["Main/Old name"]
        wiki.write("move", **{"from": "Old name", "to": "New name", "reason": "test"})
        kit.follower.poll()
        held = kit.concepts()
        assert held["Main/Link source"]["links"] == ["Main/New name"]
        assert held["Main/New name"]["aliases"] == ["Old name"]
        later("Filler two")
        wiki.write("delete", title="Old name", reason="the redirect goes")
        kit.follower.poll()
        held = kit.concepts()
        assert held["Main/Link source"]["links"] == ["Main/Old name"]
        assert held["Main/New name"]["aliases"] == []
    finally:
        kit.close()


class Killed(BaseException):
    """The process dying right after a delivery was acknowledged (not an Exception: nothing
    catches it on the way out, as nothing runs after a kill)."""


class KilledAfterSend:
    """A sink that delivers, then 'dies' before the follower can write its cursor."""

    def __init__(self, inner: LocalSink, *, deliver_first: bool) -> None:
        self.inner, self.dest, self.deliver_first = inner, inner.dest, deliver_first

    def send(self, kb: str, events: list[Event]) -> DeliveryResult:
        if self.deliver_first:
            self.inner.send(kb, events)
        raise Killed

    def kb_seq(self, kb: str) -> int | None:
        return self.inner.kb_seq(kb)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("acknowledged", [True, False])
def test_a_stop_between_delivery_and_cursor_loses_no_edit(
    wiki: Wiki, tmp_path: Path, acknowledged: bool
) -> None:
    folder = tmp_path / "follower"
    page = f"Durable {acknowledged}"
    wiki.edit(page, "First words.")
    kit = Kit(wiki.url, folder)
    kit.follower.poll()
    cursor = kit.state.cursor(kit.follower.key)
    assert cursor is not None and "First words." in str(kit.concepts()[f"Main/{page}"]["text"])
    time.sleep(1.1)  # a later second on the wiki's clock, so the cursor would move
    wiki.edit(page, "Second words.")
    kit.follower.sink = KilledAfterSend(kit.sink, deliver_first=acknowledged)
    with pytest.raises(Killed):
        kit.follower.poll()
    assert kit.state.cursor(kit.follower.key) == cursor  # never written past the delivery
    kit.close()
    again = Kit(wiki.url, folder)  # the restart: the same files
    try:
        report = again.follower.poll()
        assert "Second words." in str(again.concepts()[f"Main/{page}"]["text"])
        assert again.state.cursor(again.follower.key) == report.cursor > cursor
        # acknowledged before the stop: the manifest may not know it; sent again or not, the
        # state is the same, and a further poll sends nothing new
        assert again.follower.poll().sent.upserted == 0
    finally:
        again.close()


def test_the_cli_follows_with_signed_deliveries(wiki: Wiki, tmp_path: Path) -> None:
    wiki.edit("Signed target", "Linked to.")
    wiki.edit("Signed page", "Sent by the follower, signed. See [[signed_target]].")
    with running(served_config(tmp_path)) as url:
        env = {**os.environ, SECRET_ENV: SECRET}
        command = [
            sys.executable, "-m", "kbgraph", "sync", "--mediawiki", wiki.url, "--kb", KB,
            "--url", url, "--manifest", str(tmp_path / "manifest.sqlite"),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "read the whole wiki" in done.stdout
        got = httpx.get(
            f"{url}/v1/kbs/{KB}/concepts/Main/Signed page",
            headers=bearer(ADMIN),
            timeout=10,
        )
        assert got.status_code == 200, got.text
        assert got.json()["links"] == ["Main/Signed target"]
        again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert again.returncode == 0, again.stderr
        assert "sent 0 upserts and 0 deletes" in again.stdout
        unsigned = subprocess.run(
            command, capture_output=True, text=True, timeout=300,
            env={k: v for k, v in os.environ.items() if k != SECRET_ENV},
        )  # fmt: skip
        assert unsigned.returncode == 2  # refused before the wiki or the service is asked
        assert f"the webhook secret {SECRET_ENV}: missing" in unsigned.stderr


def test_watch_polls_until_stopped(wiki: Wiki, tmp_path: Path) -> None:
    """``sync --mediawiki --watch --interval``: an edit made while it runs reaches the KB
    without a restart, and a stop ends it within one interval."""
    (tmp_path / "c.toml").write_text('[store]\npath = "kb.db"\n')
    args = build_parser().parse_args([
        "sync", "--mediawiki", wiki.url, "--kb", KB, "--config", str(tmp_path / "c.toml"),
        "--manifest", str(tmp_path / "m.sqlite"), "--watch", "--interval", "0.3", "--quiet",
    ])  # fmt: skip
    stop = threading.Event()
    codes: list[int] = []
    watcher = threading.Thread(target=lambda: codes.append(args.func(args, stop)))
    watcher.start()
    try:
        wiki.edit("Watched page", "Written while the follower watches.")
        deadline = time.monotonic() + 120
        while True:
            with Store(tmp_path / "kb.db") as store:
                if "Main/Watched page" in kb_state(store):
                    break
            assert time.monotonic() < deadline, "the watcher never sent the edit"
            time.sleep(0.3)
    finally:
        stop.set()
        watcher.join(60)
    assert not watcher.is_alive() and codes == [0]


def exists(wiki: Wiki, title: str) -> bool:
    pages = wiki.call("GET", action="query", titles=title)["query"]["pages"]
    return "missing" not in pages[0]


def test_any_sequence_of_changes_ends_where_a_dump_import_does(wiki: Wiki, kit: Kit) -> None:
    """Random (seeded, so the same every run) edits, redirects made and undone, moves with and
    without a redirect, deletions and restorations of a few pages, the follower polling after
    every few: its KB ends equal to a fresh import of the wiki's dump."""
    rng = random.Random(39)
    pool = [f"Seq {name}" for name in ("Alpha", "Beta", "Gamma", "Delta", "Epsilon", "Zeta")]
    deleted: set[str] = set()
    done: list[str] = []
    kit.follower.poll()
    for step in range(24):
        present = [t for t in pool if exists(wiki, t)]
        absent = [t for t in pool if t not in present]
        kind = rng.choice(["edit", "edit", "redirect", "move", "delete", "undelete"])
        if kind == "edit" or not present:
            links = " ".join(f"[[{rng.choice(pool)}]]" for _ in range(rng.randint(0, 3)))
            template = f"{{{{Box|see=[[{rng.choice(pool)}]]}}}}" if rng.random() < 0.5 else ""
            text = f"Step {step}. {links} {template} [[Category:Seq {rng.randint(0, 2)}]]"
            wiki.edit(rng.choice(pool), text)
            done.append("edit")
        elif kind == "redirect":
            source = rng.choice(pool)
            wiki.edit(source, f"#REDIRECT [[{rng.choice([t for t in pool if t != source])}]]")
            done.append("redirect")
        elif kind == "move" and absent:
            params = {"from": rng.choice(present), "to": rng.choice(absent), "reason": "seq"}
            if rng.random() < 0.5:
                params["noredirect"] = "1"
            wiki.write("move", **params)
            done.append("move" + params.get("noredirect", ""))
        elif kind == "delete":
            title = rng.choice(present)
            wiki.write("delete", title=title, reason="seq")
            deleted.add(title)
            done.append("delete")
        elif kind == "undelete" and deleted & set(absent):
            wiki.write("undelete", title=rng.choice(sorted(deleted & set(absent))), reason="seq")
            done.append("undelete")
        if rng.random() < 0.4:
            kit.follower.poll()
    kit.follower.poll()
    assert {"edit", "redirect", "move", "move1", "delete", "undelete"} <= set(done), done
    dump = wiki.dump(kit.folder / "seq-dump.xml")
    other = LocalSink(kit.folder / "seq-dump.db")
    try:
        with Manifest(kit.folder / "seq-manifest.sqlite") as manifest:
            deliver(KB, other, manifest, read_dump(dump).concepts, source=SOURCE, everything=True)
        assert kb_state(other.store) == kit.concepts()
    finally:
        other.close()


KILLED_CHILD = """
import os, sys
from pathlib import Path
from tests.test_mediawiki_live import Kit, KilledAfterSend

class Dies(KilledAfterSend):
    def send(self, kb, events):
        self.inner.send(kb, events)  # acknowledged by the store...
        os._exit(137)  # ...and the process dies at once: no finally, no cleanup

kit = Kit(sys.argv[1], Path(sys.argv[2]))
kit.follower.sink = Dies(kit.sink, deliver_first=True)
kit.follower.poll()
"""


def test_a_process_killed_after_an_acknowledged_delivery_loses_nothing(
    wiki: Wiki, tmp_path: Path
) -> None:
    """The follower's process dies (``os._exit``: nothing runs after it, as after SIGKILL)
    right after the store acknowledged a delivery, before the cursor is written."""
    folder = tmp_path / "follower"
    kit = Kit(wiki.url, folder)
    kit.follower.poll()
    cursor = kit.state.cursor(kit.follower.key)
    kit.close()
    time.sleep(1.1)
    wiki.edit("Killed page", "Written before the kill.")
    child = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, wiki.url, str(folder)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 137, child.stderr
    again = Kit(wiki.url, folder)
    try:
        assert again.state.cursor(again.follower.key) == cursor
        assert "Written before the kill." in str(again.concepts()["Main/Killed page"]["text"])
        report = again.follower.poll()
        assert report.cursor > str(cursor)
        assert "Written before the kill." in str(again.concepts()["Main/Killed page"]["text"])
    finally:
        again.close()
