"""The attacks of ``python -m loadtest.abuse`` (see its docstring): each a function (port,
credentials, seconds) that stops after ``seconds`` and returns what it did, named in
``ATTACKS``; and the signed deliveries they and the run's seed send."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import httpx

from loadtest import kbgen
from loadtest.service import HOST, KB, Credentials

SNIPPET_KB: Final = "bomb"
MB: Final = 1 << 20
NAME_BOMB_NOTE: Final = "ops/long-note"  # visible to the narrowed token
NAME_WORDS: Final = [f"w{i}" for i in range(400)]


# --- signed deliveries -----------------------------------------------------------------------


def delivery(signer: kbgen.Signer, events: list[dict[str, Any]]) -> tuple[dict[str, str], bytes]:
    body = json.dumps(events).encode()
    sent = kbgen.Delivery("abuse", events, body, "application/cloudevents-batch+json",
                          f"msg-{uuid.uuid4().hex}")  # fmt: skip
    return signer.headers(sent), body


def upsert(concept_id: str, text: str = "", title: str = "") -> dict[str, Any]:
    return {"specversion": "1.0", "id": f"ev-{uuid.uuid4().hex}", "source": "abuse",
            "type": "concept.upserted", "subject": concept_id,
            "data": {"version": 1, "title": title or concept_id, "text": text,
                     "links": [], "tags": []}}  # fmt: skip


def _send_until_closed(sock: socket.socket, head: bytes, total: int, stop_at: float) -> int:
    piece = b"a" * 65536
    sent = 0
    try:
        sock.sendall(head)
        while sent < total and time.monotonic() < stop_at:
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        pass
    return sent


def attack_huge_body(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """100 MB graph_context bodies from the narrowed token, one after another."""
    stop_at = time.monotonic() + seconds
    sent = rounds = 0
    while time.monotonic() < stop_at:
        with socket.create_connection((HOST, port), timeout=5) as sock:
            head = (f"POST /v1/kbs/{KB}/tools/graph_context HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {creds.agent}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {100 * MB}\r\n\r\n").encode()  # fmt: skip
            sent += _send_until_closed(sock, head, 100 * MB, stop_at)
            rounds += 1
    return {"requests": rounds, "body_bytes_sent": sent}


def attack_huge_header(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """100 MB request heads (no credential), one after another."""
    stop_at = time.monotonic() + seconds
    sent = rounds = 0
    while time.monotonic() < stop_at:
        with socket.create_connection((HOST, port), timeout=5) as sock:
            head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "
            sent += _send_until_closed(sock, head, 100 * MB, stop_at)
            rounds += 1
    return {"requests": rounds, "header_bytes_sent": sent}


def attack_idle_sockets(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """2,000 connections that never send a byte, held for the whole attack."""
    socks = []
    for _ in range(2000):
        with contextlib.suppress(OSError):
            socks.append(socket.create_connection((HOST, port), timeout=5))
    time.sleep(seconds)
    open_left = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            open_left += sock.recv(1) != b""
        except BlockingIOError:
            open_left += 1
        except OSError:
            pass
        sock.close()
    return {"opened": len(socks), "still_open_at_end": open_left}


def attack_slow_uploads(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """40 15 MB uploads to the events endpoint, each holding back its last byte, with
    plausible signature headers (a fresh timestamp, a signature that will not verify), so the
    server must await the body: the bound on bodies in flight is what holds."""
    stop_at = time.monotonic() + seconds
    size = 15 * MB
    sent = [0] * 40
    socks: list[socket.socket] = []

    def upload(i: int) -> None:
        try:
            sock = socket.create_connection((HOST, port), timeout=5)
        except OSError:
            return
        socks.append(sock)
        head = (
            f"POST /v1/kbs/{KB}/events HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/cloudevents+json\r\nContent-Length: {size}\r\n"
            f"webhook-id: slow-{i}\r\nwebhook-timestamp: {int(time.time())}\r\n"
            "webhook-signature: v1,AAAA\r\n\r\n"
        )
        sent[i] = _send_until_closed(sock, head.encode(), size - 65536, stop_at)
        with contextlib.suppress(OSError):
            sock.sendall(b"a" * (65536 - 1))  # all but one byte

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 10)
    time.sleep(max(0.0, stop_at - time.monotonic()))
    for sock in socks:
        sock.close()
    return {"uploads": 40, "bytes_sent": sum(sent)}


def attack_kb_flood(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """Signed deliveries, each to a KB that does not exist yet, from 4 threads."""
    stop_at = time.monotonic() + seconds
    signer = kbgen.Signer(creds.secret)
    statuses: dict[int, int] = {}
    run = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    def flood() -> None:
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=30.0) as client:
            while time.monotonic() < stop_at:
                name = f"flood-{run}-{next(counter)}"
                headers, body = delivery(signer, [upsert("a/b")])
                try:
                    status = client.post(f"/v1/kbs/{name}/events", content=body,
                                         headers=headers).status_code  # fmt: skip
                except httpx.HTTPError:
                    status = 0
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return {"deliveries": sum(statuses.values()), "statuses": statuses}


def attack_snippet_bomb(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """graph_context with 200-term queries (and search with 100) over concepts of 1 MiB text
    without a word break, every term a run of "a" (the worst case of the old snippet scan)."""
    stop_at = time.monotonic() + seconds
    body = json.dumps({"query": " ".join("a" * n for n in range(1, 201)), "limit": 30}).encode()
    search: dict[str, str | int] = {"q": " ".join("a" * n for n in range(1, 101)), "limit": 50}
    statuses: dict[int, int] = {}
    slowest = [0.0]

    def bomb(i: int) -> None:
        headers = {"Authorization": f"Bearer {creds.admin}", "Content-Type": "application/json"}
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=120.0) as client:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                try:
                    if i % 2:
                        path = f"/v1/kbs/{SNIPPET_KB}/tools/graph_context"
                        answer = client.post(path, content=body, headers=headers)
                    else:
                        path = f"/v1/kbs/{SNIPPET_KB}/search"
                        answer = client.get(path, params=search, headers=headers)
                    status = answer.status_code
                except httpx.HTTPError:
                    status = 0
                slowest[0] = max(slowest[0], time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=bomb, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 300)
    return {"requests": sum(statuses.values()), "statuses": statuses,
            "slowest_ms": round(slowest[0] * 1000, 1)}  # fmt: skip


def _trickler(port: int) -> socket.socket | None:
    """A delivery with made-up signature headers (a fresh timestamp) declaring 16 MiB."""
    try:
        sock = socket.create_connection((HOST, port), timeout=5)
        head = (f"POST /v1/kbs/anykb/events HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/cloudevents+json\r\nContent-Length: {16 * MB}\r\n"
                f"webhook-id: trickle\r\nwebhook-timestamp: {int(time.time())}\r\n"
                "webhook-signature: v1,AAAA\r\n\r\n[").encode()  # fmt: skip
        sock.sendall(head)
        sock.setblocking(False)
        return sock
    except OSError:
        return None


def attack_trickled_bodies(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """1,000 deliveries trickling a byte a second (no credential needed), re-opened as the
    server closes them; meanwhile a signed delivery every 0.25 s must be answered 200."""
    stop_at = time.monotonic() + seconds
    socks = [sock for _ in range(1000) if (sock := _trickler(port)) is not None]
    opened, closed_by_server = len(socks), 0
    signer = kbgen.Signer(creds.secret)
    statuses: dict[int, int] = {}

    def signed() -> None:
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=30.0) as client:
            while time.monotonic() < stop_at:
                headers, body = delivery(signer, [upsert("infra/trickle-ok")])
                try:
                    status = client.post(f"/v1/kbs/{KB}/events", content=body,
                                         headers=headers).status_code  # fmt: skip
                except httpx.HTTPError:
                    status = 0
                statuses[status] = statuses.get(status, 0) + 1
                time.sleep(0.25)

    thread = threading.Thread(target=signed)
    thread.start()
    while time.monotonic() < stop_at:
        for i, sock in enumerate(socks):
            try:
                sock.send(b" ")
                continue
            except BlockingIOError:
                continue
            except OSError:
                sock.close()
                closed_by_server += 1
            fresh = _trickler(port)
            if fresh is not None:
                socks[i] = fresh
                opened += 1
        time.sleep(1.0)
    thread.join(60)
    for sock in socks:
        sock.close()
    failed = sum(n for status, n in statuses.items() if status != 200)
    return {"trickling": opened, "closed_by_server": closed_by_server,
            "signed_deliveries": statuses, "polite_failures": failed}  # fmt: skip


def attack_mcp_streams(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """1,000 ``GET /v1/kbs/{kb}/mcp`` event streams from the narrowed token, held open (and
    opened again) for the whole attack."""
    stop_at = time.monotonic() + seconds
    request = (f"GET /v1/kbs/{KB}/mcp HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
               f"Authorization: Bearer {creds.agent}\r\nAccept: text/event-stream\r\n"
               "\r\n").encode()  # fmt: skip
    statuses: dict[str, int] = {}
    rounds = 0
    while time.monotonic() < stop_at:
        socks = []
        for _ in range(1000):
            try:
                sock = socket.create_connection((HOST, port), timeout=5)
                sock.sendall(request)
                socks.append(sock)
            except OSError:
                statuses["connect failed"] = statuses.get("connect failed", 0) + 1
        for sock in socks:
            try:
                first = sock.recv(64).split(b" ", 2)
                status = first[1].decode() if len(first) > 1 else "closed"
            except OSError:
                status = "no answer"
            statuses[status] = statuses.get(status, 0) + 1
        time.sleep(max(0.0, min(2.0, stop_at - time.monotonic())))  # held open meanwhile
        for sock in socks:
            sock.close()
        rounds += 1
    return {"rounds": rounds, "statuses": statuses}


def attack_word_flood(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """graph_context queries of 20,000 distinct new words each, from the narrowed token."""
    stop_at = time.monotonic() + seconds
    statuses: dict[int, int] = {}
    counter = iter(range(10**9))
    run = uuid.uuid4().hex[:6]

    def flood() -> None:
        headers = {"Authorization": f"Bearer {creds.agent}", "Content-Type": "application/json"}
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=60.0) as client:
            while time.monotonic() < stop_at:
                batch = next(counter)
                words = " ".join(f"z{run}q{batch}x{i}" for i in range(20_000))
                body = json.dumps({"query": words}).encode()
                try:
                    status = client.post(f"/v1/kbs/{KB}/tools/graph_context", content=body,
                                         headers=headers).status_code  # fmt: skip
                except httpx.HTTPError:
                    status = 0
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=flood) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 120)
    return {"queries": sum(statuses.values()), "distinct_words": 20_000 * next(counter),
            "statuses": statuses}  # fmt: skip


def attack_name_bomb(port: int, creds: Credentials, seconds: float) -> dict[str, Any]:
    """link_suggest on a visible 60 KB note while hidden concepts hold aliases of 1 to 200
    of its words, two calls at a time (the explorer calls it on every click)."""
    stop_at = time.monotonic() + seconds
    statuses: dict[int, int] = {}
    slowest = [0.0]

    def bomb() -> None:
        headers = {"Authorization": f"Bearer {creds.agent}", "Content-Type": "application/json"}
        body = json.dumps({"id": NAME_BOMB_NOTE}).encode()
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=120.0) as client:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                try:
                    status = client.post(f"/v1/kbs/{KB}/tools/link_suggest", content=body,
                                         headers=headers).status_code  # fmt: skip
                except httpx.HTTPError:
                    status = 0
                slowest[0] = max(slowest[0], time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=bomb) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 300)
    return {"calls": sum(statuses.values()), "statuses": statuses,
            "slowest_ms": round(slowest[0] * 1000, 1)}  # fmt: skip


ATTACKS: Final[dict[str, Callable[[int, Credentials, float], dict[str, Any]]]] = {
    "huge_body": attack_huge_body,
    "huge_header": attack_huge_header,
    "idle_sockets": attack_idle_sockets,
    "slow_uploads": attack_slow_uploads,
    "kb_flood": attack_kb_flood,
    "snippet_bomb": attack_snippet_bomb,
    "trickled_bodies": attack_trickled_bodies,
    "mcp_streams": attack_mcp_streams,
    "word_flood": attack_word_flood,
    "name_bomb": attack_name_bomb,
}
