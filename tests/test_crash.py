"""A real ``kbgraph serve`` killed with SIGKILL mid-stream loses no acknowledged delivery.

Several clients send signed deliveries concurrently; the server is killed while they are in
flight. Afterwards every delivery that got a 200 is in the store, every delivery is there
whole or not at all, the log is gapless, and a restarted server answers an acknowledged
delivery sent again as duplicates.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kbgraph.store import Store
from tests import webhook_client as wc

pytestmark = pytest.mark.slow

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ADMIN = "crash-admin-token"
STARTUP_SECONDS = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(folder: Path) -> Path:
    path = folder / "kbgraph.toml"
    path.write_text(
        f'[store]\npath = "kb.db"\n[webhooks]\nsecrets = ["{SECRET}"]\n'
        f'[[tokens]]\nname = "admin"\ntoken = "{ADMIN}"\nadmin = true\n'
    )
    return path


def start_server(config: Path, port: int, workers: int = 1) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "kbgraph", "serve", "--config", str(config)]
    command += ["--port", str(port), "--workers", str(workers)]
    proc = subprocess.Popen(
        command,
        start_new_session=True,  # the workers of --workers N share the group
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


@contextlib.contextmanager
def running(config: Path) -> Iterator[str]:
    """A real ``kbgraph serve`` on a free loopback port for the block; yields its base URL."""
    port = free_port()
    proc = start_server(config, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    if proc.stderr is not None:
        proc.stderr.close()


def test_sigkill_loses_no_acknowledged_delivery(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/kbs/crash/events"
    proc = start_server(config, port)
    sent: list[list[dict]] = []  # every delivery attempted
    acked: list[list[dict]] = []  # deliveries answered 200
    lock = threading.Lock()
    stop_clients = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(timeout=10) as http:
            i = 0
            while not stop_clients.is_set():
                events = [
                    wc.upsert(f"c{n}/d{i}/e{j}", 1, text=f"client {n} delivery {i}")
                    for j in range(1 + (i % 4))
                ]
                body, headers = wc.delivery(SECRET, events)
                with lock:
                    sent.append(events)
                try:
                    response = http.post(url, content=body, headers=headers)
                except httpx.HTTPError:
                    return  # the server is gone
                if response.status_code == 200:
                    with lock:
                        acked.append(events)
                i += 1

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(acked) < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: clients are still sending
        proc.wait(30)
        stop_clients.set()
        for t in threads:
            t.join(30)
    finally:
        stop_clients.set()
        stop(proc)
    assert len(acked) >= 50, "too few deliveries acknowledged before the kill"
    print(f"sent {len(sent)}, acknowledged {len(acked)}")

    with Store(tmp_path / "kb.db") as store:
        state = store.load()
        present = {c.id for c in state.kbs["crash"].concepts}
        for events in acked:
            assert all(e["subject"] in present for e in events)
        for events in sent:  # atomic: whole or not at all
            subjects = {e["subject"] in present for e in events}
            assert len(subjects) == 1, events
        log = store.read_log(0, limit=1_000_000)
        assert [r.seq for r in log] == list(range(1, len(log) + 1))
        assert len(log) == len(present) == state.kbs["crash"].seq

    # a restarted server knows every acknowledged event: sent again, they are duplicates
    proc = start_server(config, port)
    try:
        for events in acked[:: max(1, len(acked) // 10)]:
            body, headers = wc.delivery(SECRET, events)
            answer = httpx.post(url, content=body, headers=headers, timeout=10).json()
            assert answer["duplicates"] == len(events) and answer["applied"] == 0
    finally:
        stop(proc)


def test_two_workers_share_the_store(tmp_path: Path) -> None:
    """``--workers 2``: two processes take deliveries into one SQLite file; none is lost."""
    config = write_config(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/kbs/shared/events"
    proc = start_server(config, port, workers=2)
    statuses: list[int] = []

    def client(n: int) -> None:
        for i in range(40):
            # a fresh connection each time, so the kernel spreads them over both workers
            body, headers = wc.delivery(SECRET, [wc.upsert(f"w{n}/{i}"), wc.upsert(f"w{n}/{i}/b")])
            statuses.append(httpx.post(url, content=body, headers=headers, timeout=30).status_code)

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        stop(proc)
    assert statuses == [200] * 240
    with Store(tmp_path / "kb.db") as store:
        assert store.kb_seq("shared") == 480
        assert len(store.load().kbs["shared"].concepts) == 480
        assert [r.seq for r in store.read_log(0, limit=10_000)] == list(range(1, 481))
