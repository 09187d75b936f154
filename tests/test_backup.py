"""``kbgraph backup``: a copy taken while a real server takes writes is consistent, checked,
and a server started on it answers as the original did at the copy's seq (issue 25, item 4)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from kbgraph.store import Store
from kbgraph.store.backup import BackupError, backup
from tests import webhook_client as wc
from tests.kb_events import upsert
from tests.support import ADMIN, SECRET, bearer, running, served_config

KB = "kb"
AUTH = bearer(ADMIN)
EVENTS_PER_DELIVERY = 3


def deliveries(count: int) -> list[tuple[bytes, dict[str, str]]]:
    """The same signed deliveries every time: each one new concept, a rewrite of an older one
    and a link event, so ids, texts and links all change as the KB grows."""
    out = []
    for i in range(1, count + 1):
        v = 3 * i  # one version counter over all subjects: every event applies
        events = [
            wc.upsert(f"n{i}", v, text=f"alpha node {i} beta", links=[f"n{i // 2}", f"n{i // 3}"]),
            wc.upsert(f"n{i // 2}", v + 1, text=f"gamma rewritten {i}", links=[f"n{i}"]),
            wc.event("link.added", f"n{i // 3}", v + 2, target=f"n{i}"),
        ]
        out.append(wc.delivery(SECRET, events))
    return out


def send(client: httpx.Client, url: str, delivery: tuple[bytes, dict[str, str]]) -> None:
    body, headers = delivery
    response = client.post(f"{url}/v1/kbs/{KB}/events", content=body, headers=headers)
    assert response.status_code == 200, response.text


def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/readyz", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "not ready"
        time.sleep(0.1)


def answers(url: str, seq: int, ids: list[str]) -> list[bytes]:
    """graph_context and search answers at ``seq`` (waiting, as a client does, while the
    projection is not there yet: 503)."""
    wait_ready(url)
    enc = msgspec.json.encode
    requests = [("graph_context", enc({"ids": [cid], "limit": 10})) for cid in ids]
    requests.append(("graph_context", enc({"query": "alpha beta gamma", "limit": 10})))
    searches = [{"q": q, "limit": 10} for q in ("alpha", "rewritten gamma", "node 7")]
    out = []
    with httpx.Client(timeout=60, headers={**AUTH, "X-Min-Seq": str(seq)}) as client:
        calls = [
            *(lambda b=body, t=tool: client.post(f"{url}/v1/kbs/{KB}/tools/{t}", content=b)
              for tool, body in requests),
            *(lambda p=params: client.get(f"{url}/v1/kbs/{KB}/search", params=p)
              for params in searches),
        ]  # fmt: skip
        for call in calls:
            deadline = time.monotonic() + 120
            while (response := call()).status_code == 503:
                assert time.monotonic() < deadline, response.text
            assert response.status_code == 200, response.text
            assert response.headers["X-KB-Seq"] == str(seq)
            out.append(response.content)
    return out


def log_rows(path: Path, up_to_gid: int) -> list[tuple]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT gid, kb, seq, event, last_in_delivery FROM log WHERE gid <= ? ORDER BY gid",
            (up_to_gid,),
        ).fetchall()
    finally:
        conn.close()


@pytest.mark.slow
def test_a_backup_under_writes_serves_the_same_bytes(tmp_path: Path) -> None:
    planned = deliveries(400)
    original = tmp_path / "original"
    original.mkdir()
    config = served_config(original)
    copy_path = tmp_path / "copy.db"
    sent = [0]
    at_backup: list[int] = []
    stop = threading.Event()
    backed_up = threading.Event()
    with running(config) as url:

        def writer() -> None:
            with httpx.Client(timeout=60) as client:
                for delivery in planned:
                    if stop.is_set():
                        return
                    if sent[0] == len(planned) - 20:
                        backed_up.wait()  # the last 20 come after the copy, however fast
                    send(client, url, delivery)
                    sent[0] += 1

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            while sent[0] < 40 and thread.is_alive():
                stop.wait(0.01)
            at_backup.append(sent[0])
            done = subprocess.run(
                [sys.executable, "-m", "kbgraph", "backup", "--config", str(config),
                 str(copy_path)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            backed_up.set()
            assert done.returncode == 0, done.stderr
            assert "integrity ok" in done.stdout
            while sent[0] < at_backup[0] + 20 and thread.is_alive():
                stop.wait(0.01)  # the service takes writes after the copy, too
        finally:
            backed_up.set()
            stop.set()
            thread.join()
        assert sent[0] >= at_backup[0] + 20
        last_seq = sent[0] * EVENTS_PER_DELIVERY

    with sqlite3.connect(copy_path) as conn:
        copy_seq = conn.execute("SELECT seq FROM kb WHERE name = ?", (KB,)).fetchone()[0]
        copy_gid, whole = conn.execute(
            "SELECT max(gid), sum(last_in_delivery) FROM log WHERE kb = ?", (KB,)
        ).fetchone()
    assert copy_seq == EVENTS_PER_DELIVERY * whole, "the copy holds part of a delivery"
    copied = whole
    assert at_backup[0] <= copied < sent[0] and copy_seq < last_seq  # taken mid-stream
    # the copy is the original as of one commit: its log is the original's, record for record
    assert log_rows(copy_path, copy_gid) == log_rows(original / "kb.db", copy_gid)
    assert not list(tmp_path.glob(".*.tmp*"))

    # A server on the copy answers as a store that took exactly those deliveries.
    served = tmp_path / "served"
    served.mkdir()
    shutil.copyfile(copy_path, served / "kb.db")
    reference = tmp_path / "reference"
    reference.mkdir()
    ids = [f"n{i}" for i in (0, 1, 5, copied // 2, copied)]
    with running(served_config(reference)) as url, httpx.Client(timeout=60) as client:
        for delivery in planned[:copied]:
            send(client, url, delivery)
        expected = answers(url, copy_seq, ids)
    with running(served_config(served)) as url:
        assert answers(url, copy_seq, ids) == expected


def test_bad_destinations_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store_path = tmp_path / "kb.db"
    with Store(store_path) as store:
        store.append(KB, [upsert("a")])
    (tmp_path / "taken.db").write_bytes(b"keep")
    cases = {
        tmp_path / "taken.db": "exists",
        tmp_path / "missing" / "x.db": "does not exist",
        store_path: "is the store itself",
        tmp_path: "is the store itself",  # a folder: the copy would take the store's name
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    for dest, says in cases.items():
        with pytest.raises(BackupError, match=says):
            backup(store_path, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "taken.db").read_bytes() == b"keep"
    with pytest.raises(BackupError, match="no such file"):
        backup(tmp_path / "none.db", tmp_path / "out.db")


def test_a_folder_destination_takes_the_store_name_and_the_copy_is_checked(
    tmp_path: Path,
) -> None:
    store_path = tmp_path / "kb.db"
    with Store(store_path) as store:
        for i in range(12):
            store.append(KB, [upsert(f"c{i}")])
    folder = tmp_path / "backups"
    folder.mkdir()
    done = backup(store_path, folder)
    assert done.path == folder / "kb.db" and done.gid == 12 and done.kbs == {KB: 12}
    assert sorted(p.name for p in folder.iterdir()) == ["kb.db"]  # one file, no -wal
    with Store(done.path) as copy:
        assert copy.kb_seq(KB) == 12 and len(copy.load().kbs[KB].concepts) == 12


def test_a_corrupt_copy_is_refused(tmp_path: Path) -> None:
    """The check runs on what was written: a copy whose log end disagrees with its KB's
    seq (here: the source itself made so) is not renamed into place."""
    store_path = tmp_path / "kb.db"
    with Store(store_path) as store:
        store.append(KB, [upsert("a"), upsert("b")])
    with sqlite3.connect(store_path) as conn:
        conn.execute("UPDATE kb SET seq = 5")
    with pytest.raises(BackupError, match="log ends KB kb at 2, its seq is 5"):
        backup(store_path, tmp_path / "copy.db")
    assert not (tmp_path / "copy.db").exists()
    assert not list(tmp_path.glob(".copy.db*"))


# --- issue 34, cases 6 to 8: the temporary file, the store's own names, no replacing --------


def _store(tmp_path: Path, mode: int = 0o600) -> Path:
    store_path = tmp_path / "kb.db"
    with Store(store_path) as store:
        store.append(KB, [upsert("a"), upsert("b")])
    store_path.chmod(mode)
    return store_path


def test_symlinks_planted_at_temporary_names_are_never_written_through(tmp_path: Path) -> None:
    """The old temporary name was ``.DEST.<pid>.tmp``: symlinks planted there for the next
    pids made the backup overwrite their target and left DEST a symlink."""
    store_path = _store(tmp_path)
    victim = tmp_path / "other-service.db"
    with sqlite3.connect(victim) as conn:
        conn.execute("CREATE TABLE theirs (x)")
        conn.execute("INSERT INTO theirs VALUES ('their data')")
    conn.close()
    before = victim.read_bytes()
    dest = tmp_path / "copy.db"

    planted = [tmp_path / f".copy.db.{pid}.tmp" for pid in range(os.getpid() - 5, os.getpid() + 6)]
    for link in planted:
        link.symlink_to(victim)
    done = backup(store_path, dest)
    assert victim.read_bytes() == before
    assert not dest.is_symlink() and dest.is_file() and done.path == dest
    with Store(dest) as copy:
        assert copy.kb_seq(KB) == 2
    assert all(link.is_symlink() for link in planted)  # left alone, not followed


def test_the_copy_has_the_store_permissions(tmp_path: Path) -> None:

    for mode in (0o600, 0o640):
        folder = tmp_path / oct(mode)
        folder.mkdir()
        store_path = _store(folder, mode)
        old = os.umask(0o022)
        try:
            done = backup(store_path, folder / "copy.db")
        finally:
            os.umask(old)
        assert done.path.stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("suffix", ["-journal", "-wal", "-shm", ".writelock"])
def test_a_destination_named_like_the_stores_own_files_is_refused(
    tmp_path: Path, suffix: str
) -> None:
    """SQLite deletes a ``-journal`` (or ``-wal``, ``-shm``) beside the store at its next
    start: a backup there would vanish."""
    store_path = _store(tmp_path)
    dest = tmp_path / f"kb.db{suffix}"
    dest.unlink(missing_ok=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(BackupError, match=f"is the store's own {suffix} file"):
        backup(store_path, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_last_step_never_replaces_a_destination_written_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two backups to one DEST at once: the one that places its copy first wins, the other
    fails naming DEST and leaves the winner's copy alone (it replaced it before)."""
    from kbgraph.store import backup as module

    store_path = _store(tmp_path)
    dest = tmp_path / "copy.db"
    real_check = module.check
    won: list[int] = []

    def check_then_another_backup_wins(conn: sqlite3.Connection) -> tuple[int, dict[str, int]]:
        result = real_check(conn)
        if not won:  # the first backup's copy is checked: another backup finishes first
            won.append(0)
            won[0] = backup(store_path, dest).path.stat().st_ino
        return result

    monkeypatch.setattr(module, "check", check_then_another_backup_wins)
    with pytest.raises(BackupError, match=f"{dest}: exists"):
        backup(store_path, dest)
    assert dest.stat().st_ino == won[0]
    assert not list(tmp_path.glob(".copy.db*"))  # the loser's temporary files are gone


def test_two_backup_commands_at_once_one_wins(tmp_path: Path) -> None:
    store_path = _store(tmp_path)
    config = tmp_path / "kbgraph.toml"
    config.write_text(f'[store]\npath = "{store_path}"\n')
    dest = tmp_path / "copy.db"
    command = [sys.executable, "-m", "kbgraph", "backup", "--config", str(config), str(dest)]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=120), *p.communicate(timeout=10)) for p in procs]
    assert sorted(code for code, _, _ in results) == [0, 2], results
    (failed,) = [err for code, _, err in results if code]
    assert failed.startswith(f"kbgraph: backup: {dest}") and "exists" in failed
    assert not list(tmp_path.glob(".copy.db*"))
    with Store(dest) as copy:
        assert copy.kb_seq(KB) == 2
