"""Parsing on several processes (issue 26) changes nothing: the same notes, links, warnings
and skips, in the same order, as parsing in the importing process; the parse cache is filled
alike."""

from __future__ import annotations

from pathlib import Path

from kbgraph.vault.reader import PARALLEL_MIN_NOTES, parse_all, read_vault


def write_vault(root: Path, n: int) -> None:
    for i in range(n):
        folder = root / f"f{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        status = ["active", "draft", "bogus"][i % 3]
        body = (
            f"---\ntitle: Note {i}\nstatus: {status}\ntags: [t{i % 5}, shared]\n---\n"
            f"# Heading {i}\n\nSee [[Note {(i * 7) % n}]] and [[f{i % 3}/n{i + 1}|x]]"
            f" #inline{i % 4}"
            f" and [[missing {i % 9}]] ![[img{i % 2}.png]]\n"
        )
        if i % 50 == 0:
            body = "same content\n"  # identical files share one parse
        (folder / f"n{i}.md").write_text(body, encoding="utf-8")
    (root / "img0.png").write_bytes(b"png")
    (root / "bad.md").write_bytes(b"\xff\xfe not utf-8")


def test_parallel_read_equals_serial(tmp_path: Path) -> None:
    n = PARALLEL_MIN_NOTES + 60
    write_vault(tmp_path, n)
    serial_cache: dict = {}
    parallel_cache: dict = {}
    serial = read_vault(tmp_path, serial_cache, workers=1)
    parallel = read_vault(tmp_path, parallel_cache, workers=2)
    assert len(serial.notes) == n
    assert list(serial.notes) == list(parallel.notes)
    assert serial.notes == parallel.notes
    assert serial.skipped == parallel.skipped and serial.skipped  # bad.md is reported
    assert serial.warnings == parallel.warnings and serial.warnings
    assert serial.unreadable == parallel.unreadable
    assert serial.attachments == parallel.attachments
    assert serial_cache == parallel_cache


def test_parse_all_keeps_the_order() -> None:
    sources = [f"---\ntitle: t{i}\n---\n[[a{i}]] #tag{i}\n" for i in range(PARALLEL_MIN_NOTES)]
    assert parse_all(sources, workers=2) == parse_all(sources, workers=1)
    assert [f.title for f in parse_all(sources, workers=2)] == [
        f"t{i}" for i in range(len(sources))
    ]
