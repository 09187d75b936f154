"""MediaWiki without a wiki: title rules, wikitext reading, and dump imports held to the
generator's own model of what it wrote (loadtest/bench_mediawiki_dump.py), an oracle that
never parses wikitext."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from kbgraph.sources.mediawiki.dump import read_dump
from kbgraph.sources.mediawiki.titles import Namespace, Namespaces, Title
from kbgraph.sources.mediawiki.wikitext import parse
from kbgraph.store import Store
from loadtest.bench_mediawiki_dump import generate
from tests.support import cli_without

SPACES = Namespaces(
    Namespace(key, name)
    for key, name in [(0, ""), (4, "Wiki"), (6, "File"), (10, "Template"), (12, "Help"),
                      (14, "Category"), (-1, "Special"), (-2, "Media")]
)  # fmt: skip


def test_titles_are_read_as_mediawiki_reads_them() -> None:
    assert SPACES.parse("help:foo_bar#Usage") == Title(12, "Foo bar")
    assert SPACES.parse("  berlin   wall ") == Title(0, "Berlin wall")
    assert SPACES.parse("Project:About") == Title(4, "About")  # canonical names too
    assert SPACES.parse("Image:X.png") == Title(6, "X.png")
    assert SPACES.parse(":Category:Cities") == Title(14, "Cities")
    assert SPACES.parse("Nope:thing") == Title(0, "Nope:thing")  # not a namespace
    assert SPACES.parse("a&amp;b") == Title(0, "A&b")
    for bad in ("", "#section", "a|b", "a[b", "{x}"):
        assert SPACES.parse(bad) is None
    assert SPACES.concept_id(Title(0, "Foo/Bar")) == "Main/Foo/Bar"  # a subpage: still Main
    assert SPACES.display(Title(12, "Foo bar")) == "Help:Foo bar"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_a_title_read_again_is_the_same_title(written: str) -> None:
    title = SPACES.parse(written)
    if title is not None:
        assert SPACES.parse(SPACES.display(title)) == title


def test_links_categories_and_text_of_a_page() -> None:
    fields = parse(
        "Hello [[berlin|the city]] and {{Infobox|capital=[[Paris]]}} [[Category:Cities|B]]\n"
        "[[File:x.png|thumb|a [[Rome]] caption]] [[:Category:Other]] [[Special:Random]]\n"
        "<nowiki>[[Not a link]]</nowiki> '''bold''' [[Media:y.ogg]]",
        SPACES,
    )
    assert fields.links == [Title(0, "Berlin"), Title(0, "Paris"), Title(0, "Rome"),
                            Title(14, "Other")]  # fmt: skip
    assert fields.categories == ["Cities"]
    assert "the city" in fields.text and "bold" in fields.text
    assert "Cities" not in fields.text and "thumb" not in fields.text and "'''" not in fields.text
    assert "Infobox" not in fields.text


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbgraph", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def state(path: Path) -> dict[str, tuple[list[str], list[str], list[str], str]]:
    with Store(path) as store:
        kbs = store.load().kbs
    concepts = kbs["wiki"].concepts if "wiki" in kbs else []
    return {c.id: (sorted(c.links), c.tags, c.aliases, c.title) for c in concepts}


def test_a_dump_imports_as_its_generator_wrote_it(tmp_path: Path) -> None:
    dump = tmp_path / "wiki.xml.bz2"
    expected = generate(dump, 400)
    (tmp_path / "c.toml").write_text('[store]\npath = "kb.db"\n')
    args = ("--kb", "wiki", "--config", "c.toml")
    done = cli("import", "--mediawiki-dump", str(dump), *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{len(expected.links)} pages, {expected.redirects} redirects" in done.stdout
    held = state(tmp_path / "kb.db")
    assert set(held) == set(expected.links)
    for cid, (links, tags, aliases, title) in held.items():
        assert links == sorted(expected.links[cid]), cid
        assert tags == expected.tags[cid], cid
        assert aliases == sorted(expected.aliases.get(cid, [])), cid
        assert title == cid.split("/", 1)[1] if cid.startswith("Main/") else ":" in title
    again = cli("import", "--mediawiki-dump", str(dump), *args, cwd=tmp_path)
    assert again.returncode == 0 and "sent 0 upserts and 0 deletes" in again.stdout


def test_a_changed_dump_ends_as_a_fresh_import(tmp_path: Path) -> None:
    """Pages gone, redirects changed: the second import of a KB ends where a fresh import of
    the second dump does (deletes included)."""
    first, second = tmp_path / "a.xml", tmp_path / "b.xml"
    generate(first, 300, seed=1)
    generate(second, 200, seed=2)
    (tmp_path / "c.toml").write_text('[store]\npath = "kb.db"\n')
    (tmp_path / "fresh.toml").write_text('[store]\npath = "fresh.db"\n')
    for dump, config, manifest in ((first, "c.toml", "m.sqlite"), (second, "c.toml", "m.sqlite"),
                                   (second, "fresh.toml", "f.sqlite")):  # fmt: skip
        done = cli("import", "--mediawiki-dump", str(dump), "--kb", "wiki", "--config", config,
                   "--manifest", manifest, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert "deletes" in done.stdout
    assert state(tmp_path / "kb.db") == state(tmp_path / "fresh.db")
    assert state(tmp_path / "kb.db").keys() == {c.id for c in read_dump(second).concepts}


def test_a_file_that_is_not_a_dump_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('[store]\npath = "kb.db"\n')
    (tmp_path / "notes.xml").write_text("<html><body>not a wiki</body></html>")
    (tmp_path / "broken.xml.bz2").write_bytes(b"BZh9 certainly not bzip2")
    entities = "".join(
        f'<!ENTITY e{i} "{f"&e{i - 1};" * 10 if i else "x" * 20}">' for i in range(10)
    )  # a billion laughs: 20 GB once expanded, refused by expat's amplification limit
    (tmp_path / "bomb.xml").write_text(
        f"<?xml version='1.0'?><!DOCTYPE m [{entities}]><mediawiki><siteinfo/><page>"
        "<title>Bomb</title><ns>0</ns><id>1</id><revision><id>1</id><text>&e9;</text>"
        "</revision></page></mediawiki>"
    )
    for name in ("notes.xml", "broken.xml.bz2", "bomb.xml"):
        done = cli("import", "--mediawiki-dump", name, "--kb", "wiki", "--config", "c.toml",
                   cwd=tmp_path)  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert f"{name}: not a MediaWiki XML dump" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "kb.db").exists() or state(tmp_path / "kb.db") == {}
    missing = cli("import", "--mediawiki-dump", "nope.xml", "--kb", "wiki", "--config", "c.toml",
                  cwd=tmp_path)  # fmt: skip
    assert missing.returncode == 2 and "nope.xml: no such file" in missing.stderr
    both = cli("import", "x", "--mediawiki-dump", "notes.xml", "--kb", "wiki", "--config",
               "c.toml", cwd=tmp_path)  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr


def test_without_the_extra_the_commands_say_which_to_install(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('[store]\npath = "kb.db"\n')
    (tmp_path / "w.xml").write_text("<mediawiki/>")
    blocked = ["mwxml", "mwparserfromhell"]
    for args in (
        ["import", "--mediawiki-dump", "w.xml", "--kb", "wiki", "--config", "c.toml"],
        ["sync", "--mediawiki", "http://127.0.0.1:9", "--kb", "wiki", "--config", "c.toml"],
    ):
        done = cli_without(args, blocked, tmp_path)
        assert done.returncode == 2, done.stderr
        assert "pip install 'kbgraph[mediawiki]'" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "kb.db").exists() and not (tmp_path / ".kbgraph").exists()


def test_an_unreachable_wiki_or_a_bad_url_is_named(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('[store]\npath = "kb.db"\n')
    done = cli("sync", "--mediawiki", "http://127.0.0.1:9", "--kb", "wiki", "--config", "c.toml",
               "--retries", "0", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "cannot reach http://127.0.0.1:9/api.php" in done.stderr
    assert "Traceback" not in done.stderr
    bad = cli("sync", "--mediawiki", "ftp://x", "--kb", "wiki", "--config", "c.toml",
              cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "expected an http:// or https:// URL" in bad.stderr
