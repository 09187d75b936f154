"""Issue 34, cases 11 and 12: what a vault's file names and hard links can do to an import.

A hard link is a second name of a file: one planted in the vault (or swapped in under
``sync --watch``) can be a file outside it that the importing user may read (only the
kernel's ``protected_hardlinks`` limited it). A regular file with more than one name is
skipped unless ``--allow-hardlinks`` says the vault's hard links are meant. A file name
holding a newline or a terminal escape cannot forge lines of the report: names are printed
escaped."""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import pytest

from kbgraph.sources.command import run_command
from kbgraph.sources.vault.reader import read_vault
from kbgraph.store import Store

SECRET = "SECRET-FROM-ANOTHER-USERS-FILE"
HANG_GUARD = 120.0  # seconds: a hang would otherwise stop the suite; never a speed claim
HARD_LINK = (
    "hard link (2 names, one may be outside the vault): not read (--allow-hardlinks reads it)"
)


def vault_with_links(base: Path) -> tuple[Path, Path]:
    outside = base / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    vault = base / "vault"
    (vault / "sub").mkdir(parents=True)
    (vault / "good.md").write_text("a good note\n")
    os.link(secret, vault / "sub" / "leak.md")
    return vault, secret


def _args(vault: Path, config: Path, **more: object) -> argparse.Namespace:
    args = argparse.Namespace(
        dir=str(vault),
        kb="kb",
        config=str(config),
        url=None,
        retries=0,
        quiet=False,
        watch=False,
        manifest=None,
        allow_hardlinks=False,
        report=None,
    )
    vars(args).update(more)
    return args


def _config(base: Path) -> Path:
    config = base / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n')
    return config


def test_a_hard_link_is_skipped_unless_allowed(tmp_path: Path) -> None:
    vault, _ = vault_with_links(tmp_path)
    read = read_vault(vault)
    assert set(read.notes) == {"good"}
    assert dict(read.skipped) == {"sub/leak.md": HARD_LINK}
    assert "sub/leak" not in read.unreadable  # skipped for good: a note sent before is deleted
    allowed = read_vault(vault, allow_hardlinks=True)
    assert set(allowed.notes) == {"good", "sub/leak"} and not allowed.skipped


def test_import_reports_the_skip_and_sends_nothing_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vault, _ = vault_with_links(tmp_path)
    config = _config(tmp_path)
    assert run_command(_args(vault, config)) == 0
    assert f"skipped sub/leak.md: {HARD_LINK}" in capsys.readouterr().out.splitlines()
    with Store(tmp_path / "kb.db") as store:
        assert [c.id for c in store.load().kbs["kb"].concepts] == ["good"]
    assert run_command(_args(vault, config, allow_hardlinks=True)) == 0
    with Store(tmp_path / "kb.db") as store:
        texts = {c.id: c.text for c in store.load().kbs["kb"].concepts}
    assert texts == {"good": "a good note\n", "sub/leak": f"{SECRET}\n"}


def test_a_hard_link_swapped_in_under_watch_is_not_sent_and_the_note_is_deleted(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "note.md").write_text("the note as written\n")
    stop = threading.Event()
    codes: list[int] = []
    args = _args(vault, _config(tmp_path), watch=True, quiet=True)
    thread = threading.Thread(target=lambda: codes.append(run_command(args, stop)))
    thread.start()

    def texts(store: Store) -> dict[str, str]:
        kb = store.load().kbs.get("kb")
        return {} if kb is None else {c.id: c.text for c in kb.concepts}

    try:
        with Store(tmp_path / "kb.db") as store:
            deadline = time.monotonic() + HANG_GUARD
            while texts(store) != {"note": "the note as written\n"}:
                assert time.monotonic() < deadline, texts(store)
                time.sleep(0.1)
            os.link(secret, vault / ".swap")  # a dot file: not a note, then renamed over one
            os.replace(vault / ".swap", vault / "note.md")
            while texts(store) == {"note": "the note as written\n"}:
                assert time.monotonic() < deadline, "the swap was never seen"
                time.sleep(0.1)
            assert texts(store) == {}  # deleted, as a note that can no longer be read
    finally:
        stop.set()
        thread.join(HANG_GUARD)
    assert codes == [0]
    for name in ("kb.db", "kb.db-wal"):
        stored = tmp_path / name
        assert not stored.exists() or SECRET.encode() not in stored.read_bytes()


FORGED = "skipped fake.md: symlink to a file outside the vault: not read"


def test_names_cannot_forge_lines_of_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "good.md").write_text("a good note\n")
    (vault / f"evil\n{FORGED}\n999 notes, 0 links.md").write_text("x\n")
    (vault / "clear\x1b[2J\x1b[Hscreen.md").write_text("x\n")
    (vault / "right\u202eto left.md").write_text("x\n")
    (vault / "folder\r\nwarning x").mkdir()
    (vault / "folder\r\nwarning x" / "note.md").write_text("x\n")
    assert run_command(_args(vault, _config(tmp_path))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5, lines  # the summary and the four skipped notes, one line each
    assert lines[0].startswith("1 notes, 0 links")
    assert not any(line.startswith(FORGED) or line.startswith("999") for line in lines)
    skipped = sorted(line.split(": ", 1)[0] for line in lines[1:])
    assert skipped == sorted([
        "skipped clear\\x1b[2J\\x1b[Hscreen.md",
        f"skipped evil\\n{FORGED.split(': ', 1)[0]}",
        "skipped folder\\r\\nwarning x/note.md",
        "skipped right\\u202eto left.md",
    ])  # fmt: skip
    assert all(line.isprintable() for line in lines)
