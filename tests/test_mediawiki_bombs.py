"""Issue 48, case 3: a few KB of dump (or one page of a live wiki) that would cost gigabytes.

Memory is measured in a subprocess, as the growth of the command's peak RSS over a benign
dump's (or wiki's), never as a fixed peak. The bombs are bz2 files of concatenated streams
(``tests/hostile_wiki.py``), so a test writes 300 MB of XML without compressing it.
"""

from __future__ import annotations

import bz2
import sys
from pathlib import Path

from kbgraph.events import MAX_LINKS
from kbgraph.sources.mediawiki.titles import Namespace, Namespaces, Title
from kbgraph.sources.mediawiki.wikitext import MAX_MARKUP, markup, parse
from tests.hostile_wiki import HEAD, FakeWiki, bomb, concepts, page, sync
from tests.peak_rss import peak_rss_of
from tests.support import HANG_GUARD

SPACES = Namespaces([Namespace(0, ""), Namespace(14, "Category")])
# growth of the peak RSS over a benign run: a page read whole before it is skipped (20 MB) or
# a 2 MB page parsed in parts fit in it; mwparserfromhell's tree of either would not (2.9 GB
# and 490 MB before)
PEAK_GROWTH_BOUND = 200 << 20


def imported(dump: Path, folder: Path, *more: str) -> tuple[int, int, str]:
    folder.mkdir(exist_ok=True)
    (folder / "c.toml").write_text('[store]\npath = "kb.db"\n')
    command = [sys.executable, "-m", "kbgraph", "import", "--mediawiki-dump", str(dump),
               "--kb", "wiki", "--config", str(folder / "c.toml"),
               "--manifest", str(folder / "m.sqlite"), *more]  # fmt: skip
    return peak_rss_of(command, HANG_GUARD)


def benign(tmp_path: Path) -> int:
    dump = tmp_path / "benign.xml.bz2"
    dump.write_bytes(bz2.compress((HEAD + page("Good", "A [[Bomb]].") + "</mediawiki>").encode()))
    code, peak, output = imported(dump, tmp_path / "benign")
    assert code == 0, output
    return peak


def test_a_small_bz2_holding_20_mb_of_link_soup_is_skipped_unparsed(tmp_path: Path) -> None:
    baseline = benign(tmp_path)
    soup = "ab [[X]] " * ((1 << 20) // 9)  # ~1 MB a stream, 20 streams
    dump = bomb(tmp_path / "soup.xml.bz2", HEAD + page("Good", "A [[Bomb]].") +
                page("Bomb", "", 2)[:-len("</text></revision></page>")], soup, 20,
                "</text></revision></page></mediawiki>")  # fmt: skip
    assert dump.stat().st_size < 8000
    code, peak, output = imported(dump, tmp_path / "soup")
    assert code == 0, output
    assert "warning Bomb: over 2097152 bytes of wikitext (--max-page-bytes): not imported" in (
        output
    )
    assert "Traceback" not in output
    assert concepts(tmp_path / "soup" / "kb.db") == {"Main/Good": "A Bomb."}
    assert peak - baseline < PEAK_GROWTH_BOUND, (peak, baseline)


def test_a_dump_expanding_to_300_mb_stops_cleanly(tmp_path: Path) -> None:
    """One page of 300 MB (the parser would hold it whole), and 300 MB of blanks after a page
    (held whole too, as the page element's tail): both stop at the XML window."""
    baseline = benign(tmp_path)
    blanks = bomb(tmp_path / "blank.xml.bz2", HEAD + page("Good", "x"), " " * (1 << 20), 300,
                  "</mediawiki>")  # fmt: skip
    code, peak, output = imported(blanks, tmp_path / "blank")
    assert code == 1 and "blank.xml.bz2: over 33554432 bytes of XML" in output, output
    assert peak - baseline < PEAK_GROWTH_BOUND, (peak, baseline)
    soup = "ab [[X]] " * ((1 << 20) // 9)
    opened = HEAD + page("Bomb", "", 1)[: -len("</text></revision></page>")]
    dump = bomb(tmp_path / "big.xml.bz2", opened, soup, 300,
                "</text></revision></page></mediawiki>")  # fmt: skip
    assert dump.stat().st_size < 40_000
    code, peak, output = imported(dump, tmp_path / "big")
    assert code == 1, output
    assert (
        "big.xml.bz2: over 33554432 bytes of XML without a revision's end (16 times"
        " --max-page-bytes): stopped, nothing sent" in output
    )
    assert "Traceback" not in output
    assert peak - baseline < PEAK_GROWTH_BOUND, (peak, baseline)
    assert concepts(tmp_path / "big" / "kb.db") == {}


def test_a_dump_past_its_total_bound_stops_cleanly(tmp_path: Path) -> None:
    """300 MB of pages, each within the bounds (the same stylesheet page again and again, not
    parsed): the total bound stops the import."""
    css = page("Same.css", "a { color: red; }\n" * 3500).replace("wikitext", "css") + "\n"
    dump = bomb(tmp_path / "many.xml.bz2", HEAD, css * ((1 << 20) // len(css)), 300,
                "</mediawiki>")  # fmt: skip
    code, _, output = imported(dump, tmp_path / "many", "--max-dump-bytes", "50000000")
    assert code == 1, output
    assert "many.xml.bz2: over 50000000 bytes once decompressed (--max-dump-bytes)" in output
    assert "Traceback" not in output
    code, _, output = imported(dump, tmp_path / "many", "--max-dump-bytes", "0")
    assert code == 2 and "--max-dump-bytes: expected a number of bytes above 0" in output


def test_a_2_mb_page_of_templates_is_followed_in_bounded_memory(tmp_path: Path) -> None:
    honest = FakeWiki(pages={"Good": "A [[B]]."})
    (tmp_path / "honest").mkdir()
    with honest.serve() as url:
        code, baseline, output = peak_rss_of(sync(url, tmp_path / "honest"), HANG_GUARD)
    assert code == 0, output
    soup = "{{x|[[B]]}}" * (2_000_000 // 11)
    wiki = FakeWiki(pages={"Good": "A [[B]].", "Soup": soup, "Huge": "x" * (3 << 20)})
    with wiki.serve() as url:
        code, peak, output = peak_rss_of(sync(url, tmp_path), HANG_GUARD)
    assert code == 0, output
    assert "warning Huge: over 2097152 bytes of wikitext (--max-page-bytes): not imported" in (
        output
    )
    held = concepts(tmp_path / "kb.db")
    assert set(held) == {"Main/Good", "Main/Soup"}
    assert peak - baseline < PEAK_GROWTH_BOUND, (peak, baseline)


def test_a_page_parsed_in_parts_reads_as_a_whole_one_would() -> None:
    """Over ``MAX_MARKUP``, a page is parsed in parts cut at line ends: what no cut splits
    (here every line) reads the same, in order; links past ``MAX_LINKS`` are cut and said."""
    lines = [f"Line {i} of [[Page {i % 1000}|the page]] and ''more'' [[Category:C{i % 3}]]"
             for i in range(8_000)]  # fmt: skip
    text = "\n".join(lines)
    assert markup(text) > MAX_MARKUP
    fields = parse(text, SPACES)
    assert fields.links == [Title(0, f"Page {i}") for i in range(1000)]
    assert fields.categories == ["C0", "C1", "C2"] and not fields.links_cut
    shown = [line.rstrip() for line in fields.text.splitlines()]
    assert shown[:2] == ["Line 0 of the page and more", "Line 1 of the page and more"]
    assert len(shown) == 8_000
    many = "\n".join(f"[[P{i}]]" for i in range(MAX_LINKS + 500))
    cut = parse(many, SPACES)
    assert len(cut.links) == MAX_LINKS and cut.links_cut
    small = parse("\n".join(f"[[P{i}]]" for i in range(MAX_LINKS + 5)), SPACES)
    assert len(small.links) == MAX_LINKS and small.links_cut  # parsed whole: the same cut
