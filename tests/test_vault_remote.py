"""``kbgraph import/sync --url``: signed deliveries to a real ``kbgraph serve``; a re-sent
delivery is all duplicates; clear failures for a wrong secret and an unreachable URL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import SECRET_ENV, SyncError, WebhookSink
from kbgraph.sources.sync import sync_once, upsert_event
from kbgraph.sources.vault.reader import read_vault
from tests.support import ADMIN, ROOT, SECRET, bearer, running, served_config
from tests.vault_files import write_vault

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(served_config(tmp_path_factory.mktemp("remote"))) as url:
        yield url


def cli(*args: str, secret: str | None = SECRET) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret is not None:
        env[SECRET_ENV] = secret
    return subprocess.run(
        [sys.executable, "-m", "kbgraph", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip


def get(url: str, path: str) -> httpx.Response:
    return httpx.get(url + path, headers=bearer(ADMIN), timeout=10)


def test_import_and_sync_over_the_webhook(server: str, tmp_path: Path) -> None:
    root = write_vault(tmp_path / "vault", {
        "infra/DNS.md": "---\naliases: [Pi-hole]\nstatus: active\n---\nUses [[router]].",
        "Router.md": "# Router\nSee [dns](infra/DNS.md).",
    })  # fmt: skip
    done = cli("import", str(root), "--kb", "remote", "--url", server)
    assert done.returncode == 0, done.stderr
    assert "2 notes, 1 links between them" in done.stdout and "0 unresolved" in done.stdout
    assert get(server, "/v1/kbs/remote/status").json()["links"] == 1  # the same count
    dns = get(server, "/v1/kbs/remote/concepts/infra/DNS").json()
    assert (dns["aliases"], dns["status"], dns["links"]) == (["Pi-hole"], "active", ["Router"])
    (root / "Router.md").rename(root / "Gateway.md")
    done = cli("sync", str(root), "--kb", "remote", "--url", server)
    assert done.returncode == 0, done.stderr
    assert "sent 2 upserts and 1 deletes" in done.stdout  # DNS's [[router]] is unresolved now
    assert get(server, "/v1/kbs/remote/concepts/Router").status_code == 404
    assert get(server, "/v1/kbs/remote/concepts/Gateway").json()["links"] == ["infra/DNS"]
    again = cli("sync", str(root), "--kb", "remote", "--url", server)
    assert "sent 0 upserts and 0 deletes, 2 notes unchanged" in again.stdout


def test_a_resent_delivery_is_all_duplicates(server: str, tmp_path: Path) -> None:
    root = write_vault(tmp_path / "vault", {"a.md": "[[b]]", "b.md": "text"})
    sink = WebhookSink(server, SECRET)
    try:
        notes = read_vault(root).notes
        events = [upsert_event("dup", note, 7 + i) for i, note in enumerate(notes.values())]
        first = sink.send("dup", events)
        second = sink.send("dup", events)  # an answer lost, the same delivery sent again
        assert (first.applied, first.duplicates) == (2, 0)
        assert (second.applied, second.duplicates, second.seq) == (0, 2, first.seq)
        with Manifest.for_vault(root) as manifest:  # a sync over it: newer versions, applied
            report = sync_once(root, "dup", sink, manifest)
        assert report.results == [(2, 0, 0)]
    finally:
        sink.close()


def test_wrong_secret_and_unreachable_url_are_clear(server: str, tmp_path: Path) -> None:
    root = write_vault(tmp_path / "vault", {"a.md": ""})
    wrong = cli("import", str(root), "--kb", "kb", "--url", server,
                secret="whsec_" + "A" * 32)  # fmt: skip
    assert wrong.returncode == 1
    assert "refused the delivery (401)" in wrong.stderr
    with socket.socket() as held:  # bound, never listening: nothing else can take the port
        held.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{held.getsockname()[1]}"
        down = cli("import", str(root), "--kb", "kb", "--url", dead, "--retries", "1")
        with pytest.raises(SyncError, match="cannot reach"):
            WebhookSink(dead, SECRET, attempts=1).send("kb", [])
    assert down.returncode == 1
    assert f"cannot reach {dead}/v1/kbs/kb/events" in down.stderr
    assert "gave up after 2 attempts" in down.stderr


def test_watch_over_the_webhook_reaches_graph_context(server: str, tmp_path: Path) -> None:
    root = write_vault(tmp_path / "vault", {"Pump.md": "The sump pump [[Alarm]].", "Alarm.md": ""})
    env = {**os.environ, SECRET_ENV: SECRET}
    command = [sys.executable, "-m", "kbgraph", "sync", str(root), "--kb", "watched", "--url",
               server, "--watch", "--quiet"]  # fmt: skip
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:

        def context(query: str) -> list[str]:
            response = httpx.post(
                f"{server}/v1/kbs/watched/tools/graph_context",
                headers=bearer(ADMIN),
                json={"query": query},
                timeout=10,
            )
            body = response.json() if response.status_code == 200 else {}
            return [seed["id"] for seed in body.get("seeds", [])]

        deadline = time.monotonic() + 90
        while "Pump" not in context("sump pump") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Pump" in context("sump pump")
        write_vault(root, {"Alarm.md": "The leak alarm beeps at the drainage sensor."})
        while "Alarm" not in context("drainage sensor") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert context("drainage sensor")[0] == "Alarm"
        assert proc.poll() is None  # still watching
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()


def test_retries_resend_the_same_signed_delivery_then_stop_on_a_refusal(tmp_path: Path) -> None:
    from kbgraph.events import SignatureVerifier

    seen: list[httpx.Request] = []
    answers = [httpx.Response(503, json={"error": "busy"}), httpx.ConnectError("reset")]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if answers else None
        if isinstance(answer, Exception):
            raise answer
        if answer is not None:
            return answer
        if request.url.path.endswith("/refused/events"):
            return httpx.Response(422, json={"error": "events[0].subject: invalid concept id"})
        body = {"accepted": 1, "applied": 1, "duplicates": 0, "stale": 0, "ignored": 0, "seq": 7}
        return httpx.Response(200, json=body)

    sink = WebhookSink(
        "http://kb.test/", SECRET, backoff=0.0, transport=httpx.MockTransport(handler)
    )
    note = read_vault(write_vault(tmp_path, {"a.md": "[[b]]"})).notes["a"]
    events = [upsert_event("kb", note, 1)]
    result = sink.send("kb", events)
    assert result.seq == 7 and len(seen) == 3
    assert {r.headers["webhook-id"] for r in seen} == {seen[0].headers["webhook-id"]}
    assert {r.content for r in seen} == {seen[0].content}
    verifier = SignatureVerifier([SECRET])
    assert all(verifier.verify(r.content, r.headers) for r in seen)
    assert seen[0].url == "http://kb.test/v1/kbs/kb/events"
    with pytest.raises(SyncError, match=r"refused the delivery \(422\): events\[0\]\.subject"):
        sink.send("refused", events)
    assert len(seen) == 4  # a refusal is not retried
    sink.close()
