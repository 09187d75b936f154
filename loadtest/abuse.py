"""Abuse (issue 10): does one hostile client hurt the others?

``python -m loadtest.abuse`` starts a real ``kbgraph serve`` (1 worker, the default limits,
a webhook secret, an admin and a narrowed token) on loopback, loads a small KB, and then:

- measures ``/healthz`` latency (answered on the event loop, so it shows any blocking) from a
  separate process with no attack;
- runs each attack for ``--seconds`` while that probe and a well-behaved client (status,
  search and graph_context with the narrowed token, reconnecting as a browser would) keep
  going: a 100 MB agent body, a 100 MB header, 2,000 idle sockets, 40 slow 15 MB uploads to
  the events endpoint (plausible signature headers, one byte held back), a flood of signed
  deliveries creating new KBs, a snippet bomb (a concept with 1 MiB of text without a word
  break, 200-term queries), and (issue 28) trickled bodies (1,000 deliveries with made-up
  signature headers sending a byte a second, while signed deliveries must still pass), MCP
  streams (1,000 ``GET /mcp`` from the narrowed token, held open), a word flood
  (``graph_context`` queries of 20,000 distinct words each) and a ``link_suggest`` name bomb
  (a visible 60 KB note, hidden concepts with aliases of 1 to 200 words).

Per attack: the probe's p50/p99, the server's RSS growth (peak during the attack over the RSS
before it), and the well-behaved client's failures (and, for trickled bodies, the signed
deliveries' failures). Aims: p99 <= 50 ms, RSS growth <= 200 MB,
no failure. Bounded: every attack stops after ``--seconds``; loopback only. The LAST line is
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing as mp
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import psutil

from loadtest import kbgen, report
from loadtest.service import HOST, KB, Credentials, ServiceProcess, write_config

P99_AIM_MS: Final = 50.0
RSS_AIM_MB: Final = 200.0
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


# --- the probe and the well-behaved client (a separate process) ------------------------------


def _probe_main(port: int, token: str, stop: Any, out: Any) -> None:
    """Time /healthz on one keep-alive connection every 10 ms; meanwhile a polite client.

    Runs for the whole benchmark; every record carries its ``time.monotonic()`` (system-wide
    on Linux), so the parent cuts the records into the windows of its attacks.
    """
    failures: list[tuple[float, str]] = []
    polite_done: list[float] = []

    def polite() -> None:
        queries = [
            ("GET", f"/v1/kbs/{KB}/status", None),
            ("GET", f"/v1/kbs/{KB}/search?q=dns+backup&limit=5", None),
            ("POST", f"/v1/kbs/{KB}/tools/graph_context", b'{"query": "dns backup"}'),
        ]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=10.0) as client:
            i = 0
            while not stop.is_set():
                method, path, body = queries[i % len(queries)]
                i += 1
                try:
                    answer = client.request(method, path, content=body, headers=headers)
                    if answer.status_code != 200:
                        failures.append(
                            (time.monotonic(), f"{path}: {answer.status_code} {answer.text[:80]}")
                        )
                except httpx.HTTPError as exc:
                    failures.append((time.monotonic(), f"{path}: {type(exc).__name__} {exc}"))
                polite_done.append(time.monotonic())
                time.sleep(0.02)

    thread = threading.Thread(target=polite, daemon=True)
    thread.start()
    latencies: list[tuple[float, float]] = []
    conn: http.client.HTTPConnection | None = None
    while not stop.is_set():
        started = time.perf_counter()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(HOST, port, timeout=10.0)
            conn.request("GET", "/healthz")
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                failures.append((time.monotonic(), f"/healthz: {answer.status}"))
        except (OSError, http.client.HTTPException) as exc:
            failures.append((time.monotonic(), f"/healthz: {type(exc).__name__}"))
            conn = None
            continue
        latencies.append((time.monotonic(), time.perf_counter() - started))
        time.sleep(0.01)
    thread.join(15)
    out.put({"latencies": latencies, "failures": failures, "polite": polite_done})


class Probe:
    """The probe process: started once, stopped once; ``window`` cuts its records."""

    def __init__(self, port: int, token: str) -> None:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.out = ctx.Queue()
        self.proc = ctx.Process(target=_probe_main, args=(port, token, self.stop, self.out))
        self.proc.start()
        self.records: dict[str, Any] = {}

    def finish(self) -> None:
        self.stop.set()
        self.records = self.out.get(timeout=120)
        self.proc.join(30)

    def window(self, start: float, end: float) -> dict[str, Any]:
        inside = [lat for at, lat in self.records["latencies"] if start <= at <= end]
        failures = [what for at, what in self.records["failures"] if start <= at <= end]
        polite = sum(start <= at <= end for at in self.records["polite"])
        return {"latencies": inside, "failures": failures, "polite": polite}


class RssSampler:
    """The server's peak RSS while a block runs (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.before = self.process.memory_info().rss
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- the attacks: each a function (port, creds, seconds) that stops after ``seconds`` --------


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
    search = {"q": " ".join("a" * n for n in range(1, 101)), "limit": 50}
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


# --- the run ---------------------------------------------------------------------------------


def seed(port: int, creds: Credentials) -> None:
    """A small KB for the polite client, and the snippet bomb's KB (1 MiB without a break)."""
    signer = kbgen.Signer(creds.secret)
    words = ["dns", "backup", "router", "vpn", "disk"]
    events = [upsert(f"infra/c{i}", text=" ".join(words[j % 5] for j in range(i, i + 30)))
              for i in range(200)]  # fmt: skip
    bomb = [upsert(f"x/{n}", text="a" * MB) for n in range(4)]
    # the name bomb: a visible 60 KB note, and hidden concepts (collection "hidden") whose
    # aliases are runs of 1 to 200 of its words
    note = " ".join(NAME_WORDS[i % len(NAME_WORDS)] for i in range(60_000 // 5))
    events.append(upsert(NAME_BOMB_NOTE, text=note))
    for k in range(4):
        event = upsert(f"hidden/names-{k}")
        event["data"]["aliases"] = [" ".join(NAME_WORDS[k : k + n])
                                    for n in range(k * 50 + 1, k * 50 + 51)]  # fmt: skip
        events.append(event)
    with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=60.0) as client:
        for kb, batch in ((KB, events), (SNIPPET_KB, bomb)):
            headers, body = delivery(signer, batch)
            answer = client.post(f"/v1/kbs/{kb}/events", content=body, headers=headers)
            answer.raise_for_status()
            seq = answer.json()["seq"]
            auth = {"Authorization": f"Bearer {creds.admin}", "X-Min-Seq": str(seq)}
            client.get(f"/v1/kbs/{kb}/status", headers=auth).raise_for_status()


def attack_window(
    service: ServiceProcess, creds: Credentials, name: str, seconds: float
) -> tuple[float, float, dict[str, Any], float]:
    """Run one attack (or nothing): its window, its detail and the server's RSS growth."""
    assert service.proc is not None
    attack = ATTACKS.get(name)
    with RssSampler(service.proc.pid) as rss:
        start = time.monotonic()
        detail = attack(service.port, creds, seconds) if attack else time.sleep(seconds) or {}
        end = time.monotonic()
    return start, end, detail, round((rss.peak - rss.before) / MB, 1)


def summarise(got: dict[str, Any], detail: dict[str, Any], rss_growth: float) -> dict[str, Any]:
    quantiles = report.percentiles(got["latencies"])
    return {
        "healthz_p50_ms": quantiles["p50"],
        "healthz_p99_ms": quantiles["p99"],
        "healthz_max_ms": quantiles["max"],
        "probes": len(got["latencies"]),
        "rss_growth_mb": rss_growth,
        "polite_requests": got["polite"],
        "failures": len(got["failures"]),
        "failure_examples": got["failures"][:3],
        "attack": detail,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    creds = Credentials()
    with tempfile.TemporaryDirectory(prefix="kbgraph-abuse-") as tmp:
        service = ServiceProcess(write_config(Path(tmp), creds))
        service.start()
        try:
            asyncio.run(service.wait_ready())
            seed(service.port, creds)
            probe = Probe(service.port, creds.agent)
            windows = {}
            try:
                time.sleep(3.0)  # the probe process is up and measuring
                for name in ["no_attack", *args.attacks]:
                    windows[name] = attack_window(service, creds, name, args.seconds)
                    print(f"{name}: {windows[name][2]}", file=sys.stderr)
                    time.sleep(1.0)  # let the server settle between attacks
            finally:
                probe.finish()
        finally:
            service.stop()
    return {
        name: summarise(probe.window(start, end), detail, rss)
        for name, (start, end, detail, rss) in windows.items()
    }


def figures(results: dict[str, Any]) -> dict[str, Any]:
    aims = {}
    for name, row in results.items():
        if name == "no_attack":
            continue
        p99 = row["healthz_p99_ms"]
        aims[name] = {
            "p99_within_50ms": p99 is not None and p99 <= P99_AIM_MS,
            "rss_growth_within_200mb": row["rss_growth_mb"] <= RSS_AIM_MB,
            "no_failed_polite_request": (
                row["failures"] == 0 and not row["attack"].get("polite_failures", 0)
            ),
        }
    return {
        "kind": "abuse",
        "server": "kbgraph serve, 1 worker, default limits",
        "results": results,
        "aims": aims,
        "all_aims_met": all(all(a.values()) for a in aims.values()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.abuse", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="per attack")
    parser.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=list(ATTACKS))
    args = parser.parse_args(argv)
    out = figures(run(args))
    rows = [
        [name, row["healthz_p50_ms"], row["healthz_p99_ms"], row["rss_growth_mb"],
         row["polite_requests"], row["failures"]]
        for name, row in out["results"].items()
    ]  # fmt: skip
    print(report.table(rows, ["attack", "p50 ms", "p99 ms", "RSS +MB", "polite req", "failed"]))
    for name, aims in out["aims"].items():
        missed = [aim for aim, met in aims.items() if not met]
        print(f"aim {name}: {'met' if not missed else 'NOT met: ' + ', '.join(missed)}")
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
