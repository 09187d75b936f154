"""A newcomer's first hour: the errors that say what to do, and progress where it is seen.

Every command runs as a user runs it, ``python -m kbgraph`` in a child process: a busy port,
a missing or malformed webhook secret and an empty folder each stop with a line naming the fix
and a non-zero exit, before anything that looks ready is printed or written; a long import draws
progress on a terminal (a pseudo-terminal here) and never a carriage return into a pipe.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pty
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbgraph.sources.progress import Progress
from kbgraph.sources.sinks import SECRET_ENV
from tests.support import ROOT, served_config
from tests.vault_files import write_vault

DEADLINE = 180.0
NOTES = 300  # above the progress helper's MIN_TOTAL


def kbgraph(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbgraph", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=DEADLINE,
    )


@pytest.fixture
def held_port() -> Iterator[tuple[socket.socket, int]]:
    """A loopback port another program listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held, held.getsockname()[1]


def many_notes(root: Path, count: int = NOTES) -> Path:
    return write_vault(
        root, {f"n{i:04}.md": f"# Note {i}\nSee [[n{(i + 1) % count:04}]]." for i in range(count)}
    )


# --- a busy port ---------------------------------------------------------------------------


def test_serve_on_a_busy_port_names_it_and_writes_nothing(
    held_port: tuple[socket.socket, int], tmp_path: Path
) -> None:
    _, port = held_port
    done = kbgraph("serve", "--config", str(served_config(tmp_path)), "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "choose another with --port" in done.stderr
    assert "Errno" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "kb.db").exists()  # the store was not even opened


def test_demo_on_a_busy_port_writes_no_config_and_prints_no_token(
    held_port: tuple[socket.socket, int], tmp_path: Path
) -> None:
    _, port = held_port
    done = kbgraph("demo", "--dir", str(tmp_path / "demo"), "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # no "wrote …", no token, no curl line
    assert done.stderr.count("\n") == 1, done.stderr  # the one line, naming the fix
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert f"--port {port + 1}" in done.stderr
    assert not (tmp_path / "demo").exists()


def test_a_free_port_is_no_problem() -> None:
    from kbgraph.http.port import port_problem

    with socket.socket() as probe:  # a port just freed: free
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert port_problem("127.0.0.1", port) is None
    assert port_problem("127.0.0.1", 70000) == "--port 70000: expected a TCP port from 0 to 65535"


# --- the webhook secret of --url -----------------------------------------------------------


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        (None, "missing"),
        ("", "missing"),
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "expected whsec_<base64>"),
        ("whsec_not*base64!", "not valid base64 after whsec_"),
        ("whsec_", "empty secret"),
    ],
)
def test_sync_url_checks_the_secret_before_sending(
    held_port: tuple[socket.socket, int], tmp_path: Path, secret: str | None, why: str
) -> None:
    held, port = held_port
    root = write_vault(tmp_path / "vault", {"a.md": "[[b]]", "b.md": "text"})
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret is not None:
        env[SECRET_ENV] = secret
    url = f"http://127.0.0.1:{port}"
    for command in (
        ["import", str(root), "--kb", "kb", "--url", url],
        ["sync", str(root), "--kb", "kb", "--url", url],
        ["sync", "--mediawiki", "http://127.0.0.1:9/api.php", "--kb", "kb", "--url", url,
         "--manifest", str(tmp_path / "wiki.sqlite")],
    ):  # fmt: skip
        done = kbgraph(*command, env=env)
        assert done.returncode == 2, (command, done.stderr)
        assert f"the webhook secret {SECRET_ENV}: {why}" in done.stderr
        assert f"export {SECRET_ENV}=whsec_" in done.stderr
        assert done.stdout == ""
    held.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing ever connected: nothing was sent
        held.accept()
    assert not (root / ".kbgraph").exists() and not (tmp_path / "wiki.sqlite").exists()


# --- an empty or mistyped folder -----------------------------------------------------------


def test_an_import_that_finds_no_notes_says_so_and_makes_nothing(tmp_path: Path) -> None:
    config = served_config(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("not a note")
    for command in ("import", "sync"):
        done = kbgraph(command, str(empty), "--kb", "notes", "--config", str(config))
        assert done.returncode == 1, done.stderr
        assert f"{empty}: no notes found" in done.stderr and "check the path" in done.stderr
        assert done.stdout == ""
    assert sorted(p.name for p in empty.iterdir()) == ["readme.txt"]  # no .kbgraph/
    assert not (tmp_path / "kb.db").exists()  # nor a store
    typo = kbgraph("import", str(tmp_path / "emtpy"), "--kb", "notes", "--config", str(config))
    assert typo.returncode == 2 and "no such folder" in typo.stderr
    assert not (tmp_path / "emtpy").exists()


def test_a_folder_emptied_after_an_import_is_synced_as_deletes(tmp_path: Path) -> None:
    """No notes with a manifest of an earlier run: the notes were deleted, not mistyped."""
    config = served_config(tmp_path)
    root = write_vault(tmp_path / "vault", {"a.md": "[[b]]", "b.md": "text"})
    first = kbgraph("import", str(root), "--kb", "notes", "--config", str(config))
    assert first.returncode == 0, first.stderr
    for note in ("a.md", "b.md"):
        (root / note).unlink()
    again = kbgraph("sync", str(root), "--kb", "notes", "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert "sent 0 upserts and 2 deletes" in again.stdout


# --- progress and the report ---------------------------------------------------------------


def test_a_pipe_gets_the_summary_and_no_carriage_return(tmp_path: Path) -> None:
    root = many_notes(tmp_path / "vault")
    config = served_config(tmp_path)
    done = kbgraph("import", str(root), "--kb", "notes", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"{NOTES} notes, {NOTES} links" in done.stdout
    assert "\r" not in done.stdout + done.stderr
    assert done.stderr == ""


def on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run kbgraph with stderr on a pseudo-terminal of 100 columns: (exit code, what the
    terminal showed, stdout)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kbgraph", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=follower,
        cwd=ROOT,
    )
    os.close(follower)
    shown = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError as exc:  # EIO: every writer of the terminal is gone
                assert exc.errno == errno.EIO
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=DEADLINE)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    reader.join(30)
    assert not reader.is_alive(), "the terminal was not closed"
    os.close(leader)
    return proc.wait(), shown.decode(errors="replace"), out.decode()


def test_a_terminal_gets_progress_bars(tmp_path: Path) -> None:
    root = many_notes(tmp_path / "vault")
    config = served_config(tmp_path)
    code, shown, out = on_a_terminal("import", str(root), "--kb", "notes", "--config", str(config))
    assert code == 0, shown
    assert f"{NOTES} notes" in out
    assert "\r" in shown
    for stage in ("read", "sent"):  # a bar per stage, each ending at the whole
        assert f"{stage}: 100%" in shown, shown
        assert f"{NOTES}/{NOTES} [" in shown and " notes/s]" in shown, shown
    quiet = on_a_terminal(
        "sync", str(root), "--kb", "notes", "--config", str(config), "--quiet"
    )  # fmt: skip
    assert quiet[0] == 0 and "%" not in quiet[1] and "\r" not in quiet[1], quiet


def test_a_mediawiki_dump_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    """The example dump's first page copied to 600 pages, each linking the next."""
    source = (ROOT / "examples" / "wiki" / "homelab.xml").read_text()
    head, rest = source.split("<page>", 1)
    first = "<page>" + rest.split("</page>", 1)[0] + "</page>"
    pages = [
        first.replace("<title>Main Page</title>", f"<title>Page {i}</title>")
        .replace("<id>1</id>\n    <revision>", f"<id>{1000 + i}</id>\n    <revision>")
        .replace("[[Network]]", f"[[Page {(i + 1) % 600}]]")
        for i in range(600)
    ]
    dump = tmp_path / "wiki.xml"
    dump.write_text(head + "\n".join(pages) + source[source.rindex("</page>") + 7 :])
    code, shown, out = on_a_terminal(
        "import", "--mediawiki-dump", str(dump), "--kb", "wiki",
        "--config", str(served_config(tmp_path)), "--manifest", str(tmp_path / "m.sqlite"),
    )  # fmt: skip
    assert code == 0, shown
    assert out.startswith("600 pages, 0 redirects")
    assert "read: 500 pages" in shown and "sent: 100%" in shown and "600/600 [" in shown, shown


def test_progress_draws_nothing_off_a_terminal_or_below_its_threshold() -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    pipe = io.StringIO()
    with Progress("notes", quiet=False, stream=pipe) as progress:
        for done in range(0, 1001, 100):
            progress("read", done, 1000)
    assert pipe.getvalue() == ""
    small, quiet, big = Terminal(), Terminal(), Terminal()
    with Progress("notes", quiet=False, stream=small) as progress:
        progress("read", 10, 10)
    with Progress("notes", quiet=True, stream=quiet) as progress:
        progress("read", 1000, 1000)
    with Progress("pages", quiet=False, stream=big) as progress:
        progress("read", 500)  # no total known yet: a count
        progress("read", 1000)
        progress("sent", 1000, 1000)
    assert small.getvalue() == "" and quiet.getvalue() == ""
    assert "1000 pages" in big.getvalue() and "sent: 100%" in big.getvalue()


def test_report_names_the_unresolved_links_and_the_skipped_files(tmp_path: Path) -> None:
    root = write_vault(tmp_path / "vault", {
        "a.md": "[[b]] and [[Nowhere]] and [[c]]",
        "b.md": "text",
        "elsewhere/c.md": "[[a]]",
    })  # fmt: skip
    (root / "linked").symlink_to(root / "elsewhere", target_is_directory=True)
    report = tmp_path / "report.tsv"
    done = kbgraph(
        "import", str(root), "--kb", "notes", "--config", str(served_config(tmp_path)),
        "--report", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "1 unresolved links" in done.stdout
    lines = report.read_text().splitlines()
    assert lines[0] == "kind\twhere\twhat"
    assert sorted(lines[1:]) == [
        "skipped\tlinked\tsymlinked folder: not followed",
        "unresolved\ta\tNowhere",
    ]
    refused = kbgraph(
        "import", "--mediawiki-dump", str(root / "a.md"), "--kb", "w", "--report", str(report),
        "--config", str(served_config(tmp_path)),
    )  # fmt: skip
    assert refused.returncode == 2 and "--report" in refused.stderr


# --- the example systemd unit --------------------------------------------------------------


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip(
            "SKIPPED LOUDLY: systemd-analyze is not installed, so examples/systemd/"
            "kbgraph.service is not checked (scripts/setup.sh installs Debian's systemd as root)"
        )
    unit = (ROOT / "examples" / "systemd" / "kbgraph.service").read_text()
    installed = Path(sys.executable).parent / "kbgraph"  # verify checks ExecStart's binary
    assert "ExecStart=/opt/kbgraph/bin/kbgraph serve --config " in unit
    good = tmp_path / "good" / "kbgraph.service"
    bad = tmp_path / "bad" / "kbgraph.service"
    here = unit.replace("/opt/kbgraph/bin/kbgraph", str(installed))
    for path, text in ((good, here), (bad, here + "[Service]\nRestart=sometimes\n")):
        path.parent.mkdir()
        path.write_text(text)
    checked = [
        subprocess.run(
            [analyze, "verify", str(path)], capture_output=True, text=True, timeout=DEADLINE
        )
        for path in (good, bad)
    ]
    said = [[line for line in c.stderr.splitlines() if "kbgraph.service" in line] for c in checked]
    assert checked[0].returncode == 0 and said[0] == [], checked[0].stderr
    assert any("sometimes" in line for line in said[1]), checked[1].stderr  # the check can fail


# --- a backup's progress -------------------------------------------------------------------


def large_store(folder: Path) -> Path:
    """A config whose store is a real, checkable store padded past the backup's bar threshold
    (a table of its own: the copy's checks read only the store's tables)."""
    from kbgraph.cli import BACKUP_PROGRESS_BYTES
    from kbgraph.store import Store

    config = served_config(folder)
    Store(folder / "kb.db").close()
    conn = sqlite3.connect(folder / "kb.db")
    with conn:
        conn.execute("CREATE TABLE padding (b BLOB)")
        for _ in range(BACKUP_PROGRESS_BYTES // (1 << 20) + 8):
            conn.execute("INSERT INTO padding VALUES (randomblob(1048576))")
    conn.close()
    return config


def test_a_large_backup_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    config = large_store(tmp_path)
    code, shown, out = on_a_terminal("backup", "--config", str(config), str(tmp_path / "a.db"))
    assert code == 0, shown
    assert "copied: 100%" in shown and "\r" in shown, shown
    assert "integrity ok" in out
    piped = kbgraph("backup", "--config", str(config), str(tmp_path / "b.db"))
    assert piped.returncode == 0, piped.stderr
    assert "\r" not in piped.stdout + piped.stderr and "%" not in piped.stderr


def test_backup_reports_how_far_the_copy_is(tmp_path: Path) -> None:
    from kbgraph.store.backup import backup

    large_store(tmp_path)
    calls: list[tuple[int, int]] = []
    done = backup(tmp_path / "kb.db", tmp_path / "copy.db", lambda *call: calls.append(call))
    assert calls, "no progress at all"
    assert all(0 <= copied <= total for copied, total in calls)
    assert [copied for copied, _ in calls] == sorted(copied for copied, _ in calls)
    assert calls[-1] == (done.bytes, done.bytes)  # the end: the whole copy
