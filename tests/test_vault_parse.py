"""The vault reader: markdown structure, front matter, every link form, Obsidian's resolution,
attachments, ids from paths (NFC, bad paths skipped)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.sources.vault.markdown import OUTLINE_PARSER, LinkRef, inline_tags, parse
from kbgraph.sources.vault.reader import read_vault
from kbgraph.sources.vault.resolve import Resolver
from tests.vault_files import write_vault


def links_of(root: Path, note: str) -> list[str]:
    return read_vault(root).notes[note].data.links


def test_code_never_yields_links_tags_or_a_title(tmp_path: Path) -> None:
    write_vault(tmp_path, {"Setup.md": (
        "```bash\n# not a title\necho [[InFence]] #infence\n```\n\n"
        "    [[Indented]] #indented\n\n"
        "Run `[[Inline]]` and `#inline`, then see [[Real]] #real.\n"
        "<div>[[InHtml]]</div>\n"
    )})  # fmt: skip
    note = read_vault(tmp_path).notes["Setup"]
    assert note.data.title == "Setup"
    assert note.data.links == ["Real"]
    assert note.data.tags == ["real"]
    assert "[[InFence]]" in note.data.text  # the body is kept whole for search


def test_every_wikilink_form() -> None:
    parsed = parse(
        "[[a]] [[b|label]] [[c#Heading]] [[d#^block1]] ![[e]] ![[f|300]] [[g.md]] [[#local]]\n"
        "\n| col | col |\n|---|---|\n| [[h\\|in a table]] | x |\n"
    )
    assert [(link.target, link.embed) for link in parsed.links] == [
        ("a", False), ("b", False), ("c", False), ("d", False), ("e", True), ("f", True),
        ("g.md", False), ("", False), ("h", False),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("front", "title", "aliases", "tags", "status", "warned"),
    [
        ("", "Note", [], [], "", False),
        ("---\n---\n", "Note", [], [], "", False),
        ("---\ntitle: Real Title\naliases: [One, Two]\ntags: [x, '#y']\nstatus: active\n---\n",
         "Real Title", ["One", "Two"], ["x", "y"], "active", False),
        ("---\ntitle: 2024\nalias: Solo, Other\ntags: a, b c\n---\n",
         "2024", ["Solo", "Other"], ["a", "b", "c"], "", False),
        ("---\ntag: '#single'\nstatus: wip\n---\n", "Note", [], ["single"], "", True),
        ("---\ntitle: [unclosed\n---\n", "Note", [], [], "", True),
        ("---\n- a list\n---\n", "Note", [], [], "", True),
        ("---\ntitle:\naliases:\ntags:\n---\n", "Note", [], [], "", False),
    ],
)  # fmt: skip
def test_front_matter_variants(
    tmp_path: Path, front: str, title: str, aliases: list[str], tags: list[str], status: str,
    warned: bool,
) -> None:  # fmt: skip
    write_vault(tmp_path, {"Note.md": front + "Body text.\n"})
    read = read_vault(tmp_path)
    data = read.notes["Note"].data
    assert (data.title, data.aliases, data.tags, data.status) == (title, aliases, tags, status)
    assert data.text == "Body text.\n"  # the body without the front matter
    assert bool(read.warnings) == warned


def test_type_and_inline_tags_join_front_matter_tags(tmp_path: Path) -> None:
    write_vault(tmp_path, {"n.md": (
        "---\ntype: Runbook\ntags: [ops]\n---\n## Restore #ops #wip\n"
        "Text #net/vlan and #2024 and a#b and (#paren).\n"
    )})  # fmt: skip
    data = read_vault(tmp_path).notes["n"].data
    assert data.type == "Runbook"
    assert data.tags == ["ops", "wip", "net/vlan"]


def test_markdown_links_relative_percent_encoded_and_urls(tmp_path: Path) -> None:
    write_vault(tmp_path, {
        "guides/start.md": (
            "[up](../Top%20Note.md) [side](peer.md#part) [abs](/guides/deep/x.md) "
            "[angle](<deep/x.md>) [web](https://example.com/a.md) [mail](mailto:a@b.c) "
            "[pic](img.png) [new](new%20page.md)"
        ),
        "guides/peer.md": "",
        "guides/deep/x.md": "",
        "Top Note.md": "",
    })  # fmt: skip
    assert links_of(tmp_path, "guides/start") == [
        "Top Note", "guides/peer", "guides/deep/x", "guides/new page",
    ]  # fmt: skip


def test_resolution_as_obsidian() -> None:
    notes = ["Router", "a/b/x", "c/x", "net/Switch", "y/Switch", "z/deep/Switch", "Café"]
    resolver = Resolver(notes, ["assets/diagram.PNG", "files/data.csv"])

    def target(text: str, source: str = "Router") -> tuple[str | None, bool, bool]:
        found = resolver.resolve(LinkRef(text), source)
        return found.target, found.resolved, found.attachment

    assert target("router") == ("Router", True, False)  # case-insensitive
    assert target("x") == ("c/x", True, False)  # the shortest path of that name
    assert target("b/x") == ("a/b/x", True, False)  # a path suffix
    assert target("A/B/X") == ("a/b/x", True, False)  # the exact path, any case
    assert target("switch") == ("net/Switch", True, False)  # shortest, then smallest path
    assert target("Cafe\u0301") == ("Café", True, False)  # NFD target, NFC id
    assert target("net/Switch.md") == ("net/Switch", True, False)
    for attachment in ["diagram.png", "assets/diagram.png", "doc.pdf", "board.canvas", "data.csv"]:
        assert target(attachment) == (None, True, True), attachment
    assert target(" Not Yet.md ") == ("Not Yet", False, False)  # kept as written, normalised
    assert target("v1.2 release") == ("v1.2 release", False, False)  # a dot is not an extension


def test_aliases_are_not_link_targets(tmp_path: Path) -> None:
    write_vault(tmp_path, {
        "DNS.md": "---\naliases: [Pi-hole]\n---\n",
        "Router.md": "[[Pi-hole]] [[dns]]",
    })  # fmt: skip
    read = read_vault(tmp_path)
    assert read.notes["Router"].data.links == ["Pi-hole", "DNS"]
    assert read.notes["Router"].unresolved == 1


def test_attachments_are_not_concepts(tmp_path: Path) -> None:
    write_vault(tmp_path, {
        "n.md": "![[photo.jpg]] [[Board.canvas]] ![[scan.pdf]] [[notes.txt]] ![](img/x.png)",
        "photo.jpg": b"\xff\xd8", "Board.canvas": "{}", "scan.pdf": b"%PDF", "notes.txt": "x",
    })  # fmt: skip
    read = read_vault(tmp_path)
    assert set(read.notes) == {"n"}
    assert read.notes["n"].data.links == []
    assert read.attachments == 5


def test_ignored_folders_and_editor_files(tmp_path: Path) -> None:
    write_vault(tmp_path, {
        "keep.md": "", ".obsidian/workspace.md": "", ".trash/old.md": "", ".hidden/x.md": "",
        ".keep.md.swp": "", ".#keep.md": "", "keep.md~": "", "sub/.git/y.md": "",
    })  # fmt: skip
    assert set(read_vault(tmp_path).notes) == {"keep"}


def test_nfd_file_names_become_nfc_ids_and_twins_are_skipped(tmp_path: Path) -> None:
    nfd = unicodedata.normalize("NFD", "Café")
    write_vault(tmp_path, {f"menu/{nfd}.md": "[[café]]", "links.md": "[[Café]]"})
    read = read_vault(tmp_path)
    assert set(read.notes) == {"menu/Café", "links"}
    assert read.notes["links"].data.links == ["menu/Café"]
    assert read.notes["menu/Café"].data.title == "Café"
    write_vault(tmp_path, {"menu/Café.md": "twin"})  # the NFC spelling beside the NFD one
    twins = read_vault(tmp_path)
    assert len(twins.skipped) == 1 and "NFC/NFD twins" in twins.skipped[0][1]
    assert "menu/Café" in twins.notes


def test_a_bad_path_is_reported_and_skipped(tmp_path: Path) -> None:
    long_path = "/".join(["x" * 250, "y" * 250, "z" * 20]) + ".md"  # each name fits the disk
    write_vault(tmp_path, {"bad\x01name.md": "[[good]]", "good.md": "", long_path: ""})
    read = read_vault(tmp_path)
    assert set(read.notes) == {"good"}
    whys = sorted(why for _, why in read.skipped)
    assert whys == ["invalid id from path: control character",
                    "invalid id from path: longer than 512 characters"]  # fmt: skip


def test_unreadable_and_non_utf8_files_are_reported(tmp_path: Path) -> None:
    write_vault(tmp_path, {"ok.md": "", "latin.md": b"caf\xe9"})
    read = read_vault(tmp_path)
    assert set(read.notes) == {"ok"} and read.unreadable == {"latin"}
    assert read.skipped == [("latin.md", "unreadable: UnicodeDecodeError")]


def test_self_links_and_duplicates_carry_nothing(tmp_path: Path) -> None:
    write_vault(tmp_path, {"a.md": "[[a]] [[#top]] [[b]] [[B]] [[b|again]]", "b.md": ""})
    assert links_of(tmp_path, "a") == ["b"]


code_text = st.text(alphabet=st.sampled_from(list("ab #[]|!()^.md\n`")), max_size=80)


@settings(max_examples=150, deadline=None)
@given(
    code=code_text, inline=st.text(alphabet=st.sampled_from(list("ab #[]|!()^.md")), max_size=30)
)
def test_nothing_inside_code_is_a_link_or_a_tag(code: str, inline: str) -> None:
    """Whatever a fenced block or an inline code span holds, it yields no link and no tag."""
    fenced = f"~~~~\n{code}\n~~~~\n"
    spans = "``" + inline.replace("`", "") + "``" if inline.strip("` ") else ""
    parsed = parse(f"Before.\n\n{fenced}\nText {spans} after.\n")
    assert parsed.links == [] and parsed.tags == []


# pieces of markdown whose meaning depends on their neighbours: links, tags, entities, escapes,
# emphasis, code, autolinks, HTML, tables, headings, lists, reference definitions
_PIECES = [
    "a", "b c", " ", "\n", "\n\n", "#", "#tag", "# ", "## ", "[", "]", "[[", "]]", "![[", "|",
    "(", ")", "](x.md)", "[r]: /u\n", "[r]", "<", ">", "<http://e.org>", "<b>", "</b>", "&",
    "&num;", "&#35;", "&#x23;", ";", "\\", "\\#", "*", "_", "~~", "`", "```\n", "- ", "1. ",
    "> ", "    ", "---\n", "| a | b |\n|---|---|\n", "!", ":", "/", "x.png",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_inline_runs_skipped_hold_no_link_and_no_tag(source: str) -> None:
    """The parser skips inline runs without ``[ < # &``: the links, tags and body it finds are
    those of markdown-it parsing every inline run (``OUTLINE_PARSER``, the notes' parser
    without the skip)."""
    assert parse(source) == parse(source, OUTLINE_PARSER)


_PLAIN = [piece for piece in _PIECES if not any(c in piece for c in "[<#&")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PLAIN), max_size=40).map("".join))
def test_a_note_markdown_it_is_not_given_reads_as_if_it_were(source: str) -> None:
    """A note without front matter and without ``[ < # &`` is not parsed: what it yields is
    what markdown-it parsing every inline run of it yields (front matter when it opens with
    ``---``, which the pieces can draw); ``OUTLINE_PARSER`` is the one that parses them all."""
    assert parse(source) == parse(source, OUTLINE_PARSER)


def tags_by_hand(text: str) -> list[str]:
    """The inline tag rule read character by character (the oracle): a ``#`` at the start or
    after whitespace, then the longest run of word characters (``str.isalnum``, ``_``), ``/``
    and ``-``; the scan goes on after the run; a run of digits alone is no tag."""
    tags, at = [], 0
    while at < len(text):
        end = at + 1
        if text[at] == "#" and (at == 0 or text[at - 1].isspace()):
            while end < len(text) and (text[end].isalnum() or text[end] in "_/-"):
                end += 1
            tag = text[at + 1 : end]
            if tag and not tag.isdigit():
                tags.append(tag)
        at = end
    return tags


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="#a1_/-é٣ \t\n\u2003\u00a0.,x(", max_size=30))
def test_inline_tags_follow_the_rule(text: str) -> None:
    """A tag opens after whitespace (any kind) or at the start; ``a#b``, ``##a`` are none."""
    assert inline_tags(text) == tags_by_hand(text)


def test_inline_tags_examples() -> None:
    assert inline_tags("#a x#b #c/d-e_1 ##f #12 #1a\u2003#g\t#h.") == [
        "a",
        "c/d-e_1",
        "1a",
        "g",
        "h",
    ]


def test_dendron_cross_vault_links_resolve(tmp_path: Path) -> None:
    """Dendron's ``dendron://<vault>/<note>`` target, alone or after a label (Dendron writes
    ``[[label|target]]``), names the note; the vault name carries nothing here."""
    root = write_vault(
        tmp_path / "v",
        {
            "dendron.topic.pods.md": "pods",
            "dendron.topic.vaults.md": "vaults",
            "root.md": (
                "[[Create New Vault|dendron://dendron.dendron-site/dendron.topic.vaults#create]]"
                " [[dendron://dendron.dendron-site/dendron.topic.pods#hovers,1]]"
                " [[dendron://other.vault/Dendron.Topic.Pods]] [[x|dendron://v/missing.note]]"
            ),
        },
    )
    read = read_vault(root)
    assert read.notes["root"].data.links == [
        "dendron.topic.vaults", "dendron.topic.pods", "missing.note",
    ]  # fmt: skip
    assert read.unresolved == 1 and read.warnings == []
