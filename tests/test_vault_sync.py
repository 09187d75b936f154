"""Sync: any sequence of edits with syncs in between ends where a fresh import of the final
folder does; a crash mid-sync converges on a re-run and never lowers a version; --watch
picks up an edit."""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.events import Event
from kbgraph.sources import sync as sync_module
from kbgraph.sources.command import run_command
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import sync_once
from kbgraph.sources.vault.reader import NoteFields, read_vault
from kbgraph.store import DeliveryResult, Store
from tests.vault_files import fresh_import, state, versions, write_vault

NAMES = ["Router", "router", "DNS", "net/Router", "net/deep/Switch", "Switch", "Café", "a b"]
BODIES = [
    "",
    "Links [[Router]] and [[switch|the switch]].",
    "---\ntitle: Named\naliases: [Other]\ntags: [x]\n---\nSee [[DNS#Setup]] #inline",
    "![[Switch]] [md](net/Router.md) [[Nowhere]] `[[Code]]`",
    "---\nstatus: active\ntype: Runbook\n---\n[[café]] [[A B]] ![[pic.png]]",
]

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMES), st.sampled_from(BODIES)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("sync")),
)


def parse_cache_of(root: Path) -> dict[str, NoteFields]:
    """The parse cache of a first run over ``root`` (nothing cached before it)."""
    parsed = read_vault(root, {}, workers=1).parsed
    return {key: msgspec.msgpack.decode(raw, type=NoteFields) for key, raw in parsed.items()}


def apply(root: Path, action: tuple) -> None:
    if action[0] == "write":
        write_vault(root, {action[1] + ".md": action[2]})
    elif action[0] == "delete":
        (root / (action[1] + ".md")).unlink(missing_ok=True)
    elif action[0] == "rename":
        source, target = root / (action[1] + ".md"), root / (action[2] + ".md")
        if source.exists() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            source.rename(target)


@settings(max_examples=30, deadline=None)
@given(actions=st.lists(op, max_size=14))
def test_sync_equals_a_fresh_import(actions: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "vault"
        root.mkdir()
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
                    # the parse cache, updated row by row, is what parsing every note gives
                    assert manifest.parse_cache() == parse_cache_of(root)
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


class CrashingSink:
    """Delegates ``sends`` deliveries, then dies: before the next send or right after it."""

    def __init__(self, inner: LocalSink, sends: int, after_send: bool) -> None:
        self.inner, self.dest = inner, inner.dest
        self.sends, self.after_send = sends, after_send

    def send(self, kb: str, events: list[Event]) -> DeliveryResult:
        if self.sends == 0:
            if self.after_send:
                self.inner.send(kb, events)  # delivered, but the run dies before recording it
            raise KeyboardInterrupt("killed mid-sync")
        self.sends -= 1
        return self.inner.send(kb, events)

    def kb_seq(self, kb: str) -> int | None:
        return self.inner.kb_seq(kb)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("after_send", [False, True])
@pytest.mark.parametrize("sends", [0, 1, 2, 4])
def test_crash_mid_sync_converges_and_never_lowers_a_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sends: int, after_send: bool
) -> None:
    monkeypatch.setattr(sync_module, "BATCH_EVENTS", 3)
    root = write_vault(tmp_path / "vault", {
        f"n{i}.md": f"note {i} [[n{(i + 1) % 12}]] [[N{(i + 5) % 12}]]" for i in range(12)
    })  # fmt: skip
    sink = LocalSink(tmp_path / "kb.db")
    try:
        with Manifest.for_vault(root) as manifest:
            sync_once(root, "kb", sink, manifest)
            for i in range(0, 12, 3):
                (root / f"n{i}.md").unlink()  # deleted
            (root / "n1.md").rename(root / "renamed.md")
            for i in (2, 5, 7):
                write_vault(root, {f"n{i}.md": f"edited {i} [[renamed]]"})
            write_vault(root, {"new.md": "[[n2]]", "n0.md": "back again"})
            before = versions(sink.store)
            with pytest.raises(KeyboardInterrupt):
                sync_once(root, "kb", CrashingSink(sink, sends, after_send), manifest)  # type: ignore[arg-type]
            during = versions(sink.store)
            assert all(during[c] >= before[c] for c in during.keys() & before.keys())
            report = sync_once(root, "kb", sink, manifest)
            assert all(stale == 0 for _, _, stale in report.results)
            after = versions(sink.store)
            assert all(after[c] >= during[c] for c in after.keys() & during.keys())
            synced = state(sink.store)
        assert "n3" not in synced and "n1" not in synced and "renamed" in synced  # no resurrection
    finally:
        sink.close()
    assert synced == fresh_import(root, tmp_path / "fresh.db")


def test_watch_picks_up_an_edit(tmp_path: Path) -> None:
    root = write_vault(tmp_path / "vault", {"a.md": "first", "b.md": "[[a]]"})
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n')
    args = argparse.Namespace(
        dir=str(root),
        kb="kb",
        config=str(config),
        url=None,
        retries=0,
        quiet=True,
        watch=True,
        manifest=None,
        allow_hardlinks=False,
        report=None,
    )
    stop = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(run_command(args, stop)))
    thread.start()
    try:
        with Store(tmp_path / "kb.db") as store:
            deadline = time.monotonic() + 60
            while "a" not in state(store) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert state(store)["a"][5] == "first"
            # an editor's save: a temp file written, then renamed over the note
            (root / ".a.md.tmp").write_text("second [[c]]")
            (root / ".a.md.tmp").replace(root / "a.md")
            write_vault(root, {"c.md": "new"})
            while time.monotonic() < deadline and (
                state(store).get("a", ())[5:6] != ("second [[c]]",) or "c" not in state(store)
            ):
                time.sleep(0.1)
            assert state(store)["a"][5:7] == ("second [[c]]", ["c"])
            (root / "c.md").unlink()
            while "c" in state(store) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "c" not in state(store)
    finally:
        stop.set()
        thread.join(60)
    assert codes == [0]


def test_a_replaced_store_gets_every_note_again(tmp_path: Path) -> None:
    root = write_vault(tmp_path / "vault", {"a.md": "[[b]]", "b.md": ""})
    with Manifest.for_vault(root) as manifest:
        sink = LocalSink(tmp_path / "kb.db")
        try:
            assert sync_once(root, "kb", sink, manifest).upserted == 2
        finally:
            sink.close()
        for leftover in tmp_path.glob("kb.db*"):
            leftover.unlink()  # the store is deleted; the vault's manifest stays
        sink = LocalSink(tmp_path / "kb.db")
        try:
            report = sync_once(root, "kb", sink, manifest)
            assert (report.reset, report.upserted) == (True, 2)
            assert sorted(state(sink.store)) == ["a", "b"]
            assert sync_once(root, "kb", sink, manifest).upserted == 0
        finally:
            sink.close()


def test_progress_and_summary(tmp_path: Path) -> None:
    root = write_vault(
        tmp_path / "vault", {f"n{i}.md": f"[[n{i + 1}]] [[gone]]" for i in range(300)}
    )
    (root / "bad\x02.md").write_text("")
    calls: list[tuple[str, int, int]] = []
    sink = LocalSink(tmp_path / "kb.db")
    try:
        with Manifest.for_vault(root) as manifest:
            report = sync_once(root, "kb", sink, manifest, lambda *call: calls.append(call))
    finally:
        sink.close()
    assert ("read", 250, 300) in calls and ("read", 300, 300) in calls
    assert calls[-1] == ("sent", 300, 300)
    summary = report.summary().splitlines()
    assert summary[0] == (
        "300 notes, 299 links between them (a pair linked both ways counts once), "
        "301 unresolved links, 0 attachment links; "
        "sent 300 upserts and 0 deletes, 0 notes unchanged"
    )
    # the name printed escaped: a control character cannot act on the reader's terminal
    assert summary[1:] == ["skipped bad\\x02.md: invalid id from path: control character"]


def test_command_line_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kbgraph.cli import main

    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n')
    (tmp_path / "file.md").write_text("")
    cases = [
        ([str(tmp_path / "nope"), "--kb", "kb"], "nope: no such folder"),
        ([str(tmp_path / "file.md"), "--kb", "kb"], "file.md: not a folder"),
        ([str(tmp_path), "--kb", "Bad KB"], "--kb 'Bad KB': expected a KB name"),
        ([str(tmp_path), "--kb", "kb", "--manifest", str(tmp_path / "file.md" / "m")],
         "cannot open the manifest"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(["import", *argv, "--config", str(config)]) == 2
        assert message in capsys.readouterr().err
    assert main(["import", str(tmp_path), "--kb", "kb", "--url", "ftp://x"]) == 2
    assert "expected an http:// or https:// URL" in capsys.readouterr().err
    assert main(["sync", str(tmp_path), "--kb", "kb", "--config", str(config)]) == 0
    assert "1 notes, 0 links" in capsys.readouterr().out


def test_watch_runs_once_armed_so_an_edit_before_it_is_not_lost(tmp_path: Path) -> None:
    """The caller's first sync ends, a note is written, and only then is the watcher armed:
    no change follows, yet the note must be sent (a run once the watcher is armed)."""
    root = write_vault(tmp_path / "vault", {"a.md": "first"})
    write_vault(root, {"b.md": "written between the first sync and the watcher"})
    runs: list[float] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def run() -> None:
        runs.append(time.monotonic())
        stop.set()

    thread = threading.Thread(target=sync_module.watch, args=(root, run, errors.append, stop))
    thread.start()
    thread.join(60)
    stop.set()
    thread.join(10)
    assert runs and not errors


def test_import_into_a_local_store_keeps_the_configs_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``import --config`` opens the store as the service does: a KB beyond ``[limits]
    max_kbs`` is refused (named, nothing stored) as the webhook refuses it."""
    from kbgraph.cli import main

    root = write_vault(tmp_path / "vault", {"a.md": "first"})
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n[limits]\nmax_kbs = 1\n')
    assert main(["import", str(root), "--kb", "one", "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["import", str(root), "--kb", "two", "--config", str(config)]) != 0
    assert "kb two not created: 1 KBs exist, the limit ([limits] max_kbs)" in (
        capsys.readouterr().err
    )
    with Store(tmp_path / "kb.db") as store:
        assert store.kb_seq("two") == 0 and store.kb_seq("one") > 0
