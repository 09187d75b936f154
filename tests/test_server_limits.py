"""Issue 10 over real sockets: a real ``kbgraph serve`` bounds heads, bodies, idle and
half-sent connections and the number of connections, and ``/readyz`` sees an unwritable store.

Small limits keep it fast; the only time bounds are generous "closed within" ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import GENEROUS, closed_by_server, start_server, stop

pytestmark = pytest.mark.slow

HEAD_LIMIT = 4096
BODY_LIMIT = 4096
KB = "limits"
UPSERT = {"specversion": "1.0", "id": "e1", "source": "t", "type": "concept.upserted",
          "subject": "a/b", "data": {"version": 1, "title": "B", "text": "bee"}}  # fmt: skip


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, store: Path) -> None:
        self.proc, self.port, self.store = proc, port, store
        self.url = f"http://127.0.0.1:{port}"

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=GENEROUS)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss


@contextlib.contextmanager
def serve(folder: Path, limits: str, server: str = "") -> Iterator[Server]:
    config = folder / "kbgraph.toml"
    config.write_text(f'[store]\npath = "kb.db"\n[server]\n{server}\n[limits]\n{limits}\n')
    proc = start_server(config)
    try:
        yield Server(proc, proc.port, folder / "kb.db")
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    limits = (
        f"max_header_bytes = {HEAD_LIMIT}\nmax_request_bytes = {BODY_LIMIT}\n"
        "header_timeout_seconds = 1.0\nkeep_alive_seconds = 1.0\n"
    )
    with serve(tmp_path_factory.mktemp("limits"), limits) as running:
        assert httpx.post(f"{running.url}/v1/kbs/{KB}/events", json=UPSERT).status_code == 200
        yield running


def response_of(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    sock.settimeout(GENEROUS)
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                length = [h for h in head.lower().split(b"\r\n") if h.startswith(b"content-length")]
                if length and len(body) >= int(length[0].split(b":")[1]):
                    break
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def test_idle_connection_is_closed(server: Server) -> None:
    assert closed_by_server(server.connect())


def test_idle_keep_alive_connection_is_closed_after_a_response(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert response_of(sock)[0] == 200
    assert closed_by_server(sock)


def test_half_sent_head_times_out_even_when_trickled(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
    stop_at = time.monotonic() + GENEROUS
    closed = False
    while time.monotonic() < stop_at and not closed:
        try:
            sock.sendall(b"X")  # one byte of a header every 0.2 s never completes the head
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        closed = closed_by_server(sock, 0.2)
    assert closed


def test_huge_head_is_431_and_closed(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (2 * HEAD_LIMIT))
    status, body = response_of(sock)
    assert status == 431
    assert json.loads(body) == {"error": f"request head over the limit of {HEAD_LIMIT} bytes"}
    assert closed_by_server(sock)
    ok = server.connect()  # a head just under the limit still passes
    ok.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: "
        + b"a" * (HEAD_LIMIT - 100)
        + b"\r\n\r\n"
    )
    assert response_of(ok)[0] == 200


def send_until_closed(sock: socket.socket, prefix: bytes, total: int, piece: bytes) -> int:
    """Send ``prefix`` then ``piece`` until ``total`` bytes or the server closes; bytes sent."""
    sent = 0
    try:
        sock.sendall(prefix)
        while sent < total:
            sock.sendall(piece)
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


def test_a_100_mb_head_is_cut_without_memory_growth(server: Server) -> None:
    before = server.rss()
    sock = server.connect()
    sent = send_until_closed(sock, b"GET / HTTP/1.1\r\nX: ", 100 << 20, b"a" * 65536)
    assert sent < 100 << 20  # the server closed the connection before taking it all
    assert server.rss() - before < 50 << 20


def test_agent_body_413_from_content_length_before_the_body(server: Server) -> None:
    sock = server.connect()
    sock.sendall(
        f"POST /v1/kbs/{KB}/tools/graph_context HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Length: {100 << 20}\r\n\r\n".encode()
    )
    status, body = response_of(sock)  # answered with no body byte sent
    assert status == 413
    assert json.loads(body) == {"error": f"request body over the limit of {BODY_LIMIT} bytes"}
    assert closed_by_server(sock)


def test_a_100_mb_chunked_agent_body_is_cut_without_memory_growth(server: Server) -> None:
    before = server.rss()
    sock = server.connect()
    head = f"POST /v1/kbs/{KB}/tools/graph_context HTTP/1.1\r\nHost: localhost\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n"
    piece = b"10000\r\n" + b" " * 65536 + b"\r\n"
    received: list[tuple[int, bytes]] = []
    reader = threading.Thread(target=lambda: received.append(response_of(sock)))
    reader.start()
    sent = send_until_closed(sock, head.encode(), 100 << 20, piece)
    reader.join(GENEROUS)
    assert sent < 100 << 20
    assert received and received[0][0] == 413
    assert server.rss() - before < 50 << 20


def test_a_well_behaved_client_keeps_working(server: Server) -> None:
    with httpx.Client(base_url=server.url) as client:
        for _ in range(20):
            assert client.get(f"/v1/kbs/{KB}/concepts/a/b").json()["title"] == "B"
        body = {"query": "bee " * 100}
        assert client.post(f"/v1/kbs/{KB}/tools/graph_context", json=body).status_code == 200


def test_connections_past_the_bound_close_the_longest_waiting(tmp_path: Path) -> None:
    limits = "max_connections = 20\nheader_timeout_seconds = 120\nkeep_alive_seconds = 120"
    with serve(tmp_path, limits, "min_seq_wait_seconds = 60") as running:
        idle = [running.connect() for _ in range(25)]
        assert all(closed_by_server(sock) for sock in idle[:5])
        for sock in idle[5:]:  # the 20 newest are still open
            assert not closed_by_server(sock, 0.05)
        with httpx.Client(base_url=running.url) as client:  # evicts more idle ones
            for _ in range(10):
                assert client.get("/healthz").status_code == 200
        assert httpx.post(f"{running.url}/v1/kbs/{KB}/events", json=UPSERT).status_code == 200
        busy = []  # 20 requests in flight (waiting for a seq that never comes): none to evict
        for _ in range(20):
            sock = running.connect()
            sock.sendall(f"GET /v1/kbs/{KB}/status HTTP/1.1\r\nX-Min-Seq: 99\r\n\r\n".encode())
            busy.append(sock)
        deadline = time.monotonic() + GENEROUS
        status = 0
        while time.monotonic() < deadline and status != 503:
            extra = running.connect()
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            status, body = response_of(extra)
        assert status == 503 and json.loads(body) == {"error": "too many connections"}
        for sock in idle + busy:
            sock.close()


def set_writable(path: Path, writable: bool) -> None:
    """Make ``path`` read-only (or writable again) even for root: chattr +i as root (from
    e2fsprogs, which minimal systems such as a Debian minbase lack: then the test says so)."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("running as root, this test needs chattr to make the store read-only:"
                        " install e2fsprogs (apt-get install e2fsprogs)")  # fmt: skip
        subprocess.run(["chattr", "-i" if writable else "+i", str(path)], check=True)
    else:
        path.chmod(0o755 if path.is_dir() else 0o644) if writable else path.chmod(0o555)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_readyz_is_503_while_the_store_cannot_write(server: Server, what: str) -> None:
    target = server.store if what == "file" else server.store.parent
    assert httpx.get(f"{server.url}/readyz").status_code == 200
    set_writable(target, False)
    try:
        deadline = time.monotonic() + GENEROUS
        while (answer := httpx.get(f"{server.url}/readyz")).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert answer.status_code == 503 and "cannot write" in answer.json()["error"]
    finally:
        set_writable(target, True)
    deadline = time.monotonic() + GENEROUS
    while httpx.get(f"{server.url}/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_start_up_on_a_read_only_store_exits_2_with_one_line(tmp_path: Path, what: str) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    store = folder / "kb.db"
    if what == "file":
        store.write_bytes(b"")
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "data/kb.db"\n')
    target = store if what == "file" else folder
    set_writable(target, False)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kbgraph", "serve", "--config", str(config), "--port", "1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        set_writable(target, True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"kbgraph: store {store}: ")
