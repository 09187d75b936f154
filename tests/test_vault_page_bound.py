"""``--max-page-bytes`` bounds a folder's notes as it bounds a wiki's pages: a note whose file
is larger is skipped and reported, never read whole nor parsed, and a note sent before that
grew past the bound is deleted, as any note that can no longer be read. Without the flag the
reader's own bound holds; the flag never raises it. A corpus refuses the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbgraph.cli import build_parser
from kbgraph.sources.logseq.reader import read_graph
from kbgraph.sources.vault.reader import MAX_NOTE_BYTES, read_vault
from kbgraph.store import Store

SMALL = "a small note, [[big]]\n"
BIG = "a big note " + "x" * 300 + "\n"  # 312 bytes


def _vault(base: Path) -> Path:
    vault = base / "vault"
    vault.mkdir()
    (vault / "small.md").write_text(SMALL)
    (vault / "big.md").write_text(BIG)
    (base / "kbgraph.toml").write_text('[store]\npath = "kb.db"\n')
    return vault


def _import(base: Path, vault: Path, *more: str) -> int:
    line = ["import", str(vault), "--kb", "kb", "--config", str(base / "kbgraph.toml"), *more]
    args = build_parser().parse_args(line)
    code: int = args.func(args)
    return code


def _texts(base: Path) -> dict[str, str]:
    with Store(base / "kb.db") as store:
        return {c.id: c.text for c in store.load().kbs["kb"].concepts}


def test_a_note_over_the_bound_is_skipped_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vault = _vault(tmp_path)
    assert _import(tmp_path, vault, "--max-page-bytes", "100") == 0
    assert "skipped big.md: over 100 bytes: not read" in capsys.readouterr().out.splitlines()
    assert _texts(tmp_path) == {"small": SMALL}
    # without the flag the reader's own bound: both read, the link now resolved
    assert _import(tmp_path, vault) == 0
    assert _texts(tmp_path) == {"small": SMALL, "big": BIG}


def test_a_note_grown_past_the_bound_is_deleted(tmp_path: Path) -> None:
    vault = _vault(tmp_path)
    assert _import(tmp_path, vault, "--max-page-bytes", "1000") == 0
    assert _texts(tmp_path) == {"small": SMALL, "big": BIG}
    (vault / "big.md").write_text(BIG * 4)  # 1,248 bytes
    assert _import(tmp_path, vault, "--max-page-bytes", "1000") == 0
    assert _texts(tmp_path) == {"small": SMALL}


def test_the_bound_of_exactly_a_note_s_size_reads_it(tmp_path: Path) -> None:
    vault = _vault(tmp_path)
    size = len(BIG.encode())
    assert set(read_vault(vault, max_note_bytes=size).notes) == {"small", "big"}
    read = read_vault(vault, max_note_bytes=size - 1)
    assert set(read.notes) == {"small"}
    assert read.skipped == [("big.md", f"over {size - 1} bytes: not read")]


@pytest.mark.parametrize("given", ["0", "-5"])
def test_a_bound_below_one_byte_is_refused_and_nothing_is_made(
    tmp_path: Path, given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    vault = _vault(tmp_path)
    assert _import(tmp_path, vault, "--max-page-bytes", given) == 2
    assert capsys.readouterr().err.strip() == (
        "kbgraph: --max-page-bytes: expected a number of bytes above 0"
    )
    assert not (tmp_path / "kb.db").exists() and not (vault / ".kbgraph").exists()


def test_the_flag_never_raises_the_reader_s_bound(tmp_path: Path) -> None:
    vault = _vault(tmp_path)
    with (vault / "huge.md").open("wb") as file:  # sparse: no disk spent
        file.truncate(MAX_NOTE_BYTES + 1)
    assert _import(tmp_path, vault, "--max-page-bytes", str(10 * MAX_NOTE_BYTES)) == 0
    assert set(_texts(tmp_path)) == {"small", "big"}


def test_the_parse_workers_hold_the_bound(tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    vault.mkdir()
    for i in range(300):  # over the pool's threshold: read by worker processes
        (vault / f"n{i:03}.md").write_text("short\n" if i % 2 else "long " * 40 + "\n")
    one = read_vault(vault, workers=1, max_note_bytes=100)
    two = read_vault(vault, workers=2, max_note_bytes=100)
    assert set(one.notes) == set(two.notes) == {f"n{i:03}" for i in range(1, 300, 2)}
    assert one.skipped == two.skipped and len(two.skipped) == 150


def test_a_logseq_graph_holds_the_bound(tmp_path: Path) -> None:
    graph = tmp_path / "graph"
    (graph / "logseq").mkdir(parents=True)
    (graph / "logseq" / "config.edn").write_text("{}\n")
    (graph / "pages").mkdir()
    (graph / "pages" / "small.md").write_text("- small\n")
    (graph / "pages" / "big.md").write_text("- " + "y" * 300 + "\n")
    read = read_graph(graph, max_note_bytes=100)
    assert set(read.notes) == {"small"}
    assert ("pages/big.md", "over 100 bytes: not read") in read.skipped


def test_a_corpus_refuses_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "d1", "title": "t", "text": "x"}\n')
    line = ["import", "--beir", str(corpus), "--kb", "kb", "--url", "http://127.0.0.1:9"]
    args = build_parser().parse_args([*line, "--max-page-bytes", "100"])
    assert args.func(args) == 2
    assert capsys.readouterr().err.strip() == (
        "kbgraph: --max-page-bytes: bounds a wiki's pages or a folder's notes, not a corpus"
    )
