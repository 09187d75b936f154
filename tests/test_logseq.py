"""Issue 39, part 1: a Logseq graph folder read with Logseq's rules, on graphs written here.

Names (``title::``, the two file-name formats of config.edn, journals), case-insensitive
resolution, aliases, tags, block properties kept out of the text, block references and
embeds, the summary's count of what resolved each reference; the vault's guarantees (a sync
equals a fresh import, a hostile graph bounded, ``--watch``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.sources.command import run_command
from kbgraph.sources.logseq.reader import (
    BY_ALIAS,
    BY_BLOCK,
    BY_CASE,
    BY_FILE_NAME,
    BY_JOURNAL,
    BY_NAMESPACE,
    BY_TITLE,
    CONFIG_PATH,
    TO_NO_BLOCK,
    TO_NO_PAGE,
    GraphConfig,
    format_date,
    is_graph,
    journal_date,
    page_name,
    parse_config,
    read_graph,
)
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import sync_once
from kbgraph.store import Store
from tests.vault_files import fresh_import, state, versions, write_vault

TRI_LB = "{:meta/version 1\n ;; a comment\n :file/name-format :triple-lowbar}\n"
LEGACY = "{:meta/version 1}\n"  # no :file/name-format: Logseq reads the graph as legacy
BLOCK = "6650a1b2-0000-4000-8000-000000000001"

GRAPH = {
    CONFIG_PATH: TRI_LB,
    "pages/Network.md": (
        "alias:: LAN, Home network\n"
        "tags:: infra, [[Core services]]\n"
        "type:: [[Area]]\n"
        "\n"
        "- The [[router]] and the [[Switch/Core]] carry everything.\n"
        f"  id:: {BLOCK}\n"
        "- See [[Backups Page]] and #dns and #[[Not Yet Written]]\n"
        "- `[[In Code]]` is not a link\n"
    ),
    "pages/Router.md": f"- Routes for [[lan]] (({BLOCK}))\n",
    "pages/Switch___Core.md": "- Core switch, see {{embed [[Network]]}}\n",
    "pages/backups.md": (
        f"title:: Backups Page\n\n- Nightly, {{{{embed (({BLOCK}))}}}} and [[Jan 31st, 2024]]\n"
    ),
    "pages/DNS.md": "- Resolver for [[Home network]] ((00000000-0000-4000-8000-00000000dead))\n",
    "journals/2024_01_31.md": "- Replaced the [[ROUTER]] #dns\n  collapsed:: true\n",
    "pages/Notes.org": "* an Org-mode page\n",
    "logseq/bak/pages/Old.md": "- a backup Logseq keeps: not a page\n",
}


def test_file_names_decode_as_logseq_decodes_them() -> None:
    assert page_name("Whiteboard___Object", "triple-lowbar") == "Whiteboard/Object"
    assert page_name("New to Logseq%3F", "triple-lowbar") == "New to Logseq?"
    assert page_name("Global config.edn", "triple-lowbar") == "Global config.edn"
    assert page_name("caf%C3%A9", "triple-lowbar") == "caf%C3%A9"  # each escape alone
    assert page_name("a______b", "triple-lowbar") == "a/b"  # no empty namespace
    assert page_name("Logseq%2FFeatures", "legacy") == "Logseq/Features"
    assert page_name("Logseq.Features", "legacy") == "Logseq/Features"
    assert page_name("Global config.edn", "legacy") == "Global config/edn"
    assert page_name("caf%C3%A9", "legacy") == "café"
    assert page_name("100%", "legacy") == "100%"  # decodeURIComponent would throw
    assert page_name("A___B", "legacy") == "A___B"


def test_journal_dates_and_titles() -> None:
    date = datetime.date(2024, 1, 31)
    assert journal_date("2024_01_31", "yyyy_MM_dd") == date
    assert journal_date("2024-1-31", "yyyy-M-d") == date
    assert journal_date("2024_02_30", "yyyy_MM_dd") is None
    assert journal_date("notes", "yyyy_MM_dd") is None
    assert format_date("MMM do, yyyy", date) == "Jan 31st, 2024"
    assert format_date("EEEE, MMMM do 'of' yy", date) == "Wednesday, January 31st of 24"
    assert format_date("yyyy/MM/dd", datetime.date(2023, 3, 2)) == "2023/03/02"
    assert [format_date("do", datetime.date(2024, 1, d)) for d in (1, 2, 3, 4, 11, 12, 13, 22)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "22nd",
    ]  # fmt: skip


def test_config_edn_is_read_with_an_edn_parser() -> None:
    assert parse_config(TRI_LB) == GraphConfig(name_format="triple-lowbar")
    assert parse_config(LEGACY) == GraphConfig(name_format="legacy")
    custom = '{:journal/page-title-format "yyyy-MM-dd" :journal/file-name-format "yyyy.MM.dd"}'
    assert parse_config(custom) == GraphConfig("legacy", "yyyy-MM-dd", "yyyy.MM.dd")
    # a keyword in a string or a comment is not the key (a regex would take it)
    assert parse_config('{:x ":file/name-format :triple-lowbar"}').name_format == "legacy"
    assert parse_config("{:a").startswith("not valid EDN")
    assert parse_config("#weird 1").startswith("not valid EDN")
    assert parse_config("[1 2]") == "not an EDN map"


def test_a_graph_is_read_with_logseqs_rules(tmp_path: Path) -> None:
    root = write_vault(tmp_path / "graph", GRAPH)
    assert is_graph(root) and not is_graph(tmp_path)
    read = read_graph(root)
    data = {nid: note.data for nid, note in read.notes.items()}
    assert sorted(data) == [
        "Backups Page", "DNS", "Network", "Router", "Switch/Core", "journals/2024-01-31",
    ]  # fmt: skip
    net = data["Network"]
    assert (net.title, net.aliases, net.type) == ("Network", ["LAN", "Home network"], "Area")
    # tags:: first, then each page referenced that has no file, as first written
    assert net.tags == ["infra", "Core services", "Area", "Not Yet Written"]
    assert net.links == ["Router", "Switch/Core", "Backups Page", "DNS"]
    assert net.text == (
        "- The [[router]] and the [[Switch/Core]] carry everything.\n"
        "- See [[Backups Page]] and #dns and #[[Not Yet Written]]\n"
        "- `[[In Code]]` is not a link"
    )  # properties out, the code's link not a reference
    assert data["Router"].links == ["Network"]  # [[lan]] by alias, ignoring case; ((uuid))
    assert data["Switch/Core"].links == ["Network"]  # {{embed [[page]]}}
    assert data["Backups Page"].links == ["journals/2024-01-31", "Network"]
    assert data["DNS"].links == ["Network"]  # a reference to no block is dropped
    journal = data["journals/2024-01-31"]
    assert (journal.title, journal.type, journal.links) == (
        "Jan 31st, 2024",
        "journal",
        ["Router", "DNS"],
    )
    assert journal.text == "- Replaced the [[ROUTER]] #dns"
    assert read.resolved_by == {
        BY_FILE_NAME: 1, BY_NAMESPACE: 1, BY_TITLE: 1, BY_JOURNAL: 1, BY_ALIAS: 1, BY_CASE: 5,
        BY_BLOCK: 2, TO_NO_PAGE: 3, TO_NO_BLOCK: 1,
    }  # fmt: skip
    assert read.unresolved == 0
    assert read.skipped == [
        ("pages/Notes.org", "Org-mode page: not read (only Markdown pages are)")
    ]


def test_legacy_names_and_name_clashes(tmp_path: Path) -> None:
    root = write_vault(
        tmp_path / "graph",
        {
            CONFIG_PATH: LEGACY,
            "pages/Logseq%2FFeatures.md": "- [[logseq/plans]] [[New to Logseq?]]",
            "pages/Logseq.Plans.md": "- plans",
            "pages/New to Logseq%3F.md": "- welcome",
            "pages/A___B.md": "- kept as written: three low bars mean nothing in legacy",
            "pages/notes.md": "- one",
            "pages/Other.md": "title:: NOTES\n\n- a second page called notes",
        },
    )
    read = read_graph(root)
    assert sorted(read.notes) == ["A___B", "Logseq/Features", "Logseq/Plans", "NOTES",
                                  "New to Logseq?"]  # fmt: skip
    assert read.notes["Logseq/Features"].data.links == ["Logseq/Plans", "New to Logseq?"]
    # two files, one page name: the first path (by code point) has it
    assert read.skipped == [("pages/notes.md", "same page name as 'pages/Other.md' (names "
                                               "ignore case)")]  # fmt: skip


PAGES = ["pages/Router.md", "pages/router.md", "pages/Switch___Core.md", "pages/DNS.md",
         "journals/2024_01_31.md", "pages/Café.md"]  # fmt: skip
BODIES = [
    "",
    "- [[Router]] and [[switch/core]] #dns",
    f"title:: Named\nalias:: Router, Other\n\n- [[Other]] (({BLOCK}))",
    f"- block\n  id:: {BLOCK}\n- [[Jan 31st, 2024]] {{{{embed [[Named]]}}}}",
    "alias:: DNS\ntags:: x\n- [[Nowhere]] `[[Code]]` [[CAFÉ]]",
]
op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PAGES), st.sampled_from(BODIES)),
    st.tuples(st.just("delete"), st.sampled_from(PAGES)),
    st.tuples(st.just("rename"), st.sampled_from(PAGES), st.sampled_from(PAGES)),
    st.tuples(st.just("config"), st.sampled_from([TRI_LB, LEGACY, "{:a"])),
    st.tuples(st.just("sync")),
)


def apply(root: Path, action: tuple) -> None:
    if action[0] == "write":
        write_vault(root, {action[1]: action[2]})
    elif action[0] == "config":
        write_vault(root, {CONFIG_PATH: action[1]})
    elif action[0] == "delete":
        (root / action[1]).unlink(missing_ok=True)
    elif action[0] == "rename":
        source, target = root / action[1], root / action[2]
        if source.exists() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            source.rename(target)


@settings(max_examples=30, deadline=None)
@given(actions=st.lists(op, max_size=14))
def test_sync_equals_a_fresh_import(actions: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = write_vault(Path(tmp) / "graph", {CONFIG_PATH: TRI_LB, "pages/Start.md": "- go"})
        sink = LocalSink(Path(tmp) / "synced.db")
        try:
            with Manifest.for_vault(root) as manifest:
                seen: dict[str, int] = {}
                for action in [*actions, ("sync",)]:
                    if action[0] != "sync":
                        apply(root, action)
                        continue
                    report = sync_once(root, "kb", sink, manifest)
                    assert all(stale == 0 for _, _, stale in report.results)
                    now = versions(sink.store)
                    assert all(now[cid] > seen[cid] for cid in now.keys() & seen.keys()
                               if now[cid] != seen[cid])  # fmt: skip
                    seen.update(now)
                synced = state(sink.store)
                again = sync_once(root, "kb", sink, manifest)  # nothing changed: nothing sent
                assert (again.upserted, again.deleted) == (0, 0)
        finally:
            sink.close()
        assert synced == fresh_import(root, Path(tmp) / "fresh.db")


def _args(root: Path, config: Path, watch: bool) -> argparse.Namespace:
    return argparse.Namespace(
        dir=str(root), kb="kb", config=str(config), url=None, retries=0, quiet=not watch,
        watch=watch, manifest=None, allow_hardlinks=False, report=None,
    )  # fmt: skip


def test_import_summary_counts_each_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_vault(tmp_path / "graph", GRAPH)
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n')
    args = _args(root, config, watch=False)
    args.quiet = False
    assert run_command(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("6 notes, 7 links between them")  # Network-4, journal-3
    assert out[1] == (
        "references resolved by file name 1, namespace or encoded file name 1, title 1,"
        " journal date 1, alias 1, case 5, block reference 2, to a page without a file (a tag)"
        " 3, to no block (dropped) 1"
    )
    with Store(tmp_path / "kb.db") as store:
        assert state(store)["Router"][6] == ["Network"]


def test_watch_follows_a_graph(tmp_path: Path) -> None:
    root = write_vault(tmp_path / "graph", {CONFIG_PATH: TRI_LB, "pages/A.md": "- [[b]]"})
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n')
    stop = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(run_command(_args(root, config, True), stop))
    )
    thread.start()
    try:
        with Store(tmp_path / "kb.db") as store:
            deadline = time.monotonic() + 60

            def wait_for(check: object) -> None:
                while time.monotonic() < deadline:
                    try:
                        if check(state(store)):  # type: ignore[operator]
                            return
                    except KeyError:
                        pass
                    time.sleep(0.1)

            wait_for(lambda s: s["A"][4] == ["b"])
            assert state(store)["A"][4:7:2] == (["b"], [])  # no page b yet: a tag
            # a page named b by its alias appears: A's reference becomes a link to it
            write_vault(root, {"pages/Bee.md": "alias:: B\n\n- here"})
            wait_for(lambda s: s["A"][6] == ["Bee"])
            assert state(store)["A"][4:7:2] == ([], ["Bee"])
            (root / "pages" / "Bee.md").unlink()
            wait_for(lambda s: "Bee" not in s)
            assert "Bee" not in state(store) and state(store)["A"][4] == ["b"]
    finally:
        stop.set()
        thread.join(60)
    assert codes == [0]


def test_a_hostile_graph_is_bounded(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.edn").write_text(TRI_LB)
    (outside / "secret.md").write_text("SECRET")
    (outside / "folder").mkdir()
    (outside / "folder" / "x.md").write_text("SECRET")
    root = write_vault(tmp_path / "graph", {"pages/A___B.md": "- [[a/b]]"})
    (root / "logseq").mkdir()
    (root / CONFIG_PATH).symlink_to(outside / "config.edn")  # not read: defaults (legacy)
    (root / "pages" / "passwd.md").symlink_to("/etc/passwd")
    (root / "pages" / "secret.md").symlink_to(outside / "secret.md")
    os.mkfifo(root / "pages" / "pipe.md")
    (root / "journals").symlink_to(outside / "folder", target_is_directory=True)
    (root / "pages" / b"bad\xff.md".decode(errors="surrogateescape")).write_text("- x")
    read = read_graph(root)
    assert sorted(read.notes) == ["A___B"]
    assert read.warnings[0] == (
        CONFIG_PATH,
        "symlink to a file outside the vault: not read: Logseq's defaults used",
    )
    assert sorted(read.skipped) == [
        ("journals", "symlinked folder: not followed"),
        ("pages/bad\\xff.md", "file name is not valid UTF-8"),
        ("pages/passwd.md", "symlink to a file outside the vault: not read"),
        ("pages/pipe.md", "not a regular file: not read"),
        ("pages/secret.md", "symlink to a file outside the vault: not read"),
    ]
    assert all("SECRET" not in n.data.text for n in read.notes.values())


def test_a_config_past_its_bound_is_not_parsed(tmp_path: Path) -> None:
    soup = "[" * 140_000 + "]" * 140_000  # 280 KB of nesting: PLY's parse would take ~6 s
    root = write_vault(tmp_path / "graph", {CONFIG_PATH: soup, "pages/a.b.md": "- x"})
    read = read_graph(root)
    assert sorted(read.notes) == ["a/b"]  # legacy: the default
    assert read.warnings == [(CONFIG_PATH, "over 262144 bytes: not read: Logseq's defaults used")]


def test_an_unreadable_journal_is_left_as_sent(tmp_path: Path) -> None:
    """A page that cannot be read right now (not UTF-8) is not a deletion: what was sent for
    it stays, a journal under its dated id too."""
    root = write_vault(tmp_path / "graph", {CONFIG_PATH: TRI_LB, "journals/2024_01_31.md": "- x"})
    sink = LocalSink(tmp_path / "kb.db")
    try:
        with Manifest.for_vault(root) as manifest:
            sync_once(root, "kb", sink, manifest)
            assert list(state(sink.store)) == ["journals/2024-01-31"]
            write_vault(root, {"journals/2024_01_31.md": b"- \xff"})
            report = sync_once(root, "kb", sink, manifest)
            assert report.deleted == 0 and list(state(sink.store)) == ["journals/2024-01-31"]
            assert report.read.skipped == [
                ("journals/2024_01_31.md", "unreadable: UnicodeDecodeError")
            ]
    finally:
        sink.close()


# what edn_format raises past its own error type: a ratio over zero, a bad #inst or #uuid
EVALUATION_BOMBS = ("{:a 1/0}", "1/0", '{:a #inst "zzzz"}', '#uuid "x"', "{:b 7/0 :c 1}")


def test_a_config_that_fails_to_evaluate_falls_back_to_the_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for text in EVALUATION_BOMBS:
        assert str(parse_config(text)).startswith("not valid EDN ("), text
    root = write_vault(tmp_path / "graph", {CONFIG_PATH: "{:x 1/0}", "pages/a.b.md": "- x"})
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n')
    args = _args(root, config, watch=False)
    args.quiet = False
    assert run_command(args) == 0
    out = capsys.readouterr().out
    assert f"warning {CONFIG_PATH}: not valid EDN (" in out and "Logseq's defaults used" in out
    with Store(tmp_path / "kb.db") as store:
        assert list(state(store)) == ["a/b"]  # legacy: the default


def test_watch_goes_on_when_config_edn_turns_bad(tmp_path: Path) -> None:
    root = write_vault(tmp_path / "graph", {CONFIG_PATH: TRI_LB, "pages/A.md": "- first"})
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n')
    stop = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(run_command(_args(root, config, True), stop))
    )
    thread.start()
    try:
        with Store(tmp_path / "kb.db") as store:
            deadline = time.monotonic() + 120
            while "A" not in state(store) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "A" in state(store)
            write_vault(root, {CONFIG_PATH: "{:file/name-format :triple-lowbar :x 1/0}"})
            time.sleep(1)  # a pass reads the bad config
            write_vault(root, {"pages/Later.md": "- written after the config broke"})
            while "Later" not in state(store) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "Later" in state(store)
            assert thread.is_alive()
    finally:
        stop.set()
        thread.join(120)
    assert codes == [0]
